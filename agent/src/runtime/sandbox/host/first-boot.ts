/**
 * First boot: the env file and the setup script, applied at most once per disk.
 *
 * Everything is written from inside the guest (by the init at a cold boot, else through exec; the
 * setup script through the guest helper), with the content on a pipe, so no host-side write ever
 * follows a path the guest controls. The driver's marker lives outside the guest-visible tree and is written after the env
 * file and before the script starts: a crash in between may leave the script unstarted, but it
 * can never run twice.
 *
 * The setup script runs as the detached process `setup` (see guest-processes.ts).
 */
import { chmod, mkdir, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { ExecOutcome, FirstBootSpec } from '../../driver.js';

export interface FirstBootSteps {
  /**
   * Runs WRITE_ENV_COMMAND in the guest with `content` on stdin; null when the boot already wrote
   * the file (the init does, before Xvfb starts, when it is handed the content: cold-boot.ts).
   */
  writeEnv: ((content: string) => Promise<ExecOutcome>) | null;
  /** Starts the setup script as the detached process `setup`. */
  startSetup(script: string): Promise<void>;
  /** The driver's marker, outside the guest-visible tree. */
  markerPath: string;
  log(msg: string, fields?: object): void;
}

/**
 * Writes the env file, then the marker, then starts the setup script: a crash between the marker
 * and the script leaves the script unstarted, but it never runs twice.
 */
export async function applyFirstBoot(steps: FirstBootSteps, spec: FirstBootSpec): Promise<void> {
  if (steps.writeEnv !== null) {
    const env = await steps.writeEnv(renderEnvFile(spec.env));
    if (env.exitCode !== 0) {
      throw new AgentFailure('runtime_error', `writing the env file failed: ${env.stderr.trim()}`, true);
    }
  }
  await writeFile(steps.markerPath, new Date().toISOString());
  if (spec.setupScript !== null) {
    await steps.startSetup(spec.setupScript).catch((err: unknown) => steps.log('setup script could not be started', { error: String(err) }));
  }
}

/** `export KEY='value'` with POSIX single-quote escaping (`'` becomes `'\''`). */
export function renderEnvFile(env: Readonly<Record<string, string>>): string {
  return Object.entries(env)
    .map(([key, value]) => {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(key)) throw new Error(`invalid env key ${JSON.stringify(key)}`);
      return `export ${key}='${value.replace(/'/g, `'\\''`)}'\n`;
    })
    .join('');
}

export const WRITE_ENV_COMMAND =
  'umask 077 && mkdir -p /root/.canto && cat > /root/.canto/.env.tmp && chmod 600 /root/.canto/.env.tmp && mv -f /root/.canto/.env.tmp /root/.canto/env';

/**
 * Writes the env file from the host into a desktop's mounted disk, as WRITE_ENV_COMMAND would in
 * the guest. Only for a disk no user code has run on yet (a golden template's clone before its
 * first wake: host/golden.ts), so nothing on the way can be a link a guest planted; a cold guest
 * process for it cost ≈50 ms of that first wake.
 */
export async function writeEnvOnFreshDisk(disk: string, content: string): Promise<void> {
  const dir = join(disk, 'root', '.canto');
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const tmp = join(dir, '.env.tmp');
  await writeFile(tmp, content, { mode: 0o600, flag: 'w' });
  await chmod(tmp, 0o600);
  await rename(tmp, join(dir, 'env'));
}

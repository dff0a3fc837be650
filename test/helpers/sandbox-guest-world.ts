/**
 * The desktop the sandbox guest-operation tests share (sandbox-guest-files.test.ts,
 * sandbox-guest-ops.test.ts): a real sandbox driver on a fresh state directory, one started
 * desktop (with an env file and a setup script that exits 4) and a second, never-started one, a
 * host sentinel file the guest must never see, and the calls the tests make on them. Needs root.
 * Each test file gets its own (vitest loads this module afresh for every file); both desktops are
 * destroyed in afterAll, and per-operation timings are printed for the docs.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { chunks, drain, hostProcesses, stopwatch } from './sandbox.js';

export const MiB = 1024 * 1024;
export const GUEST_ROOT_NAMES = new Set(['bin', 'dev', 'etc', 'home', 'lib', 'lib64', 'proc', 'root', 'run', 'sbin', 'tmp', 'usr', 'var']);

export const { timings, timed } = stopwatch();

/**
 * Host pids of guest helpers working on `needles`: a cold helper has them as whole arguments, a
 * warm one (a child of the desktop's file server) in its title, `canto-helper <op> <args>`.
 */
export async function hostPidsWithArgs(...needles: string[]): Promise<number[]> {
  const found = await hostProcesses((args) => {
    const title = args[0]?.startsWith('canto-helper ') ? args[0].split(' ') : [];
    return needles.every((n) => args.includes(n) || title.includes(n));
  });
  return found.map((p) => p.pid);
}

export let base: string;
export let stateDir: string;
export let driver: SandboxDriver;
export let id: string;
export let stopped: string;
export let hostDir: string;
export let sentinel: string;

export async function sh(command: string): Promise<string> {
  const out = await driver.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: MiB });
  expect(out.stderr, `stderr of ${command}`).toBe('');
  expect(out.exitCode, `exit code of ${command}`).toBe(0);
  return out.stdout.trim();
}

export const read = (path: string, offset: number | null = null, length = 0, maxWholeBytes = 8 * MiB) =>
  driver.readFile(id, { path, offset, length, maxWholeBytes });
export const text = async (path: string) => (await drain(await read(path))).toString();
export const put = (path: string, ...parts: Array<string | Buffer>) =>
  driver.writeFile(id, { path, appendAt: null }, chunks(...parts));
export const append = (path: string, at: number, ...parts: Array<string | Buffer>) =>
  driver.writeFile(id, { path, appendAt: at }, chunks(...parts));

/** Starts the shared desktops around the calling describe block; call it inside one. */
export function useGuestDesktop(): void {
  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-guest-ops-test-'));
    stateDir = join(base, 'state');
    driver = await createSandboxDriver({ stateDir });
    id = newId('desktop');
    await driver.prepare(id, 'small');
    const firstBoot = {
      env: { GREETING: `hello 'world'` },
      setupScript: 'echo setup-out; echo setup-err >&2; exit 4',
    };
    await driver.start({ desktopId: id, tier: 'small', firstBoot });
    stopped = newId('desktop');
    await driver.prepare(stopped, 'small');
    // A host file the guest must never see: under the host's /tmp, which the guest does not share.
    hostDir = await mkdtemp(join(tmpdir(), 'canto-sentinel-'));
    sentinel = join(hostDir, 'secret.txt');
    await writeFile(sentinel, 'HOST-SENTINEL');
  });

  afterAll(async () => {
    for (const desktop of [id, stopped]) if (desktop) await driver?.destroy(desktop);
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
    if (hostDir) await rm(hostDir, { recursive: true, force: true });
    console.log('sandbox guest-ops timings (ms):', JSON.stringify(timings));
  });
}

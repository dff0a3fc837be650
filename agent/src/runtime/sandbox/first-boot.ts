/**
 * First boot: the env file and the setup script, applied at most once per disk.
 *
 * Everything is written from inside the guest (through exec, or the guest helper for the setup
 * script), with the content on stdin, so no host-side write ever follows a path the guest controls. The driver's marker lives outside the
 * guest-visible tree and is written after the env file and before the script starts: a crash in
 * between may leave the script unstarted, but it can never run twice.
 *
 * The setup script runs as the detached process `setup` (see guest-processes.ts).
 */
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

/**
 * First boot: the env file and the setup script, applied at most once per disk.
 *
 * Everything is written from inside the guest through exec, with the content on stdin, so no
 * host-side write ever follows a path the guest controls. The driver's marker lives outside the
 * guest-visible tree and is written after the env file and before the script starts: a crash in
 * between may leave the script unstarted, but it can never run twice.
 *
 * Detached processes use the layout `/root/.canto/processes/<id>/{pid,stdout,stderr,exit_code}`;
 * `exit_code` appears (atomically, via rename) only when the process has ended.
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

/**
 * Starts a script (read from stdin) detached under process id `id`. The wrapper shell runs in its
 * own session, reparented to the guest init when the exec returns, so it survives hibernation.
 */
export function startDetachedCommand(id: string): string {
  if (!/^[a-z0-9][a-z0-9_-]{0,63}$/.test(id)) throw new Error(`invalid process id ${id}`);
  const dir = `/root/.canto/processes/${id}`;
  const runner =
    `cd /root; [ -f /root/.canto/env ] && . /root/.canto/env; ` +
    `/bin/sh ${dir}/script >${dir}/stdout 2>${dir}/stderr </dev/null; ` +
    `echo $? > ${dir}/.exit_code.tmp && mv -f ${dir}/.exit_code.tmp ${dir}/exit_code`;
  return [
    'set -e',
    `rm -rf ${dir}`,
    `mkdir -p ${dir}`,
    `cat > ${dir}/script`,
    `setsid /bin/sh -c '${runner}' </dev/null >/dev/null 2>&1 &`,
    `echo $! > ${dir}/pid`,
  ].join('\n');
}

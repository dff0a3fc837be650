/**
 * The process spawner's socket directories (`$TMPDIR/canto-spawn-*`, spawner.ts), and the sweep
 * that removes those of helpers killed without their clean-up.
 */
import { readdir, rm, stat } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const SOCKET_DIR_PREFIX = 'canto-spawn-';
/** How long a helper's socket may take to accept before it counts as nobody's. */
const SWEEP_CONNECT_MS = 500;
/**
 * How old a directory without a socket must be to count as stale. Its agent makes it and then
 * starts the helper, which binds the socket a few milliseconds later: two agents starting together
 * on one machine each swept the other's fresh directory, and one of them ran without its helper.
 */
const UNBOUND_GRACE_MS = 60_000;

/**
 * Removes the socket directories of helpers that are gone: a helper removes its own when its
 * agent exits, but not when it is killed (SIGKILL of the agent's process group). A directory
 * whose socket no process listens on is such a one; a live helper's accepts (and then drops the
 * connection, as it is not its parent's). One with no socket is a helper that died before it
 * listened, once it is older than a start takes.
 */
export async function sweepStaleSockets(root = tmpdir()): Promise<string[]> {
  const names = (await readdir(root).catch(() => [] as string[])).filter((n) => n.startsWith(SOCKET_DIR_PREFIX));
  const stale = await Promise.all(
    names.map(async (name) => {
      const dir = join(root, name);
      const socketPath = join(dir, 's');
      const bound = await stat(socketPath).then(() => true, () => false);
      const live = bound
        ? await new Promise<boolean>((resolve) => {
          const socket = connect({ path: socketPath });
          const timer = setTimeout(() => done(true), SWEEP_CONNECT_MS);
          const done = (answer: boolean) => {
            clearTimeout(timer);
            socket.destroy();
            resolve(answer);
          };
          socket.once('connect', () => done(true));
          // Refused: nobody listens. Anything else (the socket just went with its helper's own
          // clean-up) is not this sweep's to remove.
          socket.once('error', (err: NodeJS.ErrnoException) => done(err.code !== 'ECONNREFUSED'));
        })
        : Date.now() - ((await stat(dir).catch(() => null))?.mtimeMs ?? Date.now()) < UNBOUND_GRACE_MS;
      if (live) return null;
      await rm(dir, { recursive: true, force: true });
      return dir;
    }),
  );
  return stale.filter((d): d is string => d !== null);
}

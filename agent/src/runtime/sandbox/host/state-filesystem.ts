/**
 * The state directory is one filesystem. Forks freeze a desktop's disk by renaming it into the
 * layer store, a move's import renames its staged copy into the desktops directory, and a destroy
 * renames a desktop into the discard bin: each is one rename, which is what makes it crash-safe,
 * and rename(2) does not cross filesystems (EXDEV). A host whose operator mounted a disk at
 * `<state>/desktops` rather than at `<state>` would run desktops and then fail every fork and every
 * move to it, so the agent refuses to start on such a layout (another filesystem, or a bind mount of
 * the same one) and says where to mount instead.
 */
import { mkdir, readFile, realpath, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { parseMountTable } from './mount-table.js';
import { discardedDir } from './discarded.js';
import { layersDir } from './layers.js';
import { desktopsDir, incomingDir } from './layout.js';

/** The directories whose contents are renamed into one another. */
function renamedBetween(stateDir: string): string[] {
  return [desktopsDir(stateDir), layersDir(stateDir), incomingDir(stateDir), discardedDir(stateDir)];
}

/** Creates the state's directories and throws, naming two of them, when they span filesystems. */
export async function assertOneFilesystem(stateDir: string): Promise<void> {
  const dirs = renamedBetween(stateDir);
  const devices: bigint[] = [];
  for (const dir of dirs) {
    // The discard bin holds destroyed desktops' files: nobody else lists it (discarded.ts).
    await mkdir(dir, { recursive: true, mode: dir === discardedDir(stateDir) ? 0o700 : 0o755 });
    devices.push((await stat(dir, { bigint: true })).dev);
  }
  const other = devices.findIndex((dev) => dev !== devices[0]);
  if (other !== -1) {
    throw new Error(
      `${dirs[other]} and ${dirs[0]} are on different filesystems: forks, moves and destroys rename ` +
        `between them, which cannot cross filesystems. Mount the desktops' disk at ${stateDir} itself, not below it.`,
    );
  }
  // A bind mount keeps the device but is a mount of its own, and rename(2) does not cross mounts either.
  const below = await mountBelow(stateDir, dirs);
  if (below !== null) {
    throw new Error(
      `${below} is a mount of its own below ${stateDir}: forks, moves and destroys rename between its directories, ` +
        `which cannot cross mounts. Mount at ${stateDir} itself, not below it.`,
    );
  }
}

/** A mount point strictly below `stateDir` that holds one of `dirs` (or is one), or null. */
async function mountBelow(stateDir: string, dirs: readonly string[]): Promise<string | null> {
  const root = await realpath(stateDir);
  const real = await Promise.all(dirs.map((d) => realpath(d)));
  const mounts = parseMountTable(await readFile('/proc/self/mountinfo', 'utf8').catch(() => ''));
  for (const { mountPoint } of mounts) {
    if (!mountPoint.startsWith(join(root, '/'))) continue;
    if (real.some((d) => d === mountPoint || d.startsWith(join(mountPoint, '/')))) return mountPoint;
  }
  return null;
}

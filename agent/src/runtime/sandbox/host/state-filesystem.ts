/**
 * The state directory is one filesystem. Forks freeze a desktop's disk by renaming it into the
 * layer store, a move's import renames its staged copy into the desktops directory, and a destroy
 * renames a desktop into the discard bin: each is one rename, which is what makes it crash-safe,
 * and rename(2) does not cross filesystems (EXDEV). A host whose operator mounted a disk at
 * `<state>/desktops` rather than at `<state>` would run desktops and then fail every fork and every
 * move to it, so the agent refuses to start on such a layout and says where to mount instead.
 */
import { mkdir, stat } from 'node:fs/promises';
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
  if (other === -1) return;
  throw new Error(
    `${dirs[other]} and ${dirs[0]} are on different filesystems: forks, moves and destroys rename ` +
      `between them, which cannot cross filesystems. Mount the desktops' disk at ${stateDir} itself, not below it.`,
  );
}

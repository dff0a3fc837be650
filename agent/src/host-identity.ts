/**
 * Who this agent is. Two ids with different lifetimes:
 *
 * - the host id names the machine and its disks. It is minted once, stored in `<stateDir>/host-id`
 *   and reused by every later agent process, so the scheduler recognizes a returning host (and
 *   the desktops whose disks live on it) after a restart or a reboot;
 * - the agent instance id names one process. It is fresh on every start, so the scheduler can tell
 *   a reconnect of the same process (same instance) from a restart (new instance, in-memory state
 *   lost) even though both present the same host id.
 *
 * A host-id file that exists but does not hold a host id is an error, not something to overwrite:
 * minting a new id would orphan every desktop disk the scheduler believes lives on this host.
 */
import { randomUUID } from 'node:crypto';
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { isId, newId } from '../../shared/src/ids.js';

export interface HostIdentity {
  /** Stable across restarts: `host_…`. */
  readonly hostId: string;
  /** Fresh per process. */
  readonly agentInstanceId: string;
}

export const HOST_ID_FILE = 'host-id';

export async function loadHostIdentity(stateDir: string): Promise<HostIdentity> {
  await mkdir(stateDir, { recursive: true, mode: 0o700 });
  const file = join(stateDir, HOST_ID_FILE);
  let hostId = await readHostId(file);
  if (hostId === undefined) {
    hostId = newId('host');
    // Written to a temporary name and renamed, so a crash mid-write never leaves a truncated id
    // that the next start would refuse.
    const temp = `${file}.tmp-${process.pid}`;
    await writeFile(temp, `${hostId}\n`, { mode: 0o644 });
    await rename(temp, file);
  }
  return Object.freeze({ hostId, agentInstanceId: randomUUID() });
}

async function readHostId(file: string): Promise<string | undefined> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  const hostId = text.trim();
  if (!isId('host', hostId)) {
    throw new Error(`${file} does not hold a host id; fix or remove it (removing it makes this a new host)`);
  }
  return hostId;
}

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
 *
 * Beside the id, the host key (`<stateDir>/host-key`, mode 0600): 32 random bytes minted with it
 * (or at the first start of an agent that had none), sent in every hello. The schedulers keep the
 * hash of the first key a host id said hello with and refuse any other for that id, so the join
 * token, which every agent holds, lets no one take over another host's id, its desktops and its
 * port-link key. Moving a host to another machine means moving both files.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdir, open, readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { isId, newId } from '../../shared/src/ids.js';

export interface HostIdentity {
  /** Stable across restarts: `host_…`. */
  readonly hostId: string;
  /** Fresh per process. */
  readonly agentInstanceId: string;
  /** Stable across restarts: the secret that proves the host id is this host's (base64url). */
  readonly hostKey: string;
}

export const HOST_ID_FILE = 'host-id';
export const HOST_KEY_FILE = 'host-key';
const HOST_KEY = /^[A-Za-z0-9_-]{43}$/;

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
  return Object.freeze({ hostId, agentInstanceId: randomUUID(), hostKey: await loadHostKey(join(stateDir, HOST_KEY_FILE)) });
}

async function loadHostKey(file: string): Promise<string> {
  const text = await readFile(file, 'utf8').catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return null;
    throw err;
  });
  if (text !== null) {
    const key = text.trim();
    // Not replaced: a new key would lock this host out of its own id.
    if (!HOST_KEY.test(key)) throw new Error(`${file} does not hold a host key; restore it from a backup (removing it locks this host out of its id)`);
    return key;
  }
  const key = randomBytes(32).toString('base64url');
  const temp = `${file}.tmp-${process.pid}`;
  // On disk before the schedulers hear of it: a key lost to a power loss would lock the host out.
  const handle = await open(temp, 'w', 0o600);
  try {
    await handle.writeFile(`${key}\n`);
    await handle.sync();
  } finally {
    await handle.close();
  }
  await rename(temp, file);
  return key;
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

/**
 * CRIU's kernel-facts cache on hosts whose `/run` is not a tmpfs.
 *
 * Every CRIU run starts by probing the kernel (forking, ptrace, netlink, mounts: 40–70 ms on a
 * 2-core host), unless it finds `/run/criu.kdat`, the facts a former run saved. CRIU saves that
 * file only on a tmpfs, so that a reboot (perhaps into another kernel) clears it; on a host whose
 * `/run` lives on disk, every dump and every restore probes again, a sixth of a wake. CRIU reads
 * the file from any file system, though.
 *
 * So where `/run` is not a tmpfs, the agent has CRIU save the file once, in a mount namespace of
 * its own whose `/run` is a fresh tmpfs, and puts it at `/run/criu.kdat`, taking on the reboot's
 * job itself: the file is made anew whenever the boot id or the CRIU binary differs from those it
 * was made for (kept in `/run/canto/criu-kdat.key`). Where `/run` is a tmpfs nothing is done.
 */
import { mkdir, readFile, rename, stat, statfs, writeFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { execa } from 'execa';

export const KDAT_FILE = '/run/criu.kdat';
export const KDAT_KEY_FILE = '/run/canto/criu-kdat.key';
const TMPFS_MAGIC = 0x01021994;

/** What happened: `tmpfs` (CRIU keeps its own), `kept` (ours is current), `made`, or why not. */
export type KdatOutcome = 'tmpfs' | 'kept' | 'made' | { readonly failed: string };

export async function ensureKdatCache(criuPath: string): Promise<KdatOutcome> {
  try {
    if ((await statfs(dirname(KDAT_FILE))).type === TMPFS_MAGIC) return 'tmpfs';
    const key = await cacheKey(criuPath);
    const kept = await readFile(KDAT_KEY_FILE, 'utf8').catch(() => null);
    if (kept === key && (await stat(KDAT_FILE).catch(() => null)) !== null) return 'kept';
    // `criu check` initialises (and saves) the facts; the file is read out before the namespace,
    // and its tmpfs with it, goes away.
    const made = await execa(
      'unshare',
      ['--mount', '--propagation', 'private', 'sh', '-c', 'mount -t tmpfs -o size=1m,mode=0755 canto-kdat /run && "$0" check >/dev/null 2>&1; cat /run/criu.kdat', criuPath],
      { reject: false, timeout: 30_000, encoding: 'buffer', env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' } },
    );
    const facts = made.stdout as Buffer;
    if (made.exitCode !== 0 || facts.length === 0) return { failed: `CRIU saved no kernel facts (${made.exitCode})` };
    const tmp = `${KDAT_FILE}.canto-${process.pid}`;
    await writeFile(tmp, facts, { mode: 0o600 });
    await rename(tmp, KDAT_FILE);
    // The key comes last: a crash between the two leaves a current file under an old key, which
    // the next start makes again, never an old file under the current key.
    await mkdir(dirname(KDAT_KEY_FILE), { recursive: true });
    await writeFile(KDAT_KEY_FILE, key);
    return 'made';
  } catch (err) {
    return { failed: err instanceof Error ? err.message : String(err) };
  }
}

async function cacheKey(criuPath: string): Promise<string> {
  const binary = await stat(criuPath);
  const bootId = (await readFile('/proc/sys/kernel/random/boot_id', 'utf8')).trim();
  return `${bootId} ${criuPath} ${binary.size} ${binary.mtimeMs}\n`;
}

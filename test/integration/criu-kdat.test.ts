/**
 * CRIU's kernel-facts cache (agent/src/runtime/sandbox/host/criu-kdat.ts), with the real CRIU:
 * where `/run` is not a tmpfs the agent has the file made and CRIU then loads it instead of
 * probing; where it is a tmpfs CRIU keeps its own and the agent does nothing.
 */
import { mkdtemp, readFile, rm, statfs, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { describe, expect, it } from 'vitest';
import { detectCriu } from '../../agent/src/runtime/sandbox/host/criu.js';
import { ensureKdatCache, KDAT_FILE, KDAT_KEY_FILE } from '../../agent/src/runtime/sandbox/host/criu-kdat.js';
import { isRoot } from '../helpers/sandbox.js';

const criu = isRoot ? await detectCriu(undefined) : null;
const runIsTmpfs = (await statfs('/run')).type === 0x01021994;

/** What CRIU's own log says about the cache when it runs `check`. */
async function criuSaysOfCache(criuPath: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'canto-kdat-'));
  try {
    await execa(criuPath, ['check', '-v4', '-o', join(dir, 'check.log')], { reject: false });
    const log = await readFile(join(dir, 'check.log'), 'utf8');
    return log.split('\n').find((l) => /kdat/i.test(l)) ?? '';
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

describe.skipIf(criu === null)("CRIU's kernel facts, cached per boot", () => {
  it.skipIf(runIsTmpfs)('are made once where /run is on disk, loaded by CRIU, and made again for another boot or binary', async () => {
    const criuPath = criu!.path;
    await rm(KDAT_FILE, { force: true });
    await rm(KDAT_KEY_FILE, { force: true });
    expect(await criuSaysOfCache(criuPath)).toMatch(/does not exist/);

    expect(await ensureKdatCache(criuPath)).toBe('made');
    expect(await criuSaysOfCache(criuPath)).toMatch(`Loaded kdat cache from ${KDAT_FILE}`);
    const key = await readFile(KDAT_KEY_FILE, 'utf8');
    expect(key).toContain((await readFile('/proc/sys/kernel/random/boot_id', 'utf8')).trim());
    expect(key).toContain(criuPath);

    // Current: kept as it is.
    expect(await ensureKdatCache(criuPath)).toBe('kept');
    // Made for another boot: made again (a reboot does not clear a /run on disk).
    await writeFile(KDAT_KEY_FILE, `another-boot ${criuPath} 1 1\n`);
    expect(await ensureKdatCache(criuPath)).toBe('made');
    // The file gone (CRIU drops one it finds stale) under a current key: made again.
    await rm(KDAT_FILE);
    expect(await ensureKdatCache(criuPath)).toBe('made');
    expect(await criuSaysOfCache(criuPath)).toMatch(`Loaded kdat cache from ${KDAT_FILE}`);
  });

  it.skipIf(!runIsTmpfs)('are left to CRIU where /run is a tmpfs', async () => {
    expect(await ensureKdatCache(criu!.path)).toBe('tmpfs');
  });
});

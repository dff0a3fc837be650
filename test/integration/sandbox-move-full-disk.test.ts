/**
 * An import into a host whose disk fills up (agent/src/transfer/unit-fetch.ts): a real desktop
 * moved between two agents on this machine, the target's staging directory a 4 MiB tmpfs. The
 * import fails retryable saying the disk is full, installs nothing and leaves the source's copy
 * as it was; once there is room, the same import completes and the desktop starts with its files.
 * Needs root (namespaces, mounts).
 */
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import type { ExportResult } from '../../shared/src/transfer.js';
import { failure } from '../helpers/agent-failure.js';
import { startMoveHost, type MoveHost } from '../helpers/move-hosts.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';

describe.skipIf(!isRoot)('an import into a full disk', () => {
  let base: string;
  let a: MoveHost;
  let b: MoveHost;
  let staging: string;
  let mounted = false;
  const id = newId('desktop');
  let generation = 0;
  const ref = () => ({ desktop_id: id, generation: ++generation, operation_id: `op_${generation}` });

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-move-full-'));
    a = await startMoveHost(join(base, 'a'), { retries: 1, backoffMs: 20 });
    b = await startMoveHost(join(base, 'b'), { retries: 1, backoffMs: 20 });
    staging = join(b.state, 'runtime', 'incoming');
    await mkdir(staging, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=4m', 'canto-test-full', staging]);
    mounted = true;
  });
  afterAll(async () => {
    if (mounted) execFileSync('umount', ['-l', staging]);
    for (const h of [b, a]) await h?.close();
    if (base) {
      await destroyLeftDesktops(join(base, 'a', 'runtime'));
      await destroyLeftDesktops(join(base, 'b', 'runtime'));
      await rm(base, { recursive: true, force: true });
    }
  });

  const sh = async (h: MoveHost, command: string) => {
    const out = await h.driver.exec(id, { command, timeoutMs: 60_000, maxOutputBytes: 1 << 20 });
    expect(out.exitCode, out.stderr).toBe(0);
    return out.stdout.trim();
  };

  it('fails retryable saying so, installs nothing, and completes once there is room', async () => {
    await a.handlers.handle('desktop.prepare', { ...ref(), tier: 'small' });
    await a.handlers.handle('desktop.start', { ...ref(), tier: 'small', first_boot: null });
    await sh(a, 'head -c 16777216 /dev/urandom > /root/data');
    const sum = await sh(a, 'sha256sum /root/data');
    await a.handlers.handle('desktop.hibernate', ref());
    const exported = (await a.handlers.handle('desktop.export', { desktop_id: id, generation: ++generation, ttl_ms: 600_000, listing: 'sized' })) as ExportResult;
    expect(exported.total_bytes).toBeGreaterThan(16 << 20);
    const importing = () =>
      b.handlers.handle('desktop.import', { desktop_id: id, generation, tier: 'small', source: { url: exported.url, ticket: exported.ticket } });

    const full = await failure(importing());
    expect(full.code).toBe('runtime_error');
    expect(full.retryable).toBe(true);
    expect(full.message).toMatch(/no space left/i);
    expect(await b.driver.list()).toEqual([]);
    expect(await a.driver.list()).toEqual([{ desktopId: id, running: false, hasSnapshot: true }]);

    execFileSync('umount', ['-l', staging]);
    mounted = false;
    const done = (await importing()) as { fetched_bytes: number };
    expect(done.fetched_bytes).toBeGreaterThan(0);
    expect(await readdir(join(b.state, 'runtime', 'desktops'))).toEqual([id]);
    // The source copy goes before the moved one starts (both hosts share this machine's cgroups).
    await a.handlers.handle('desktop.destroy', ref());
    expect(await b.handlers.handle('desktop.start', { ...ref(), tier: 'small', first_boot: null })).toEqual({ restored: true });
    expect(await sh(b, 'sha256sum /root/data')).toBe(sum);
  }, 120_000);
});

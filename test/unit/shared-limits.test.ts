/**
 * The limits every guest shares with the host's root (agent/src/runtime/sandbox/host/shared-limits.ts):
 * raised to their floors where lower, never lowered, left alone when turned off, and a limit that
 * cannot be written is reported, not fatal. On files standing in for /proc/sys.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { raiseSharedLimits, SHARED_LIMITS } from '../../agent/src/runtime/sandbox/host/shared-limits.js';

describe('limits shared with the host', () => {
  let procSys: string;
  const logged: Array<{ msg: string; fields?: object }> = [];
  const log = (msg: string, fields?: object) => void logged.push({ msg, fields });
  const value = (name: string) => Number(readFileSync(join(procSys, name), 'utf8'));

  beforeEach(() => {
    procSys = mkdtempSync(join(tmpdir(), 'canto-procsys-'));
    mkdirSync(join(procSys, 'fs', 'inotify'), { recursive: true });
    writeFileSync(join(procSys, 'fs/inotify/max_user_instances'), '128\n');
    writeFileSync(join(procSys, 'fs/inotify/max_user_watches'), `${(1 << 22) + 5}\n`);
    logged.length = 0;
  });
  afterEach(() => rmSync(procSys, { recursive: true, force: true }));

  it('raises a limit below its floor and leaves one above it', async () => {
    const raised = await raiseSharedLimits(true, log, procSys);
    expect(raised).toEqual([{ name: 'fs.inotify.max_user_instances', from: 128, to: SHARED_LIMITS['fs/inotify/max_user_instances'] }]);
    expect(value('fs/inotify/max_user_instances')).toBe(1 << 20);
    expect(value('fs/inotify/max_user_watches')).toBe((1 << 22) + 5);
    expect(logged.map((l) => l.msg)).toEqual(['raised limits every desktop shares with the host']);
  });

  it('changes nothing when turned off', async () => {
    expect(await raiseSharedLimits(false, log, procSys)).toEqual([]);
    expect(value('fs/inotify/max_user_instances')).toBe(128);
  });

  it('says how to set a limit it cannot write, and goes on', async () => {
    // A sysctl nobody may write, root included, standing in for a read-only /proc/sys: 65536 is below the floor.
    rmSync(join(procSys, 'fs/inotify/max_user_instances'));
    symlinkSync('/proc/sys/kernel/ngroups_max', join(procSys, 'fs/inotify/max_user_instances'));
    writeFileSync(join(procSys, 'fs/inotify/max_user_watches'), '8192\n');
    const raised = await raiseSharedLimits(true, log, procSys);
    expect(raised).toEqual([{ name: 'fs.inotify.max_user_watches', from: 8192, to: 1 << 22 }]);
    expect(logged[0]).toMatchObject({
      msg: 'could not raise a limit every desktop shares with the host',
      fields: { sysctl: 'fs.inotify.max_user_instances', wanted: 1 << 20, advice: expect.stringContaining('sysctl.d') as unknown },
    });
  });
});

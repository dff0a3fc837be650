/**
 * Reading the host's mount table, and its cgroup mounts to decide whether the agent turns `favordynmods` on
 * (cgroup-migrations.ts), from mountinfo texts of the shapes hosts have.
 */
import { describe, expect, it } from 'vitest';
import { cgroupMounts, favorDynmodsPlan } from '../../agent/src/runtime/sandbox/host/cgroup-migrations.js';
import { parseMountTable } from '../../agent/src/runtime/sandbox/host/mount-table.js';

/** systemd's unified hierarchy. */
const UNIFIED = '35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n';
/** A hybrid host: v1 controllers and a cgroup2 beside them, as this project's test machines have. */
const HYBRID = [
  '29 24 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755',
  '33 29 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory',
  '34 29 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids',
  '41 29 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw',
  '50 24 0:40 / /mnt/with\\040space rw - ext4 /dev/vdb rw',
].join('\n');

describe('favordynmods on the cgroup mounts', () => {
  it('reads the cgroup filesystems of mountinfo, and nothing else', () => {
    expect(cgroupMounts(HYBRID)).toEqual([
      { mountPoint: '/sys/fs/cgroup/memory', mountOptions: ['rw', 'relatime'], fsType: 'cgroup', superOptions: ['rw', 'memory'] },
      { mountPoint: '/sys/fs/cgroup/pids', mountOptions: ['rw', 'relatime'], fsType: 'cgroup', superOptions: ['rw', 'pids'] },
      { mountPoint: '/sys/fs/cgroup/unified', mountOptions: ['rw', 'relatime'], fsType: 'cgroup2', superOptions: ['rw'] },
    ]);
    expect(cgroupMounts('60 24 0:41 / /srv/cg\\040two rw - cgroup2 cgroup2 rw\n')[0]?.mountPoint).toBe('/srv/cg two');
    // The table every part of the runtime reads (mount-table.ts): escapes undone, optional fields skipped.
    expect(parseMountTable(HYBRID).at(-1)).toEqual({ mountPoint: '/mnt/with space', mountOptions: ['rw'], fsType: 'ext4', superOptions: ['rw'] });
    // A mount's own options, apart from its filesystem's: a read-only bind of a writable filesystem.
    expect(parseMountTable('44 93 0:43 /sys /proc/sys ro,nosuid,nodev,noexec,relatime - proc proc rw\n')[0]).toMatchObject({ mountOptions: ['ro', 'nosuid', 'nodev', 'noexec', 'relatime'], superOptions: ['rw'] });
  });

  it('remounts the cgroup2 mount with the option, keeping the options a remount would otherwise drop', () => {
    expect(favorDynmodsPlan(cgroupMounts(UNIFIED))).toEqual({
      already: false,
      remount: ['-o', 'remount,nsdelegate,memory_recursiveprot,favordynmods', '/sys/fs/cgroup'],
    });
    expect(favorDynmodsPlan(cgroupMounts(HYBRID))).toEqual({ already: false, remount: ['-o', 'remount,favordynmods', '/sys/fs/cgroup/unified'] });
  });

  it('leaves a host alone where any cgroup mount has it already (the mode is one for the whole kernel)', () => {
    expect(favorDynmodsPlan(cgroupMounts(UNIFIED.replace('memory_recursiveprot', 'memory_recursiveprot,favordynmods')))).toEqual({ already: true });
    expect(favorDynmodsPlan(cgroupMounts(HYBRID.replace('rw,memory', 'rw,memory,favordynmods')))).toEqual({ already: true });
  });

  it('has nothing to remount without a cgroup2 mount', () => {
    expect(favorDynmodsPlan(cgroupMounts(HYBRID.replace(/^.*cgroup2.*$/m, '')))).toEqual({ already: false, remount: null });
  });
});

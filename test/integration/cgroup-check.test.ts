/**
 * The sandbox runtime's check for cgroup v1 (agent/src/runtime/sandbox/host/cgroups.ts): a host
 * without the memory, cpu and pids hierarchies is refused at the agent's start, saying how to
 * boot it, instead of taking desktops and failing every boot. This host has them; a directory of
 * this disk stands for a host that has none.
 */
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { cgroupV1Problem } from '../../agent/src/runtime/sandbox/host/cgroups.js';
import { isRoot } from '../helpers/sandbox.js';

describe.skipIf(!isRoot)('the cgroup v1 check', () => {
  it('passes on this host', async () => {
    expect(await cgroupV1Problem()).toBeNull();
  });

  it('names the hierarchies a host lacks and how to boot it', async () => {
    const root = await mkdtemp(join(tmpdir(), 'canto-cgroup-root-'));
    try {
      // Directories, as a unified hierarchy's subtree has them, but no v1 hierarchy mounted there.
      for (const c of ['memory', 'cpu']) await mkdir(join(root, c));
      const problem = await cgroupV1Problem(root);
      expect(problem).toContain('no memory, cpu, pids hierarchy');
      expect(problem).toContain('systemd.unified_cgroup_hierarchy=0');
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});

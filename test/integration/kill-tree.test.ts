/**
 * killTree on the shape every guest command has: a host process (nsenter, here `unshare --fork`)
 * whose child lives in another pid namespace. The child must be reaped by that parent, never handed
 * to the host's init: a desktop's pid namespace cannot end until its last process is reaped, and
 * a memory snapshot's dump waits for that. Killed together, the child went to this machine's init,
 * which reaps about once a second, and hibernates with a terminal open took 1.2-1.9 s. Needs root
 * (a new pid namespace).
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { newId } from '../../shared/src/ids.js';
import { describe, expect, it } from 'vitest';
import { childPidsSync, desktopPeers, killTree, procStatSync } from '../../agent/src/runtime/sandbox/host/host-procs.js';
import { isRoot } from '../helpers/sandbox.js';
import { until } from '../helpers/wait.js';

describe.skipIf(!isRoot)('killTree', () => {
  it('kills the part in another pid namespace first, so its parent outside reaps it', async () => {
    const outer = spawn('unshare', ['--pid', '--fork', '--kill-child', 'sh', '-c', 'sleep 1000 & wait'], { stdio: 'ignore' });
    const exited = new Promise<void>((resolve) => outer.once('exit', () => resolve()));
    // The tree: unshare (this namespace) → sh (pid 1 of its own) → sleep.
    const inner = await until(() => childPidsSync(outer.pid!)[0] ?? null, 5_000, 'the child in its namespace');
    await until(() => childPidsSync(inner).length === 1, 5_000, 'the sleep');
    expect(readFileSync(`/proc/${inner}/status`, 'utf8')).toMatch(/^NSpid:\s+\d+\s+1$/m);

    await killTree(outer.pid!);
    // Reaped by unshare, not left a zombie for the host's init.
    expect(existsSync(`/proc/${inner}`)).toBe(false);
    await exited;
  });

  it('lets a stopped parent outside go on to reap it (nsenter stops itself when its child stops)', async () => {
    const outer = spawn('unshare', ['--pid', '--fork', '--kill-child', 'sleep', '1000'], { stdio: 'ignore' });
    const exited = new Promise<void>((resolve) => outer.once('exit', () => resolve()));
    const inner = await until(() => childPidsSync(outer.pid!)[0] ?? null, 5_000, 'the child in its namespace');
    process.kill(inner, 'SIGSTOP');
    process.kill(outer.pid!, 'SIGSTOP');
    await until(() => /^State:\s+T/m.test(readFileSync(`/proc/${outer.pid}/status`, 'utf8')), 5_000, 'the parent stopped');

    await killTree(outer.pid!);
    expect(existsSync(`/proc/${inner}`)).toBe(false);
    await exited;
  });

  it("kills a session's member that left the tree, found among its desktop's processes alone", async () => {
    const group = join('/sys/fs/cgroup/pids/canto', newId('desktop'));
    mkdirSync(group, { recursive: true });
    try {
      // root (in the desktop's groups) → a session leader → a sleep; the subshell's sleep is
      // handed to init: in the session and the groups, no longer in the tree.
      const root = spawn('sh', ['-c', `echo $$ > ${group}/cgroup.procs && setsid sh -c '(sleep 1000 &); exec sleep 1001'; wait`], { stdio: 'ignore' });
      const exited = new Promise<void>((resolve) => root.once('exit', () => resolve()));
      const members = () => readFileSync(`${group}/cgroup.procs`, 'utf8').split('\n').filter(Boolean).map(Number);
      await until(() => members().length === 3, 5_000, 'the three processes in the group');
      const lost = members().find((pid) => readFileSync(`/proc/${pid}/cmdline`, 'utf8') === 'sleep\u00001000\u0000')!;
      expect(childPidsSync(root.pid!).flatMap((c) => [c, ...childPidsSync(c)])).not.toContain(lost);
      expect(desktopPeers(root.pid!)?.sort()).toEqual(members().sort());
      expect(desktopPeers(process.pid)).toBeNull();

      await killTree(root.pid!);
      // Dead, maybe a zombie until init reaps it.
      const dead = () => {
        try {
          return /^State:\s+Z/m.test(readFileSync(`/proc/${lost}/status`, 'utf8'));
        } catch {
          return procStatSync(lost) === null;
        }
      };
      await until(dead, 5_000, 'the lost member killed');
      await exited;
    } finally {
      // The lost member is reaped by this machine's init, which takes its time under load (a full
      // run once kept its zombie in the group past 10 s). Its removal is the test's tidying, not
      // what it checks: anything left is killed, and a group that will not empty is reported.
      for (const pid of readFileSync(`${group}/cgroup.procs`, 'utf8').split('\n').filter(Boolean).map(Number)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone meanwhile
        }
      }
      await until(() => {
        try {
          rmdirSync(group);
          return true;
        } catch {
          return false;
        }
      }, 30_000, 'the group to empty').catch(() => console.warn(`kill-tree test: ${group} did not empty within 30 s; left behind`));
    }
  });
});

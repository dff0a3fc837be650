/**
 * What a guest (root inside, able to trace its own init) can make of its file helpers:
 * - no file of the kernel (/proc, /sys) is read or appended through the file routes, by name or
 *   through a link the guest made: /proc/kcore is the host's memory, and an append to
 *   /proc/1/oom_score_adj would lower what the guest itself may not;
 * - a guest that moves its init's root elsewhere: the native entry (agent/native/guest-enter.c)
 *   refuses an init whose root is not the root of the guest's mount namespace, and the chain of
 *   programs (hosts without the spawner) enters that namespace's root rather than the init's;
 *   neither runs the guest's own programs there with what the entry keeps.
 * Needs root, the built spawner binary and gdb on the host.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { helperPath } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { newId } from '../../shared/src/ids.js';
import { isRoot } from '../helpers/sandbox.js';

function hasGdb(): boolean {
  try {
    execFileSync('gdb', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

describe.skipIf(!isRoot || helperPath() === null || !hasGdb())('a guest whose init was moved to another root', () => {
  let base: string;
  let driver: SandboxDriver;
  const id = newId('desktop');

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-reroot-'));
    driver = await createSandboxDriver({ stateDir: join(base, 'state') });
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
  });

  afterAll(async () => {
    await driver?.destroy(id).catch(() => {});
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
  });

  const sh = async (command: string) => {
    const out = await driver.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: 1 << 16 });
    expect(out.exitCode, out.stderr).toBe(0);
    return out.stdout.trim();
  };
  async function* chunk(text: string) {
    yield Buffer.from(text);
  }

  it('reads and appends no file of the kernel, named or reached through a link the guest made', async () => {
    const before = await sh('cat /proc/1/oom_score_adj');
    // The guest itself may not lower it (no CAP_SYS_RESOURCE); an append by the file route would have.
    await expect(driver.writeFile(id, { path: '/proc/1/oom_score_adj', appendAt: 0 }, chunk('-1000'))).rejects.toMatchObject({ code: 'path_conflict' });
    expect(await sh('cat /proc/1/oom_score_adj')).toBe(before);
    await expect(driver.readFile(id, { path: '/proc/self/status', offset: null, length: 0, maxWholeBytes: 1 << 20 })).rejects.toMatchObject({ code: 'path_conflict' });
    await sh('mkdir -p /root/k && ln -sf /proc/1/environ /root/k/link');
    await expect(driver.readFile(id, { path: '/root/k/link', offset: null, length: 0, maxWholeBytes: 1 << 20 })).rejects.toMatchObject({ code: 'path_conflict' });
    // The guest's own files read as ever.
    await sh('echo mine > /root/k/own');
    const own = await driver.readFile(id, { path: '/root/k/own', offset: null, length: 0, maxWholeBytes: 1 << 20 });
    const parts: Buffer[] = [];
    for await (const part of own.body) parts.push(part as Buffer);
    expect(Buffer.concat(parts).toString()).toBe('mine\n');
  });

  /** The guest builds a root of its own with a "perl" that leaves a mark, and moves its init there. */
  async function rerootInit(desktopId: string): Promise<void> {
    const setup = await driver.exec(desktopId, {
      command: `set -e; R=/root/evil; mkdir -p $R/proof $R/usr/bin
        for b in /usr/bin/dash /usr/bin/touch; do cp $b $R$b; for l in $(ldd $b | grep -o '/[^ ]*'); do mkdir -p $R$(dirname $l); cp -n $l $R$l; done; done
        printf '#!/usr/bin/dash\\n/usr/bin/touch /proof/ran-as-helper\\n' > $R/usr/bin/perl; chmod 755 $R/usr/bin/perl
        gdb -q -p 1 -batch -ex 'call (int)chroot("/root/evil")' -ex detach >/dev/null 2>&1
        pkill -KILL -f 'canto-[h]elper' || :`,
      timeoutMs: 60_000,
      maxOutputBytes: 1 << 16,
    });
    expect(setup.exitCode, setup.stderr).toBe(0);
  }
  const marked = (desktopId: string) => existsSync(join(base, 'state', 'desktops', desktopId, 'disk', 'root', 'evil', 'proof', 'ran-as-helper'));

  it('runs nothing of the guest with the entry\'s capabilities, and refuses the entry', async () => {
    await rerootInit(id);
    await expect(driver.statPath(id, '/etc/hostname')).rejects.toBeDefined();
    expect(marked(id)).toBe(false);
  }, 120_000);

  it('enters the guest\'s own root through the chain of programs, not the one its init was moved to', async () => {
    const other = newId('desktop');
    await driver.prepare(other, 'small');
    await driver.start({ desktopId: other, tier: 'small', firstBoot: null });
    process.env.CANTO_AGENT_NATIVE_ENTRY = 'off';
    try {
      await rerootInit(other);
      expect(await driver.statPath(other, '/etc/hostname')).toMatchObject({ fileType: 'file' });
      expect(marked(other)).toBe(false);
    } finally {
      delete process.env.CANTO_AGENT_NATIVE_ENTRY;
      await driver.destroy(other).catch(() => {});
    }
  }, 120_000);
});

/**
 * File handoff (agent/src/runtime/sandbox/guest-handoff.ts) on a real sandbox desktop: large reads
 * and replacing writes move through the agent's own descriptor of the guest's file, land in the
 * guest (through guest symlinks too), and the agent opens a guest descriptor only when it is a
 * regular file, named exactly (device and inode), held by a process inside the desktop and below
 * the call's own process. A read moves several pieces in order (one read ahead), and a file that
 * shrinks under it ends the body short; a replaced file's old content is let go once the write
 * has answered.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { mkdtemp, readdir, readFile, readlink, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import { HANDOFF_READ_MIN_BYTES } from '../../agent/src/runtime/sandbox/guest/guest-files.js';
import { openHandedFile, type HandedFile } from '../../agent/src/runtime/sandbox/guest/guest-handoff.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { chunks, drain, hostProcesses, isRoot, parentPid, sha256 } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';

/** `[innermost pid, depth]` of a host pid's NSpid line. */
function nspid(pid: number): [number, number] {
  const line = /^NSpid:\s+(.*)$/m.exec(readFileSync(`/proc/${pid}/status`, 'latin1'))?.[1] ?? '';
  const pids = line.trim().split(/\s+/).map(Number);
  return [pids[pids.length - 1] as number, pids.length];
}

describe.skipIf(!isRoot)('sandbox file handoff', () => {
  let base: string;
  let driver: SandboxDriver;
  let id: string;

  async function sh(command: string): Promise<string> {
    const out = await driver.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
    expect(out.exitCode, `${command}: ${out.stderr}`).toBe(0);
    return out.stdout.trim();
  }

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-handoff-test-'));
    driver = await createSandboxDriver({ stateDir: join(base, 'state') });
    id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
  });

  afterAll(async () => {
    await driver?.destroy(id).catch(() => undefined);
    await driver?.close();
    await rm(base, { recursive: true, force: true });
  });

  it('moves large files both ways, through guest symlinks, inside the guest only', async () => {
    const hostFile = join(base, 'host-target.bin');
    await writeFile(hostFile, 'HOST');
    await sh(`mkdir -p /root/ho && ln -s ${hostFile} /root/ho/link && ln -s /proc/1/root${hostFile} /root/ho/proc-link`);
    const data = randomBytes(3 * 1024 * 1024 + 5);
    for (const path of ['/root/ho/link', '/root/ho/proc-link', '/root/ho/plain.bin']) {
      await driver.writeFile(id, { path, appendAt: null }, chunks(data));
      const read = await driver.readFile(id, { path, offset: null, length: 0, maxWholeBytes: 8 << 20 });
      expect(read.size).toBe(data.length);
      expect(sha256(await drain(read)), path).toBe(sha256(data));
      const window = await driver.readFile(id, { path, offset: 1000, length: HANDOFF_READ_MIN_BYTES * 2, maxWholeBytes: 0 });
      expect((await drain(window)).equals(data.subarray(1000, 1000 + HANDOFF_READ_MIN_BYTES * 2)), path).toBe(true);
    }
    // The links resolved inside the guest: the host file is untouched, the guest holds the data.
    expect(await readFile(hostFile, 'utf8')).toBe('HOST');
    expect(await sh(`sha256sum < ${hostFile} | cut -d' ' -f1`)).toBe(sha256(data));
    // Nothing of the upload's temporaries is left behind.
    expect(await sh('ls -A /root/ho')).toBe('link\nplain.bin\nproc-link');
  });

  it('reads a window over several pieces byte-exact, and a file that shrinks under a read ends short', async () => {
    const data = randomBytes(5 * 1024 * 1024 + 3);
    await driver.writeFile(id, { path: '/root/ho/pieces.bin', appendAt: null }, chunks(data));
    const whole = await driver.readFile(id, { path: '/root/ho/pieces.bin', offset: null, length: 0, maxWholeBytes: 8 << 20 });
    expect(sha256(await drain(whole))).toBe(sha256(data));
    const [from, length] = [777, 4 * 1024 * 1024 + 11];
    const window = await driver.readFile(id, { path: '/root/ho/pieces.bin', offset: from, length, maxWholeBytes: 0 });
    expect(window.length).toBe(length);
    expect(sha256(await drain(window))).toBe(sha256(data.subarray(from, from + length)));

    // Truncated after the first piece: the pieces still to come find the end of the file.
    const read = await driver.readFile(id, { path: '/root/ho/pieces.bin', offset: null, length: 0, maxWholeBytes: 8 << 20 });
    const it = read.body[Symbol.asyncIterator]();
    expect((await it.next()).done).toBe(false);
    await sh('truncate -s 1000 /root/ho/pieces.bin');
    const rest = (async () => {
      for (let step = await it.next(); !step.done; step = await it.next());
    })();
    await expect(rest).rejects.toThrow(/file ended early/);
  });

  it('frees a replaced file once the write has answered: nothing in the desktop keeps it open', async () => {
    /** Descriptors of the desktop's processes (helpers included) on the file, old content or new. */
    const holders = async () => {
      const found: string[] = [];
      const procs = await readFile(`/sys/fs/cgroup/pids/canto/${id}/cgroup.procs`, 'utf8');
      for (const pid of procs.split('\n').filter(Boolean)) {
        for (const fd of await readdir(`/proc/${pid}/fd`).catch(() => [] as string[])) {
          const target = await readlink(`/proc/${pid}/fd/${fd}`).catch(() => '');
          if (target.includes('replaced.bin')) found.push(`${pid}: ${target}`);
        }
      }
      return found;
    };
    const second = randomBytes(3 * 1024 * 1024 + 1);
    await driver.writeFile(id, { path: '/root/ho/replaced.bin', appendAt: null }, chunks(randomBytes(2 * 1024 * 1024)));
    await driver.writeFile(id, { path: '/root/ho/replaced.bin', appendAt: null }, chunks(second));
    // The scan sees a helper's descriptor: a read's helper holds the file until its body is read.
    const read = await driver.readFile(id, { path: '/root/ho/replaced.bin', offset: null, length: 0, maxWholeBytes: 8 << 20 });
    expect((await holders()).length).toBeGreaterThan(0);
    expect(sha256(await drain(read))).toBe(sha256(second));
    // The writer held the old content only until it exited, after its answer; the reader is gone too.
    await until(async () => (await holders()).length === 0, 10_000, 'the replaced content to be released');
  });

  it('opens only a regular file, named exactly, held inside the desktop below the call', async () => {
    await sh('printf held > /root/held.txt && mkfifo /root/fifo');
    // A guest process holding a regular file (7), a directory (8) and a FIFO (9).
    await driver.exec(id, {
      command: 'setsid sh -c "exec 7</root/held.txt 8</ 9<>/root/fifo; exec sleep 6543" >/dev/null 2>&1 &',
      timeoutMs: 10_000,
      maxOutputBytes: 100,
    });
    const { pid: holder } = await until(async () => (await hostProcesses((args) => args.join(' ') === 'sleep 6543 '))[0]);
    const [guestPid, depth] = nspid(holder);
    expect(depth).toBe(2);
    let initPid = holder;
    while (nspid(initPid)[0] !== 1) initPid = await parentPid(initPid);
    const scope = { root: initPid, initPid };
    const st = statSync(`/proc/${holder}/fd/7`, { bigint: true });
    const file: HandedFile = { guestPid, fd: 7, dev: st.dev, ino: st.ino };

    const handle = openHandedFile(scope, file, 'read');
    const buffer = Buffer.alloc(16);
    expect(buffer.subarray(0, await handle.read(buffer, 0)).toString()).toBe('held');
    handle.close();

    const refused = (f: HandedFile, s = scope) => {
      try {
        openHandedFile(s, f, 'read').close();
        return 'opened';
      } catch (err) {
        expect(err).toBeInstanceOf(AgentFailure);
        return (err as AgentFailure).message;
      }
    };
    expect(refused({ ...file, ino: file.ino + 1n })).toMatch(/not the file the helper opened/);
    expect(refused({ ...file, fd: 8 })).toMatch(/not a regular file/);
    expect(refused({ ...file, fd: 9 })).toMatch(/not a regular file/);
    expect(refused({ ...file, fd: 99 })).toMatch(/cannot open the descriptor/);
    expect(refused({ ...file, guestPid: 99_999 })).toMatch(/not among the processes/);
    // Below another root (a host process of its own), the guest's holder is not found.
    const other = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      expect(refused(file, { root: other.pid as number, initPid })).toMatch(/not among the processes/);
    } finally {
      other.kill('SIGKILL');
    }
    // A scope whose "desktop" is the host: the holder is not in its pid namespace.
    expect(refused(file, { root: initPid, initPid: process.pid })).toMatch(/not in the desktop/);
    await sh(`kill ${guestPid}`);
  });
});

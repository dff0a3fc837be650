/**
 * The agent refuses a handed-over descriptor of a kernel filesystem (guest-handoff.ts), whatever
 * the helper says: a helper the guest tampered with could otherwise hand it /proc/kcore or a
 * process's oom_score_adj, and the agent reads and writes as host root. A "helper" here is a shell
 * in a pid namespace of its own (as a guest's processes are) holding a file on descriptor 9.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { openHandedFile } from '../../agent/src/runtime/sandbox/guest/guest-handoff.js';
import { until } from '../helpers/wait.js';

const started: ChildProcess[] = [];
const dir = mkdtempSync(join(tmpdir(), 'canto-handoff-'));

afterEach(() => {
  for (const p of started.splice(0)) p.kill('SIGKILL');
});

/**
 * `unshare` (the scope's root) and the shell inside it holding `path` on fd 9: the helper. With
 * `mount`, it first mounts a filesystem of that type at `path`'s directory, in a mount namespace
 * of its own, and creates the file.
 */
async function helperHolding(path: string, mount?: string): Promise<{ root: number; helper: number }> {
  const setup = mount === undefined ? '' : `mount -t ${mount} none '${join(path, '..')}' && : > '${path}' && `;
  const unshare = spawn('unshare', ['--pid', '--mount', '--fork', 'sh', '-c', `${setup}exec 9<'${path}'; exec sleep 30`], { stdio: 'ignore' });
  started.push(unshare);
  const helper = await until(() => {
    const children = readFileSync(`/proc/${unshare.pid}/task/${unshare.pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
    const child = children[0];
    // Once the shell has exec'd sleep, its fd 9 is the file.
    return child !== undefined && readdirSync(`/proc/${child}/fd`).includes('9') && readFileSync(`/proc/${child}/comm`, 'utf8').trim() === 'sleep' ? child : null;
  }, 5_000, 'the helper to hold its file');
  return { root: unshare.pid!, helper };
}

function handed(helper: number) {
  const st = statSync(`/proc/${helper}/fd/9`, { bigint: true });
  return { guestPid: 1, fd: 9, dev: st.dev, ino: st.ino };
}

describe('a handed-over descriptor', () => {
  it('of a regular file on a disk opens', async () => {
    const file = join(dir, 'data');
    writeFileSync(file, 'guest data');
    const { root, helper } = await helperHolding(file);
    const fd = openHandedFile({ root, initPid: helper }, handed(helper), 'read');
    const buffer = Buffer.alloc(10);
    expect(await fd.read(buffer, 0)).toBe(10);
    expect(buffer.toString()).toBe('guest data');
    fd.close();
  });

  it.each(['/proc/self/status', '/sys/kernel/mm/transparent_hugepage/enabled'])('of %s is refused, though it is a regular file', async (path) => {
    const { root, helper } = await helperHolding(path);
    expect(statSync(`/proc/${helper}/fd/9`).isFile()).toBe(true);
    expect(() => openHandedFile({ root, initPid: helper }, handed(helper), 'read')).toThrow(/handoff refused: a file of a kernel filesystem/);
  });

  it.each(['mqueue', 'hugetlbfs'])('on a %s mount is refused, though it is a regular file', async (type) => {
    const at = mkdtempSync(join(dir, `${type}-`));
    const { root, helper } = await helperHolding(join(at, 'file'), type);
    expect(statSync(`/proc/${helper}/fd/9`).isFile()).toBe(true);
    expect(() => openHandedFile({ root, initPid: helper }, handed(helper), 'read')).toThrow(/handoff refused: a file of a kernel filesystem/);
  });
});

process.on('exit', () => rmSync(dir, { recursive: true, force: true }));

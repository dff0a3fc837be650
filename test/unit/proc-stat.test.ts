/**
 * Whether a process counts as running, for the host's bookkeeping (host-procs.ts), against a real
 * process caught in its exit: the init of a pid namespace that was killed while a process of its
 * namespace cannot finish dying (held at its exit by a tracer), which is how a desktop's guest
 * init lingers after a kill of its whole tree while its namespace empties.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { isSameProcessSync, procStat, procStatSync } from '../../agent/src/runtime/sandbox/host/host-procs.js';

const isRoot = process.getuid?.() === 0;

/**
 * Starts `sh` as the init of a new pid namespace with one child, holds the child at its exit
 * (ptrace, PTRACE_O_TRACEEXIT), kills the init and prints its pid: the init then waits in its exit
 * for the child. Killing this tracer lets both finish.
 */
const LINGERING_INIT = `
import ctypes, os, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_SEIZE, PTRACE_O_TRACEEXIT = 0x4206, 0x40
ns = subprocess.Popen(['unshare', '--pid', '--fork', 'sh', '-c', 'sleep 1000 & wait'])
def children(p):
    try: return [int(x) for x in open(f'/proc/{p}/task/{p}/children').read().split()]
    except FileNotFoundError: return []
for _ in range(500):
    inits = children(ns.pid)
    kids = children(inits[0]) if inits else []
    if kids: break
    time.sleep(0.01)
else: sys.exit('the namespace did not start')
init, kid = inits[0], kids[0]
if libc.ptrace(PTRACE_SEIZE, kid, None, ctypes.c_void_p(PTRACE_O_TRACEEXIT)) != 0: sys.exit('ptrace: errno %d' % ctypes.get_errno())
os.kill(init, signal.SIGKILL)
print(init, flush=True)
sys.stdin.read()
`;

let tracer: ChildProcess | null = null;
afterEach(() => {
  tracer?.kill('SIGKILL');
  tracer = null;
});

async function lingeringInit(): Promise<number> {
  const child = spawn('python3', ['-c', LINGERING_INIT], { stdio: ['pipe', 'pipe', 'inherit'] });
  tracer = child;
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('\n')) resolve(out.trim());
    });
    child.once('exit', (code) => reject(new Error(`the tracer exited ${code}`)));
  });
  return Number(line);
}

/** Field 9 of /proc/PID/stat, the task's flags, as the kernel shows them. */
function flags(pid: number): number {
  const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(text.slice(text.lastIndexOf(')') + 2).split(' ')[6]);
}

describe.skipIf(!isRoot)('a process in its exit', () => {
  it('counts as gone while its /proc entry remains', async () => {
    const init = await lingeringInit();
    // The kill has reached it: it is exiting, waiting for its namespace to empty.
    await expect.poll(() => flags(init) & 0x4, { timeout: 5_000 }).toBe(0x4);
    expect(existsSync(`/proc/${init}/stat`)).toBe(true);
    expect(procStatSync(init)).toBeNull();
    expect(await procStat(init)).toBeNull();
    // Whatever start time a record kept for it, it is not that process any more.
    expect(isSameProcessSync(init, '0')).toBe(false);
    // A live process still reads as one: the tracer itself.
    expect(procStatSync(tracer!.pid!)).toMatchObject({ pid: tracer!.pid });
  });
});

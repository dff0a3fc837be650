/**
 * A process's children as the agent lists them, under churn. The kernel's `children` file is not
 * a snapshot: a child reaped while the list is being read makes the read skip the entry after it.
 * A file handoff that walked the warm server's children while the server reaped another once
 * failed to find its own helper that way. Real processes: a Perl parent that keeps twenty
 * short-lived children and reaps and replaces them as fast as they exit.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { childPidsSync } from '../../agent/src/runtime/sandbox/host/host-procs.js';

const CHURN = `
$SIG{CHLD} = 'DEFAULT';
sub child { my $p = fork(); if (defined $p && !$p) { select(undef, undef, undef, rand(0.004)); exit 0 } }
child() for 1 .. 20;
print "up\\n";
while (waitpid(-1, 0) > 0) { child() }
`;

/** One plain read of the file, the way that can skip. */
function rawChildren(pid: number): Set<number> {
  try {
    return new Set(readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').split(' ').filter(Boolean).map(Number));
  } catch {
    return new Set();
  }
}

let parent: ChildProcess | null = null;
afterEach(() => {
  parent?.kill('SIGKILL');
  parent = null;
});

async function churningParent(): Promise<number> {
  const child = spawn('perl', ['-e', CHURN], { stdio: ['ignore', 'pipe', 'inherit'] });
  parent = child;
  await new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.stdout?.once('data', () => resolve());
  });
  return child.pid as number;
}

/**
 * Lists the children of `pid` with `list` between two plain reads for `ms`, and returns the
 * children that were on both plain reads (so alive and children all along) but not on the list.
 */
function missed(pid: number, list: () => number[], ms: number): { lists: number; missed: number[] } {
  const out: number[] = [];
  let lists = 0;
  for (const end = Date.now() + ms; Date.now() < end; lists++) {
    const before = rawChildren(pid);
    const listed = new Set(list());
    const after = rawChildren(pid);
    for (const p of before) if (after.has(p) && !listed.has(p)) out.push(p);
  }
  return { lists, missed: out };
}

describe('child pids under churn', () => {
  it('lists every child that lived through the read', async () => {
    const pid = await churningParent();
    const { lists, missed: gone } = missed(pid, () => childPidsSync(pid), 2000);
    expect(lists).toBeGreaterThan(1000);
    expect(gone).toEqual([]);
  });
});

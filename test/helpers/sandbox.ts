/**
 * Helpers of the sandbox integration tests: file bodies, the host's view of processes, and
 * per-test timings printed for the docs. These tests need root (namespaces, cgroups, CRIU) and skip without it.
 */
import { existsSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { readdir, readFile, readlink } from 'node:fs/promises';
import { expect } from 'vitest';
import type { FileRead } from '../../agent/src/runtime/driver.js';
import { detectCriu } from '../../agent/src/runtime/sandbox/host/criu.js';

export const isRoot = process.getuid?.() === 0;

/**
 * Whether this host's CRIU makes memory snapshots, by the driver's own probe (kept per boot).
 * Tests of what only a snapshot keeps (memory, processes, connections) check it and say so when
 * they cannot run; everything else runs either way.
 */
export async function memorySnapshotsHere(): Promise<boolean> {
  const criu = await detectCriu(undefined);
  if (criu === null) console.warn('memory snapshots are not available on this host: tests of what only a snapshot keeps are skipped');
  return criu !== null;
}

/**
 * Host processes whose command line (split at NULs) passes `match`, by pid. Processes come and go
 * while /proc is listed; one gone before its command line is read is simply not matched.
 */
export async function hostProcesses(match: (args: string[]) => boolean): Promise<Array<{ pid: number; args: string[] }>> {
  const out: Array<{ pid: number; args: string[] }> = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const args = (await readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '')).split('\0');
    if (args[0] !== '' && match(args)) out.push({ pid: Number(name), args });
  }
  return out.sort((a, b) => a.pid - b.pid);
}

/** The fields of `/proc/<pid>/stat` after the command name, or null once the process is gone. */
async function statFields(pid: number): Promise<string[] | null> {
  const text = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  return text === '' ? null : text.slice(text.lastIndexOf(')') + 2).split(' ');
}

export async function parentPid(pid: number): Promise<number> {
  return Number((await statFields(pid))?.[1] ?? 0);
}

/** A pid counts as gone once it is reaped or a zombie. */
export async function isAlive(pid: number): Promise<boolean> {
  const state = (await statFields(pid))?.[0];
  return state !== undefined && state !== 'Z' && state !== 'X';
}

/** An upload body of the given parts. */
export async function* chunks(...parts: Array<string | Buffer>): AsyncGenerator<Buffer> {
  for (const p of parts) yield Buffer.from(p);
}

/** A read's whole body, which must be as long as the read said. */
export async function drain(read: FileRead): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const part of read.body) parts.push(part);
  const data = Buffer.concat(parts);
  expect(data.length).toBe(read.length);
  return data;
}

export const sha256 = (data: Buffer): string => createHash('sha256').update(data).digest('hex');

export const median = (xs: readonly number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

/** Durations by name, in ms to a tenth, and `timed` to add one. */
export function stopwatch(): {
  timings: Record<string, number[]>;
  timed: <T>(name: string, fn: () => Promise<T>) => Promise<T>;
} {
  const timings: Record<string, number[]> = {};
  async function timed<T>(name: string, fn: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      (timings[name] ??= []).push(Math.round((performance.now() - t0) * 10) / 10);
    }
  }
  return { timings, timed };
}

/**
 * Destroys every desktop a sandbox runtime directory still holds (a test's agents may be killed
 * before they could), so no guest outlives the test. A directory that was never made is skipped.
 */
export async function destroyLeftDesktops(runtimeDir: string): Promise<void> {
  if (!existsSync(runtimeDir)) return;
  const { createSandboxDriver } = await import('../../agent/src/runtime/sandbox/index.js');
  const { templateIds } = await import('../../agent/src/runtime/sandbox/host/golden.js');
  const cleaner = await createSandboxDriver({ stateDir: runtimeDir });
  // Golden templates are desktops too, hidden from list(); one being built may be running.
  for (const id of [...(await cleaner.list()).map((d) => d.desktopId), ...(await templateIds(runtimeDir))]) await cleaner.destroy(id);
  await cleaner.close();
}

/** The kB of `field` (Rss, Pss, ...) in a process's `/proc/<pid>/smaps_rollup`. */
export async function memoryKiB(pid: number, field: string): Promise<number> {
  return Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(await readFile(`/proc/${pid}/smaps_rollup`, 'utf8'))?.[1] ?? NaN);
}

/**
 * A host process that reaches into a desktop's network (a port forwarder, a port relay) and
 * nothing more: the guest init's network namespace, the host's pid and mount namespaces, the
 * desktop's memory, pids and cpu groups, `nobody` with no capabilities and no_new_privs.
 */
export async function expectNetworkOnlyConfinement(pid: number, guestInit: number, desktopId: string): Promise<void> {
  const ns = (of: number | 'self', name: string) => readlink(`/proc/${of}/ns/${name}`);
  expect(await ns(pid, 'net')).toBe(await ns(guestInit, 'net'));
  expect(await ns(pid, 'net')).not.toBe(await ns('self', 'net'));
  expect(await ns(pid, 'pid')).not.toBe(await ns(guestInit, 'pid'));
  expect(await ns(pid, 'pid')).toBe(await ns('self', 'pid'));
  expect(await ns(pid, 'mnt')).toBe(await ns('self', 'mnt'));
  const cgroup = await readFile(`/proc/${pid}/cgroup`, 'utf8');
  for (const controller of ['memory', 'pids', 'cpu']) {
    expect(cgroup, controller).toMatch(new RegExp(`^\\d+:[^:]*\\b${controller}\\b[^:]*:/canto/${desktopId}$`, 'm'));
  }
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  expect(status).toMatch(/^Uid:\s+65534\s+65534\s+65534\s+65534$/m);
  expect(status).toMatch(/^CapEff:\s+0+$/m);
  expect(status).toMatch(/^CapBnd:\s+0+$/m);
  expect(status).toMatch(/^NoNewPrivs:\s+1$/m);
}

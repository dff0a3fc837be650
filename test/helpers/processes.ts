/**
 * End-to-end helpers: the real `canto` CLI (the built bundle) started as child processes —
 * a scheduler and an agent — exactly as an operator would run them. Every child is killed by
 * pid when the test ends.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { JOIN_TOKEN, until } from './scheduler.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');

export interface Child {
  proc: ChildProcess;
  output(): string;
  /** SIGKILL, then wait for the exit. */
  kill(signal?: NodeJS.Signals): Promise<void>;
}

/**
 * The fd a stray descriptor gets in a child: above the low ones Node itself marks close-on-exec
 * as it starts (measured: 3 to about 19), so the child keeps it open across its own execs.
 */
export const STRAY_CHILD_FD = 40;

/** The stdio entries from fd 3 on that hand `stray` to a child as STRAY_CHILD_FD, as a leaking supervisor would. */
export function strayStdio(stray: number | undefined): Array<'ignore' | number> {
  return stray === undefined ? [] : [...Array<'ignore'>(STRAY_CHILD_FD - 3).fill('ignore'), stray];
}

/** `stray`: see strayStdio. */
function startChild(args: string[], env: Record<string, string>, stray?: number): Child {
  if (!existsSync(CLI)) throw new Error('dist/cli.js is missing: run `npm run build` (npm test does)');
  const extra = strayStdio(stray);
  const proc = spawn(process.execPath, [CLI, ...args], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/root', ...env },
    stdio: ['ignore', 'pipe', 'pipe', ...extra],
  });
  let out = '';
  proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  return {
    proc,
    output: () => out,
    async kill(signal = 'SIGKILL') {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      await exited;
    },
  };
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

export interface SchedulerProcessEnv {
  databaseUrl: string;
  port: number;
  secretKey?: string;
  extra?: Record<string, string>;
}

export async function startSchedulerProcess(opts: SchedulerProcessEnv): Promise<Child & { url: string }> {
  const child = startChild(['scheduler'], {
    DATABASE_URL: opts.databaseUrl,
    CANTO_SECRET_KEY: opts.secretKey ?? generateSecretKey(),
    CANTO_LISTEN: `127.0.0.1:${opts.port}`,
    CANTO_JOIN_TOKEN: JOIN_TOKEN,
    CANTO_LEASE_TTL_MS: '3000',
    CANTO_LEASE_RENEW_MS: '300',
    CANTO_ENGINE_POLL_MS: '100',
    CANTO_LOG_LEVEL: 'info',
    // One process, as tests that kill or signal "the scheduler" mean it; tests of the cluster set more.
    CANTO_WORKERS: '1',
    ...opts.extra,
  });
  const url = `http://127.0.0.1:${opts.port}`;
  try {
    await until(async () => {
      if (child.proc.exitCode !== null) throw new Error(`scheduler exited:\n${child.output()}`);
      return fetch(`${url}/v1/openapi.json`).then((r) => r.ok, () => false);
    }, 30_000, 'scheduler to listen');
  } catch (err) {
    // Not left running for nobody (its workers, if any, exit with it).
    await child.kill('SIGKILL');
    throw err;
  }
  return Object.assign(child, { url });
}

export function startAgentProcess(schedulerUrl: string, stateDir: string, extra: Record<string, string> = {}, stray?: number): Child {
  return startChild(['agent', '--scheduler', schedulerUrl, '--state-dir', stateDir], {
    CANTO_AGENT_TOKEN: JOIN_TOKEN,
    CANTO_AGENT_RECONNECT_MAX_MS: '500',
    CANTO_LOG_LEVEL: 'info',
    CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_ADDRESS: '127.0.0.1',
    ...extra,
  }, stray);
}

/** `pid` and every process below it, parents before children, read from /proc. */
export function processTree(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${name}/stat`, 'utf8');
    } catch {
      continue;
    }
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    children.set(ppid, [...(children.get(ppid) ?? []), Number(name)]);
  }
  const out: number[] = [];
  const walk = (p: number) => {
    out.push(p);
    for (const c of children.get(p) ?? []) walk(c);
  };
  walk(pid);
  return out;
}

/**
 * A crash, as a power cut or the OOM killer would deliver it: the whole tree is stopped first
 * (SIGSTOP, so no process sees another die and reacts), then killed with SIGKILL.
 */
export function crashTree(pid: number): number[] {
  const tree = processTree(pid);
  for (const p of tree) signalQuietly(p, 'SIGSTOP');
  for (const p of processTree(pid)) if (!tree.includes(p)) tree.push(p);
  for (const p of tree) signalQuietly(p, 'SIGKILL');
  return tree;
}

function signalQuietly(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // Gone already.
  }
}

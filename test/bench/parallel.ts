/**
 * Lifecycle in parallel (issue goals: 10 simultaneous wakes from memory snapshots settle within 2×
 * one wake; 30 cold creates + wakes at once are all awake in < 5 s). Through the API, on one host:
 * each wake's own latency when 10 are asked at once against a wake alone (the baseline), and for
 * 30 desktops created and woken at once, the time until the last is awake against one cold
 * create + wake alone. Placement by measured memory lets the 30 small desktops fit with default settings.
 * `CANTO_BENCH_COLD` sets another number of cold creates (a larger burst).
 *
 * Two more rows say why ten wakes at once take as long as they do: the host's CPU time per wake
 * (every process: scheduler, agent, CRIU, PostgreSQL, the guest), and what that makes the least
 * time the slowest of ten can take on this host's cores, whatever order they run in.
 */
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { median, percentile, table, timed } from './stats.js';

export interface ParallelBenchContext {
  readonly schedulerUrl: string;
  readonly apiKey: string;
  readonly runs: number;
}

const WAKES = 10;
const COLD = Number(process.env.CANTO_BENCH_COLD ?? 30);

/** CPU time the whole host has spent so far, in ms (`/proc/stat`; steal is not ours). */
function hostCpuMs(): number {
  const [user, nice, system, , , irq, softirq] = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
  // USER_HZ is 100 on Linux: a tick is 10 ms.
  return (user! + nice! + system! + irq! + softirq!) * 10;
}

/** `fn`'s wall time and the host's CPU time meanwhile, in ms. */
async function timedWithCpu(fn: () => Promise<unknown>): Promise<{ ms: number; cpuMs: number }> {
  const cpu = hostCpuMs();
  const ms = await timed(fn);
  return { ms, cpuMs: hostCpuMs() - cpu };
}

export async function benchParallel(ctx: ParallelBenchContext): Promise<void> {
  const headers = { authorization: `Bearer ${ctx.apiKey}`, 'content-type': 'application/json' };
  const post = async (path: string, body: unknown = {}) => {
    const res = await fetch(ctx.schedulerUrl + path, { method: 'POST', headers, body: JSON.stringify(body) });
    const json = (await res.json()) as Record<string, any>;
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    if (json.state === 'failed') throw new Error(`${path}: the operation failed: ${JSON.stringify(json.error)}`);
    return json;
  };
  const create = async () => (await post('/v1/desktops', { tier: 'small' })).id as string;
  const wake = (id: string) => post(`/v1/desktops/${id}/wake?wait=true`);
  const hibernate = (id: string) => post(`/v1/desktops/${id}/hibernate?wait=true`);
  const destroy = (id: string) => post(`/v1/desktops/${id}/destroy?wait=true`).catch(() => undefined);

  const ids: string[] = [];
  try {
    // Ten hibernated desktops, each woken once before so its next wake restores memory.
    for (let i = 0; i < WAKES; i++) {
      const id = await create();
      ids.push(id);
      await wake(id);
      await hibernate(id);
    }
    const alone: number[] = [];
    const together: number[] = [];
    const cpuAlone: number[] = [];
    const cpuTogether: number[] = [];
    const rounds = Math.max(2, Math.min(ctx.runs, 3));
    for (let r = 0; r < rounds; r++) {
      for (const id of ids.slice(0, 3)) {
        const one = await timedWithCpu(() => wake(id));
        alone.push(one.ms);
        cpuAlone.push(one.cpuMs);
        await hibernate(id);
      }
      const cpu = hostCpuMs();
      together.push(...(await Promise.all(ids.map((id) => timed(() => wake(id))))));
      cpuTogether.push((hostCpuMs() - cpu) / WAKES);
      await Promise.all(ids.map(hibernate));
      process.stderr.write(`parallel wakes round ${r + 1}/${rounds}\r`);
    }
    await Promise.all(ids.splice(0).map(destroy));

    const coldAlone: number[] = [];
    for (let i = 0; i < 3; i++) {
      let id = '';
      coldAlone.push(await timed(async () => {
        id = await create();
        await wake(id);
      }));
      await destroy(id);
    }
    const cold: number[] = [];
    const all = await timed(() => Promise.all(Array.from({ length: COLD }, async () => {
      cold.push(await timed(async () => {
        const id = await create();
        ids.push(id);
        await wake(id);
      }));
    })));
    table(`Parallel lifecycle (${WAKES} wakes from snapshots at once, ${rounds} rounds; ${COLD} cold creates + wakes at once); baseline = the same alone`, [
      [`wake, ${WAKES} at once (each)`, median(together), median(alone), 'ms', 'within 2× one wake', together],
      [`slowest of ${WAKES} wakes at once`, percentile(together, 100), median(alone), 'ms', '≤ 2× one wake'],
      ['host CPU per wake, alone (all processes; ratio = cores kept busy)', median(cpuAlone), median(alone), 'ms', '(why)', cpuAlone],
      [`CPU floor for the slowest of ${WAKES} (${WAKES} × CPU per wake at once ÷ ${availableParallelism()} cores)`, (WAKES * median(cpuTogether)) / availableParallelism(), median(alone), 'ms', '(no order does better)'],
      [`${COLD} cold creates + wakes at once, all awake`, all, median(coldAlone), 'ms', '< 5000 ms'],
      [`cold create + wake, ${COLD} at once (each)`, median(cold), median(coldAlone), 'ms', '', cold],
    ]);
  } finally {
    await Promise.all(ids.map(destroy));
  }
}

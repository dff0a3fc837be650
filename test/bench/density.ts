/**
 * Density (issue 18: 1,000 idle awake desktops on a 2-core, 24 GiB host with default settings,
 * while the API keeps its latency goals). Opt-in, as it takes minutes: `CANTO_BENCH_DENSITY=1000
 * CANTO_BENCH_ONLY=density npm run bench`. Through the API, with the scheduler's default placement
 * settings, it creates and wakes N small desktops (`CANTO_BENCH_DENSITY_PARALLEL` at a time), lets
 * them settle idle, and then measures: host memory per desktop (MemAvailable before and after,
 * and the sum of the desktops' memory cgroups), the agent's RSS, open files and processes per
 * desktop, processes inside the desktops, CPU while all are idle (the host's, the agent's and
 * the scheduler's), and `GET /v1/desktops/{id}` and exec latency while they are all awake. Then it
 * destroys them all. Baselines: the same host before the first desktop, and for the figures per
 * desktop the ones issue 18 measured with 200 desktops.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { processTree } from '../helpers/processes.js';
import { median, percentile, table, timed } from './stats.js';

export interface DensityBenchContext {
  readonly schedulerUrl: string;
  readonly apiKey: string;
  readonly agentPid: number;
  readonly schedulerPid: number;
  readonly count: number;
  /** The scheduler's and the agent's output so far (printed when a desktop did not wake). */
  output(): string;
}

const PARALLEL = Number(process.env.CANTO_BENCH_DENSITY_PARALLEL ?? 8);
/** How long the desktops idle before the measures, and the window CPU is measured over. */
const SETTLE_MS = 20_000;
const CPU_WINDOW_MS = 20_000;
const GETS = 1_000;
const EXECS = 50;
const MIB = 1024 * 1024;

interface HostSample {
  memAvailableMb: number;
  agentRssMb: number;
  agentFds: number;
  agentProcesses: number;
}

function memAvailableMb(): number {
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))![1]) / 1024;
}

function sample(agentPid: number): HostSample {
  const status = readFileSync(`/proc/${agentPid}/status`, 'utf8');
  return {
    memAvailableMb: memAvailableMb(),
    agentRssMb: Number(/^VmRSS:\s+(\d+) kB/m.exec(status)![1]) / 1024,
    agentFds: readdirSync(`/proc/${agentPid}/fd`).length,
    agentProcesses: processTree(agentPid).length,
  };
}

/** A cgroup file of one desktop, as a number; 0 when the group is gone. */
function cgroupNumber(controller: string, desktopId: string, file: string): number {
  try {
    return Number(readFileSync(`/sys/fs/cgroup/${controller}/canto/${desktopId}/${file}`, 'utf8').trim());
  } catch {
    return 0;
  }
}

/** Jiffies the processes used (utime + stime) and the host's busy and total jiffies. */
function cpuTicks(pids: number[]): { procs: number; busy: number; total: number } {
  let procs = 0;
  for (const pid of pids) {
    try {
      const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
      procs += Number(fields[11]) + Number(fields[12]);
    } catch {
      // gone meanwhile
    }
  }
  const cpu = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = cpu.reduce((a, b) => a + b, 0);
  return { procs, busy: total - cpu[3]! - cpu[4]!, total };
}

/** CPU over the window, in % of one core: the host's (all cores), the agent's and the scheduler's. */
async function cpuOver(ms: number, agentPid: number, schedulerPid: number): Promise<{ host: number; agent: number; scheduler: number }> {
  const cores = readFileSync('/proc/stat', 'utf8').split('\n').filter((l) => /^cpu\d/.test(l)).length;
  const a0 = cpuTicks([agentPid]);
  const s0 = cpuTicks([schedulerPid]);
  await new Promise((r) => setTimeout(r, ms));
  const a1 = cpuTicks([agentPid]);
  const s1 = cpuTicks([schedulerPid]);
  const elapsed = (a1.total - a0.total) / cores; // jiffies of one core
  return {
    host: (100 * (a1.busy - a0.busy)) / (a1.total - a0.total),
    agent: (100 * (a1.procs - a0.procs)) / elapsed,
    scheduler: (100 * (s1.procs - s0.procs)) / elapsed,
  };
}

/** Runs `fn` over `items`, `parallel` at a time. */
async function pool<T>(items: readonly T[], parallel: number, fn: (item: T, index: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(parallel, items.length) }, async () => {
    while (next < items.length) {
      const i = next++;
      await fn(items[i]!, i);
    }
  }));
}

export async function benchDensity(ctx: DensityBenchContext): Promise<void> {
  const headers = { authorization: `Bearer ${ctx.apiKey}`, 'content-type': 'application/json' };
  const call = async (method: string, path: string, body?: unknown) => {
    const res = await fetch(ctx.schedulerUrl + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const json = (await res.json()) as Record<string, any>;
    if (res.status >= 300) throw new Error(`${method} ${path}: ${res.status} ${JSON.stringify(json)}`);
    if (json.state === 'failed') throw new Error(`${method} ${path}: the operation failed: ${JSON.stringify(json.error)}`);
    return json;
  };
  const n = ctx.count;
  const before = sample(ctx.agentPid);
  const idleCpu = await cpuOver(5_000, ctx.agentPid, ctx.schedulerPid);
  const ids: string[] = [];
  const failures: string[] = [];
  const wakes: number[] = [];
  try {
    const started = performance.now();
    await pool(Array.from({ length: n }), PARALLEL, async (_, i) => {
      try {
        // Never idle-hibernated while the bench runs: they stay awake and idle.
        const id = (await call('POST', '/v1/desktops', { tier: 'small', idle_timeout_secs: 0 })).id as string;
        ids.push(id);
        wakes.push(await timed(() => call('POST', `/v1/desktops/${id}/wake?wait=true`)));
      } catch (err) {
        failures.push(String(err instanceof Error ? err.message : err));
      }
      if (i % 10 === 9) process.stderr.write(`density: ${i + 1}/${n} asked, ${wakes.length} awake, ${failures.length} failed, ${Math.round(memAvailableMb())} MiB available\r`);
    });
    const fillS = (performance.now() - started) / 1000;
    process.stderr.write('\n');
    if (failures.length > 0) {
      console.log(`density: ${failures.length} of ${n} desktops did not wake; first: ${failures[0]}; last: ${failures.at(-1)}`);
      console.log(`density: the scheduler's and the agent's last output:\n${ctx.output().slice(-6000)}`);
    }
    const awake = wakes.length;
    await new Promise((r) => setTimeout(r, SETTLE_MS));

    const after = sample(ctx.agentPid);
    const cgroupMb = ids.reduce((sum, id) => sum + cgroupNumber('memory', id, 'memory.usage_in_bytes'), 0) / MIB;
    const desktopProcesses = ids.reduce((sum, id) => sum + cgroupNumber('pids', id, 'pids.current'), 0);
    const cpu = await cpuOver(CPU_WINDOW_MS, ctx.agentPid, ctx.schedulerPid);

    const gets: number[] = [];
    for (let i = 0; i < GETS; i++) {
      const id = ids[(i * 7919) % ids.length]!;
      gets.push(await timed(() => call('GET', `/v1/desktops/${id}`)));
    }
    const execs: number[] = [];
    for (let i = 0; i < EXECS; i++) {
      const id = ids[(i * 104_729) % ids.length]!;
      execs.push(await timed(() => call('POST', `/v1/desktops/${id}/exec`, { command: 'true' })));
    }
    const per = (x: number) => x / Math.max(1, awake);
    console.log(`\ndensity: ${awake} of ${n} small desktops awake after ${fillS.toFixed(0)} s (${PARALLEL} at a time; create + wake p50 ${median(wakes).toFixed(0)} ms, p99 ${percentile(wakes, 99).toFixed(0)} ms)`);
    table(`Density (${awake} idle awake small desktops, default placement settings); baseline = the host before the first desktop`, [
      ['host memory in use', before.memAvailableMb - after.memAvailableMb, 0, 'MiB', ''],
      ["desktops' memory cgroups, summed", cgroupMb, 0, 'MiB', ''],
      ['agent RSS', after.agentRssMb, before.agentRssMb, 'MiB', ''],
      ['agent open files', after.agentFds, before.agentFds, '', ''],
      ['processes under the agent, desktops included', after.agentProcesses, before.agentProcesses, '', ''],
      ['processes inside the desktops', desktopProcesses, 0, '', ''],
      ['host CPU busy, all idle', cpu.host, idleCpu.host, '%', ''],
      ['agent CPU, all idle', cpu.agent, idleCpu.agent, '% of a core', 'nothing polls per desktop'],
      ['scheduler CPU, all idle', cpu.scheduler, idleCpu.scheduler, '% of a core', 'nothing polls per desktop'],
      ['GET /v1/desktops/{id}, all awake', median(gets), 1.0, 'ms', 'p99 < 20 ms', gets],
      ['exec `true`, all awake', median(execs), 5.5, 'ms', '', execs],
    ], ['with the desktops', 'baseline']);
    table(`Density per desktop (${awake} idle awake); baseline = issue 18's figures with 200 desktops`, [
      ['memory per idle desktop (MemAvailable drop / N)', per(before.memAvailableMb - after.memAvailableMb), 11.4, 'MiB', ''],
      ['memory per idle desktop (cgroup sum / N)', per(cgroupMb), 11.4, 'MiB', ''],
      ['agent RSS per desktop', (per(after.agentRssMb - before.agentRssMb) * 1024), 1, 'KiB', ''],
      ['agent open files per desktop', per(after.agentFds - before.agentFds), 1, '', ''],
      ['host processes per desktop, outside its cgroups', per(after.agentProcesses - before.agentProcesses - desktopProcesses), 5, '', ''],
      ['processes inside each desktop', per(desktopProcesses), 1, '', ''],
      ['host CPU per 100 idle desktops', per(cpu.host - idleCpu.host) * 100, 1.3 / 2, '%', ''],
    ], ['per desktop', 'baseline']);
  } finally {
    const destroyStarted = performance.now();
    await pool(ids, PARALLEL, async (id) => {
      await call('POST', `/v1/desktops/${id}/destroy?wait=true`).catch((err: unknown) => console.log(`density: destroy ${id}: ${String(err)}`));
    });
    console.log(`density: ${ids.length} desktops destroyed in ${((performance.now() - destroyStarted) / 1000).toFixed(0)} s`);
  }
}

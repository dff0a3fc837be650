/**
 * `npm run bench`: lifecycle latencies, API reads and the data plane on this machine, each
 * printed as a table of medians over repeated runs with the ratio to a baseline measured in the
 * same process. The scheduler and the agent run as processes of their own, as in production. The
 * lifecycle baselines are the sandbox driver's own calls (what the runtime costs without the API,
 * database and agent link). API reads are in api.ts; guest operations in guest-ops.ts;
 * terminals and the browser stream in terminal.ts; moving a desktop between two agents in
 * move.ts; moves and drains through the whole service in drain.ts; 1,000 idle desktops on one
 * host in density.ts (opt-in: `CANTO_BENCH_DENSITY=1000`). `CANTO_AGENT_*` settings in the
 * bench's environment reach its agent (e.g. `CANTO_AGENT_LIFECYCLE_CONCURRENCY=0` to run without
 * the host's lifecycle bound).
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { startEmbeddedPostgres } from '../../scheduler/src/pg/embedded.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { newId } from '../../shared/src/ids.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { benchApi } from './api.js';
import { benchGuestOps } from './guest-ops.js';
import { benchFork } from './fork.js';
import { benchParallel } from './parallel.js';
import { benchWebhooks } from './webhooks.js';
import { benchComputerUse } from './computer-use.js';
import { benchTerminal } from './terminal.js';
import { benchIngress } from './ingress.js';
import { benchFailover } from './failover.js';
import { benchMove } from './move.js';
import { benchDrain } from './drain.js';
import { benchDensity } from './density.js';
import { median, printSummary, summary, table, timed } from './stats.js';
import { freePort, startAgentProcess, startSchedulerProcess } from '../helpers/processes.js';
import { destroyLeftDesktops } from '../helpers/sandbox.js';

const RUNS = Number(process.env.CANTO_BENCH_RUNS ?? 10);
/** The scheduler's worker processes (`CANTO_WORKERS`); the production default, one per core, unless set. */
const WORKERS = Number(process.env.CANTO_BENCH_WORKERS ?? availableParallelism());
/** `npm run bench -- --json FILE` also writes the summary as JSON, for tracking figures over time. */
const JSON_OUT = ((i) => (i >= 0 ? process.argv[i + 1] : undefined))(process.argv.indexOf('--json'));
/** `CANTO_BENCH_ONLY=ingress,computer-use` runs only those sections; unset runs them all. */
const ONLY = process.env.CANTO_BENCH_ONLY?.split(',').map((s) => s.trim()).filter(Boolean) ?? [];
const want = (section: string) => ONLY.length === 0 || ONLY.includes(section);
/** `CANTO_BENCH_DENSITY=1000`: the density section with that many desktops; it takes minutes, so only when asked. */
const DENSITY = Number(process.env.CANTO_BENCH_DENSITY ?? 0);
/** `CANTO_BENCH_LOG_LEVEL=info`: what the scheduler and the agent log (printed when a run fails). */
const LOG_LEVEL = process.env.CANTO_BENCH_LOG_LEVEL ?? 'warn';

/** Production's timers, not the test helper's faster ones (engine poll, leader lease): the figures are production's. */
const PRODUCTION_TIMERS = { CANTO_ENGINE_POLL_MS: '500', CANTO_LEASE_TTL_MS: '2500', CANTO_LEASE_RENEW_MS: '500' };

/** Until the agent has said hello (its host is ready). */
async function waitForHost(databaseUrl: string): Promise<void> {
  const sql = connectDatabase(databaseUrl, { max: 1 });
  try {
    for (let i = 0; i < 300; i++) {
      const [row] = await sql<Array<{ n: number }>>`select count(*)::int as n from hosts where status = 'ready'`;
      if ((row?.n ?? 0) > 0) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error('the agent did not connect');
  } finally {
    await sql.end();
  }
}

/**
 * Until the agent's golden template is built (or the agent says none is coming), so that the
 * figures are a running host's: a desktop created in the first half second of an agent's life
 * boots cold beside the template's own boot (480-830 ms here, against 90-160 ms after), which with
 * ten runs would be every p99. The agent's metrics show the state (`canto_agent_desktop_template`).
 */
async function waitForTemplate(metricsUrl: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    const text = await fetch(metricsUrl).then((r) => r.text(), () => '');
    const state = /^canto_agent_desktop_template\{state="(\w+)"\} 1$/m.exec(text)?.[1];
    if (state === 'ready' || state === 'none') return;
    // A scrape with the agent's metrics but no template series: templates are off.
    if (state === undefined && text.includes('canto_agent_desktops')) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the agent built no desktop template in 30 s');
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'canto-bench-'));
  chmodSync(dir, 0o711); // the embedded PostgreSQL runs as the postgres user
  const pg = await startEmbeddedPostgres({ dir: join(dir, 'pg'), fast: true });
  // The production shape: the scheduler and the agent are processes of their own (the built
  // CLI), and this process is only the client and the baseline.
  const ingressPort = await freePort();
  const secretKey = generateSecretKey();
  const scheduler = await startSchedulerProcess({
    databaseUrl: pg.url,
    port: await freePort(),
    secretKey,
    extra: {
      CANTO_WORKERS: String(WORKERS),
      ...PRODUCTION_TIMERS,
      CANTO_LOG_LEVEL: LOG_LEVEL, CANTO_INGRESS_BASE_URL: 'http://apps.canto.test', CANTO_INGRESS_LISTEN: `127.0.0.1:${ingressPort}`,
    },
  }).catch(async (err: unknown) => {
    await pg.stop();
    rmSync(dir, { recursive: true, force: true });
    throw err;
  });
  const agentSettings = Object.entries(process.env).filter((e): e is [string, string] => e[0].startsWith('CANTO_AGENT_') && e[1] !== undefined);
  const agentMetrics = `127.0.0.1:${await freePort()}`;
  const agent = startAgentProcess(scheduler.url, join(dir, 'agent'), { CANTO_AGENT_METRICS_LISTEN: agentMetrics, ...Object.fromEntries(agentSettings), CANTO_LOG_LEVEL: LOG_LEVEL });
  const sql = connectDatabase(pg.url, { max: 1 });
  const key = (await createApiKey(sql, 'bench')).key;
  await sql.end();
  await waitForHost(pg.url);
  await waitForTemplate(`http://${process.env.CANTO_AGENT_METRICS_LISTEN ?? agentMetrics}/metrics`);
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const post = async (path: string, body: unknown = {}) => {
    const res = await fetch(scheduler.url + path, { method: 'POST', headers, body: JSON.stringify(body) });
    const json = (await res.json()) as { id: string; state?: string };
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };

  try {
    if (want('lifecycle')) {
      // Lifecycle through the API.
      const cold: number[] = [];
      const hibernate: number[] = [];
      const wake: number[] = [];
      for (let i = 0; i < RUNS; i++) {
        let id = '';
        cold.push(await timed(async () => {
          id = (await post('/v1/desktops', { tier: 'small' })).id;
          await post(`/v1/desktops/${id}/wake?wait=true`);
        }));
        hibernate.push(await timed(() => post(`/v1/desktops/${id}/hibernate?wait=true`)));
        wake.push(await timed(() => post(`/v1/desktops/${id}/wake?wait=true`)));
        await post(`/v1/desktops/${id}/destroy?wait=true`);
        process.stderr.write(`lifecycle run ${i + 1}/${RUNS}\r`);
      }

      // The same operations straight on the runtime driver.
      const driver = await createSandboxDriver({ stateDir: join(dir, 'direct') });
      const dCold: number[] = [];
      const dHib: number[] = [];
      const dWake: number[] = [];
      for (let i = 0; i < RUNS; i++) {
        const id = newId('desktop');
        dCold.push(await timed(async () => {
          await driver.prepare(id, 'small');
          await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
        }));
        dHib.push(await timed(() => driver.hibernate(id)));
        dWake.push(await timed(() => driver.start({ desktopId: id, tier: 'small', firstBoot: null })));
        await driver.destroy(id);
      }
      await driver.close();
      const snapshots = driver.capabilities().memorySnapshots ? 'CRIU' : 'cold stop (no CRIU)';
      table(`Lifecycle latency (ms, ${RUNS} runs each, hibernate = ${snapshots}); baseline = sandbox driver alone`, [
        ['create → awake (first wake; baseline a cold boot)', median(cold), median(dCold), 'ms', '< 300 ms, p99 < 500 ms', cold],
        ['hibernate', median(hibernate), median(dHib), 'ms', '< 300 ms', hibernate],
        ['wake from snapshot', median(wake), median(dWake), 'ms', '< 250 ms', wake],
      ]);
    }
    if (want('api')) {
      // One worker beside the production shape, on the same database, for the comparison.
      const single = await startSchedulerProcess({ databaseUrl: pg.url, port: await freePort(), secretKey, extra: { ...PRODUCTION_TIMERS, CANTO_LOG_LEVEL: 'warn', CANTO_WORKERS: '1' } });
      try {
        await benchApi({ schedulerUrl: scheduler.url, workers: WORKERS, singleWorkerUrl: single.url, databaseUrl: pg.url, apiKey: key, runs: RUNS });
      } finally {
        await single.kill('SIGTERM');
      }
    }
    if (want('guest-ops')) await benchGuestOps({ schedulerUrl: scheduler.url, apiKey: key, runtimeDir: join(dir, 'agent', 'runtime'), runs: RUNS });
    if (want('parallel')) await benchParallel({ schedulerUrl: scheduler.url, apiKey: key, runs: RUNS });
    if (want('fork')) await benchFork({ schedulerUrl: scheduler.url, apiKey: key, runs: RUNS });
    if (want('computer-use')) await benchComputerUse({ schedulerUrl: scheduler.url, apiKey: key, runs: RUNS });
    if (want('terminal')) await benchTerminal({ schedulerUrl: scheduler.url, apiKey: key, runs: RUNS });
    if (want('ingress')) {
      await benchIngress({
        schedulerUrl: scheduler.url,
        ingressUrl: `http://127.0.0.1:${ingressPort}`,
        apiKey: key,
        runtimeDir: join(dir, 'agent', 'runtime'),
        runs: RUNS,
        databaseUrl: pg.url,
        secretKey,
      });
    }
    if (want('webhooks')) await benchWebhooks({ databaseUrl: pg.url, runs: RUNS });
    if (want('failover')) await benchFailover({ databaseUrl: pg.url, stateDir: join(dir, 'failover-agent'), runs: RUNS });
    if (want('move')) await benchMove({ runs: RUNS });
    if (want('drain')) await benchDrain({ databaseUrl: pg.url, stateDir: join(dir, 'drain-agents'), runs: RUNS });
    if (want('density') && DENSITY > 0) {
      await benchDensity({
        schedulerUrl: scheduler.url, apiKey: key, agentPid: agent.proc.pid!, schedulerPid: scheduler.proc.pid!, count: DENSITY,
        output: () => `--- scheduler\n${scheduler.output().slice(-3000)}\n--- agent\n${agent.output().slice(-3000)}`,
      });
    }
  } catch (err) {
    // What the two processes said is most of what explains a failed run.
    console.error(`--- scheduler\n${scheduler.output().slice(-20000)}\n--- agent\n${agent.output().slice(-20000)}`);
    throw err;
  } finally {
    await agent.kill('SIGTERM');
    // Desktops outlive their agent: whatever a section left running (a failed run's above all) goes.
    const runtimes = ['agent', 'failover-agent', join('drain-agents', 'a'), join('drain-agents', 'b')].map((d) => join(dir, d, 'runtime'));
    for (const state of runtimes) await destroyLeftDesktops(state).catch((err: unknown) => console.error(`could not clean ${state}:`, err));
    await scheduler.kill('SIGTERM');
    await pg.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The summary as JSON, with what it was measured on. */
function writeJson(file: string): void {
  const commit = (() => {
    try {
      return execFileSync('git', ['rev-parse', 'HEAD'], { encoding: 'utf8' }).trim();
    } catch {
      return null;
    }
  })();
  const doc = {
    measured_at: new Date().toISOString(), commit, node: process.version, cpus: cpus().length,
    memory_bytes: totalmem(), runs: RUNS, figures: summary(),
  };
  writeFileSync(file, `${JSON.stringify(doc, null, 2)}\n`);
  console.log(`\nwrote ${file}`);
}

main().then(
  () => {
    printSummary();
    if (JSON_OUT) writeJson(JSON_OUT);
    process.exit(0);
  },
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);

/**
 * API read throughput and latency (issue goals: ≥ 10,000 `GET /v1/desktops/{id}` per second on two
 * cores, p99 < 20 ms at 5,000 requests/s offered over 200 connections, `GET /v1/desktops` of an org
 * with 1,000 desktops < 20 ms). The baseline is a bare `node:http` server answering a fixed JSON
 * body of the same size, driven by the same load generator in the same run: what one HTTP round
 * trip costs on this machine.
 *
 * The scheduler under test runs as in production (`CANTO_WORKERS` workers, one per core by
 * default); a second scheduler with one worker, on the same database, is driven in the same
 * rounds, so the table shows what the workers buy.
 */
import { createServer } from 'node:http';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { insertDesktop } from '../../scheduler/src/store/desktops.js';
import { runLoad } from './load.js';
import { median, percentile, table, timed } from './stats.js';

export interface ApiBenchOptions {
  schedulerUrl: string;
  /** Worker processes of the scheduler at `schedulerUrl`. */
  workers: number;
  /** A scheduler with one worker on the same database, for comparison. */
  singleWorkerUrl: string;
  databaseUrl: string;
  apiKey: string;
  runs: number;
}

const CONNECTIONS = 200;
const OFFERED = 5000;
const SECONDS = Number(process.env.CANTO_BENCH_LOAD_SECONDS ?? 3);

export async function benchApi(o: ApiBenchOptions): Promise<void> {
  const auth = { authorization: `Bearer ${o.apiKey}` };
  const created = await fetch(`${o.schedulerUrl}/v1/desktops`, {
    method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify({ tier: 'small' }),
  });
  const desktop = (await created.json()) as { id: string };
  const apiUrl = `${o.schedulerUrl}/v1/desktops/${desktop.id}`;
  const singleUrl = `${o.singleWorkerUrl}/v1/desktops/${desktop.id}`;
  const body = JSON.stringify(await (await fetch(apiUrl, { headers: auth })).json());
  const bare = createServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body));
  await new Promise<void>((r) => bare.listen(0, '127.0.0.1', r));
  const bareUrl = `http://127.0.0.1:${(bare.address() as { port: number }).port}/`;

  await benchList(o, apiUrl, auth);

  const rps: number[] = [];
  const bareRps: number[] = [];
  const singleRps: number[] = [];
  const open: number[] = [];
  const bareOpen: number[] = [];
  const singleOpen: number[] = [];
  // Scheduler CPU per request (all workers'): what a read costs whatever else the machine runs.
  const cpu: number[] = [];
  const singleCpu: number[] = [];
  try {
    const rounds = Math.max(1, Math.min(o.runs, 3));
    for (let i = 0; i < rounds; i++) {
      const closed = { connections: CONNECTIONS, durationMs: SECONDS * 1000 };
      bareRps.push(checked(await runLoad({ url: bareUrl, headers: {}, ...closed })).rps);
      rps.push(await cpuMeasured(o.schedulerUrl, cpu, () => runLoad({ url: apiUrl, headers: auth, ...closed })));
      singleRps.push(await cpuMeasured(o.singleWorkerUrl, singleCpu, () => runLoad({ url: singleUrl, headers: auth, ...closed })));
      const offered = { ...closed, rate: OFFERED };
      bareOpen.push(...checked(await runLoad({ url: bareUrl, headers: {}, ...offered })).latencies);
      open.push(...checked(await runLoad({ url: apiUrl, headers: auth, ...offered })).latencies);
      singleOpen.push(...checked(await runLoad({ url: singleUrl, headers: auth, ...offered })).latencies);
      process.stderr.write(`api load round ${i + 1}/${rounds}\r`);
    }
  } finally {
    bare.close();
  }
  const w = `${o.workers} worker${o.workers === 1 ? '' : 's'}`;
  table(`API reads (${CONNECTIONS} keep-alive connections, ${SECONDS} s per round); baseline = bare node:http, same body`, [
    [`GET /v1/desktops/{id}, closed loop, ${w}`, median(rps), median(bareRps), 'req/s', '≥ 10000 req/s', rps],
    ['GET /v1/desktops/{id}, closed loop, 1 worker', median(singleRps), median(bareRps), 'req/s', '(comparison)', singleRps],
    [`GET /v1/desktops/{id} at ${OFFERED} req/s offered, p50, ${w}`, median(open), median(bareOpen), 'ms', 'p99 < 20 ms', open],
    [`GET /v1/desktops/{id} at ${OFFERED} req/s offered, p50, 1 worker`, median(singleOpen), median(bareOpen), 'ms', '(comparison)', singleOpen],
  ]);
  console.log(`p99 at ${OFFERED} req/s offered: ${w} ${percentile(open, 99).toFixed(1)} ms, 1 worker ${percentile(singleOpen, 99).toFixed(1)} ms, bare ${percentile(bareOpen, 99).toFixed(1)} ms`);
  table('Scheduler CPU per API read (closed loop, process_cpu_seconds_total of every worker); baseline = 1 worker', [
    [`GET /v1/desktops/{id}, ${w}`, median(cpu), median(singleCpu), 'ms', '(comparison)', cpu],
  ]);
}

/** Runs a closed loop, records the scheduler's CPU ms per request into `into`, and returns req/s. */
async function cpuMeasured(base: string, into: number[], load: () => Promise<{ errors: number; requests: number; rps: number }>): Promise<number> {
  const before = await cpuSeconds(base);
  const result = checked(await load());
  into.push(((await cpuSeconds(base)) - before) * 1000 / result.requests);
  return result.rps;
}

/** `process_cpu_seconds_total` from the scheduler's `/metrics` (summed over its workers). */
async function cpuSeconds(base: string): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith('process_cpu_seconds_total '));
  if (!line) throw new Error('the scheduler reports no process_cpu_seconds_total');
  return Number(line.split(' ')[1]);
}

function checked<T extends { errors: number; requests: number }>(r: T): T {
  if (r.errors > 0) throw new Error(`${r.errors} of ${r.requests + r.errors} requests failed`);
  return r;
}

/**
 * `GET /v1/desktops` of an org with 1,000 desktops, against a GET of one desktop. Measured before
 * the load rounds, whose aftermath (connections closing, collections in every process) made a
 * single GET take several times its quiet time in the seconds after them.
 */
async function benchList(o: ApiBenchOptions, apiUrl: string, auth: Record<string, string>): Promise<void> {
  // Made in the database (placement does not matter to a read).
  const sql = connectDatabase(o.databaseUrl, { max: 1 });
  const listKey = await createApiKey(sql, 'bench-list');
  const orgId = listKey.orgId;
  let someId = '';
  for (let i = 0; i < 1000; i++) {
    someId = (await insertDesktop(sql, {
      orgId, tier: 'small', imageVersion: 'bench', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null,
    })).id;
  }
  // Inserted desktops are `provisioning`: the engine places each and has the agent prepare its
  // disk. The list is measured once that is over, not while a thousand placements change it.
  const placedWithin = Date.now() + 180_000;
  for (;;) {
    const [row] = await sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM desktops WHERE org_id = ${orgId} AND state = 'provisioning'`;
    if (row!.n === 0) break;
    if (Date.now() > placedWithin) throw new Error(`${row!.n} of the list's desktops still provisioning after 180 s`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const listHeaders = { authorization: `Bearer ${listKey.key}` };
  const listed = async () => {
    const res = await fetch(`${o.schedulerUrl}/v1/desktops`, { headers: listHeaders });
    const json = (await res.json()) as { desktops: unknown[] };
    if (json.desktops.length !== 1000) throw new Error(`listed ${json.desktops.length} desktops`);
  };
  const list: number[] = [];
  const changed: number[] = [];
  const one: number[] = [];
  const samples = Math.max(20, o.runs * 3);
  try {
    // Warm-up, as in the other sections: each worker's first list reads and encodes the whole
    // list cold (a connection of its own each, so that every worker of the scheduler gets some).
    for (let i = 0; i < 6; i++) await (await fetch(`${o.schedulerUrl}/v1/desktops`, { headers: { ...listHeaders, connection: 'close' } })).arrayBuffer();
    for (let i = 0; i < samples; i++) {
      list.push(await timed(listed));
      one.push(await timed(async () => (await fetch(apiUrl, { headers: auth })).arrayBuffer()));
    }
    // A write before each list, as another client's would be: every scheduler process reads the
    // list anew (services/desktop-list.ts).
    for (let i = 0; i < samples; i++) {
      await sql`UPDATE desktops SET idle_timeout_secs = ${i + 1} WHERE id = ${someId}`;
      changed.push(await timed(listed));
    }
  } finally {
    await sql.end();
  }
  table('API list (1,000 desktops in the org); baseline = GET of one desktop', [
    ['GET /v1/desktops', median(list), median(one), 'ms', '< 20 ms', list],
    ['GET /v1/desktops, one desktop changed since the last list', median(changed), median(one), 'ms', '< 20 ms', changed],
  ]);
}

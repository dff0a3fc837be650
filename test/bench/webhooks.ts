/**
 * Webhook dispatch benchmark: how fast outbox events reach a receiver through the scheduler's
 * dispatcher (fan-out, claim, sign, POST over a checked connection, record), against plain
 * POSTs of the same body to the same receiver from this process at the same concurrency, one
 * connection per request as the dispatcher does: what the HTTP exchange itself costs here.
 *
 * The scheduler runs as a process of its own on a fresh database of the given cluster, with
 * loopback receivers allowed. Events are written straight to the outbox, as the engine writes
 * them, each for a different desktop (events of one desktop are delivered one after another).
 *
 * `benchWebhooks({ databaseUrl, runs })` is called from run.ts; `node --import tsx
 * test/bench/webhooks.ts` runs it alone on a private PostgreSQL (it needs the built CLI).
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { startEmbeddedPostgres } from '../../scheduler/src/pg/embedded.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { freePort, startSchedulerProcess } from '../helpers/processes.js';
import { median, table, timed } from './stats.js';

export interface WebhookBenchContext {
  /** Any database URL on the cluster to use; the bench creates (and drops) a database of its own. */
  readonly databaseUrl: string;
  readonly runs: number;
  /** Events per throughput run. Default 400. */
  readonly events?: number;
}

const CONCURRENCY = 16;

/** A receiver that answers 200 at once and resolves a promise when it has counted `n` requests. */
async function startCountingReceiver() {
  let count = 0;
  let target = Infinity;
  let reached: () => void = () => {};
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200).end();
      if (++count === target) reached();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/bench`,
    /** Resolves once `n` more requests have arrived. */
    expect(n: number): Promise<void> {
      count = 0;
      target = n;
      return new Promise<void>((r) => (reached = r));
    },
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** One POST on a new connection, as the dispatcher sends it (without the signature work). */
function plainPost(url: string, body: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', connection: 'close' } }, (res) => {
      res.resume();
      res.on('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`status ${res.statusCode}`))));
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function plainPosts(url: string, body: string, n: number): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next++ < n) await plainPost(url, body);
  }));
}

async function insertEvents(sql: Sql, orgId: string, n: number, tag: string): Promise<void> {
  await sql`
    INSERT INTO outbox (org_id, desktop_id, type, payload)
    SELECT ${orgId}, 'dsk_bench_' || ${tag} || '_' || i, 'desktop.created',
           jsonb_build_object('type', 'desktop.created', 'desktopId', 'dsk_bench_' || ${tag} || '_' || i, 'orgId', ${orgId}::text,
                              'occurredAt', now(), 'data', jsonb_build_object('tier', 'small'))
    FROM generate_series(1, ${n}) AS i`;
}

export async function benchWebhooks(ctx: WebhookBenchContext): Promise<void> {
  const events = ctx.events ?? 400;
  const name = `canto_bench_webhooks_${randomBytes(4).toString('hex')}`;
  const admin = connectDatabase(ctx.databaseUrl, { max: 1 });
  await admin.unsafe(`CREATE DATABASE ${name}`);
  const url = new URL(ctx.databaseUrl);
  url.pathname = `/${name}`;
  const databaseUrl = url.toString();
  const receiver = await startCountingReceiver();
  const scheduler = await startSchedulerProcess({
    databaseUrl,
    port: await freePort(),
    extra: { CANTO_LOG_LEVEL: 'warn', CANTO_WEBHOOK_ALLOW_LOOPBACK: 'true', CANTO_WEBHOOK_CONCURRENCY: String(CONCURRENCY) },
  });
  const sql = connectDatabase(databaseUrl, { max: 2 });
  try {
    const { orgId, key } = await createApiKey(sql, 'bench-webhooks');
    const res = await fetch(`${scheduler.url}/v1/webhooks`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ url: receiver.url, events: ['desktop.created'] }),
    });
    if (res.status !== 201) throw new Error(`registering the endpoint: ${res.status} ${await res.text()}`);
    const body = JSON.stringify({ type: 'desktop.created', desktopId: 'dsk_bench', orgId, occurredAt: new Date().toISOString(), data: { tier: 'small' } });

    const dispatched: number[] = [];
    const baseline: number[] = [];
    const eventLatency: number[] = [];
    const postLatency: number[] = [];
    for (let run = 0; run < ctx.runs; run++) {
      let arrived = receiver.expect(events);
      dispatched.push((events / (await timed(async () => {
        await insertEvents(sql, orgId, events, `${run}`);
        await arrived;
      }))) * 1000);
      arrived = receiver.expect(events);
      baseline.push((events / (await timed(async () => {
        await plainPosts(receiver.url, body, events);
        await arrived;
      }))) * 1000);
      for (let i = 0; i < 10; i++) {
        arrived = receiver.expect(1);
        eventLatency.push(await timed(async () => {
          await insertEvents(sql, orgId, 1, `${run}_single_${i}`);
          await arrived;
        }));
        arrived = receiver.expect(1);
        postLatency.push(await timed(async () => {
          await plainPost(receiver.url, body);
          await arrived;
        }));
      }
      process.stderr.write(`webhook run ${run + 1}/${ctx.runs}\r`);
    }
    const [settled] = await sql<Array<{ delivered: number; other: number }>>`
      SELECT count(*) FILTER (WHERE state = 'delivered')::int AS delivered, count(*) FILTER (WHERE state <> 'delivered')::int AS other
      FROM webhook_deliveries`;
    table(
      `Webhook dispatch (${events} events to one endpoint, concurrency ${CONCURRENCY}, ${ctx.runs} runs; ` +
        `${settled?.delivered ?? 0} delivered, ${settled?.other ?? 0} not); baseline = plain POSTs from this process, one connection each`,
      [
        ['dispatch throughput', median(dispatched), median(baseline), 'deliveries/s', 'higher is better', dispatched],
        ['outbox commit → received (one event)', median(eventLatency), median(postLatency), 'ms', '< 50 ms', eventLatency],
      ],
    );
  } finally {
    await sql.end();
    await scheduler.kill('SIGTERM');
    await receiver.close();
    await admin.unsafe(`DROP DATABASE IF EXISTS ${name}`).catch(() => {});
    await admin.end();
  }
}

async function standalone(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'canto-bench-webhooks-'));
  chmodSync(dir, 0o711); // the embedded PostgreSQL runs as the postgres user
  const pg = await startEmbeddedPostgres({ dir: join(dir, 'pg'), fast: true });
  try {
    await benchWebhooks({ databaseUrl: pg.url, runs: Number(process.env.CANTO_BENCH_RUNS ?? 5) });
  } finally {
    await pg.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  standalone().then(
    () => process.exit(0),
    (err: unknown) => {
      console.error(err);
      process.exit(1);
    },
  );
}

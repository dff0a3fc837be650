/**
 * `npm run bench`: lifecycle latencies and API read throughput on this machine, each printed as
 * a table of medians over repeated runs with the ratio to a baseline measured in the same
 * process. The lifecycle baselines are the sandbox driver's own calls (what the runtime costs
 * without the API, database and agent link); the read baseline is a bare Node HTTP server
 * answering a fixed JSON body (what one HTTP round trip costs here).
 */
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { startScheduler } from '../../scheduler/src/main.js';
import { startEmbeddedPostgres } from '../../scheduler/src/pg/embedded.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { runAgent } from '../../agent/src/main.js';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { silentLogger } from '../../shared/src/log.js';
import { newId } from '../../shared/src/ids.js';

const RUNS = Number(process.env.CANTO_BENCH_RUNS ?? 10);
const JOIN = 'bench-join-token';

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await fn();
  return performance.now() - t;
}

function table(title: string, rows: Array<[string, number, number, string, string]>): void {
  console.log(`\n${title}`);
  console.log('| measure | median | baseline median | ratio | target |');
  console.log('|---|---:|---:|---:|---|');
  for (const [name, value, base, unit, target] of rows) {
    console.log(`| ${name} | ${value.toFixed(1)} ${unit} | ${base.toFixed(1)} ${unit} | ${(value / base).toFixed(2)}× | ${target} |`);
  }
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'canto-bench-'));
  chmodSync(dir, 0o711); // the embedded PostgreSQL runs as the postgres user
  const pg = await startEmbeddedPostgres({ dir: join(dir, 'pg'), fast: true });
  const logger = silentLogger();
  const scheduler = await startScheduler(
    loadSchedulerConfig({
      DATABASE_URL: pg.url,
      CANTO_SECRET_KEY: generateSecretKey(),
      CANTO_LISTEN: '127.0.0.1:0',
      CANTO_JOIN_TOKEN: JOIN,
      CANTO_ENGINE_POLL_MS: '100',
    }),
    logger,
  );
  const agent = await runAgent(
    loadAgentConfig({ CANTO_SCHEDULER_URL: scheduler.url, CANTO_AGENT_TOKEN: JOIN, CANTO_AGENT_STATE_DIR: join(dir, 'agent') }),
    { logger, handleSignals: false },
  );
  await agent.waitConnected(30_000);
  const sql = connectDatabase(pg.url, { max: 1 });
  const key = (await createApiKey(sql, 'bench')).key;
  await sql.end();
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const post = async (path: string, body: unknown = {}) => {
    const res = await fetch(scheduler.url + path, { method: 'POST', headers, body: JSON.stringify(body) });
    const json = (await res.json()) as { id: string; state?: string };
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };

  try {
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
      ['create → awake (cold boot)', median(cold), median(dCold), 'ms', '< 1000 ms'],
      ['hibernate', median(hibernate), median(dHib), 'ms', '< 300 ms'],
      ['wake from snapshot', median(wake), median(dWake), 'ms', '< 250 ms'],
    ]);

    // Read throughput: GET /v1/desktops/{id} against a bare HTTP server.
    const id = (await post('/v1/desktops', { tier: 'small' })).id;
    const bare = createServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}'));
    await new Promise<void>((r) => bare.listen(0, '127.0.0.1', r));
    const bareUrl = `http://127.0.0.1:${(bare.address() as { port: number }).port}/`;
    const throughput = async (url: string, hdrs: Record<string, string>) => {
      const n = 400;
      const concurrency = 16;
      let next = 0;
      const ms = await timed(() =>
        Promise.all(Array.from({ length: concurrency }, async () => {
          while (next++ < n) {
            const res = await fetch(url, { headers: hdrs });
            if (res.status !== 200) throw new Error(`GET ${url}: ${res.status}`);
            await res.arrayBuffer();
          }
        })),
      );
      return (n / ms) * 1000;
    };
    const api: number[] = [];
    const base: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      base.push(await throughput(bareUrl, {}));
      api.push(await throughput(`${scheduler.url}/v1/desktops/${id}`, { authorization: headers.authorization }));
    }
    bare.close();
    table(`Read throughput (requests/s, 400 requests at concurrency 16, ${RUNS} rounds); baseline = bare node:http`, [
      ['GET /v1/desktops/{id}', median(api), median(base), 'req/s', 'higher is better'],
    ]);
  } finally {
    await agent.stop();
    const cleaner = await createSandboxDriver({ stateDir: join(dir, 'agent', 'runtime') });
    for (const d of await cleaner.list()) await cleaner.destroy(d.desktopId);
    await cleaner.close();
    await scheduler.close();
    await pg.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);

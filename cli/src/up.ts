/**
 * `canto up`: everything on one machine with embedded defaults — a private PostgreSQL cluster in
 * the data directory, the scheduler, and a local agent joined with a generated token. Prints the
 * API base URL and, on the first start, a bootstrap API key for the org `default`.
 */
import { join } from 'node:path';
import { createRootLogger } from '../../shared/src/log.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { startScheduler } from '../../scheduler/src/main.js';
import { startEmbeddedPostgres } from '../../scheduler/src/pg/embedded.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { runAgent } from '../../agent/src/main.js';
import { loadOrCreateSecrets } from './data-dir.js';

export interface UpOptions {
  dataDir: string;
  listen: string;
}

export async function up(options: UpOptions, env: NodeJS.ProcessEnv): Promise<void> {
  // stdout carries the banner (URL, bootstrap key); logs go to stderr.
  const logger = createRootLogger({ level: env.CANTO_LOG_LEVEL || 'info', name: 'canto', toStderr: true });
  const secrets = loadOrCreateSecrets(options.dataDir);
  const pg = await startEmbeddedPostgres({ dir: join(options.dataDir, 'postgres') });
  const stops: Array<() => Promise<void>> = [() => pg.stop()];
  const stopAll = async () => {
    for (const stop of stops.splice(0).reverse()) await stop().catch((err: unknown) => logger.error({ err }, 'stop failed'));
  };
  // One machine: exposed ports at http://{port}-{desktop_id}.localhost:8081, which browsers and
  // curl resolve to loopback without any DNS setup.
  const ingressBaseUrl = env.CANTO_INGRESS_BASE_URL || 'http://localhost:8081';
  try {
    const scheduler = await startScheduler(
      loadSchedulerConfig({
        ...env,
        DATABASE_URL: pg.url,
        CANTO_SECRET_KEY: env.CANTO_SECRET_KEY || secrets.secret_key,
        CANTO_JOIN_TOKEN: env.CANTO_JOIN_TOKEN || secrets.join_token,
        CANTO_LISTEN: options.listen,
        CANTO_INGRESS_BASE_URL: ingressBaseUrl,
        CANTO_INGRESS_LISTEN: env.CANTO_INGRESS_LISTEN || '127.0.0.1:8081',
      }),
      logger,
    );
    stops.push(() => scheduler.close());
    const bootstrapKey = await firstStartKey(pg.url);
    const agent = await runAgent(
      loadAgentConfig({
        ...env,
        CANTO_SCHEDULER_URL: scheduler.url,
        CANTO_AGENT_TOKEN: env.CANTO_JOIN_TOKEN || secrets.join_token,
        CANTO_AGENT_STATE_DIR: env.CANTO_AGENT_STATE_DIR || join(options.dataDir, 'agent'),
        // One machine: stream clients dial this one, on loopback unless told otherwise.
        CANTO_AGENT_STREAM_LISTEN: env.CANTO_AGENT_STREAM_LISTEN || '127.0.0.1:7010',
        CANTO_AGENT_INGRESS_LISTEN: env.CANTO_AGENT_INGRESS_LISTEN || '127.0.0.1:7011',
        CANTO_AGENT_ADDRESS: env.CANTO_AGENT_ADDRESS || '127.0.0.1',
      }),
      { logger, handleSignals: false },
    );
    stops.push(() => agent.stop());
    await agent.waitConnected(30_000);
    process.stdout.write(`Canto is up.\n  API:      ${scheduler.url}/v1\n  OpenAPI:  ${scheduler.url}/v1/openapi.json\n  Host:     ${agent.hostId}\n`);
    if (scheduler.ingressUrl) process.stdout.write(`  Ingress:  ${scheduler.ingressUrl} (exposed ports: ${ingressPattern(ingressBaseUrl)})\n`);
    if (bootstrapKey) process.stdout.write(`  API key:  ${bootstrapKey}   (org "default"; shown once, store it now)\n`);
    process.stdout.write('Press Ctrl-C to stop.\n');
  } catch (err) {
    await stopAll();
    throw err;
  }
  await new Promise<void>((resolve) => {
    const onSignal = () => {
      process.off('SIGINT', onSignal);
      process.off('SIGTERM', onSignal);
      process.stdout.write('\nStopping Canto…\n');
      void stopAll().then(resolve);
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
  });
}

/** `http://{port}-{desktop_id}.localhost:8081` for base `http://localhost:8081`. */
function ingressPattern(baseUrl: string): string {
  const url = new URL(baseUrl);
  return `${url.protocol}//{port}-{desktop_id}.${url.host}`;
}

/** A key for the org `default` when the database has no org yet (the very first start). */
async function firstStartKey(databaseUrl: string): Promise<string | null> {
  const sql = connectDatabase(databaseUrl, { max: 1 });
  try {
    const [row] = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM orgs`;
    if (row!.n > 0) return null;
    return (await createApiKey(sql, 'default')).key;
  } finally {
    await sql.end();
  }
}

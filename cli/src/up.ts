/**
 * `canto up`: everything on one machine with embedded defaults — a private PostgreSQL cluster in
 * the data directory, the scheduler, and a local agent joined with a generated token (or several,
 * `--hosts N`, each a host of its own, to try cordon, drain and moves on one machine). Prints the
 * API base URL and, on the first start, a bootstrap API key for the org `default`.
 *
 * The scheduler is one process unless `CANTO_WORKERS` asks for more (then this process is also
 * their cluster primary, scheduler/src/cluster/primary.ts): one person trying Canto gains nothing
 * from a second worker, which costs memory and start-up time on the machine the desktops run on.
 *
 * One `canto up` per data directory: a lock file (`canto-up.pid`) names the running one; a lock
 * left by a process that is gone (kill -9, a crash) is taken over, along with any PostgreSQL
 * server it left running (scheduler/src/pg/embedded.ts).
 *
 * Stopping (Ctrl-C or SIGTERM) hibernates every awake desktop of its agents first, memory kept,
 * so the next start finds them as their users left them and nothing is billed meanwhile (an agent
 * joined from elsewhere keeps running its desktops and is left alone); then the agents, the
 * scheduler and PostgreSQL stop, in that order. A second signal skips the hibernation (desktops
 * keep running and the next start adopts them); a third exits at once. The handler stays
 * installed throughout: removing it while a signal is delivered let another library's listener
 * (execa's signal-exit) re-raise the signal and kill the process before PostgreSQL stopped.
 */
import { realpath } from 'node:fs/promises';
import { join } from 'node:path';
import { createRootLogger, type Logger } from '../../shared/src/log.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { startScheduler } from '../../scheduler/src/main.js';
import { startSchedulerCluster } from '../../scheduler/src/cluster/primary.js';
import { LifecycleService } from '../../scheduler/src/services/lifecycle.js';
import { startEmbeddedPostgres } from '../../scheduler/src/pg/embedded.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { ApiError } from '../../scheduler/src/errors.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { runAgent } from '../../agent/src/main.js';
import { loadOrCreateSecrets, lockDataDir, recordApiUrl } from './data-dir.js';

export interface UpOptions {
  dataDir: string;
  listen: string;
  /** Agents to run, each a host of its own (for trying cordon, drain and moves on one machine). */
  hosts: number;
}

/**
 * The settings of local agent `index`: the first keeps the historical state directory (`agent`)
 * and its listeners (7010-7013 unless set); each further one has `agent-<index>` and listeners ten
 * ports up per index (or ports of their own, where a listener is set to port 0), so no two share a
 * listener, a host identity or a desktop directory.
 */
function localAgentEnv(env: NodeJS.ProcessEnv, dataDir: string, schedulerUrl: string, token: string, index: number): NodeJS.ProcessEnv {
  const listen = (name: string, defaultPort: number) => {
    const given = env[name] || `127.0.0.1:${defaultPort}`;
    const colon = given.lastIndexOf(':');
    const port = Number(given.slice(colon + 1));
    return port === 0 || index === 0 ? given : `${given.slice(0, colon)}:${port + 10 * index}`;
  };
  return {
    ...env,
    CANTO_SCHEDULER_URL: schedulerUrl,
    CANTO_AGENT_TOKEN: token,
    CANTO_AGENT_STATE_DIR: index === 0 ? env.CANTO_AGENT_STATE_DIR || join(dataDir, 'agent') : join(dataDir, `agent-${index}`),
    // One machine: stream clients dial this one, on loopback unless told otherwise.
    CANTO_AGENT_STREAM_LISTEN: listen('CANTO_AGENT_STREAM_LISTEN', 7010),
    CANTO_AGENT_INGRESS_LISTEN: listen('CANTO_AGENT_INGRESS_LISTEN', 7011),
    CANTO_AGENT_METRICS_LISTEN: listen('CANTO_AGENT_METRICS_LISTEN', 7012),
    CANTO_AGENT_TRANSFER_LISTEN: listen('CANTO_AGENT_TRANSFER_LISTEN', 7013),
    CANTO_AGENT_ADDRESS: env.CANTO_AGENT_ADDRESS || '127.0.0.1',
  };
}

/** How long a stop waits for desktops to hibernate before it stops everything anyway. */
const HIBERNATE_ON_STOP_MS = 60_000;
const LOCAL_INGRESS_PORT = 8081;

/**
 * One machine: exposed ports at http://{port}-{desktop_id}.localhost:{port the ingress listens
 * on}, which browsers and curl resolve to loopback. A listener on port 0 learns its port only
 * once bound, after the URLs are settled: such a setup names its base URL itself.
 */
export function localIngressBaseUrl(listen: string): string {
  const port = Number(listen.slice(listen.lastIndexOf(':') + 1));
  return `http://localhost:${port > 0 ? port : LOCAL_INGRESS_PORT}`;
}

export async function up(options: UpOptions, env: NodeJS.ProcessEnv): Promise<void> {
  // stdout carries the banner (URL, bootstrap key) and the stop's progress; logs go to stderr.
  const logger = createRootLogger({ level: env.CANTO_LOG_LEVEL || 'info', name: 'canto', toStderr: true });
  const say = (line: string) => process.stdout.write(`${line}\n`);
  const lock = lockDataDir(options.dataDir);
  const stops: Array<() => Promise<void>> = [async () => lock.release()];
  const stopAll = async () => {
    for (const stop of stops.splice(0).reverse()) await stop().catch((err: unknown) => logger.error({ err }, 'stop failed'));
  };

  // Signals that arrive while starting are kept for when it is done.
  let signals = 0;
  let onSignalWhileRunning: (() => void) | null = null;
  const onSignal = () => {
    signals++;
    if (signals >= 3) process.exit(130);
    onSignalWhileRunning?.();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  let scheduler: { readonly url: string; readonly ingressUrl: string | null; close(): Promise<void> };
  let lifecycle: LifecycleService;
  let databaseUrl: string;
  /** The hosts of the agents this `up` runs: its stop hibernates their desktops, no others. */
  let localHosts: string[] = [];
  try {
    const secrets = loadOrCreateSecrets(options.dataDir);
    const pg = await startEmbeddedPostgres({ dir: join(options.dataDir, 'postgres'), log: (msg) => logger.warn(msg) });
    stops.push(() => pg.stop());
    databaseUrl = pg.url;
    const ingressListen = env.CANTO_INGRESS_LISTEN || `127.0.0.1:${LOCAL_INGRESS_PORT}`;
    const ingressBaseUrl = env.CANTO_INGRESS_BASE_URL || localIngressBaseUrl(ingressListen);
    const settings = {
      ...env,
      DATABASE_URL: pg.url,
      CANTO_SECRET_KEY: env.CANTO_SECRET_KEY || secrets.secret_key,
      CANTO_JOIN_TOKEN: env.CANTO_JOIN_TOKEN || secrets.join_token,
      CANTO_ADMIN_TOKEN: env.CANTO_ADMIN_TOKEN || secrets.admin_token,
      CANTO_LISTEN: options.listen,
      // One replica per data directory (the lock sees to it): a stable name lets a restart after
      // a crash take the lease back at once instead of waiting out the dead one's TTL.
      CANTO_REPLICA_ID: env.CANTO_REPLICA_ID || 'up',
      CANTO_INGRESS_BASE_URL: ingressBaseUrl,
      CANTO_INGRESS_LISTEN: ingressListen,
      CANTO_WORKERS: env.CANTO_WORKERS || '1',
    };
    const config = loadSchedulerConfig(settings);
    scheduler = config.workers > 1
      // Workers log to stderr too: stdout is this process's, for the banner.
      ? await startSchedulerCluster({ config, env: settings, logger, workerStdout: 'stderr' })
      : await startScheduler(config, logger);
    stops.push(() => scheduler.close());
    // The stop's hibernations are requested here, whichever process runs the scheduler.
    const lifecycleSql = connectDatabase(pg.url, { max: 2 });
    stops.push(() => lifecycleSql.end({ timeout: 1 }));
    lifecycle = new LifecycleService(lifecycleSql, config.hostSlots);
    recordApiUrl(options.dataDir, scheduler.url);
    const bootstrapKey = await firstStartKey(pg.url);
    const agents = [];
    for (let i = 0; i < options.hosts; i++) {
      const agentConfig = loadAgentConfig(localAgentEnv(env, options.dataDir, scheduler.url, env.CANTO_JOIN_TOKEN || secrets.join_token, i));
      // Stops run last first: once the agent has stopped, its hibernated desktops' mounts go too.
      if (agentConfig.runtime === 'sandbox') stops.push(() => releaseDisks(join(agentConfig.stateDir, 'runtime'), logger));
      const agent = await runAgent(agentConfig, { logger, handleSignals: false });
      stops.push(() => agent.stop());
      agents.push(agent);
    }
    for (const agent of agents) await agent.waitConnected(30_000);
    localHosts = agents.map((a) => a.hostId);
    say(`Canto is up.\n  API:      ${scheduler.url}/v1\n  OpenAPI:  ${scheduler.url}/v1/openapi.json\n  Console:  ${scheduler.url}/console/ (sign in with an API key)\n  ${agents.length === 1 ? 'Host: ' : 'Hosts:'}    ${agents.map((a) => a.hostId).join(', ')}`);
    // With the token from the environment, --data-dir would read the secrets file's own token instead.
    const adminHint = env.CANTO_ADMIN_TOKEN
      ? `token: CANTO_ADMIN_TOKEN; try canto hosts list --api ${scheduler.url} with it set`
      : `token: ${join(options.dataDir, 'secrets.json')}; try canto hosts list --data-dir ${options.dataDir}`;
    say(`  Admin:    ${scheduler.url}/admin/v1 (${adminHint})`);
    if (scheduler.ingressUrl) say(`  Ingress:  ${scheduler.ingressUrl} (exposed ports: ${ingressPattern(ingressBaseUrl)})`);
    if (bootstrapKey) say(`  API key:  ${bootstrapKey}   (org "default"; shown once, store it now)`);
    say('Press Ctrl-C to stop (awake desktops are hibernated first; press it again to skip that).');
  } catch (err) {
    await stopAll();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    throw err;
  }

  await new Promise<void>((resolve) => {
    const begin = () => {
      onSignalWhileRunning = null;
      say('\nStopping Canto…');
      void hibernateAll(lifecycle, databaseUrl, localHosts, () => signals > 1, say, logger)
        .then(stopAll)
        .then(resolve);
    };
    if (signals > 0) begin();
    else onSignalWhileRunning = begin;
  });
  say('Canto stopped.');
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
}

/**
 * Hibernates every awake desktop of `hosts` (memory kept where the host can), reason `shutdown`,
 * and waits for their operations and any others at work on those hosts; stops waiting at `skip()`
 * or after HIBERNATE_ON_STOP_MS. `?wait=true` requests still open are answered when the scheduler
 * stops. Desktops on agents joined from elsewhere are left alone: their agents keep running them.
 */
async function hibernateAll(
  lifecycle: LifecycleService,
  databaseUrl: string,
  hosts: readonly string[],
  skip: () => boolean,
  say: (line: string) => void,
  logger: Logger,
): Promise<void> {
  const sql = connectDatabase(databaseUrl, { max: 1 });
  const deadline = Date.now() + HIBERNATE_ON_STOP_MS;
  const requested = new Set<string>();
  let reported = '';
  try {
    for (;;) {
      const awake = await sql<Array<{ id: string; org_id: string; open: boolean }>>`
        SELECT d.id, d.org_id, EXISTS (SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.state IN ('pending', 'running')) AS open
        FROM desktops d WHERE d.state = 'awake' AND d.host_id = ANY(${hosts as string[]}::text[])`;
      // Operations on placed desktops are at work on the host (a wake would leave one awake);
      // one still waiting for a host with room would wait for ever, and keeps for the next start.
      const [ops] = await sql<Array<{ open: number }>>`
        SELECT count(*)::int AS open FROM operations o JOIN desktops d ON d.id = o.desktop_id
        WHERE o.state IN ('pending', 'running') AND d.host_id = ANY(${hosts as string[]}::text[])`;
      const open = ops!.open;
      const fresh = awake.filter((x) => !x.open && !requested.has(x.id));
      for (const d of fresh) {
        requested.add(d.id);
        await lifecycle.request(d.org_id, d.id, 'hibernate', { expectedGeneration: null, idempotencyKey: null, reason: 'shutdown' }).catch((err: unknown) => {
          // 409: it changed state meanwhile; the next round sees it as it is.
          if (!(err instanceof ApiError)) throw err;
        });
      }
      if (fresh.length === 0 && open === 0) {
        // Still awake now means its hibernate failed (the log says why): it keeps running.
        if (requested.size > 0) say(`  hibernated ${requested.size - awake.length} of ${requested.size} desktop(s)`);
        return;
      }
      const line = `  hibernating: ${requested.size} requested, ${awake.length} still awake, ${open} operation(s) in flight`;
      if (line !== reported) say((reported = line));
      if (skip()) return say('  skipped: desktops keep running; the next start adopts them');
      if (Date.now() > deadline) return say('  gave up waiting: the rest keep running; the next start adopts them');
      await new Promise((r) => setTimeout(r, 100));
    }
  } catch (err) {
    logger.error({ err }, 'hibernating desktops before the stop failed; they keep running');
  } finally {
    await sql.end({ timeout: 1 });
  }
}

/**
 * Unmounts the overlays a stopped local agent's idle desktops (and destroyed ones not yet removed) held, so nothing of Canto stays
 * mounted once `up` has stopped (the data directory can then be removed); running desktops (a
 * stop told to skip the hibernation) keep theirs.
 */
async function releaseDisks(dir: string, logger: Logger): Promise<void> {
  const { releaseIdleDisks, sweepDiscarded } = await import('../../agent/src/runtime/sandbox/index.js');
  // The real path, as the agent's driver works on it: mounts are found by it.
  const stateDir = await realpath(dir).catch(() => dir);
  // Destroyed desktops whose removal (and overlay) the agent left for later: finished now.
  await sweepDiscarded(stateDir).catch((err: unknown) => logger.warn({ err, stateDir }, 'could not remove destroyed desktops\' files'));
  const released = await releaseIdleDisks(stateDir);
  if (released > 0) logger.info({ stateDir, released }, 'unmounted the disks of hibernated desktops');
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

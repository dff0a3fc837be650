/**
 * Scheduler start-up wiring: the one place that builds the scheduler's objects and connects them.
 * Nothing listens, reads the environment or opens the database at import time.
 *
 * Every replica serves the whole API and links to every agent; leadership (engine/leader.ts)
 * switches on the leader-only loops: the operation engine, the idle sweeper, host health and
 * the webhook dispatcher. A stopping replica hands the lease over first, answers its waits,
 * gives requests in flight a moment, and is gone within `STOP_BUDGET_MS`.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createRootLogger, type Logger } from '../../shared/src/log.js';
import { CANTO_VERSION } from '../../shared/src/version.js';
import { advertisedUrlFor, type SchedulerConfig } from './config.js';
import { connectDatabase } from './store/db.js';
import { migrate, schemaProblem } from './store/migrations.js';
import { createSecretBox, parseSecretKey } from './crypto/secret-box.js';
import { createJwtVerifier } from './auth/jwt-verifier.js';
import { createAuthenticator } from './http/auth.js';
import { buildApp, type App } from './http/app.js';
import { DesktopService } from './services/desktops.js';
import { LifecycleService } from './services/lifecycle.js';
import { OperationWaiter } from './services/waiter.js';
import { API_KEY_CHANGED_CHANNEL, DESKTOP_ROUTE_CHANNEL, NotifiedCache, ORG_CHANGED_CHANNEL } from './store/notified-cache.js';
import { UsageService } from './services/usage.js';
import { GuestService, isRoutable, routeNotification, type DesktopRoute } from './services/guest.js';
import { AgentGateway } from './agents/gateway.js';
import { OperationEngine } from './engine/engine.js';
import { Leadership } from './engine/leader.js';
import { IdleSweeper } from './engine/idle-sweeper.js';
import { HostHealth } from './engine/host-health.js';
import { WebhookService } from './services/webhooks.js';
import { WebhookDispatcher } from './webhooks/dispatcher.js';
import { deliveryQueue } from './store/webhook-deliveries.js';
import { PortService } from './services/ports.js';
import { KeyService } from './services/keys.js';
import { PortIngress } from './ingress/ingress-server.js';
import { ReplicaRegistry, REPLICA_LIVE_MS, REPLICA_REFRESH_MS } from './fleet/registry.js';
import { sharedSettings } from './fleet/settings.js';
import { SchedulerMetrics } from './observability/metrics.js';
import { AdminService } from './admin/service.js';
import { registerAdminApi } from './admin/routes.js';
import { MoveService } from './admin/moves.js';
import { AdminDesktops } from './admin/desktops.js';
import { Drainer, isDrainMove } from './engine/drainer.js';
import { bindLegacySecrets } from './crypto/desktop-secrets.js';
import { DatabaseClock } from './store/db-clock.js';

/** JWT org and desktop route lookups: a missed change is served for at most this long. */
const LOOKUP_CACHE = { ttlMs: 30_000, maxEntries: 10_000 };
/**
 * API key lookups: a revocation holds within a second on every replica, even one whose
 * notification of it never came (its listen connection silently dead): one read per key and second.
 */
const KEY_CACHE = { ttlMs: 1_000, maxEntries: 10_000 };
/** A stopping replica is gone within this long, whatever it was doing. */
export const STOP_BUDGET_MS = 5_000;
/** Requests in flight at a stop get this long before their agent links close under them. */
const DRAIN_MS = 1_500;

export interface RunningScheduler {
  readonly url: string;
  /** Where agents reach this replica (CANTO_ADVERTISE_URL, or the listener). */
  readonly advertisedUrl: string;
  readonly app: App;
  readonly leadership: Leadership;
  readonly agents: AgentGateway;
  readonly lifecycle: LifecycleService;
  readonly metrics: SchedulerMetrics;
  /** Where the port ingress listens (`http://host:port`); null when it is not enabled. */
  readonly ingressUrl: string | null;
  close(): Promise<void>;
}

/**
 * `metrics`: the registry to record into, when the caller needs it before the scheduler serves
 * (a cluster worker answers the primary's scrapes from the start, cluster/worker.ts).
 */
export async function startScheduler(config: SchedulerConfig, logger?: Logger, metrics = new SchedulerMetrics()): Promise<RunningScheduler> {
  const log = logger ?? createRootLogger({ level: config.logLevel, name: 'canto-scheduler' });
  const sql = connectDatabase(config.databaseUrl, { max: config.databasePoolMax, idleTransactionMs: config.databaseIdleTransactionMs });
  await migrate(sql);
  const secrets = createSecretBox(parseSecretKey(config.secretKey));
  // In the background: values not yet bound still open (crypto/desktop-secrets.ts), and a start
  // must not wait on a row at a time of a large deployment's desktops.
  void bindLegacySecrets(sql, secrets, log).then(
    (rebound) => rebound > 0 && log.info({ desktops: rebound }, 'sealed desktop secrets again, bound to their org'),
    (err: unknown) => log.warn({ err: (err as Error).message }, 'could not seal every desktop secret again; the next start goes on'),
  );

  let registry: ReplicaRegistry | null = null;
  let leadership: Leadership | null = null;
  const agents = new AgentGateway({
    sql,
    logger: log,
    joinToken: config.joinToken,
    portLinkSecret: config.secretKey,
    heartbeatMs: config.heartbeatMs,
    hostDownMs: config.hostDownMs,
    replicaId: config.replicaId,
    replicas: () => registry?.addresses() ?? [],
  });
  // Ages against times the database recorded are measured on its clock (store/db-clock.ts).
  const clock = new DatabaseClock(sql);
  await clock.start();
  const lifecycle = new LifecycleService(sql, config.hostSlots, config.orgDesktopQuota);
  const waiter = new OperationWaiter(sql, config.waitPollMs);
  await waiter.start();
  const authCaches = { keys: new NotifiedCache<string>(KEY_CACHE), orgs: new NotifiedCache<string>(LOOKUP_CACHE) };
  const routeCache = new NotifiedCache<DesktopRoute>(LOOKUP_CACHE);
  const unlisten = [
    await authCaches.keys.listen(sql, API_KEY_CHANGED_CHANNEL),
    await authCaches.orgs.listen(sql, ORG_CHANGED_CHANNEL),
    await routeCache.listenValues(sql, DESKTOP_ROUTE_CHANNEL, routeNotification, isRoutable),
  ];
  const stopListening = async () => {
    for (const stop of unlisten.splice(0)) await stop().catch(() => {});
  };
  // A pass is two small queries on the leader; the engine kicks one when a drain's move lands, and
  // the interval catches everything else (a drain asked for, a host back).
  // Leader-only components each ask before a pass (a stalled leader resumes with timers overdue),
  // and fence the pass's writes on the term they got: the stall may come after the asking.
  const leading = () => leadership?.isLeader() ?? false;
  const term = () => leadership?.term() ?? null;
  // Told of drains asked for, and of their moves landing and settling: the interval is a backstop.
  const drainer = new Drainer({ sql, logger: log, intervalMs: config.enginePollMs, isConnected: (id) => agents.isConnected(id), term });
  const engine = new OperationEngine({
    sql,
    clock,
    agents,
    secrets,
    logger: log,
    agentCommandTimeoutMs: config.agentCommandTimeoutMs,
    hostWaitMs: config.hostWaitMs,
    placement: config.placement,
    hostSlots: config.hostSlots,
    pollMs: config.enginePollMs,
    operationDeadlineMs: config.operationDeadlineMs,
    capacityWaitMs: config.capacityWaitMs,
    currentTerm: () => leadership?.term() ?? null,
    onSettled: (op, outcome) => {
      metrics.observeSettled(op.kind, outcome, op.created_at);
      // The drain may be over (or stopped by a failure) now.
      if (isDrainMove(op)) drainer.kick();
    },
    onMoveLanded: (op) => {
      if (isDrainMove(op)) drainer.kick();
    },
  });
  const sweeper = new IdleSweeper(sql, lifecycle, config.idleSweepMs, log, term);
  const health = new HostHealth({
    sql,
    clock,
    downMs: config.hostDownMs,
    graceMs: config.hostFailureGraceMs,
    intervalMs: Math.max(20, Math.min(250, Math.floor(config.hostDownMs / 4))),
    recordingSince: () => registry?.recordingSince() ?? null,
    isLinked: (hostId) => agents.isConnected(hostId),
    term,
    logger: log,
    onDown: () => metrics.hostsDown.inc(),
  });
  const webhooks = new WebhookDispatcher({ queue: deliveryQueue(sql), secrets, settings: config.webhooks, logger: log, leading });
  let lastEpoch = 0;
  leadership = new Leadership(sql, config.replicaId, config.leaseTtlMs, config.leaseRenewMs, {
    async establish(term) {
      lastEpoch = term.epoch;
      // First, so agents refuse the previous leader's late commands before this one sends any.
      agents.announceEpoch(term.epoch);
      await engine.start(term);
      sweeper.start();
      health.start();
      await drainer.start();
      await webhooks.start();
    },
    async revoke() {
      sweeper.stop();
      await drainer.stop();
      await health.stop();
      await Promise.all([webhooks.stop(), engine.stop()]);
    },
  }, log);

  const ports = new PortService({ sql, ingress: config.ingress });
  const keys = new KeyService(sql, authCaches.keys);
  unlisten.push(await ports.listen());
  const app = await buildApp({
    logger: log,
    authenticate: createAuthenticator(sql, config.jwt ? createJwtVerifier(config.jwt) : null, authCaches, (key) => keys.used(key)),
    desktops: new DesktopService({ sql, secrets, defaultImageVersion: config.defaultImageVersion, orgDesktopQuota: config.orgDesktopQuota }),
    lifecycle,
    waiter,
    usage: new UsageService(sql),
    guest: new GuestService(sql, agents, log, routeCache),
    webhooks: new WebhookService({ sql, secrets, allowLoopback: config.webhooks.allowLoopback }),
    ports,
    keys,
    waitCapMs: config.waitCapMs,
    metrics,
    notReady: async () => {
      try {
        return await schemaProblem(sql);
      } catch {
        return 'the database does not answer';
      }
    },
  });
  const fleetNumbers = { linked: (id: string) => agents.isConnected(id), placement: config.placement, hostSlots: config.hostSlots };
  const speaks = (id: string, major: number, minor: number) => agents.speaks(id, major, minor);
  await registerAdminApi(app, {
    service: new AdminService({ sql, keys, lifecycle, hostDownMs: config.hostDownMs, ...fleetNumbers }),
    moves: new MoveService({ sql, ...fleetNumbers, speaks }),
    desktops: new AdminDesktops(sql),
    token: config.adminToken,
    logger: log,
  });
  agents.attach(app.server);
  // Agent links only (worker-config.ts): a bare server with the gateway's upgrade and a 404 for
  // anything else, so the API is served where it always was and nowhere more.
  const agentServer = config.agentListen && createServer((_req, res) => res.writeHead(404, { 'content-type': 'text/plain' }).end('agent links only\n'));
  if (agentServer) agents.attach(agentServer);
  // Requests in flight, so a stop closes the agent links (failing their guest calls) only once
  // they are answered or out of time.
  let inFlight = 0;
  let drainedAll: (() => void) | null = null;
  app.addHook('onRequest', async (_request, reply) => {
    inFlight++;
    reply.raw.once('close', () => {
      if (--inFlight === 0) drainedAll?.();
    });
  });
  const requestsDone = (maxMs: number) =>
    inFlight === 0
      ? Promise.resolve()
      : new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, maxMs);
          drainedAll = () => {
            clearTimeout(timer);
            resolve();
          };
        });
  const abandon = async () => {
    agents.stop();
    agentServer?.close();
    await app.close();
    await stopListening();
    await waiter.stop();
    await sql.end({ timeout: 5 });
  };
  let ingress: PortIngress | null = null;
  try {
    await app.listen({ host: config.listenHost, port: config.listenPort });
    if (agentServer && config.agentListen) await listenExclusive(agentServer, config.agentListen);
    ingress = config.ingress && (await PortIngress.start({ settings: config.ingress, ports, portLinkSecret: config.secretKey, logger: log }));
  } catch (err) {
    await abandon();
    throw err;
  }
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.listenPort;
  const url = advertisedUrlFor(config.listenHost === '0.0.0.0' || config.listenHost === '::' ? '127.0.0.1' : config.listenHost, port);
  const advertisedUrl = agentServer && config.agentListen
    ? agentLinkUrl(config.advertiseUrl, config.agentListen.host, (agentServer.address() as AddressInfo).port)
    : config.advertiseUrl ?? advertisedUrlFor(config.listenHost, port);
  registry = new ReplicaRegistry({
    sql,
    self: { id: config.replicaId, url: advertisedUrl, version: CANTO_VERSION, settings: sharedSettings(config) },
    refreshMs: REPLICA_REFRESH_MS,
    liveMs: REPLICA_LIVE_MS,
    logger: log,
    linkedHosts: () => agents.connectedHostIds(),
  });
  registry.onChange((replicas) => agents.announceReplicas(replicas));
  metrics.attach({
    sql,
    agentLinks: () => agents.connectedHostIds().length,
    isLeader: () => leadership.isLeader(),
    leaseEpoch: () => lastEpoch,
  });
  try {
    await registry.start();
    await leadership.start();
  } catch (err) {
    // Its refresh timer and subscription would otherwise run on against an ended pool.
    await registry.stop().catch(() => undefined);
    await ingress?.close();
    await abandon();
    throw err;
  }
  log.info({ url, advertised_url: advertisedUrl, replica: config.replicaId, version: CANTO_VERSION }, 'scheduler listening');

  let closing: Promise<void> | null = null;
  return {
    url,
    advertisedUrl,
    app,
    leadership,
    agents,
    lifecycle,
    metrics,
    ingressUrl: ingress?.url ?? null,
    close() {
      closing ??= (async () => {
        const started = Date.now();
        // The lease first: a follower takes over at once (its notification), not after the TTL.
        await leadership.stop();
        waiter.release();
        await registry.stop();
        // New requests get 503 from here; those in flight get a moment before their links go.
        const closed = app.close();
        agentServer?.close();
        await requestsDone(DRAIN_MS);
        agents.stop();
        const force = setTimeout(() => {
          app.server.closeAllConnections();
          agentServer?.closeAllConnections();
        }, Math.max(0, STOP_BUDGET_MS - 1_000 - (Date.now() - started)));
        await closed;
        clearTimeout(force);
        await ingress?.close();
        await stopListening();
        await waiter.stop();
        clock.stop();
        await sql.end({ timeout: 1 });
      })();
      return closing;
    },
  };
}

/**
 * Listens on a port of this process's own even in a cluster worker (where a plain listen would
 * share the port among all workers through the primary): the agent that dials it must reach
 * exactly this replica.
 */
function listenExclusive(server: Server, address: { host: string; port: number }): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: address.host, port: address.port, exclusive: true }, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/**
 * The URL agents reach an agent-link listener at: `CANTO_ADVERTISE_URL` (its scheme, host and
 * path) with the listener's port, else the listener's own address.
 */
function agentLinkUrl(advertise: string | null, host: string, port: number): string {
  if (advertise === null) return advertisedUrlFor(host, port);
  const url = new URL(advertise);
  url.port = String(port);
  return url.toString().replace(/\/+$/, '');
}

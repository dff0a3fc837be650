/**
 * Scheduler start-up wiring: the one place that builds the scheduler's objects and connects them.
 * Nothing listens, reads the environment or opens the database at import time.
 */
import { createRootLogger, type Logger } from '../../shared/src/log.js';
import type { SchedulerConfig } from './config.js';
import { connectDatabase } from './store/db.js';
import { migrate } from './store/migrations.js';
import { createSecretBox, parseSecretKey } from './crypto/secret-box.js';
import { createJwtVerifier } from './auth/jwt-verifier.js';
import { createAuthenticator } from './http/auth.js';
import { buildApp, type App } from './http/app.js';
import { DesktopService } from './services/desktops.js';
import { LifecycleService } from './services/lifecycle.js';
import { OperationWaiter } from './services/waiter.js';
import { API_KEY_CHANGED_CHANNEL, DESKTOP_CHANGED_CHANNEL, NotifiedCache, ORG_CHANGED_CHANNEL } from './store/notified-cache.js';
import { UsageService } from './services/usage.js';
import { GuestService, type DesktopRoute } from './services/guest.js';
import { AgentGateway } from './agents/gateway.js';
import { OperationEngine } from './engine/engine.js';
import { Leadership } from './engine/leader.js';
import { IdleSweeper } from './engine/idle-sweeper.js';
import { HostRecovery } from './engine/host-recovery.js';
import { WebhookService } from './services/webhooks.js';
import { WebhookDispatcher } from './webhooks/dispatcher.js';
import { deliveryQueue } from './store/webhook-deliveries.js';
import { PortService } from './services/ports.js';
import { PortIngress } from './ingress/ingress-server.js';
import { formatHost } from '../../shared/src/host-port.js';

/** API key, JWT org and desktop route lookups: a missed change is served for at most this long. */
const LOOKUP_CACHE = { ttlMs: 30_000, maxEntries: 10_000 };

export interface RunningScheduler {
  readonly url: string;
  readonly app: App;
  readonly leadership: Leadership;
  readonly agents: AgentGateway;
  /** Where the port ingress listens (`http://host:port`); null when it is not enabled. */
  readonly ingressUrl: string | null;
  close(): Promise<void>;
}

export async function startScheduler(config: SchedulerConfig, logger?: Logger): Promise<RunningScheduler> {
  const log = logger ?? createRootLogger({ level: config.logLevel, name: 'canto-scheduler' });
  const sql = connectDatabase(config.databaseUrl, { max: 20 });
  await migrate(sql);
  const secrets = createSecretBox(parseSecretKey(config.secretKey));

  let leadership: Leadership | null = null;
  const isLeader = () => leadership?.isLeader() ?? false;
  const agents = new AgentGateway({
    sql, logger: log, joinToken: config.joinToken, portLinkSecret: config.secretKey, heartbeatMs: config.heartbeatMs, isLeader,
  });
  const lifecycle = new LifecycleService(sql, { isLeader }, Math.max(1, Math.ceil(config.leaseTtlMs / 1000)), config.hostSlots);
  const waiter = new OperationWaiter(sql, config.waitPollMs);
  await waiter.start();
  const authCaches = { keys: new NotifiedCache<string>(LOOKUP_CACHE), orgs: new NotifiedCache<string>(LOOKUP_CACHE) };
  const routeCache = new NotifiedCache<DesktopRoute>(LOOKUP_CACHE);
  const unlisten = [
    await authCaches.keys.listen(sql, API_KEY_CHANGED_CHANNEL),
    await authCaches.orgs.listen(sql, ORG_CHANGED_CHANNEL),
    await routeCache.listen(sql, DESKTOP_CHANGED_CHANNEL),
  ];
  const stopListening = async () => {
    for (const stop of unlisten.splice(0)) await stop();
  };
  const engine = new OperationEngine({
    sql,
    agents,
    secrets,
    logger: log,
    holder: config.replicaId,
    agentCommandTimeoutMs: config.agentCommandTimeoutMs,
    hostWaitMs: config.hostWaitMs,
    overcommit: { cpu: config.cpuOvercommit, memory: config.memoryOvercommit },
    hostSlots: config.hostSlots,
    pollMs: config.enginePollMs,
    operationDeadlineMs: config.operationDeadlineMs,
  });
  const sweeper = new IdleSweeper(sql, lifecycle, config.idleSweepMs, log);
  const recovery = new HostRecovery(sql, () => agents.connectedHostIds(), config.hostFailureGraceMs, Math.min(5_000, config.hostFailureGraceMs), log);
  const webhooks = new WebhookDispatcher({ queue: deliveryQueue(sql), secrets, settings: config.webhooks, logger: log });
  leadership = new Leadership(sql, config.replicaId, config.leaseTtlMs, config.leaseRenewMs, {
    async establish() {
      await engine.start();
      sweeper.start();
      recovery.start();
      await webhooks.start();
    },
    async revoke() {
      sweeper.stop();
      recovery.stop();
      await webhooks.stop();
      agents.closeAll();
      await engine.stop();
    },
  }, log);

  const ports = new PortService({ sql, ingress: config.ingress });
  unlisten.push(await ports.listen());
  const app = await buildApp({
    logger: log,
    authenticate: createAuthenticator(sql, config.jwt ? createJwtVerifier(config.jwt) : null, authCaches),
    desktops: new DesktopService({ sql, secrets, defaultImageVersion: config.defaultImageVersion }),
    lifecycle,
    waiter,
    usage: new UsageService(sql),
    guest: new GuestService(sql, agents, log, routeCache),
    webhooks: new WebhookService({ sql, secrets, allowLoopback: config.webhooks.allowLoopback }),
    ports,
    waitCapMs: config.waitCapMs,
  });
  agents.attach(app.server);
  await app.listen({ host: config.listenHost, port: config.listenPort });
  let ingress: PortIngress | null = null;
  try {
    ingress = config.ingress && (await PortIngress.start({ settings: config.ingress, ports, portLinkSecret: config.secretKey, logger: log }));
  } catch (err) {
    await app.close();
    await stopListening();
    await waiter.stop();
    await sql.end({ timeout: 5 });
    throw err;
  }
  await leadership.start();
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : config.listenPort;
  const host = formatHost(config.listenHost);
  const url = `http://${host === '0.0.0.0' ? '127.0.0.1' : host}:${port}`;
  log.info({ url, replica: config.replicaId }, 'scheduler listening');

  let closing: Promise<void> | null = null;
  return {
    url,
    app,
    leadership,
    agents,
    ingressUrl: ingress?.url ?? null,
    close() {
      closing ??= (async () => {
        await leadership.stop();
        agents.closeAll();
        await ingress?.close();
        await app.close();
        await stopListening();
        await waiter.stop();
        await sql.end({ timeout: 5 });
      })();
      return closing;
    },
  };
}

/**
 * Scheduler configuration: read once in main from `CANTO_*` environment variables (and flags the
 * CLI maps onto the same names), validated, and frozen. Every option documents its default and
 * unit; durations end in `Ms`. docs/operators.md lists them all.
 */
import { randomUUID } from 'node:crypto';
import { isIP } from 'node:net';
import { availableParallelism, hostname } from 'node:os';
import { formatHostPort, parseHostPort } from '../../shared/src/host-port.js';
import { IDLE_TRANSACTION_MS } from './store/db.js';

export interface JwtSettings {
  readonly jwksUrl: string;
  readonly issuer: string;
  readonly audience: string;
  /** Claim naming the caller's org (its name; the org is created on first sight). */
  readonly orgClaim: string;
}

/** Webhook delivery (docs/api.md §4.8, 6); docs/operators.md has the retry schedule these produce. */
export interface WebhookSettings {
  /**
   * `CANTO_WEBHOOK_ALLOW_LOOPBACK`: `true` lets endpoints use loopback hosts and plain `http://`,
   * for local development. Link-local and other blocked ranges stay refused. Default `false`.
   */
  readonly allowLoopback: boolean;
  /** `CANTO_WEBHOOK_TIMEOUT_MS`: one attempt (resolve, connect, TLS, response headers). Default 10000. */
  readonly timeoutMs: number;
  /** `CANTO_WEBHOOK_MAX_ATTEMPTS`: attempts per delivery, the first included. Default 10. */
  readonly maxAttempts: number;
  /** `CANTO_WEBHOOK_RETRY_BASE_MS`: nominal wait after the first failure; doubles each time. Default 30000. */
  readonly retryBaseMs: number;
  /** `CANTO_WEBHOOK_RETRY_MAX_MS`: cap on the nominal wait. Default 3600000. */
  readonly retryMaxMs: number;
  /** `CANTO_WEBHOOK_POLL_MS`: how often the dispatcher looks for due retries. Default 1000. */
  readonly pollMs: number;
  /** `CANTO_WEBHOOK_CONCURRENCY`: attempts in flight at once. Default 16. */
  readonly concurrency: number;
  /**
   * `CANTO_WEBHOOK_HOSTS`: `name=address[,name=address]` pins receiver host names to addresses
   * instead of DNS (split-horizon setups, test rigs). Pinned addresses pass the same guard. Default none.
   */
  readonly hosts: Readonly<Record<string, string>>;
}

/**
 * The port ingress (docs/api.md §4.7): an HTTP server of its own that routes
 * `Host: {port}-{desktop_id}.{domain}` to a port inside a desktop, through its host's agent.
 */
export interface IngressSettings {
  /**
   * `CANTO_INGRESS_BASE_URL`: `http(s)://domain[:port]`, the origin exposure URLs are built on:
   * `<scheme>://{port}-{desktop_id}.<domain>[:<port>]`. TLS, when the scheme is https, is
   * terminated in front of the ingress. Unset: no ingress (creating an exposure answers 501).
   */
  readonly scheme: 'http' | 'https';
  /** The base URL's host name, lowercase. */
  readonly domain: string;
  /** The base URL's explicit port, kept in exposure URLs; null when it has none. */
  readonly urlPort: number | null;
  /** `CANTO_INGRESS_LISTEN`: HOST:PORT the ingress listens on. Default `0.0.0.0:8081`. */
  readonly listenHost: string;
  readonly listenPort: number;
  /**
   * `CANTO_INGRESS_MOVE_HOLD_MS`: how long a request to a desktop that a move has stopped waits
   * for it to run on its target before it is answered 503. Default 10000; 0 answers at once.
   */
  readonly moveHoldMs: number;
}

export interface SchedulerConfig {
  /** `DATABASE_URL`: postgres:// URL; `?host=/dir` selects a unix socket directory. Required. */
  readonly databaseUrl: string;
  /** `CANTO_LISTEN`: HOST:PORT for the HTTP API and the agent link. Default `127.0.0.1:8080`. */
  readonly listenHost: string;
  readonly listenPort: number;
  /**
   * `CANTO_WORKERS`: scheduler processes sharing the listeners, each a replica of its own
   * (scheduler/src/cluster/). `1` runs the scheduler in this process. Default: the CPU cores.
   */
  readonly workers: number;
  /**
   * `CANTO_AGENT_LISTEN`: HOST:PORT of a listener that takes agent links only; worker `i` (from 1)
   * listens on PORT + i - 1, or on a port of its own when PORT is 0. Null (unset): agents link
   * over the API listener, and with several workers each takes a port of its own on the API host.
   */
  readonly agentListen: { readonly host: string; readonly port: number } | null;
  /** `CANTO_DB_POOL_MAX`: database connections for queries, shared out among the workers. Default 20. */
  readonly databasePoolMax: number;
  /**
   * `CANTO_DB_IDLE_TRANSACTION_MS`: the `idle_in_transaction_session_timeout` every connection
   * asks for (store/db.ts). Default 5000; `0` asks for none (a pooler that refuses the startup
   * parameter, or one set on the role instead).
   */
  readonly databaseIdleTransactionMs: number;
  /** `CANTO_SECRET_KEY`: base64 (or hex) 32-byte key sealing desktop env/setup_script. Required. */
  readonly secretKey: string;
  /** `CANTO_JOIN_TOKEN`: the token agents present to join. Unset: no agent can join. */
  readonly joinToken: string | null;
  /**
   * `CANTO_ADMIN_TOKEN`: the bearer token of the admin API (`/admin/v1`), at least
   * `ADMIN_TOKEN_MIN_LENGTH` printable characters. Unset: every admin route answers 503.
   */
  readonly adminToken: string | null;
  /** `CANTO_JWT_JWKS_URL`, `CANTO_JWT_ISSUER`, `CANTO_JWT_AUDIENCE`, `CANTO_JWT_ORG_CLAIM` (default `org_id`). Unset URL: JWTs are refused. */
  readonly jwt: JwtSettings | null;
  /** `CANTO_REPLICA_ID`: this replica's name in the leader lease and the replica registry. Default: random. */
  readonly replicaId: string;
  /**
   * `CANTO_ADVERTISE_URL`: the base URL agents (and `canto status`) reach this replica at.
   * Default: `http://<listen host>:<port>`, with the machine's host name for a wildcard address,
   * or with an agent-link listener (`agentListen`) its address. Null when unset: main.ts derives
   * it from the listener agents use once its port is known.
   */
  readonly advertiseUrl: string | null;
  /** `CANTO_LEASE_TTL_MS`: leader lease lifetime. Default 2500. */
  readonly leaseTtlMs: number;
  /** `CANTO_LEASE_RENEW_MS`: how often the leader renews (and followers try). Default min(500, TTL/3); at most TTL/2. */
  readonly leaseRenewMs: number;
  /** `CANTO_WAIT_CAP_MS`: the `?wait=true` cap. Default 120000 (docs/api.md §4.1). */
  readonly waitCapMs: number;
  /** `CANTO_WAIT_POLL_MS`: `?wait=true` poll cadence behind the notification. Default 2000. */
  readonly waitPollMs: number;
  /** `CANTO_ENGINE_POLL_MS`: how often the engine looks for work it was not notified of. Default 500. */
  readonly enginePollMs: number;
  /** `CANTO_IDLE_SWEEP_MS`: idle-timeout sweep interval. Default 1000. */
  readonly idleSweepMs: number;
  /** `CANTO_AGENT_TIMEOUT_MS`: per agent command. Default 60000. */
  readonly agentCommandTimeoutMs: number;
  /** `CANTO_HEARTBEAT_MS`: heartbeat interval agents are told to use. Default 1000. */
  readonly heartbeatMs: number;
  /** `CANTO_HOST_DOWN_MS`: a host silent this long reads `down` and its links are dropped. Default 2.25 heartbeats (2250). */
  readonly hostDownMs: number;
  /** `CANTO_HOST_FAILURE_GRACE_MS`: a host silent this long has its awake desktops force-hibernated. Default 60000. */
  readonly hostFailureGraceMs: number;
  /** `CANTO_HOST_WAIT_MS`: how long an operation waits for its host's agent to (re)connect. Default 30000. */
  readonly hostWaitMs: number;
  /** `CANTO_OPERATION_DEADLINE_MS`: retryable failures are retried until this age. Default 300000. */
  readonly operationDeadlineMs: number;
  /**
   * `CANTO_CAPACITY_WAIT_MS`: how long a wake (or a move) waits for a host with room before it
   * fails with `no_capacity`. Default 30000.
   */
  readonly capacityWaitMs: number;
  /** How placement judges a host's room (scheduler/src/placement/feasible.ts). */
  readonly placement: {
    /**
     * `CANTO_CPU_OVERCOMMIT`, `CANTO_MEMORY_OVERCOMMIT`: nominal caps, multipliers on a host's
     * reported CPU and memory that the running desktops' tier sizes must fit in. 0 (the default)
     * is no cap: measured memory decides.
     */
    readonly cpuOvercommit: number;
    readonly memoryOvercommit: number;
    /** `CANTO_MEMORY_RESERVE_PERCENT`: share of a host's memory placement keeps free, by measured use. Default 10. */
    readonly memoryReservePercent: number;
    /**
     * `CANTO_DESKTOP_EXPECTED_MB`: memory counted for a desktop its host's last measure does not
     * show yet (just placed or woken), and for every running desktop of a host that reports no
     * measure, in MiB. Default 256.
     */
    readonly desktopExpectedMb: number;
  };
  /**
   * `CANTO_HOST_SLOTS`: storage slots per host. Every placed desktop holds its tier's slots
   * (small 1, default 2, large 4) awake or hibernated; placement and fork need free ones. Default 2048.
   */
  readonly hostSlots: number;
  /**
   * `CANTO_ORG_DESKTOP_QUOTA`: desktops an org may hold (not destroyed, forks asked for included);
   * a create or fork past it is refused with 409. `0`: no quota. Default 1000.
   */
  readonly orgDesktopQuota: number;
  /** `CANTO_DEFAULT_IMAGE`: image_version of desktops created without one. Default `debian-12`. */
  readonly defaultImageVersion: string;
  /** `CANTO_WEBHOOK_*`: webhook delivery settings. */
  readonly webhooks: WebhookSettings;
  /** `CANTO_INGRESS_*`: the port ingress; null when `CANTO_INGRESS_BASE_URL` is unset. */
  readonly ingress: IngressSettings | null;
  /** `CANTO_LOG_LEVEL`: pino level. Default `info`. */
  readonly logLevel: string;
}

type Env = Readonly<Record<string, string | undefined>>;

function int(env: Env, name: string, fallback: number, min = 0): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new Error(`${name} must be an integer >= ${min}, got "${raw}"`);
  return Number(raw);
}

function num(env: Env, name: string, fallback: number, zeroAllowed = false): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0 || (value === 0 && !zeroAllowed)) {
    throw new Error(`${name} must be a ${zeroAllowed ? 'non-negative' : 'positive'} number, got "${raw}"`);
  }
  return value;
}

function percent(env: Env, name: string, fallback: number): number {
  const value = num(env, name, fallback, true);
  if (value >= 100) throw new Error(`${name} must be below 100, got "${env[name]}"`);
  return value;
}

export function parseListen(value: string): { host: string; port: number } {
  const address = parseHostPort(value);
  if (address === null) throw new Error(`listen address must be HOST:PORT ([v6]:PORT), got "${value}"`);
  return address;
}

export function loadSchedulerConfig(env: Env): SchedulerConfig {
  const databaseUrl = env.DATABASE_URL;
  if (!databaseUrl) throw new Error('DATABASE_URL is required');
  const secretKey = env.CANTO_SECRET_KEY;
  if (!secretKey) throw new Error('CANTO_SECRET_KEY is required (32 bytes, base64)');
  const listen = parseListen(env.CANTO_LISTEN || '127.0.0.1:8080');
  const jwt = env.CANTO_JWT_JWKS_URL
    ? {
        jwksUrl: env.CANTO_JWT_JWKS_URL,
        issuer: required(env, 'CANTO_JWT_ISSUER'),
        audience: required(env, 'CANTO_JWT_AUDIENCE'),
        orgClaim: env.CANTO_JWT_ORG_CLAIM || 'org_id',
      }
    : null;
  const leaseTtlMs = int(env, 'CANTO_LEASE_TTL_MS', 2_500, 500);
  const leaseRenewMs = int(env, 'CANTO_LEASE_RENEW_MS', Math.min(500, Math.floor(leaseTtlMs / 3)), 100);
  // A leader renewing less often loses its lease to one late or failed renewal, and the lease
  // then changes hands over and over.
  if (leaseRenewMs * 2 > leaseTtlMs) throw new Error(`CANTO_LEASE_RENEW_MS (${leaseRenewMs}) must be at most half of CANTO_LEASE_TTL_MS (${leaseTtlMs})`);
  const heartbeatMs = int(env, 'CANTO_HEARTBEAT_MS', 1_000, 20);
  // Two heartbeats missed and a quarter of one more: 2.25 s by default.
  const hostDownMs = int(env, 'CANTO_HOST_DOWN_MS', heartbeatMs * 2 + Math.round(heartbeatMs / 4), 1);
  if (hostDownMs <= heartbeatMs) throw new Error(`CANTO_HOST_DOWN_MS (${hostDownMs}) must be longer than CANTO_HEARTBEAT_MS (${heartbeatMs})`);
  const workers = int(env, 'CANTO_WORKERS', Math.max(1, availableParallelism()), 1);
  const agentListen = env.CANTO_AGENT_LISTEN ? parseListen(env.CANTO_AGENT_LISTEN) : null;
  if (agentListen && agentListen.port !== 0 && agentListen.port + workers - 1 > 65_535) {
    throw new Error(`CANTO_AGENT_LISTEN port ${agentListen.port} leaves no room for ${workers} workers (ports ${agentListen.port}..${agentListen.port + workers - 1})`);
  }
  return Object.freeze({
    databaseUrl,
    listenHost: listen.host,
    listenPort: listen.port,
    workers,
    agentListen: agentListen && Object.freeze(agentListen),
    databasePoolMax: int(env, 'CANTO_DB_POOL_MAX', 20, 1),
    databaseIdleTransactionMs: int(env, 'CANTO_DB_IDLE_TRANSACTION_MS', IDLE_TRANSACTION_MS),
    secretKey,
    joinToken: env.CANTO_JOIN_TOKEN || null,
    adminToken: loadAdminToken(env),
    jwt: jwt && Object.freeze(jwt),
    replicaId: env.CANTO_REPLICA_ID || `sched-${randomUUID().slice(0, 8)}`,
    advertiseUrl: parseAdvertiseUrl(env.CANTO_ADVERTISE_URL),
    leaseTtlMs,
    leaseRenewMs,
    waitCapMs: int(env, 'CANTO_WAIT_CAP_MS', 120_000, 1),
    waitPollMs: int(env, 'CANTO_WAIT_POLL_MS', 2_000, 10),
    enginePollMs: int(env, 'CANTO_ENGINE_POLL_MS', 500, 10),
    idleSweepMs: int(env, 'CANTO_IDLE_SWEEP_MS', 1_000, 10),
    agentCommandTimeoutMs: int(env, 'CANTO_AGENT_TIMEOUT_MS', 60_000, 100),
    heartbeatMs,
    hostDownMs,
    hostWaitMs: int(env, 'CANTO_HOST_WAIT_MS', 30_000, 0),
    hostFailureGraceMs: int(env, 'CANTO_HOST_FAILURE_GRACE_MS', 60_000, 100),
    operationDeadlineMs: int(env, 'CANTO_OPERATION_DEADLINE_MS', 300_000, 1_000),
    capacityWaitMs: int(env, 'CANTO_CAPACITY_WAIT_MS', 30_000, 0),
    placement: Object.freeze({
      cpuOvercommit: num(env, 'CANTO_CPU_OVERCOMMIT', 0, true),
      memoryOvercommit: num(env, 'CANTO_MEMORY_OVERCOMMIT', 0, true),
      memoryReservePercent: percent(env, 'CANTO_MEMORY_RESERVE_PERCENT', 10),
      desktopExpectedMb: int(env, 'CANTO_DESKTOP_EXPECTED_MB', 256, 1),
    }),
    hostSlots: int(env, 'CANTO_HOST_SLOTS', 2048, 1),
    orgDesktopQuota: int(env, 'CANTO_ORG_DESKTOP_QUOTA', 1000, 0),
    defaultImageVersion: env.CANTO_DEFAULT_IMAGE || 'debian-12',
    webhooks: loadWebhookSettings(env),
    ingress: loadIngressSettings(env),
    logLevel: env.CANTO_LOG_LEVEL || 'info',
  });
}

/** The URL agents dial this replica at, as `CANTO_ADVERTISE_URL` gives it; null when unset. */
function parseAdvertiseUrl(raw: string | undefined): string | null {
  const value = raw?.trim();
  if (value) {
    let url: URL;
    try {
      url = new URL(value);
    } catch {
      throw new Error(`CANTO_ADVERTISE_URL must be an http(s) URL, got "${value}"`);
    }
    if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.username || url.password || url.search || url.hash) {
      throw new Error(`CANTO_ADVERTISE_URL must be an http(s) URL without credentials, query or fragment, got "${value}"`);
    }
    return url.toString().replace(/\/+$/, '');
  }
  return null;
}

/** `http://host:port` for a listener; a wildcard address stands for the machine's host name. */
export function advertisedUrlFor(host: string, port: number): string {
  const name = host === '0.0.0.0' || host === '::' ? hostname() : host;
  return `http://${formatHostPort(name, port)}`;
}

/** The admin token's shortest length: a short one could be guessed, and it opens the whole fleet. */
export const ADMIN_TOKEN_MIN_LENGTH = 32;

function loadAdminToken(env: Env): string | null {
  const raw = env.CANTO_ADMIN_TOKEN;
  if (raw === undefined || raw === '') return null;
  // Printable ASCII without spaces: what a bearer credential can carry in a header.
  if (raw.length < ADMIN_TOKEN_MIN_LENGTH || !/^[\x21-\x7e]+$/.test(raw)) {
    throw new Error(
      `CANTO_ADMIN_TOKEN must be at least ${ADMIN_TOKEN_MIN_LENGTH} printable characters without spaces ` +
        `(for example the output of \`openssl rand -base64 32\`); the one given has ${raw.length} characters`,
    );
  }
  return raw;
}

function required(env: Env, name: string): string {
  const value = env[name];
  if (!value) throw new Error(`${name} is required when CANTO_JWT_JWKS_URL is set`);
  return value;
}

function loadWebhookSettings(env: Env): WebhookSettings {
  const flag = env.CANTO_WEBHOOK_ALLOW_LOOPBACK || 'false';
  if (flag !== 'true' && flag !== 'false') throw new Error(`CANTO_WEBHOOK_ALLOW_LOOPBACK must be true or false, got "${flag}"`);
  const hosts: Record<string, string> = {};
  for (const entry of (env.CANTO_WEBHOOK_HOSTS ?? '').split(',').map((e) => e.trim()).filter(Boolean)) {
    const match = /^([^=\s]+)=([0-9a-fA-F.:]+)$/.exec(entry);
    if (!match || !isIP(match[2]!)) throw new Error(`CANTO_WEBHOOK_HOSTS entries must be name=ip-address, got "${entry}"`);
    hosts[match[1]!.toLowerCase().replace(/\.$/, '')] = match[2]!;
  }
  const retryBaseMs = int(env, 'CANTO_WEBHOOK_RETRY_BASE_MS', 30_000, 1);
  return Object.freeze({
    allowLoopback: flag === 'true',
    timeoutMs: int(env, 'CANTO_WEBHOOK_TIMEOUT_MS', 10_000, 100),
    maxAttempts: int(env, 'CANTO_WEBHOOK_MAX_ATTEMPTS', 10, 1),
    retryBaseMs,
    retryMaxMs: int(env, 'CANTO_WEBHOOK_RETRY_MAX_MS', Math.max(3_600_000, retryBaseMs), retryBaseMs),
    pollMs: int(env, 'CANTO_WEBHOOK_POLL_MS', 1_000, 10),
    concurrency: int(env, 'CANTO_WEBHOOK_CONCURRENCY', 16, 1),
    hosts: Object.freeze(hosts),
  });
}

function loadIngressSettings(env: Env): IngressSettings | null {
  const raw = env.CANTO_INGRESS_BASE_URL?.trim();
  if (!raw) return null;
  const problem = `CANTO_INGRESS_BASE_URL must be an http:// or https:// origin with a domain name (e.g. https://apps.example.com), got "${raw}"`;
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new Error(problem);
  }
  // Exposure hosts are `{port}-{desktop_id}.<domain>`: the domain must be a name that can take a
  // label in front of it, not an IP literal, and nothing but an origin makes sense as the base.
  const domain = url.hostname.toLowerCase().replace(/\.$/, '');
  if (
    (url.protocol !== 'http:' && url.protocol !== 'https:') ||
    url.username || url.password || url.search || url.hash || (url.pathname !== '/' && url.pathname !== '') ||
    !/^[a-z0-9-]+(\.[a-z0-9-]+)*$/.test(domain) || isIP(domain) !== 0
  ) {
    throw new Error(problem);
  }
  const listen = parseListen(env.CANTO_INGRESS_LISTEN || '0.0.0.0:8081');
  return Object.freeze({
    scheme: url.protocol === 'https:' ? 'https' : 'http',
    domain,
    urlPort: url.port === '' ? null : Number(url.port),
    listenHost: listen.host,
    listenPort: listen.port,
    moveHoldMs: int(env, 'CANTO_INGRESS_MOVE_HOLD_MS', 10_000),
  });
}

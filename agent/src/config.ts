/**
 * Agent configuration: one pure function turns the environment and the command-line flags into a
 * frozen, validated object. Nothing here reads `process.env` by itself, so tests build configs
 * from plain objects and the daemon's `main.ts` is the only place that touches the real process.
 *
 * Precedence is flag, then environment variable, then default. Every option documents its default
 * and unit; durations are milliseconds and their names end in `Ms`. A missing or malformed value
 * throws at startup with the name of the flag or variable to fix, rather than surfacing later as
 * a confusing connection failure.
 */

import { hostname } from 'node:os';
import { parseHostPort } from '../../shared/src/host-port.js';
import { defaultLifecycleSlots } from './lifecycle-slots.js';
import { parseSwitch, RUNTIME_SWITCHES } from './env-switch.js';

export type AgentRuntime = 'sandbox' | 'fake';

export interface AgentConfig {
  /**
   * http(s) base URLs of the scheduler replicas, e.g. `https://canto.example.com`, given
   * comma-separated: seeds the agent dials until it has a link, after which it links to every
   * live replica the schedulers advertise (scheduler-links.ts). Required.
   */
  readonly schedulerUrls: readonly string[];
  /**
   * Join token presented as `Authorization: Bearer <token>`. Required; never logged. The CLI reads
   * it from `--token-file` / `CANTO_AGENT_TOKEN_FILE` (never from its command line) or takes
   * `CANTO_AGENT_TOKEN`.
   */
  readonly token: string;
  /** Directory for the host id, the fencing store and the runtime's disks. Default `/var/lib/canto-agent`. */
  readonly stateDir: string;
  /** Runtime driver. Default `sandbox`; `fake` is an in-memory driver for tests. */
  readonly runtime: AgentRuntime;
  /** Keep memory on hibernate (CRIU). Default true; false forces a cold stop. */
  readonly memorySnapshots: boolean;
  /** New desktops start as clones of a pre-booted template (sandbox runtime with CRIU). */
  readonly goldenTemplates: boolean;
  /** Starts, hibernates and forks run at once on this host (lifecycle-slots.ts); 0 = no bound. Default four per core. */
  readonly lifecycleSlots: number;
  /** Heartbeat interval in ms when the scheduler does not set one. Default 1000. */
  readonly heartbeatMs: number;
  /** First reconnect delay in ms; doubles per failed attempt. Default 100. */
  readonly reconnectMinMs: number;
  /** Cap on the reconnect delay in ms, also used after a refused token. Default 2000. */
  readonly reconnectMaxMs: number;
  /** pino level: trace, debug, info, warn, error, fatal or silent. Default `info`. */
  readonly logLevel: string;
  /**
   * Where the stream gateway listens for VNC clients holding a ticket, `host:port`. Default
   * `0.0.0.0:7010`; port 0 picks a free port; `off` turns streaming off (the API answers 501).
   */
  readonly streamListen: { readonly host: string; readonly port: number } | null;
  /**
   * Where the port gateway listens for the scheduler's ingress, `host:port` (shared/src/port-link.ts).
   * Default `0.0.0.0:7011`; port 0 picks a free port; `off` turns port exposures off on this host.
   */
  readonly ingressListen: { readonly host: string; readonly port: number } | null;
  /**
   * `CANTO_AGENT_METRICS_LISTEN`: where `/healthz`, `/readyz` and `/metrics` are served,
   * `host:port`, or `off`. Default `127.0.0.1:7012`.
   */
  readonly metricsListen: { readonly host: string; readonly port: number } | null;
  /**
   * `CANTO_AGENT_TRANSFER_LISTEN`: where other agents fetch desktops being moved off this host,
   * `host:port` (agent/src/transfer/server.ts). Default `0.0.0.0:7013`; port 0 picks a free port;
   * `off` means desktops cannot be moved off this host (moves onto it still work).
   */
  readonly transferListen: { readonly host: string; readonly port: number } | null;
  /**
   * The host name or address that stream clients, the scheduler's ingress and other agents
   * fetching moved desktops dial to reach this agent's listeners. Default: this machine's hostname.
   */
  readonly address: string;
}

/** Command-line flags, as commander names them (`--state-dir` → `stateDir`). */
export interface AgentFlags {
  readonly scheduler?: string;
  readonly token?: string;
  readonly stateDir?: string;
  readonly runtime?: string;
  readonly logLevel?: string;
}

export type Env = Readonly<Record<string, string | undefined>>;

const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

export function loadAgentConfig(env: Env, flags: AgentFlags = {}): AgentConfig {
  const pick = (flag: string | undefined, name: string): string | undefined => {
    const value = flag ?? env[name];
    return value === undefined || value.trim() === '' ? undefined : value.trim();
  };

  const schedulerUrls = parseSchedulerUrls(pick(flags.scheduler, 'CANTO_SCHEDULER_URL'));
  const token = pick(flags.token, 'CANTO_AGENT_TOKEN');
  if (token === undefined) {
    throw new Error('agent config: the join token is required (--token-file FILE, CANTO_AGENT_TOKEN_FILE or CANTO_AGENT_TOKEN)');
  }

  const runtime = pick(flags.runtime, 'CANTO_AGENT_RUNTIME') ?? 'sandbox';
  if (runtime !== 'sandbox' && runtime !== 'fake') {
    throw new Error(`agent config: CANTO_AGENT_RUNTIME must be "sandbox" or "fake", got "${runtime}"`);
  }

  const logLevel = pick(flags.logLevel, 'CANTO_LOG_LEVEL') ?? 'info';
  if (!LOG_LEVELS.includes(logLevel)) {
    throw new Error(`agent config: log level must be one of ${LOG_LEVELS.join(', ')}, got "${logLevel}"`);
  }

  const reconnectMinMs = parseMs(env, 'CANTO_AGENT_RECONNECT_MIN_MS', 100);
  const reconnectMaxMs = parseMs(env, 'CANTO_AGENT_RECONNECT_MAX_MS', 2_000);
  if (reconnectMaxMs < reconnectMinMs) {
    throw new Error('agent config: CANTO_AGENT_RECONNECT_MAX_MS must not be below CANTO_AGENT_RECONNECT_MIN_MS');
  }

  // Read where they are used; checked here so that a misspelt one stops the start.
  for (const [name, fallback] of Object.entries(RUNTIME_SWITCHES)) parseBoolean(env, name, fallback);
  return Object.freeze({
    schedulerUrls,
    token,
    stateDir: pick(flags.stateDir, 'CANTO_AGENT_STATE_DIR') ?? '/var/lib/canto-agent',
    runtime,
    memorySnapshots: parseBoolean(env, 'CANTO_AGENT_MEMORY_SNAPSHOTS', true),
    goldenTemplates: parseBoolean(env, 'CANTO_AGENT_GOLDEN_TEMPLATES', true),
    lifecycleSlots: parseCount(env, 'CANTO_AGENT_LIFECYCLE_CONCURRENCY', defaultLifecycleSlots()),
    heartbeatMs: parseMs(env, 'CANTO_AGENT_HEARTBEAT_MS', 1000),
    reconnectMinMs,
    reconnectMaxMs,
    logLevel,
    streamListen: parseListen(env, 'CANTO_AGENT_STREAM_LISTEN', '0.0.0.0:7010'),
    ingressListen: parseListen(env, 'CANTO_AGENT_INGRESS_LISTEN', '0.0.0.0:7011'),
    metricsListen: parseListen(env, 'CANTO_AGENT_METRICS_LISTEN', '127.0.0.1:7012'),
    transferListen: parseListen(env, 'CANTO_AGENT_TRANSFER_LISTEN', '0.0.0.0:7013'),
    address: env.CANTO_AGENT_ADDRESS?.trim() || hostname(),
  });
}

/** `host:port` (IPv6 in brackets), or `off`. */
function parseListen(env: Env, name: string, fallback: string): { host: string; port: number } | null {
  const raw = env[name]?.trim() || fallback;
  if (raw.toLowerCase() === 'off') return null;
  const address = parseHostPort(raw);
  if (address === null) throw new Error(`agent config: ${name} must be host:port or off, got "${raw}"`);
  return address;
}

function parseSchedulerUrls(value: string | undefined): readonly string[] {
  if (value === undefined) {
    throw new Error('agent config: the scheduler URL is required (--scheduler or CANTO_SCHEDULER_URL)');
  }
  return Object.freeze(value.split(',').map((part) => parseSchedulerUrl(part.trim())));
}

function parseSchedulerUrl(value: string): string {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new Error(`agent config: the scheduler URL "${value}" is not a valid URL`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new Error(`agent config: the scheduler URL must be http or https, got "${url.protocol}"`);
  }
  if (url.username || url.password) {
    // Credentials belong in the token, which is kept out of logs; a URL is logged freely.
    throw new Error('agent config: the scheduler URL must not carry credentials; use --token-file');
  }
  // A trailing slash would double up when the websocket path is appended.
  return url.toString().replace(/\/+$/, '');
}

function parseMs(env: Env, name: string, fallback: number): number {
  const raw = env[name]?.trim();
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value <= 0) {
    throw new Error(`agent config: ${name} must be a positive integer number of milliseconds, got "${raw}"`);
  }
  return value;
}

function parseCount(env: Env, name: string, fallback: number): number {
  const raw = env[name]?.trim();
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!/^[0-9]+$/.test(raw) || !Number.isSafeInteger(value)) {
    throw new Error(`agent config: ${name} must be a whole number (0 for no bound), got "${raw}"`);
  }
  return value;
}

function parseBoolean(env: Env, name: string, fallback: boolean): boolean {
  return parseSwitch(name, env[name], fallback);
}

/**
 * The agent's connection manager. The agent always dials out (hosts sit behind NAT and firewalls;
 * the scheduler never needs to reach them) to `ws(s)://<scheduler>/internal/agents/ws`,
 * authenticates with its join token as a bearer header, and then:
 *
 * 1. wraps the socket in an `RpcPeer` and registers the command handlers;
 * 2. says hello — protocol version, host id, agent instance id, capabilities, capacity, the
 *    desktops it holds with their fenced generations and where its port gateway listens — and
 *    validates the scheduler's reply;
 * 3. sends a heartbeat notification every `heartbeat_ms` (set by the scheduler in its reply) and a
 *    websocket ping beside it; a scheduler that stops answering pings is dropped as dead, because
 *    a half-open TCP connection would otherwise look connected for ever.
 *
 * Any close or error reconnects with capped exponential backoff and jitter (`reconnectMinMs`
 * doubling up to `reconnectMaxMs`), reset once a hello succeeds. Refusals an operator has to fix —
 * a 401/403 on the upgrade (bad token), a rejected hello (protocol major mismatch) — are logged as
 * errors and retried at the maximum delay rather than crashing the daemon: the fix is usually made
 * on the scheduler while the agent keeps waiting. Replays after a reconnect are safe because
 * every command is idempotent and fenced (see `handlers.ts`).
 */
import { availableParallelism, hostname, totalmem } from 'node:os';
import WebSocket from 'ws';
import type { Logger } from '../../shared/src/log.js';
import {
  AgentFailure,
  HeartbeatPayload,
  HelloPayload,
  HelloResult,
  PROTOCOL_VERSION,
  protocolAtLeast,
  parseMessage,
  protocolMajor,
} from '../../shared/src/protocol.js';
import { RpcPeer } from '../../shared/src/rpc.js';
import type { AgentConfig } from './config.js';
import { GenerationStore } from './generations.js';
import { CommandHandlers } from './handlers.js';
import { StreamGateway } from './stream/gateway.js';
import { fencePortLine } from './ports/fence.js';
import { PortGateway } from './ports/gateway.js';
import { loadHostIdentity, type HostIdentity } from './host-identity.js';
import type { RuntimeDriver } from './runtime/driver.js';

export interface AgentHandle {
  readonly hostId: string;
  /** True between a successful hello and the next disconnect. */
  connected(): boolean;
  /** Resolves once connected (at once if already); rejects after `timeoutMs` or on stop. */
  waitConnected(timeoutMs: number): Promise<void>;
  /** Closes the link, clears every timer and closes the driver; desktops keep running. */
  stop(): Promise<void>;
}

export interface StartAgentOptions {
  readonly config: AgentConfig;
  readonly driver: RuntimeDriver;
  readonly logger: Logger;
}

export const AGENT_SOCKET_PATH = '/internal/agents/ws';
const HANDSHAKE_TIMEOUT_MS = 10_000;
const HELLO_TIMEOUT_MS = 15_000;
const CLOSE_TIMEOUT_MS = 2_000;
/** Floor on the scheduler-chosen heartbeat interval, so a bad reply cannot make us spin. */
const MIN_HEARTBEAT_MS = 20;

/** `http://host:8080/base` → `ws://host:8080/base/internal/agents/ws` (https → wss). */
export function agentSocketUrl(schedulerUrl: string): string {
  const url = new URL(schedulerUrl);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  url.pathname = `${url.pathname.replace(/\/+$/, '')}${AGENT_SOCKET_PATH}`;
  return url.toString();
}

/** Starts dialing the scheduler and returns at once; use `waitConnected` to wait for the hello. */
export async function startAgent(options: StartAgentOptions): Promise<AgentHandle> {
  const identity = await loadHostIdentity(options.config.stateDir);
  const generations = await GenerationStore.open(options.config.stateDir);
  const stream = await startStreamGateway(options);
  let ports: PortGateway | null;
  try {
    ports = await startPortGateway(options, generations);
  } catch (err) {
    await stream?.close();
    throw err;
  }
  const channel = new AgentChannel(options, identity, generations, stream, ports);
  channel.connect();
  return {
    hostId: identity.hostId,
    connected: () => channel.isConnected,
    waitConnected: (timeoutMs) => channel.waitConnected(timeoutMs),
    stop: () => channel.stop(),
  };
}

/**
 * The stream gateway, where this host takes VNC clients holding a ticket; none when streaming
 * is turned off or the runtime has no computer-use support (stream grants then answer 501).
 */
async function startStreamGateway(options: StartAgentOptions): Promise<StreamGateway | null> {
  const listen = options.config.streamListen;
  if (listen === null || !options.driver.capabilities().computerUse) return null;
  const log = options.logger.child({ component: 'stream-gateway' });
  return StreamGateway.start({
    listenHost: listen.host,
    port: listen.port,
    advertiseHost: options.config.address,
    open: (desktopId, viewOnly) => options.driver.openVnc(desktopId, viewOnly),
    log: (msg, fields) => log.info(fields ?? {}, msg),
  });
}

/**
 * The port gateway, where the scheduler's ingress reaches ports inside this host's desktops with
 * lines signed by this host's port-link key (shared/src/port-link.ts), which the hello reply
 * brings; none when turned off. Each line is
 * fenced against the generations this host holds (ports/fence.ts) before the port is opened.
 */
async function startPortGateway(options: StartAgentOptions, generations: GenerationStore): Promise<PortGateway | null> {
  const listen = options.config.ingressListen;
  if (listen === null) return null;
  const log = options.logger.child({ component: 'port-gateway' });
  return PortGateway.start({
    listenHost: listen.host,
    port: listen.port,
    open: async (target) => {
      fencePortLine(generations.get(target.desktopId), target);
      return options.driver.openGuestPort(target.desktopId, target.port);
    },
    log: (msg, fields) => log.info(fields ?? {}, msg),
  });
}

/** One socket's life, from dial to close. */
interface Connection {
  readonly ws: WebSocket;
  ready: boolean;
  /** Set when the scheduler refused us for a reason an operator must fix: retry slowly. */
  refused: boolean;
  heartbeat?: NodeJS.Timeout;
  beating: boolean;
  lastSeenAt: number;
}

interface Waiter {
  resolve(): void;
  reject(error: Error): void;
  timer: NodeJS.Timeout;
}

class AgentChannel {
  isConnected = false;
  private readonly log: Logger;
  /** Websocket URLs of the scheduler replicas; `dialIndex` is the one dialed next. */
  private readonly urls: readonly string[];
  private dialIndex = 0;
  private url: string;
  private readonly handlers: CommandHandlers;
  private current?: Connection;
  private attempt = 0;
  private reconnectTimer?: NodeJS.Timeout;
  private stopping?: Promise<void>;
  private readonly waiters = new Set<Waiter>();

  constructor(
    private readonly options: StartAgentOptions,
    private readonly identity: HostIdentity,
    private readonly generations: GenerationStore,
    private readonly stream: StreamGateway | null,
    private readonly ports: PortGateway | null,
  ) {
    this.log = options.logger.child({ component: 'agent-channel', host_id: identity.hostId });
    this.urls = options.config.schedulerUrls.map(agentSocketUrl);
    this.url = this.urls[0]!;
    this.handlers = new CommandHandlers({ driver: options.driver, generations, logger: options.logger, stream });
  }

  connect(): void {
    this.reconnectTimer = undefined;
    if (this.stopping) return;
    this.url = this.urls[this.dialIndex % this.urls.length]!;
    const ws = new WebSocket(this.url, {
      headers: { authorization: `Bearer ${this.options.config.token}` },
      handshakeTimeout: HANDSHAKE_TIMEOUT_MS,
      perMessageDeflate: false,
      // RFC 6455 masks client frames so a hostile script in a browser cannot choose the bytes an
      // intermediary sees. The agent is not a browser and its payloads are not attacker-chosen
      // framing, while masking costs a byte-by-byte JavaScript loop on both ends (a file read
      // streams megabytes agent → scheduler). A zero mask makes ws skip the work on both sides.
      generateMask: (mask: Buffer) => void mask.fill(0),
    });
    const conn: Connection = { ws, ready: false, refused: false, beating: false, lastSeenAt: Date.now() };
    this.current = conn;
    ws.on('unexpected-response', (_req, res) => {
      res.resume();
      const status = res.statusCode ?? 0;
      if (status === 401 || status === 403) {
        conn.refused = true;
        this.log.error({ status, url: this.url }, 'scheduler refused the join token; check --token / CANTO_AGENT_TOKEN');
      } else {
        this.log.warn({ status, url: this.url }, 'scheduler answered the websocket upgrade with an HTTP error');
      }
      ws.terminate();
    });
    ws.on('error', (err) => {
      if (!conn.refused && !this.stopping) this.log.warn({ url: this.url, attempt: this.attempt, message: err.message }, 'agent link error');
    });
    ws.on('pong', () => (conn.lastSeenAt = Date.now()));
    ws.on('message', () => (conn.lastSeenAt = Date.now()));
    ws.once('open', () => void this.onOpen(conn));
    ws.once('close', () => this.onClose(conn));
  }

  waitConnected(timeoutMs: number): Promise<void> {
    if (this.isConnected) return Promise.resolve();
    if (this.stopping) return Promise.reject(new Error('agent is stopped'));
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        resolve,
        reject,
        timer: setTimeout(() => {
          this.waiters.delete(waiter);
          reject(new Error(`agent did not connect to the scheduler within ${timeoutMs} ms`));
        }, timeoutMs),
      };
      this.waiters.add(waiter);
    });
  }

  stop(): Promise<void> {
    this.stopping ??= this.shutdown();
    return this.stopping;
  }

  private async shutdown(): Promise<void> {
    clearTimeout(this.reconnectTimer);
    this.settleWaiters(new Error('agent is stopped'));
    const conn = this.current;
    if (conn) await closeSocket(conn.ws);
    await this.stream?.close();
    await this.ports?.close();
    await this.options.driver.close();
    this.log.info('agent stopped');
  }

  private async onOpen(conn: Connection): Promise<void> {
    const peer = new RpcPeer(conn.ws, (message) => this.log.warn({ message }, 'protocol error on the agent link'));
    this.handlers.register(peer);
    try {
      const hello = parseMessage(HelloPayload, await this.helloPayload(), 'hello payload');
      const reply = parseMessage(HelloResult, await peer.request('hello', hello, HELLO_TIMEOUT_MS), 'hello reply');
      if (protocolMajor(reply.protocol) < protocolMajor(PROTOCOL_VERSION)) {
        // An older scheduler cannot understand a newer major, even if it failed to say so.
        throw new AgentFailure('unsupported', `scheduler speaks protocol ${reply.protocol}, agent ${PROTOCOL_VERSION}`, false);
      }
      if (!peer.isOpen || this.stopping) return;
      peer.binaryStreams = protocolAtLeast(reply.protocol, 1, 6);
      // A scheduler before 1.6 sends no key: its ingress still signs with the join token.
      this.ports?.setKey(reply.port_link_key ?? this.options.config.token);
      conn.ready = true;
      this.isConnected = true;
      this.attempt = 0;
      this.settleWaiters();
      const configured = reply.heartbeat_ms > 0 ? reply.heartbeat_ms : this.options.config.heartbeatMs;
      const interval = Math.max(MIN_HEARTBEAT_MS, configured);
      this.log.info({ url: this.url, protocol: reply.protocol, heartbeat_ms: interval }, 'connected to the scheduler');
      void this.beat(conn, peer, interval);
      conn.heartbeat = setInterval(() => void this.beat(conn, peer, interval), interval);
    } catch (err) {
      if (err instanceof AgentFailure && !err.retryable) {
        conn.refused = true;
        this.log.error({ code: err.code, message: err.message }, 'hello refused; retrying at the maximum delay');
      } else {
        this.log.warn({ message: err instanceof Error ? err.message : String(err) }, 'hello failed');
      }
      conn.ws.terminate();
    }
  }

  private async helloPayload(): Promise<HelloPayload> {
    const { driver } = this.options;
    const capabilities = driver.capabilities();
    const desktops = await driver.list();
    return {
      protocol: PROTOCOL_VERSION,
      host_id: this.identity.hostId,
      agent_instance_id: this.identity.agentInstanceId,
      hostname: hostname(),
      capabilities: { runtime: capabilities.runtime, memory_snapshots: capabilities.memorySnapshots },
      capacity: { vcpus: availableParallelism(), memory_mb: Math.floor(totalmem() / (1024 * 1024)) },
      desktops: desktops.map((d) => ({
        desktop_id: d.desktopId,
        generation: this.generations.get(d.desktopId) ?? 0,
        running: d.running,
        has_snapshot: d.hasSnapshot,
      })),
      ...(this.ports === null ? {} : { ingress: { host: this.options.config.address, port: this.ports.port } }),
    };
  }

  private async beat(conn: Connection, peer: RpcPeer, intervalMs: number): Promise<void> {
    // Five silent intervals (and at least 15 s, so a busy scheduler is not dropped) mean the
    // scheduler or the path to it is gone without a close; reconnecting is the only way out.
    if (Date.now() - conn.lastSeenAt > Math.max(5 * intervalMs, 15_000)) {
      this.log.warn('scheduler stopped answering pings; reconnecting');
      conn.ws.terminate();
      return;
    }
    if (conn.beating || !peer.isOpen) return;
    conn.beating = true;
    try {
      conn.ws.ping();
      const running = (await this.options.driver.list()).filter((d) => d.running).length;
      peer.notify('heartbeat', parseMessage(HeartbeatPayload, { running_desktops: running }, 'heartbeat'));
    } catch (err) {
      this.log.warn({ message: err instanceof Error ? err.message : String(err) }, 'heartbeat failed');
    } finally {
      conn.beating = false;
    }
  }

  private onClose(conn: Connection): void {
    clearInterval(conn.heartbeat);
    if (this.current === conn) {
      this.current = undefined;
      this.isConnected = false;
    }
    if (this.stopping) return;
    const { reconnectMinMs, reconnectMaxMs } = this.options.config;
    // Jitter spreads a fleet of agents that lost the same scheduler over the delay window.
    const delay = conn.refused
      ? reconnectMaxMs * (0.8 + 0.2 * Math.random())
      : Math.min(reconnectMaxMs, reconnectMinMs * 2 ** Math.min(this.attempt, 30)) * (0.5 + 0.5 * Math.random());
    this.attempt++;
    // A replica that never took us (a follower answers 503, or it is down): try the next one.
    // After a working link drops, the same replica is tried first; it is likely still the leader.
    if (!conn.ready) this.dialIndex++;
    if (conn.ready) this.log.warn({ retry_ms: Math.round(delay) }, 'lost the scheduler link; reconnecting');
    else this.log.debug({ retry_ms: Math.round(delay), attempt: this.attempt }, 'reconnecting');
    this.reconnectTimer = setTimeout(() => this.connect(), delay);
  }

  private settleWaiters(error?: Error): void {
    for (const waiter of this.waiters) {
      clearTimeout(waiter.timer);
      if (error) waiter.reject(error);
      else waiter.resolve();
    }
    this.waiters.clear();
  }
}

/** Closes politely, then forcibly if the peer does not answer; resolves once the socket is closed. */
function closeSocket(ws: WebSocket): Promise<void> {
  if (ws.readyState === WebSocket.CLOSED) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => ws.terminate(), CLOSE_TIMEOUT_MS);
    ws.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
    if (ws.readyState === WebSocket.OPEN) ws.close(1000, 'agent stopping');
    else ws.terminate();
  });
}

/**
 * The agent's links to the scheduler replicas: one to each live replica, so that whichever replica
 * a client reaches serves this host's guest operations, screens and streams over its own link.
 *
 * Where the links go:
 * - the configured URLs (`--scheduler`, comma-separated) are seeds: dialed while no link is up,
 *   to find the fleet (a seed may be a load balancer);
 * - every hello reply and `cluster` notification lists the live replicas' advertised URLs, and
 *   each gets a link of its own, kept with its own reconnect backoff until the replica leaves
 *   the list;
 * - the upgrade response names the replica (`x-canto-replica`): a second link to a replica
 *   already linked (a seed that is its load balancer) is dropped before its hello, and that URL
 *   waits until the first link goes.
 *
 * Each link says hello with the desktops this host holds. The reply names the leader's current
 * epoch (lifecycle commands of older terms are refused from then on, leader-epochs.ts) and any
 * desktop this host runs that its record says may not run; those are stopped, keeping their
 * memory, before the link reports `host.ready` (fleet/hello-fence.ts on the scheduler).
 *
 * Liveness both ways: heartbeats.ts sends a heartbeat and a ping on every link each interval (the
 * scheduler chooses it) and drops a replica that stops answering.
 *
 * Refusals an operator has to fix (a bad join token, a scheduler without one, a protocol the
 * scheduler does not speak) are logged as errors naming the cause and retried at the maximum
 * delay; the fix is usually made on the scheduler while the agent keeps waiting.
 */
import type { IncomingMessage } from 'node:http';
import WebSocket from 'ws';
import type { Logger } from '../../shared/src/log.js';
import {
  AgentFailure,
  ClusterPayload,
  HelloPayload,
  HelloResult,
  PROTOCOL_VERSION,
  REFUSAL_HEADER,
  REPLICA_HEADER,
  protocolAtLeast,
  parseMessage,
  protocolMajor,
  type ReplicaAddress,
} from '../../shared/src/protocol.js';
import { RpcPeer } from '../../shared/src/rpc.js';
import type { AgentConfig } from './config.js';
import type { GenerationStore } from './generations.js';
import type { CommandHandlers } from './handlers.js';
import type { HostIdentity } from './host-identity.js';
import type { LeaderEpochs } from './leader-epochs.js';
import type { PortGateway } from './ports/gateway.js';
import type { RuntimeDriver } from './runtime/driver.js';
import { buildHello } from './hello.js';
import { beatingMeanwhile, Heartbeats, type BeatingLink } from './heartbeats.js';
import type { HostMeter } from './host-meter.js';

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

export interface SchedulerLinksOptions {
  readonly config: AgentConfig;
  readonly driver: RuntimeDriver;
  readonly identity: HostIdentity;
  readonly generations: GenerationStore;
  readonly handlers: CommandHandlers;
  readonly epochs: LeaderEpochs;
  readonly ports: PortGateway | null;
  /** The transfer server (transfer/server.ts); null when it is turned off. */
  readonly transfer?: { readonly port: number } | null;
  readonly logger: Logger;
  /** The protocol version said in hello when not this build's (channel.ts `StartAgentOptions`). */
  readonly announceProtocol?: string;
  /** What the heartbeats report of the host's use (host-meter.ts). */
  readonly meter: HostMeter;
}

/** A URL the agent dials: a seed, a replica's advertised URL, or both. */
interface Target {
  readonly url: string;
  seed: boolean;
  /** In the latest replica list. */
  advertised: boolean;
  /** The replica behind it, once known (from the list, or the upgrade response). */
  replicaId: string | null;
  conn: Connection | null;
  attempt: number;
  timer: NodeJS.Timeout | null;
}

/** One socket's life, from dial to close. */
interface Connection {
  readonly ws: WebSocket;
  readonly target: Target;
  replicaId: string | null;
  /** Holds its replica's claim (the one link to that replica). */
  claimed: boolean;
  ready: boolean;
  /** The replica refused us for a reason an operator must fix: retry slowly. */
  refused: boolean;
  peer: RpcPeer | null;
  /** `performance.now()` of the last pong or message: a monotonic clock, which wall-clock steps do not move. */
  lastSeenAt: number;
}

interface Waiter {
  resolve(): void;
  reject(error: Error): void;
  timer: NodeJS.Timeout;
}

export class SchedulerLinks {
  private readonly targets = new Map<string, Target>();
  /** The one connection to each replica, claimed at its upgrade response. */
  private readonly claims = new Map<string, Connection>();
  private readonly waiters = new Set<Waiter>();
  private heartbeatMs: number;
  private readonly heartbeats: Heartbeats;
  private stopping = false;
  private readonly log: Logger;

  constructor(private readonly options: SchedulerLinksOptions) {
    this.log = options.logger.child({ component: 'agent-channel', host_id: options.identity.hostId });
    this.heartbeatMs = options.config.heartbeatMs;
    // An agent standing for an older release reports no measured use, as that release did not.
    const measured = options.announceProtocol === undefined || protocolAtLeast(options.announceProtocol, 1, 11);
    this.heartbeats = new Heartbeats(options.meter, () => this.readyConnections().map((c) => this.beating(c)), this.log, measured);
    for (const url of options.config.schedulerUrls) this.target(agentSocketUrl(url)).seed = true;
  }

  start(): void {
    this.dialWanted();
  }

  get isConnected(): boolean {
    return this.readyConnections().length > 0;
  }

  /** Replica ids this agent has a working link to. */
  linkedReplicas(): string[] {
    return this.readyConnections().map((c) => c.replicaId ?? c.target.url);
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

  async stop(): Promise<void> {
    this.stopping = true;
    this.heartbeats.stop();
    this.settleWaiters(new Error('agent is stopped'));
    const closing: Array<Promise<void>> = [];
    for (const target of this.targets.values()) {
      if (target.timer) clearTimeout(target.timer);
      if (target.conn) closing.push(closeSocket(target.conn.ws));
    }
    await Promise.all(closing);
  }

  private beating(conn: Connection): BeatingLink {
    return { ws: conn.ws, peer: conn.peer, lastSeenAt: conn.lastSeenAt, label: { url: conn.target.url, replica: conn.replicaId } };
  }

  private readyConnections(): Connection[] {
    return [...this.targets.values()].flatMap((t) => (t.conn?.ready ? [t.conn] : []));
  }

  private target(url: string): Target {
    let target = this.targets.get(url);
    if (!target) {
      target = { url, seed: false, advertised: false, replicaId: null, conn: null, attempt: 0, timer: null };
      this.targets.set(url, target);
    }
    return target;
  }

  /** A target is dialed while its replica has no other link: always if advertised, seeds only with no link at all. */
  private wanted(target: Target): boolean {
    if (this.stopping || target.conn !== null) return false;
    if (target.replicaId !== null && this.claims.has(target.replicaId)) return false;
    return target.advertised || (target.seed && !this.isConnected);
  }

  private dialWanted(): void {
    for (const target of this.targets.values()) {
      if (target.timer === null && this.wanted(target)) this.dial(target);
    }
  }

  private dial(target: Target): void {
    target.timer = null;
    if (!this.wanted(target)) return;
    const ws = new WebSocket(target.url, {
      headers: { authorization: `Bearer ${this.options.config.token}` },
      handshakeTimeout: HANDSHAKE_TIMEOUT_MS,
      perMessageDeflate: false,
      // RFC 6455 masks client frames so a hostile script in a browser cannot choose the bytes an
      // intermediary sees. The agent is not a browser and its payloads are not attacker-chosen
      // framing, while masking costs work on both ends (a file read streams megabytes agent →
      // scheduler). A zero mask makes ws skip it on both sides.
      generateMask: (mask: Buffer) => void mask.fill(0),
    });
    const conn: Connection = { ws, target, replicaId: null, claimed: false, ready: false, refused: false, peer: null, lastSeenAt: performance.now() };
    target.conn = conn;
    ws.on('upgrade', (res: IncomingMessage) => {
      const replica = res.headers[REPLICA_HEADER];
      if (typeof replica === 'string' && replica !== '') this.claim(conn, replica);
    });
    ws.on('unexpected-response', (_req, res) => {
      res.resume();
      const status = res.statusCode ?? 0;
      const refusal = res.headers[REFUSAL_HEADER];
      if (refusal === 'no-join-token') {
        conn.refused = true;
        this.log.error({ url: target.url }, 'this scheduler has no join token configured (CANTO_JOIN_TOKEN is unset there): it accepts no agent until its operator sets one');
      } else if (status === 401 || status === 403) {
        conn.refused = true;
        this.log.error({ status, url: target.url }, 'the scheduler refused the join token: check --token-file / CANTO_AGENT_TOKEN against its CANTO_JOIN_TOKEN');
      } else {
        this.log.warn({ status, url: target.url }, 'the scheduler answered the websocket upgrade with an HTTP error');
      }
      ws.terminate();
    });
    ws.on('error', (err) => {
      if (!conn.refused && !this.stopping) this.log.warn({ url: target.url, attempt: target.attempt, message: err.message }, 'agent link error');
    });
    ws.on('pong', () => (conn.lastSeenAt = performance.now()));
    ws.on('message', () => (conn.lastSeenAt = performance.now()));
    ws.once('open', () => void this.onOpen(conn));
    ws.once('close', () => this.onClose(conn));
  }

  /** Takes the replica's one link for `conn`; false (and the socket dropped) if another holds it. */
  private claim(conn: Connection, replicaId: string): boolean {
    conn.replicaId = replicaId;
    conn.target.replicaId ??= replicaId;
    const holder = this.claims.get(replicaId);
    if (holder !== undefined && holder !== conn) {
      this.log.debug({ url: conn.target.url, replica: replicaId }, 'already linked to this replica; dropping the second link');
      conn.ws.terminate();
      return false;
    }
    this.claims.set(replicaId, conn);
    conn.claimed = true;
    return true;
  }

  private async onOpen(conn: Connection): Promise<void> {
    if (this.stopping || conn.ws.readyState !== WebSocket.OPEN) return;
    const peer = new RpcPeer(conn.ws, (message) => this.log.warn({ message }, 'protocol error on the agent link'));
    conn.peer = peer;
    this.options.handlers.register(peer);
    peer.handle('cluster', async (raw) => {
      const news = parseMessage(ClusterPayload, raw, 'cluster');
      if (news.leader_epoch !== undefined) this.options.epochs.observe(news.leader_epoch);
      if (news.replicas !== undefined) this.updateReplicas(news.replicas);
    });
    try {
      const { driver, identity, generations, ports, config, transfer = null } = this.options;
      const at = (listener: { port: number } | null) => (listener === null ? null : { host: config.address, port: listener.port });
      const hello = parseMessage(
        HelloPayload,
        await buildHello({ driver, identity, generations, ingress: at(ports), transfer: at(transfer), protocol: this.options.announceProtocol }),
        'hello payload',
      );
      const reply = parseMessage(HelloResult, await peer.request('hello', hello, HELLO_TIMEOUT_MS), 'hello reply');
      if (protocolMajor(reply.protocol) < protocolMajor(PROTOCOL_VERSION)) {
        // An older scheduler cannot understand a newer major, even if it failed to say so.
        throw new AgentFailure('unsupported', `scheduler speaks protocol ${reply.protocol}, agent ${PROTOCOL_VERSION}`, false);
      }
      if (reply.replica_id !== undefined && !conn.claimed && !this.claim(conn, reply.replica_id)) return;
      if (!peer.isOpen || this.stopping) return;
      if (reply.leader_epoch !== undefined) this.options.epochs.observe(reply.leader_epoch);
      peer.binaryStreams = protocolAtLeast(reply.protocol, 1, 6);
      // A scheduler before 1.6 sends no key, and its ingress signed with the join token, which
      // every agent holds: any of them could have opened this host's desktops' ports. Its lines
      // are refused, and a hello without a key leaves the one another replica gave in place.
      if (reply.port_link_key !== undefined) this.options.ports?.setKey(reply.port_link_key);
      if (reply.heartbeat_ms > 0) this.heartbeatMs = Math.max(MIN_HEARTBEAT_MS, reply.heartbeat_ms);
      if (reply.replicas !== undefined) this.updateReplicas(reply.replicas);
      if (protocolAtLeast(reply.protocol, 1, 7)) {
        const stopped = await beatingMeanwhile(peer, this.heartbeatMs, () => this.options.handlers.fence(reply.fence ?? []));
        if (!peer.isOpen || this.stopping) return;
        peer.notify('host.ready', { stopped });
      }
      conn.ready = true;
      conn.target.attempt = 0;
      this.settleWaiters();
      this.log.info({ url: conn.target.url, replica: conn.replicaId, protocol: reply.protocol, heartbeat_ms: this.heartbeatMs }, 'connected to the scheduler');
      await this.heartbeats.start(this.heartbeatMs, this.beating(conn));
    } catch (err) {
      if (err instanceof AgentFailure && !err.retryable) {
        conn.refused = true;
        this.log.error({ code: err.code, message: err.message, url: conn.target.url }, 'hello refused; retrying at the maximum delay');
      } else {
        this.log.warn({ message: err instanceof Error ? err.message : String(err), url: conn.target.url }, 'hello failed');
      }
      conn.ws.terminate();
    }
  }

  /** Adopts the live replica list: a target per replica, dialed; targets of departed ones go once idle. */
  private updateReplicas(replicas: readonly ReplicaAddress[]): void {
    const listed = new Map<string, ReplicaAddress>();
    for (const r of replicas) {
      try {
        listed.set(agentSocketUrl(r.url), r);
      } catch {
        this.log.warn({ replica: r.id }, 'a replica advertises a URL that is not one; ignoring it');
      }
    }
    for (const [url, r] of listed) {
      const target = this.target(url);
      target.advertised = true;
      target.replicaId = r.id;
    }
    for (const target of [...this.targets.values()]) {
      if (listed.has(target.url)) continue;
      target.advertised = false;
      if (!target.seed && target.conn === null) {
        if (target.timer) clearTimeout(target.timer);
        this.targets.delete(target.url);
      }
    }
    this.dialWanted();
  }

  private onClose(conn: Connection): void {
    const target = conn.target;
    if (target.conn === conn) target.conn = null;
    const released = conn.claimed && conn.replicaId !== null && this.claims.get(conn.replicaId) === conn;
    if (released) this.claims.delete(conn.replicaId!);
    if (this.stopping) return;
    if (conn.ready) this.log.warn({ url: target.url, replica: conn.replicaId }, 'lost a scheduler link; reconnecting');
    // A link that was dropped for being a second one to its replica waits for the first to go.
    const duplicate = !conn.claimed && conn.replicaId !== null && this.claims.has(conn.replicaId);
    if (!duplicate) this.scheduleRedial(target, conn.refused, conn.ready);
    if (!target.seed && !target.advertised) this.targets.delete(target.url);
    // Another URL of the same replica (parked while this one held it), or the seeds (no link
    // left at all), may be wanted now.
    this.dialWanted();
  }

  private scheduleRedial(target: Target, refused: boolean, wasReady: boolean): void {
    if (target.timer) clearTimeout(target.timer);
    const { reconnectMinMs, reconnectMaxMs } = this.options.config;
    // Jitter spreads a fleet of agents that lost the same scheduler over the delay window.
    const delay = refused
      ? reconnectMaxMs * (0.8 + 0.2 * Math.random())
      : Math.min(reconnectMaxMs, reconnectMinMs * 2 ** Math.min(target.attempt, 30)) * (0.5 + 0.5 * Math.random());
    if (!wasReady) target.attempt++;
    target.timer = setTimeout(() => this.dial(target), delay);
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

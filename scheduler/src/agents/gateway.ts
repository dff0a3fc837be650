/**
 * The scheduler's end of the agent link. Agents dial `/internal/agents/ws` with their join token
 * as a bearer credential; the upgrade is refused (401) before any websocket exists when the token
 * is wrong, so an unauthenticated process can neither register a host nor receive commands.
 *
 * Every replica accepts agents, and every agent keeps a link to every live replica (it learns
 * them from the hello reply and from `cluster` notifications): whichever replica a client
 * reaches serves guest operations, screens and streams over its own link, with no hop through the
 * leader. Only the leader's engine sends lifecycle commands, each carrying its lease epoch; the
 * agent refuses a command from an older term. The upgrade response names the replica, so an agent
 * that reached it twice (a load balancer and its direct address) drops the second link at once.
 *
 * Liveness is application heartbeats, not TCP: a link not heard from for `hostDownMs` is dropped,
 * which fails its calls in flight (503 to clients, never a hang) and answers new ones with 503 at
 * once. Every replica records the heartbeats it hears in `hosts.last_seen_at`; the leader's host
 * health loop marks silent hosts down from that record (engine/host-health.ts).
 *
 * A hello is answered with the desktops the host must stop before it takes work (see
 * fleet/hello-fence.ts); the host reads `ready` once the agent says it has (`host.ready`).
 */
import { portLinkKey } from '../../../shared/src/port-link.js';
import type { IncomingMessage, Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer } from 'ws';
import type { Logger } from '../../../shared/src/log.js';
import {
  AGENT_COMMANDS,
  AgentFailure,
  HeartbeatPayload,
  HelloPayload,
  HostReadyPayload,
  PROTOCOL_VERSION,
  REFUSAL_HEADER,
  REPLICA_HEADER,
  protocolAtLeast,
  parseMessage,
  protocolMajor,
  type AgentCommand,
  type ClusterPayload,
  type CommandPayload,
  type CommandResult,
  type HelloResult,
} from '../../../shared/src/protocol.js';
import { RpcPeer } from '../../../shared/src/rpc.js';
import type { Sql } from '../store/db.js';
import { markHostReady, touchHost, upsertHost } from '../store/hosts.js';
import { recordCopyProgress } from '../store/moves.js';
import { ImportProgressPayload } from '../../../shared/src/transfer.js';
import { LEADER_LEASE, readLease } from '../store/leases.js';
import { hashToken, safeEqualHex } from '../crypto/secret-box.js';
import { formatHostPort } from '../../../shared/src/host-port.js';
import { helloFence } from '../fleet/hello-fence.js';
import type { ReplicaAddress } from '../fleet/registry.js';

export const AGENT_LINK_PATH = '/internal/agents/ws';
const HELLO_TIMEOUT_MS = 10_000;
/** What the agent's log says of a refused host key. */
const HOST_KEY_HELP = 'restore <state-dir>/host-key from the machine that registered it, or have an operator run canto hosts reset-key on this host id, then restart this agent';

export type HelloDesktops = HelloPayload['desktops'];
export type HelloListener = (hostId: string, desktops: HelloDesktops) => void;

interface Link {
  readonly peer: RpcPeer;
  readonly instanceId: string;
  readonly protocol: string;
  /** The agent has applied its hello fence (or predates it). */
  ready: boolean;
  /** When the host was last heard on this link (`performance.now()`: a monotonic clock, so a step of the wall clock neither drops live links nor keeps dead ones). */
  lastHeard: number;
  /** The desktops the host reported holding in its hello (a leader's new term reads them). */
  readonly held: HelloDesktops;
}

export interface AgentGatewayDeps {
  sql: Sql;
  logger: Logger;
  joinToken: string | null;
  /** The schedulers' secret key, from which each host's port-link key is derived. */
  portLinkSecret: string;
  heartbeatMs: number;
  /** A link not heard from for this long is dropped. */
  hostDownMs: number;
  replicaId: string;
  /** The live replicas, as agents should dial them. */
  replicas(): ReplicaAddress[];
}

export class AgentGateway {
  private readonly links = new Map<string, Link>();
  /** Every open agent socket, linked or still saying hello: a stop closes them all. */
  private readonly peers = new Set<RpcPeer>();
  /** Hosts whose agent has been linked to this replica since it started (services/first-link.ts waits for a first link only). */
  private readonly everLinked = new Set<string>();
  private readonly startedAt = performance.now();
  private stopped = false;
  private readonly connectWaiters = new Map<string, Set<() => void>>();
  private readonly helloListeners = new Set<HelloListener>();
  private readonly wss = new WebSocketServer({ noServer: true, maxPayload: 64 * 1024 * 1024 });
  private readonly joinTokenHash: string | null;
  private readonly watchdog: NodeJS.Timeout;
  private leaderEpoch = 0;
  private readonly log: Logger;

  constructor(private readonly deps: AgentGatewayDeps) {
    this.joinTokenHash = deps.joinToken ? hashToken(deps.joinToken) : null;
    this.log = deps.logger.child({ component: 'agent-gateway' });
    if (this.joinTokenHash === null) {
      this.log.error('CANTO_JOIN_TOKEN is not set: no agent can link to this replica until it is');
    }
    this.wss.on('headers', (headers) => headers.push(`${REPLICA_HEADER}: ${deps.replicaId}`));
    this.watchdog = setInterval(() => this.dropSilentLinks(), Math.max(20, Math.min(250, Math.floor(deps.hostDownMs / 4))));
    this.watchdog.unref();
  }

  attach(server: Server): void {
    server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => this.upgrade(req, socket, head));
  }

  /** True while the host's agent is linked to this replica and not silent. */
  isConnected(hostId: string): boolean {
    const link = this.links.get(hostId);
    return link !== undefined && performance.now() - link.lastHeard <= this.deps.hostDownMs;
  }

  /** Whether the host's agent has been linked to this replica at any time since it started. */
  hasLinked(hostId: string): boolean {
    return this.everLinked.has(hostId);
  }

  /** How long this gateway has been taking agent links, in ms. */
  upForMs(): number {
    return performance.now() - this.startedAt;
  }

  connectedHostIds(): string[] {
    return [...this.links.keys()].filter((id) => this.isConnected(id));
  }

  /** Resolves true once the host's agent is connected, false after `timeoutMs`. */
  async waitConnected(hostId: string, timeoutMs: number): Promise<boolean> {
    if (this.isConnected(hostId)) return true;
    if (timeoutMs <= 0) return false;
    return new Promise((resolve) => {
      const waiters = this.connectWaiters.get(hostId) ?? new Set();
      this.connectWaiters.set(hostId, waiters);
      const done = (ok: boolean) => {
        clearTimeout(timer);
        waiters.delete(onConnect);
        resolve(ok);
      };
      const onConnect = () => done(true);
      const timer = setTimeout(() => done(false), timeoutMs);
      waiters.add(onConnect);
    });
  }

  /** Sends a command; with `upload`, its bytes follow the command on the link. */
  async call<C extends AgentCommand>(
    hostId: string,
    command: C,
    payload: CommandPayload<C>,
    timeoutMs: number,
    upload?: AsyncIterable<Uint8Array>,
  ): Promise<CommandResult<C>> {
    const reply = await this.link(hostId).request(command, payload, timeoutMs, upload);
    return parseMessage(AGENT_COMMANDS[command].result, reply, `${command} reply`) as CommandResult<C>;
  }

  /** Sends a command the agent answers with a download; its bytes stream after the reply. */
  async callDownload<C extends AgentCommand>(
    hostId: string,
    command: C,
    payload: CommandPayload<C>,
    timeoutMs: number,
  ): Promise<{ result: CommandResult<C>; body: AsyncIterable<Buffer> }> {
    const { result, body } = await this.link(hostId).requestDownload(command, payload, timeoutMs);
    return { result: parseMessage(AGENT_COMMANDS[command].result, result, `${command} reply`) as CommandResult<C>, body };
  }

  /** The host's agent speaks at least `major.minor`. */
  speaks(hostId: string, major: number, minor: number): boolean {
    const link = this.links.get(hostId);
    return link !== undefined && protocolAtLeast(link.protocol, major, minor);
  }

  private link(hostId: string): RpcPeer {
    if (!this.isConnected(hostId)) throw new AgentFailure('disconnected', `host ${hostId} is not connected`, true);
    return this.links.get(hostId)!.peer;
  }

  /** The desktops a linked host reported in its hello; empty when it is not linked here. */
  helloDesktops(hostId: string): HelloDesktops {
    return this.links.get(hostId)?.held ?? [];
  }

  /** Calls `listener` after each accepted hello with the desktops the host reports; returns an unsubscribe. */
  onHello(listener: HelloListener): () => void {
    this.helloListeners.add(listener);
    return () => this.helloListeners.delete(listener);
  }

  /** A new leader term: agents refuse lifecycle commands of older ones from now on. */
  announceEpoch(epoch: number): void {
    this.leaderEpoch = Math.max(this.leaderEpoch, epoch);
    this.broadcast({ leader_epoch: epoch });
  }

  /** The live replicas changed: agents link to the new ones. */
  announceReplicas(replicas: readonly ReplicaAddress[]): void {
    this.broadcast({ replicas: [...replicas] });
  }

  /** Closes every agent link (shutdown): agents carry on with the other replicas. */
  stop(): void {
    this.stopped = true;
    clearInterval(this.watchdog);
    // Sockets still in their hello too: a replica that has just started is dialled at once
    // (fleet/registry.ts), and one left open would hold the listener's close until it ended.
    for (const peer of this.peers) peer.close(1001, 'scheduler replica stopping');
    this.peers.clear();
    this.links.clear();
  }

  private broadcast(payload: ClusterPayload): void {
    for (const link of this.links.values()) {
      if (protocolAtLeast(link.protocol, 1, 7)) link.peer.notify('cluster', payload);
    }
  }

  private dropSilentLinks(): void {
    const now = performance.now();
    for (const [hostId, link] of this.links) {
      if (now - link.lastHeard <= this.deps.hostDownMs) continue;
      this.log.warn({ hostId, silent_ms: now - link.lastHeard }, 'agent link silent; dropping it');
      this.links.delete(hostId);
      link.peer.terminate();
    }
  }

  private upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const path = (req.url ?? '').split('?')[0];
    if (path !== AGENT_LINK_PATH) return refuse(socket, 404, 'Not Found');
    if (this.stopped) return refuse(socket, 503, 'Service Unavailable');
    if (this.joinTokenHash === null) {
      this.log.error({ remote: req.socket.remoteAddress }, 'agent refused: this replica has no join token (set CANTO_JOIN_TOKEN)');
      return refuse(socket, 503, 'Service Unavailable', 'no-join-token');
    }
    const header = req.headers.authorization ?? '';
    const token = /^Bearer (\S+)$/i.exec(header)?.[1];
    if (!token || !safeEqualHex(hashToken(token), this.joinTokenHash)) {
      this.log.warn({ remote: req.socket.remoteAddress }, 'agent refused: bad join token');
      return refuse(socket, 401, 'Unauthorized', 'bad-join-token');
    }
    this.wss.handleUpgrade(req, socket, head, (ws) => this.accept(new RpcPeer(ws, (m) => this.log.warn({ m }, 'agent protocol error'))));
  }

  private accept(peer: RpcPeer): void {
    if (this.stopped) {
      peer.close(1001, 'scheduler replica stopping');
      return;
    }
    this.peers.add(peer);
    let hostId: string | null = null;
    let link: Link | null = null;
    const helloTimer = setTimeout(() => hostId || peer.close(1008, 'no hello'), HELLO_TIMEOUT_MS);
    const heard = () => {
      if (link) link.lastHeard = performance.now();
    };

    peer.handle('hello', async (raw) => {
      const hello = parseMessage(HelloPayload, raw, 'hello');
      if (!(protocolMajor(hello.protocol) <= protocolMajor(PROTOCOL_VERSION))) {
        setImmediate(() => peer.close(1002, 'unsupported protocol'));
        throw new AgentFailure('unsupported', `protocol ${hello.protocol} is newer than ${PROTOCOL_VERSION}`, false);
      }
      const fences = protocolAtLeast(hello.protocol, 1, 7);
      const recorded = await upsertHost(this.deps.sql, {
        id: hello.host_id,
        hostname: hello.hostname,
        agentInstanceId: hello.agent_instance_id,
        protocol: hello.protocol,
        runtime: hello.capabilities.runtime,
        memorySnapshots: hello.capabilities.memory_snapshots,
        vcpus: hello.capacity.vcpus,
        memoryMb: hello.capacity.memory_mb,
        // Recorded on every hello, so an agent that turned its port gateway off clears it.
        ingressAddress: hello.ingress ? formatHostPort(hello.ingress.host, hello.ingress.port) : null,
        transferAddress: hello.transfer ? formatHostPort(hello.transfer.host, hello.transfer.port) : null,
        hostKeyHash: hello.host_key === undefined ? null : hashToken(hello.host_key),
      }, !fences);
      if (recorded === 'lost') {
        this.log.warn({ hostId: hello.host_id, hostname: hello.hostname }, `agent refused: host ${hello.host_id} was declared lost; its desktops are being written off`);
        setImmediate(() => peer.close(1008, 'host declared lost'));
        throw new AgentFailure('unauthorized', `host ${hello.host_id} was declared lost (canto hosts forget); once it is removed, an agent with a new state directory registers afresh`, false);
      }
      if (recorded === 'key_mismatch') {
        // The join token is every agent's: only the host's own key proves the id is its own.
        this.log.warn({ hostId: hello.host_id, hostname: hello.hostname }, `agent refused: host ${hello.host_id} said hello before with another host key`);
        setImmediate(() => peer.close(1008, 'host key mismatch'));
        throw new AgentFailure('unauthorized', `host ${hello.host_id} is registered with another host key (${HOST_KEY_HELP})`, false);
      }
      const [fence, lease] = fences
        ? await Promise.all([helloFence(this.deps.sql, hello.host_id, hello.desktops), readLease(this.deps.sql, LEADER_LEASE)])
        : [[], null];
      if (!peer.isOpen || this.stopped) throw new AgentFailure('disconnected', 'link closed during hello', true);
      clearTimeout(helloTimer);
      peer.binaryStreams = protocolAtLeast(hello.protocol, 1, 6);
      hostId = hello.host_id;
      link = { peer, instanceId: hello.agent_instance_id, protocol: hello.protocol, ready: !fences, lastHeard: performance.now(), held: hello.desktops };
      const previous = this.links.get(hostId);
      if (previous && previous.peer !== peer) previous.peer.close(1000, 'replaced by a newer link');
      this.links.set(hostId, link);
      this.everLinked.add(hostId);
      this.log.info({ hostId, instanceId: link.instanceId, runtime: hello.capabilities.runtime, protocol: hello.protocol, fence: fence.length }, 'agent connected');
      for (const waiter of this.connectWaiters.get(hostId) ?? []) waiter();
      const connectedHost = hostId;
      // After the reply is on its way: listeners may send the host commands.
      setImmediate(() => {
        for (const listener of this.helloListeners) listener(connectedHost, hello.desktops);
      });
      const reply: HelloResult = {
        protocol: PROTOCOL_VERSION,
        heartbeat_ms: this.deps.heartbeatMs,
        port_link_key: portLinkKey(this.deps.portLinkSecret, hello.host_id),
      };
      if (fences) {
        reply.replica_id = this.deps.replicaId;
        reply.replicas = this.deps.replicas();
        reply.leader_epoch = Math.max(this.leaderEpoch, lease?.epoch ?? 0);
        reply.fence = fence;
      }
      return reply;
    });

    peer.handle('host.ready', async (raw) => {
      const ready = parseMessage(HostReadyPayload, raw, 'host.ready');
      heard();
      if (!hostId || !link || this.links.get(hostId) !== link) return;
      link.ready = true;
      await markHostReady(this.deps.sql, hostId);
      this.log.info({ hostId, stopped: ready.stopped }, 'agent ready');
    });

    // A target's copy under way: kept with its move, so any replica shows it (admin API, drains).
    peer.handle('desktop.import.progress', async (raw) => {
      const progress = parseMessage(ImportProgressPayload, raw, 'desktop.import.progress');
      heard();
      await recordCopyProgress(this.deps.sql, progress.desktop_id, progress.done_bytes, progress.total_bytes);
    });

    peer.handle('heartbeat', async (raw) => {
      const beat = parseMessage(HeartbeatPayload, raw, 'heartbeat');
      heard();
      // A quarter interval: the replicas' heartbeats of one beat land together, and one write does,
      // while the record stays within a quarter interval of the last heartbeat for host health.
      if (hostId && link && this.links.get(hostId) === link) await touchHost(this.deps.sql, hostId, link.ready, this.deps.heartbeatMs / 4, beat);
    });

    peer.onClose(() => {
      this.peers.delete(peer);
      clearTimeout(helloTimer);
      if (!hostId || this.links.get(hostId)?.peer !== peer) return;
      this.links.delete(hostId);
      this.log.info({ hostId }, 'agent disconnected');
    });
  }
}

function refuse(socket: Duplex, status: number, reason: string, refusal?: string): void {
  const extra = refusal ? `${REFUSAL_HEADER}: ${refusal}\r\n` : '';
  socket.end(`HTTP/1.1 ${status} ${reason}\r\n${extra}Connection: close\r\nContent-Length: 0\r\n\r\n`);
}

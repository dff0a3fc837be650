/**
 * The scheduler's end of the agent link. Agents dial `/internal/agents/ws` with their join token
 * as a bearer credential; the upgrade is refused (401) before any websocket exists when the token
 * is wrong, so an unauthenticated process can neither register a host nor receive commands.
 * After the `hello` the link is registered under the host id, replacing any older link of the
 * same host, and the engine can `call` the host.
 *
 * Only the leader accepts agents (followers answer the upgrade with 503): the leader's engine is
 * the only sender of commands, so agents must be connected to it. Losing leadership closes every
 * link, and agents reconnect to whichever replica leads now.
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
  PROTOCOL_VERSION,
  protocolAtLeast,
  parseMessage,
  protocolMajor,
  type AgentCommand,
  type CommandPayload,
  type CommandResult,
} from '../../../shared/src/protocol.js';
import { RpcPeer } from '../../../shared/src/rpc.js';
import type { Sql } from '../store/db.js';
import { markHostDown, touchHost, upsertHost } from '../store/hosts.js';
import { hashToken, safeEqualHex } from '../crypto/secret-box.js';
import { formatHostPort } from '../../../shared/src/host-port.js';

export const AGENT_LINK_PATH = '/internal/agents/ws';
const HELLO_TIMEOUT_MS = 10_000;
/** A link silent for this many heartbeat intervals is presumed dead (a half-open TCP connection). */
const MISSED_HEARTBEATS = 5;

export type HelloDesktops = HelloPayload['desktops'];
export type HelloListener = (hostId: string, desktops: HelloDesktops) => void;

interface Link {
  peer: RpcPeer;
  instanceId: string;
}

export interface AgentGatewayDeps {
  sql: Sql;
  logger: Logger;
  joinToken: string | null;
  /** The schedulers' secret key, from which each host's port-link key is derived. */
  portLinkSecret: string;
  heartbeatMs: number;
  isLeader(): boolean;
}

export class AgentGateway {
  private readonly links = new Map<string, Link>();
  private readonly connectWaiters = new Map<string, Set<() => void>>();
  private readonly helloListeners = new Set<HelloListener>();
  private readonly wss = new WebSocketServer({ noServer: true, maxPayload: 64 * 1024 * 1024 });
  private readonly joinTokenHash: string | null;
  private readonly log: Logger;

  constructor(private readonly deps: AgentGatewayDeps) {
    this.joinTokenHash = deps.joinToken ? hashToken(deps.joinToken) : null;
    this.log = deps.logger.child({ component: 'agent-gateway' });
  }

  attach(server: Server): void {
    server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => this.upgrade(req, socket, head));
  }

  isConnected(hostId: string): boolean {
    return this.links.has(hostId);
  }

  connectedHostIds(): string[] {
    return [...this.links.keys()];
  }

  /** Resolves true once the host's agent is connected, false after `timeoutMs`. */
  async waitConnected(hostId: string, timeoutMs: number): Promise<boolean> {
    if (this.links.has(hostId)) return true;
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

  private link(hostId: string): RpcPeer {
    const link = this.links.get(hostId);
    if (!link) throw new AgentFailure('disconnected', `host ${hostId} is not connected`, true);
    return link.peer;
  }

  /** Calls `listener` after each accepted hello with the desktops the host reports; returns an unsubscribe. */
  onHello(listener: HelloListener): () => void {
    this.helloListeners.add(listener);
    return () => this.helloListeners.delete(listener);
  }

  /** Closes every agent link (leadership lost, or shutdown). */
  closeAll(): void {
    for (const link of this.links.values()) link.peer.close(1012, 'scheduler leadership changed');
    this.links.clear();
  }

  private upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    const path = (req.url ?? '').split('?')[0];
    if (path !== AGENT_LINK_PATH) return refuse(socket, 404, 'Not Found');
    const header = req.headers.authorization ?? '';
    const token = /^Bearer (\S+)$/i.exec(header)?.[1];
    if (!this.joinTokenHash || !token || !safeEqualHex(hashToken(token), this.joinTokenHash)) {
      this.log.warn({ remote: req.socket.remoteAddress }, 'agent refused: bad join token');
      return refuse(socket, 401, 'Unauthorized');
    }
    if (!this.deps.isLeader()) return refuse(socket, 503, 'Service Unavailable');
    this.wss.handleUpgrade(req, socket, head, (ws) => this.accept(new RpcPeer(ws, (m) => this.log.warn({ m }, 'agent protocol error'))));
  }

  private accept(peer: RpcPeer): void {
    let hostId: string | null = null;
    let instanceId = '';
    let lastHeard = Date.now();
    const helloTimer = setTimeout(() => hostId || peer.close(1008, 'no hello'), HELLO_TIMEOUT_MS);
    const silenceTimer = setInterval(() => {
      if (Date.now() - lastHeard > this.deps.heartbeatMs * MISSED_HEARTBEATS) {
        this.log.warn({ hostId }, 'agent link silent; closing it');
        peer.close(4000, 'heartbeat timeout');
      }
    }, this.deps.heartbeatMs);

    peer.handle('hello', async (raw) => {
      const hello = parseMessage(HelloPayload, raw, 'hello');
      if (!(protocolMajor(hello.protocol) <= protocolMajor(PROTOCOL_VERSION))) {
        setImmediate(() => peer.close(1002, 'unsupported protocol'));
        throw new AgentFailure('unsupported', `protocol ${hello.protocol} is newer than ${PROTOCOL_VERSION}`, false);
      }
      await upsertHost(this.deps.sql, {
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
      });
      clearTimeout(helloTimer);
      peer.binaryStreams = protocolAtLeast(hello.protocol, 1, 6);
      hostId = hello.host_id;
      instanceId = hello.agent_instance_id;
      const previous = this.links.get(hostId);
      if (previous && previous.peer !== peer) previous.peer.close(1000, 'replaced by a newer link');
      this.links.set(hostId, { peer, instanceId });
      this.log.info({ hostId, instanceId, runtime: hello.capabilities.runtime }, 'agent connected');
      for (const waiter of this.connectWaiters.get(hostId) ?? []) waiter();
      const connectedHost = hostId;
      // After the reply is on its way: listeners may send the host commands.
      setImmediate(() => {
        for (const listener of this.helloListeners) listener(connectedHost, hello.desktops);
      });
      return {
        protocol: PROTOCOL_VERSION,
        heartbeat_ms: this.deps.heartbeatMs,
        port_link_key: portLinkKey(this.deps.portLinkSecret, hello.host_id),
      };
    });

    peer.handle('heartbeat', async (raw) => {
      parseMessage(HeartbeatPayload, raw, 'heartbeat');
      lastHeard = Date.now();
      if (hostId) await touchHost(this.deps.sql, hostId);
    });

    peer.onClose(() => {
      clearTimeout(helloTimer);
      clearInterval(silenceTimer);
      if (!hostId || this.links.get(hostId)?.peer !== peer) return;
      this.links.delete(hostId);
      this.log.info({ hostId }, 'agent disconnected');
      markHostDown(this.deps.sql, hostId, instanceId).catch((err: unknown) => this.log.error({ err }, 'marking host down failed'));
    });
  }
}

/** `host:port`, with an IPv6 literal in brackets so the last colon always separates the port. */
function refuse(socket: Duplex, status: number, reason: string): void {
  socket.end(`HTTP/1.1 ${status} ${reason}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
}

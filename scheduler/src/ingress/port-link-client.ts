/**
 * The ingress's end of the port link (shared/src/port-link.ts): dial the agent's port gateway,
 * send the signed opening line, read the one-line answer, and hand over the socket, which from
 * then on carries raw bytes to and from the guest port. Plain requests take such sockets from a
 * pool of kept-alive links (link-pool.ts); `PortLinkAgent` makes one the connection of an
 * ordinary `http.request`, which is how the proxy library uses it for WebSocket upgrades.
 */
import { Agent, type ClientRequestArgs } from 'node:http';
import { connect, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { portLinkLine, type PortLinkRefusal, type PortTarget } from '../../../shared/src/port-link.js';
import { parseHostPort } from '../../../shared/src/host-port.js';

/** Connecting and reading the answer, together. */
const DIAL_TIMEOUT_MS = 10_000;
/** `ERR unavailable\n` is the longest answer; anything longer is not the port link. */
const MAX_ANSWER_BYTES = 64;
const REFUSALS: readonly PortLinkRefusal[] = ['unauthorized', 'not_running', 'refused', 'unavailable'];
/** An idle kept-alive link is closed after this long (link-pool.ts). */
export const IDLE_LINK_MS = 1_000;

export class PortLinkError extends Error {
  constructor(
    /**
     * The agent's refusal; `unreachable` (no connection, a timeout, closed before answering: the
     * host may be down); or `garbled` (a malformed address, or an answer that is not the port link).
     */
    readonly reason: PortLinkRefusal | 'unreachable' | 'garbled',
    message: string,
  ) {
    super(message);
    this.name = 'PortLinkError';
  }
}

/** The gateway address the scheduler recorded from the agent's hello; null if it cannot be dialled. */
export function parseGatewayAddress(address: string): { host: string; port: number } | null {
  const gateway = parseHostPort(address);
  return gateway === null || gateway.port < 1 ? null : gateway;
}

/** A socket relaying to the guest port, or a `PortLinkError`. */
export function dialPortLink(secret: string, address: string, target: PortTarget, options: { timeoutMs?: number; version?: 1 | 2 } = {}): Promise<Socket> {
  const timeoutMs = options.timeoutMs ?? DIAL_TIMEOUT_MS;
  const gateway = parseGatewayAddress(address);
  if (!gateway) return Promise.reject(new PortLinkError('garbled', `malformed port gateway address "${address}"`));
  return new Promise((resolve, reject) => {
    const socket = connect({ host: gateway.host, port: gateway.port });
    let answer = Buffer.alloc(0);
    const fail = (reason: PortLinkError['reason'], message: string) => {
      cleanup();
      socket.destroy();
      reject(new PortLinkError(reason, message));
    };
    const onReadable = () => {
      let chunk: Buffer | null;
      while ((chunk = socket.read() as Buffer | null) !== null) {
        answer = Buffer.concat([answer, chunk]);
        const newline = answer.indexOf(0x0a);
        if (newline === -1) {
          if (answer.length > MAX_ANSWER_BYTES) return fail('garbled', 'the port gateway sent no answer line');
          continue;
        }
        const line = answer.subarray(0, newline).toString('latin1').replace(/\r$/, '');
        const rest = answer.subarray(newline + 1);
        if (line === 'OK') {
          cleanup();
          // Bytes the guest sent right behind the answer belong to whoever reads the socket next.
          if (rest.length > 0) socket.unshift(rest);
          // The HTTP client listens for errors only a tick after it is handed the socket; an error
          // in between must not be an uncaught exception (it still reaches the client as a close).
          socket.on('error', () => {});
          return resolve(socket);
        }
        const code = /^ERR (\S+)$/.exec(line)?.[1] as PortLinkRefusal | undefined;
        if (code && REFUSALS.includes(code)) return fail(code, `the agent refused the port link: ${code}`);
        return fail('garbled', 'the port gateway answered something other than the port link');
      }
    };
    const onError = (err: Error) => fail('unreachable', `port gateway: ${err.message}`);
    const onEnd = () => fail('unreachable', 'the port gateway closed before answering');
    const timer = setTimeout(() => fail('unreachable', 'the port gateway did not answer in time'), timeoutMs);
    function cleanup() {
      clearTimeout(timer);
      socket.off('readable', onReadable);
      socket.off('error', onError);
      socket.off('end', onEnd);
    }
    socket.on('readable', onReadable);
    socket.on('error', onError);
    socket.on('end', onEnd);
    socket.once('connect', () => {
      socket.setNoDelay(true);
      socket.write(portLinkLine(secret, target, Date.now(), options.version ?? 2));
    });
  });
}

/**
 * An `http.Agent` whose connections are port links to one guest port of one desktop generation,
 * each used once: it carries WebSocket upgrades, and an upgraded link belongs to its WebSocket.
 */
export class PortLinkAgent extends Agent {
  constructor(private readonly open: () => Promise<Socket>) {
    super({ keepAlive: false });
  }

  override createConnection(_options: ClientRequestArgs, callback?: (err: Error | null, stream: Duplex) => void): Duplex | null | undefined {
    this.open().then(
      (socket) => callback?.(null, socket),
      (err: unknown) => callback?.(err instanceof Error ? err : new Error(String(err)), undefined as unknown as Duplex),
    );
    return undefined;
  }
}

/**
 * A TCP proxy in front of a transfer server that spoils the first answers passing through it:
 * it cuts a connection after so many response bytes, or flips one byte of a response's body, so
 * tests see an importer resume or reject a unit over real sockets. It also records when each
 * request came and when its connection ended, so tests see which fetches overlapped.
 */
import { createServer, connect, type Server, type Socket } from 'node:net';

export interface ProxyPlan {
  /** Cut each spoiled connection after this many response bytes (headers included). */
  readonly cutAfter?: number;
  /** Flip this byte of each spoiled response's body (counted from the end of its headers). */
  readonly flipBodyByte?: number;
  /** How many connections to spoil (the first ones that match). Default 1. */
  readonly times?: number;
  /** Only responses of requests whose first line contains this are spoiled. Default: any. */
  readonly match?: string;
  /**
   * Takes the upgrade to a raw unit stream out of every request, so that the source answers
   * as one that predates it does (the plain chunked stream).
   */
  readonly plainOnly?: boolean;
}

/** One connection through the proxy: its request line, its status line, and when it opened and closed (ms). */
export interface Exchange {
  request: string;
  response: string;
  readonly opened: number;
  closed: number | null;
}

export interface TransferProxy {
  readonly url: string;
  /** Connections spoiled so far. */
  spoiled(): number;
  /** Every connection so far, in the order they opened. */
  exchanges(): readonly Exchange[];
  close(): Promise<void>;
}

export async function startTransferProxy(target: string, plan: ProxyPlan): Promise<TransferProxy> {
  const upstream = new URL(target);
  let spoiled = 0;
  const sockets = new Set<Socket>();
  const exchanges: Exchange[] = [];
  const server: Server = createServer((client) => {
    const up = connect({ host: upstream.hostname, port: Number(upstream.port) });
    sockets.add(client).add(up);
    client.once('close', () => sockets.delete(client));
    up.once('close', () => sockets.delete(up));
    let requestLine = '';
    let spoil: boolean | null = null;
    let seen = 0;
    let bodyStart = -1;
    let head = Buffer.alloc(0);
    const exchange: Exchange = { request: '', response: '', opened: performance.now(), closed: null };
    exchanges.push(exchange);
    client.once('close', () => (exchange.closed ??= performance.now()));
    client.on('data', (chunk: Buffer) => {
      if (requestLine === '') {
        requestLine = exchange.request = chunk.toString('latin1').split('\r\n', 1)[0] ?? '';
        // The request's head comes in its first chunk (a GET of a few lines).
        if (plan.plainOnly) chunk = Buffer.from(chunk.toString('latin1').replace(/^(upgrade|connection):[^\r]*\r\n/gim, ''), 'latin1');
      }
      up.write(chunk);
    });
    up.on('data', (raw: Buffer) => {
      let chunk = raw;
      if (exchange.response === '') exchange.response = chunk.toString('latin1').split('\r\n', 1)[0] ?? '';
      if (spoil === null) {
        spoil = spoiled < (plan.times ?? 1) && (plan.match === undefined || requestLine.includes(plan.match));
        if (spoil) spoiled++;
      }
      if (spoil && plan.flipBodyByte !== undefined) {
        if (bodyStart < 0) {
          head = Buffer.concat([head, chunk]);
          const end = head.indexOf('\r\n\r\n');
          if (end >= 0) bodyStart = end + 4;
        }
        const at = bodyStart + plan.flipBodyByte - seen;
        if (bodyStart >= 0 && at >= 0 && at < chunk.length) {
          chunk = Buffer.from(chunk);
          chunk[at] = chunk[at]! ^ 0xff;
        }
      }
      if (spoil && plan.cutAfter !== undefined && seen + chunk.length >= plan.cutAfter) {
        client.write(chunk.subarray(0, plan.cutAfter - seen));
        client.destroy();
        up.destroy();
        return;
      }
      seen += chunk.length;
      client.write(chunk);
    });
    up.on('end', () => client.end());
    client.on('end', () => up.end());
    up.on('error', () => client.destroy());
    client.on('error', () => up.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    spoiled: () => spoiled,
    exchanges: () => exchanges,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

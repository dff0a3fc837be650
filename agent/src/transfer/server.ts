/**
 * The transfer server: the HTTP listener (`CANTO_AGENT_TRANSFER_LISTEN`, default port 7013)
 * another agent fetches a desktop being moved from (shared/src/transfer.ts). Two routes, both
 * needing `Authorization: Bearer <ticket>` for the desktop in the path (tickets.ts):
 *
 *   GET /v1/transfer/{desktop_id}/units              → {units, total_bytes}
 *   GET /v1/transfer/{desktop_id}/units/{unit}?offset=N
 *       → the unit's stream from byte N, chunked, with trailer `x-canto-sha256`: the sha256 of
 *         the whole stream from byte 0 (source.ts); raw instead when asked with
 *         `Upgrade: canto-unit/1` (RAW_UNIT_PROTOCOL in shared/src/transfer.ts)
 *   GET /v1/transfer/{desktop_id}/precopy/{precopy_id}   (1.12)
 *       → the pre-copy's stream, from its start, with the same trailer (precopy-source.ts)
 *
 * Both unit routes take `?reuse={precopy_id}` (1.12): the target holds that pre-copy, and the
 * `desktop` unit may leave its unchanged files out (shared/src/precopy.ts).
 *
 * Refusals are small `application/problem+json` bodies: 401 without a good ticket, 404 for a
 * ticket of another desktop or a unit it lacks, 409 while the desktop runs or once it has moved
 * past the ticket's generation (woken, destroyed), 416 for an offset past the end. Nothing here
 * logs a ticket or the Authorization header.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { formatHost } from '../../../shared/src/host-port.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { PRECOPY_ID_PATTERN } from '../../../shared/src/precopy.js';
import { RAW_UNIT_PROTOCOL, SHA256_TRAILER, type ListingMode } from '../../../shared/src/transfer.js';
import type { TransferSource } from './source.js';
import type { TransferTickets } from './tickets.js';

export interface TransferServerOptions {
  readonly listenHost: string;
  /** 0 picks a free port (see `port`). */
  readonly port: number;
  /** The host name other agents are told to dial. */
  readonly advertiseHost: string;
  readonly source: TransferSource;
  readonly tickets: TransferTickets;
  /** The generation this host holds for a desktop, and whether it was destroyed here. */
  readonly generations: { get(desktopId: string): number | undefined; isDestroyed(desktopId: string): boolean };
  readonly log: (msg: string, fields?: object) => void;
}

const ROUTE = /^\/v1\/transfer\/([A-Za-z0-9_-]{1,64})\/units(?:\/([A-Za-z0-9_-]{1,80}))?$/;
const PRECOPY_ROUTE = /^\/v1\/transfer\/([A-Za-z0-9_-]{1,64})\/precopy\/(pc_[A-Za-z0-9_-]{16,64})$/;
const OFFSET = /^\d{1,15}$/;
const REUSE = new RegExp(PRECOPY_ID_PATTERN);

/** What an AgentFailure from the source is answered with. */
const STATUS: Partial<Record<AgentFailure['code'], number>> = { not_found: 404, bad_request: 404, conflict: 409, too_large: 416 };

class Refusal extends Error {
  constructor(
    readonly status: number,
    readonly detail: string,
  ) {
    super(detail);
  }
}

/** What a request on the units routes asks for. */
interface UnitRequest {
  readonly desktopId: string;
  readonly generation: number;
  readonly mode: ListingMode;
  readonly reuse: string | null;
  readonly unitId: string;
  readonly offset: number;
}

export class TransferServer {
  private server!: Server;
  /** Raw unit streams: no longer the HTTP server's connections, so closed here. */
  private readonly upgraded = new Set<Duplex>();

  private constructor(private readonly options: TransferServerOptions) {}

  static async start(options: TransferServerOptions): Promise<TransferServer> {
    const ts = new TransferServer(options);
    ts.server = createServer((req, res) => void ts.serve(req, res));
    ts.server.on('upgrade', (req: IncomingMessage, socket: Duplex) => void ts.serveRaw(req, socket));
    // A unit may take minutes; the request itself is only a few header lines.
    ts.server.requestTimeout = 30_000;
    await new Promise<void>((resolve, reject) => {
      ts.server.once('error', reject);
      ts.server.listen(options.port, options.listenHost, () => resolve());
    });
    return ts;
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port;
  }

  /** What the server sends (the export side of `desktop.export` uses it too). */
  get source(): TransferSource {
    return this.options.source;
  }

  /** The base URL other agents fetch from, as `desktop.export` answers it. */
  get url(): string {
    return `http://${formatHost(this.options.advertiseHost)}:${this.port}`;
  }

  async close(): Promise<void> {
    this.options.source.close();
    this.options.tickets.clear();
    await new Promise<void>((resolve) => {
      this.server.closeAllConnections();
      for (const socket of this.upgraded) socket.destroy();
      this.server.close(() => resolve());
    });
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      if (req.method !== 'GET') throw new Refusal(405, 'only GET is served here');
      const url = new URL(req.url ?? '/', 'http://transfer');
      const precopy = PRECOPY_ROUTE.exec(url.pathname);
      if (precopy !== null) {
        const { generation } = this.admit(req, precopy[1]!);
        await this.sendPrecopy(res, precopy[1]!, generation, precopy[2]!);
        return;
      }
      const asked = this.unitRequest(req, url);
      if (asked.unitId === undefined) {
        const listing = await this.options.source.listing(asked.desktopId, asked.generation, asked.mode, asked.reuse);
        const body = JSON.stringify(listing);
        res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body) });
        res.end(body);
        return;
      }
      await this.sendUnit(res, { ...asked, unitId: asked.unitId });
    } catch (err) {
      this.refuse(req, res, err);
    }
  }

  /** A request on the units routes, its ticket admitted; throws a Refusal. */
  private unitRequest(req: IncomingMessage, url: URL): Omit<UnitRequest, 'unitId'> & { unitId: string | undefined } {
    const route = ROUTE.exec(url.pathname);
    if (route === null) throw new Refusal(404, 'no such route');
    const desktopId = route[1]!;
    const { generation, listing: mode } = this.admit(req, desktopId);
    const reuse = url.searchParams.get('reuse');
    if (reuse !== null && !REUSE.test(reuse)) throw new Refusal(400, 'reuse must name a pre-copy');
    const raw = url.searchParams.get('offset') ?? '0';
    if (!OFFSET.test(raw)) throw new Refusal(400, 'offset must be a whole number of bytes');
    return { desktopId, generation, mode, reuse, unitId: route[2], offset: Number(raw) };
  }

  /**
   * A unit or a pre-copy asked for raw (`Upgrade: canto-unit/1`, RAW_UNIT_PROTOCOL): `101`, the
   * bytes (a unit's from the offset), the whole stream's sha256 in hex, and the end. Refusals are
   * the same problem bodies as over plain HTTP; a stream that fails once begun is cut (a unit's
   * receiver resumes it).
   */
  private async serveRaw(req: IncomingMessage, socket: Duplex): Promise<void> {
    socket.on('error', () => undefined);
    this.upgraded.add(socket);
    socket.once('close', () => this.upgraded.delete(socket));
    const started = performance.now();
    let fields: object = {};
    let begun = false;
    const switched = (more = '') => `HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: ${RAW_UNIT_PROTOCOL}\r\n${more}\r\n`;
    try {
      if (req.method !== 'GET') throw new Refusal(405, 'only GET is served here');
      if (req.headers.upgrade?.toLowerCase() !== RAW_UNIT_PROTOCOL) throw new Refusal(400, `the only upgrade here is ${RAW_UNIT_PROTOCOL}`);
      const url = new URL(req.url ?? '/', 'http://transfer');
      const precopy = PRECOPY_ROUTE.exec(url.pathname);
      if (precopy !== null) {
        // No length known ahead: the bytes run to the end, the digest last; a cut is a reset.
        const desktopId = precopy[1]!;
        const id = precopy[2]!;
        const { generation } = this.admit(req, desktopId);
        fields = { desktopId, raw: true };
        if (!this.options.source.precopies.knows(desktopId, generation, id)) throw new Refusal(404, 'no such pre-copy here');
        begun = true;
        socket.write(switched());
        socket.end(await this.options.source.sendPrecopy(desktopId, generation, id, socket));
        this.options.log('pre-copy sent', { ...fields, bytes: (socket as Socket).bytesWritten, ms: Math.round(performance.now() - started) });
        return;
      }
      const asked = this.unitRequest(req, url);
      if (asked.unitId === undefined) throw new Refusal(400, 'only a unit comes raw');
      fields = { desktopId: asked.desktopId, unit: asked.unitId, offset: asked.offset, raw: true };
      const unit = await this.options.source.openUnit(asked.desktopId, asked.generation, asked.unitId, asked.offset, asked.mode, asked.reuse);
      begun = true;
      socket.write(switched(`x-canto-offset: ${asked.offset}\r\nx-canto-unit-bytes: ${unit.bytes}\r\n`));
      socket.end(await unit.send(socket, true));
      this.options.log('unit sent', { ...fields, bytes: unit.bytes - asked.offset, ms: Math.round(performance.now() - started) });
    } catch (err) {
      if (begun) {
        // A reset, not an end: a stream of unknown length ends where the connection does.
        (socket as Socket).resetAndDestroy();
        this.options.log('raw stream cut', { ...fields, error: err instanceof Error ? err.message : String(err) });
        return;
      }
      const { status, body } = this.refusal(req, err);
      socket.end(
        `HTTP/1.1 ${status} ${TITLES[status] ?? 'Error'}\r\ncontent-type: application/problem+json\r\ncache-control: no-store\r\n`
        + `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
    }
  }

  /** Checks the ticket and the desktop's generation here; answers the ticket's generation and listing. */
  private admit(req: IncomingMessage, desktopId: string): { generation: number; listing: ListingMode } {
    const header = req.headers.authorization;
    const presented = header === undefined ? null : (/^Bearer (\S+)$/.exec(header)?.[1] ?? '');
    const check = this.options.tickets.check(presented, desktopId);
    if (!check.ok) throw new Refusal(check.status, check.detail);
    const { generations } = this.options;
    if (generations.isDestroyed(desktopId)) throw new Refusal(404, 'the desktop is no longer on this host');
    const held = generations.get(desktopId);
    if (held !== undefined && held > check.generation) {
      throw new Refusal(409, `the desktop has changed since it was exported (generation ${held} > ${check.generation}); export it again`);
    }
    return { generation: check.generation, listing: check.listing };
  }

  private async sendUnit(res: ServerResponse, asked: UnitRequest): Promise<void> {
    const started = performance.now();
    const { desktopId, unitId, offset } = asked;
    const unit = await this.options.source.openUnit(desktopId, asked.generation, unitId, offset, asked.mode, asked.reuse);
    res.writeHead(200, {
      'content-type': 'application/octet-stream',
      'cache-control': 'no-store',
      trailer: SHA256_TRAILER,
      'x-canto-offset': String(offset),
      'x-canto-unit-bytes': String(unit.bytes),
    });
    const fields = { desktopId, unit: unitId, offset };
    try {
      res.addTrailers({ [SHA256_TRAILER]: await unit.send(res) });
      res.end();
      this.options.log('unit sent', { ...fields, bytes: unit.bytes - offset, ms: Math.round(performance.now() - started) });
    } catch (err) {
      // Headers are out: the only way to say so is to cut the stream, which the receiver resumes.
      res.destroy();
      this.options.log('unit stream cut', { ...fields, sent: res.socket?.bytesWritten, error: err instanceof Error ? err.message : String(err) });
    }
  }

  /** A pre-copy has no length known ahead (its files may shrink as they are read): chunked. */
  private async sendPrecopy(res: ServerResponse, desktopId: string, generation: number, id: string): Promise<void> {
    const { source } = this.options;
    if (!source.precopies.knows(desktopId, generation, id)) throw new Refusal(404, 'no such pre-copy here');
    const started = performance.now();
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'cache-control': 'no-store', trailer: SHA256_TRAILER });
    try {
      res.addTrailers({ [SHA256_TRAILER]: await source.sendPrecopy(desktopId, generation, id, res) });
      res.end();
      this.options.log('pre-copy sent', { desktopId, bytes: res.socket?.bytesWritten, ms: Math.round(performance.now() - started) });
    } catch (err) {
      res.destroy();
      this.options.log('pre-copy stream cut', { desktopId, error: err instanceof Error ? err.message : String(err) });
    }
  }

  private refuse(req: IncomingMessage, res: ServerResponse, err: unknown): void {
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const { status, body } = this.refusal(req, err);
    res.writeHead(status, { 'content-type': 'application/problem+json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  }

  /** The status and problem body a failed request is answered with (and logged). */
  private refusal(req: IncomingMessage, err: unknown): { status: number; body: string } {
    let status = 500;
    let detail = 'the transfer server failed';
    if (err instanceof Refusal) ({ status, detail } = err);
    else if (err instanceof AgentFailure && STATUS[err.code] !== undefined) {
      status = STATUS[err.code]!;
      detail = err.message;
    }
    const path = (req.url ?? '').split('?')[0];
    this.options.log('transfer request refused', { method: req.method, path, status, detail, ...(status === 500 ? { error: String(err) } : {}) });
    return { status, body: JSON.stringify({ type: 'about:blank', title: TITLES[status] ?? 'Error', status, detail }) };
  }
}

const TITLES: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  404: 'Not Found',
  405: 'Method Not Allowed',
  409: 'Conflict',
  416: 'Range Not Satisfiable',
  500: 'Internal Server Error',
};

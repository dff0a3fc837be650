/**
 * An HTTP load generator for the read-throughput figures: many keep-alive connections spread over
 * worker threads, so the client is not the bottleneck of the process that measures. Two shapes:
 * closed loop (every connection sends its next request when the last answer arrives — the most
 * requests per second the server gives) and open loop (requests are sent on a fixed schedule
 * whatever the server does, so a slow server shows as latency, not as a lower rate; latencies
 * are measured from the scheduled send time, which avoids coordinated omission).
 */
import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { connect } from 'node:net';
import type { Duplex } from 'node:stream';
import { fileURLToPath, pathToFileURL } from 'node:url';

export interface LoadSpec {
  url: string;
  headers: Record<string, string>;
  /** Keep-alive connections in all. */
  connections: number;
  durationMs: number;
  /** Requests per second offered in all; absent = closed loop. */
  rate?: number;
}

export interface LoadResult {
  requests: number;
  /** Answers other than 200, and connection errors. */
  errors: number;
  /** Requests per second answered. */
  rps: number;
  /** Every latency in ms. */
  latencies: number[];
}

interface WorkerJob extends LoadSpec {
  /** The open loop's schedule for this worker: requests per second. */
  workerRate?: number;
}

/** Runs `spec` over `threads` worker threads and merges what they measured. */
export async function runLoad(spec: LoadSpec, threads = 2): Promise<LoadResult> {
  const self = fileURLToPath(import.meta.url);
  const jobs = Array.from({ length: threads }, (_, i): WorkerJob => ({
    ...spec,
    connections: Math.floor(spec.connections / threads) + (i < spec.connections % threads ? 1 : 0),
    workerRate: spec.rate === undefined ? undefined : spec.rate / threads,
  }));
  const parts = await Promise.all(jobs.map((job) => new Promise<LoadResult>((resolve, reject) => {
    // Workers do not inherit the main thread's TypeScript loader: register it, then load this file.
    const boot = `import('tsx/esm/api').then((tsx) => { tsx.register(); return import(${JSON.stringify(pathToFileURL(self).href)}); })`;
    const worker = new Worker(boot, { eval: true, workerData: job });
    worker.once('message', (r: LoadResult) => resolve(r));
    worker.once('error', reject);
    worker.once('exit', (code) => (code === 0 ? undefined : reject(new Error(`load worker exited ${code}`))));
  })));
  const requests = parts.reduce((n, p) => n + p.requests, 0);
  return {
    requests,
    errors: parts.reduce((n, p) => n + p.errors, 0),
    rps: (requests / spec.durationMs) * 1000,
    latencies: parts.flatMap((p) => p.latencies),
  };
}

/**
 * One keep-alive connection speaking just enough HTTP/1.1 for these figures: a fixed request,
 * answers delimited by Content-Length. Node's own HTTP client costs several times the server's
 * work per request, which made the client, not the server, the bottleneck. It runs over any
 * stream: a TCP connection, or a guest port the sandbox driver opened.
 */
export class HttpConnection {
  private buffered: Buffer = Buffer.alloc(0);
  private waiting: Array<(status: number) => void> = [];
  private expected: number | null = null;
  private status = 0;

  constructor(private readonly stream: Duplex, private readonly requestBytes: Buffer, private readonly opened: Promise<unknown> = Promise.resolve()) {
    stream.on('data', (chunk: Buffer) => this.read(chunk));
    stream.on('error', () => this.failAll());
    stream.on('close', () => this.failAll());
  }

  /** A TCP connection to `url`'s host that sends `GET url` with `headers`. */
  static dial(url: URL, headers: Record<string, string>): HttpConnection {
    const socket = connect({ host: url.hostname, port: Number(url.port), noDelay: true });
    const opened = new Promise((resolve, reject) => socket.once('connect', resolve).once('error', reject));
    return new HttpConnection(socket, getRequest(url, headers), opened);
  }

  /** Sends the request; answers its status (0 when the connection failed). */
  async send(): Promise<number> {
    await this.opened;
    return new Promise((resolve) => {
      this.waiting.push(resolve);
      this.stream.write(this.requestBytes);
    });
  }

  close(): void {
    this.stream.destroy();
  }

  private read(chunk: Buffer): void {
    this.buffered = this.buffered.length === 0 ? chunk : Buffer.concat([this.buffered, chunk]);
    for (;;) {
      if (this.expected === null) {
        const end = this.buffered.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = this.buffered.toString('latin1', 0, end);
        this.status = Number(head.slice(9, 12));
        const length = /\r\ncontent-length: *(\d+)/i.exec(head);
        if (!length) throw new Error(`an answer without Content-Length: ${head.split('\r\n')[0]}`);
        this.expected = end + 4 + Number(length[1]);
      }
      if (this.buffered.length < this.expected) return;
      this.buffered = this.buffered.subarray(this.expected);
      this.expected = null;
      this.waiting.shift()?.(this.status);
    }
  }

  private failAll(): void {
    for (const w of this.waiting.splice(0)) w(0);
  }
}

/** The bytes of `GET url` with `headers` (and Host), keeping the connection open. */
export function getRequest(url: URL, headers: Record<string, string>): Buffer {
  const head = Object.entries({ host: url.host, ...headers }).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  return Buffer.from(`GET ${url.pathname}${url.search} HTTP/1.1\r\n${head}\r\n`, 'latin1');
}

async function work(job: WorkerJob): Promise<LoadResult> {
  const target = new URL(job.url);
  const connections = Array.from({ length: job.connections }, () => HttpConnection.dial(target, job.headers));
  const latencies: number[] = [];
  let errors = 0;
  const one = async (connection: HttpConnection, scheduledAt: number) => {
    const status = await connection.send();
    if (status === 200) latencies.push(performance.now() - scheduledAt);
    else errors++;
  };
  if (job.workerRate === undefined) {
    const end = performance.now() + job.durationMs;
    await Promise.all(connections.map(async (c) => {
      while (performance.now() < end) await one(c, performance.now());
    }));
  } else {
    // Every connection is open and has carried one request before the schedule starts: the
    // figure is the steady state at the offered rate, not 200 TCP handshakes (and, behind a
    // cluster, their hand-off to a worker) landing in its first few hundred milliseconds.
    await Promise.all(connections.map((c) => c.send()));
    // Open loop: request k is due at start + k / rate, sent on the next idle connection; when
    // every connection is busy it waits, and the wait counts in its latency.
    const start = performance.now();
    const interval = 1000 / job.workerRate;
    const idle = [...connections];
    const due: number[] = [];
    const pending: Promise<void>[] = [];
    const dispatch = () => {
      while (idle.length > 0 && due.length > 0) {
        const c = idle.pop()!;
        pending.push(one(c, due.shift()!).then(() => {
          idle.push(c);
          dispatch();
        }));
      }
    };
    const end = start + job.durationMs;
    let k = 0;
    while (performance.now() < end) {
      const now = performance.now();
      while (start + k * interval <= now) due.push(start + k++ * interval);
      dispatch();
      await new Promise((r) => setTimeout(r, 1));
    }
    while (due.length > 0 || idle.length < connections.length) await new Promise((r) => setTimeout(r, 5));
    await Promise.all(pending);
  }
  for (const c of connections) c.close();
  return { requests: latencies.length, errors, rps: 0, latencies };
}

if (!isMainThread) {
  work(workerData as WorkerJob).then((r) => parentPort!.postMessage(r), (err: unknown) => {
    throw err;
  });
}

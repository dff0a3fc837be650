/**
 * A webhook receiver for tests: a real node:http server on 127.0.0.1 that records every request
 * (raw body included, for signature checks) and answers from a per-path script.
 */
import { createServer, type IncomingHttpHeaders, type ServerResponse } from 'node:http';

export interface ReceivedRequest {
  path: string;
  method: string;
  headers: IncomingHttpHeaders;
  /** The raw body, exactly as received. */
  body: string;
}

/** What the receiver answers: a status, or `hang` (never answer until the receiver closes). */
export type ScriptedAnswer = number | 'hang';

export interface WebhookReceiver {
  readonly port: number;
  /** `http://127.0.0.1:<port>` */
  readonly origin: string;
  readonly requests: ReceivedRequest[];
  /** TCP connections accepted, including ones that never sent a request. */
  connections(): number;
  /** Answers for the next requests to `path`, in order; afterwards 200. */
  script(path: string, answers: ScriptedAnswer[]): void;
  at(path: string): ReceivedRequest[];
  close(): Promise<void>;
}

export async function startWebhookReceiver(): Promise<WebhookReceiver> {
  const requests: ReceivedRequest[] = [];
  const scripts = new Map<string, ScriptedAnswer[]>();
  const hanging: ServerResponse[] = [];
  let connections = 0;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const path = req.url ?? '/';
      requests.push({ path, method: req.method ?? '', headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
      const answer = scripts.get(path)?.shift() ?? 200;
      if (answer === 'hang') {
        hanging.push(res);
        return;
      }
      // A redirect points somewhere else on this receiver, so a test can see it was not followed.
      const location = answer >= 300 && answer < 400 ? { location: `${path}-redirected` } : {};
      res.writeHead(answer, { 'content-type': 'text/plain', ...location }).end(answer < 300 ? 'ok' : 'no');
    });
  });
  server.on('connection', () => connections++);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  return {
    port,
    origin: `http://127.0.0.1:${port}`,
    requests,
    connections: () => connections,
    script: (path, answers) => scripts.set(path, [...answers]),
    at: (path) => requests.filter((r) => r.path === path),
    async close() {
      for (const res of hanging) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

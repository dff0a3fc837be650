/**
 * Port ingress benchmark: HTTP requests to an app inside a desktop through the scheduler's
 * ingress (Host routing, token check, port link to the agent, the desktop's forwarder), against
 * the same requests sent straight into the guest port from this process through the sandbox
 * driver's forwarder — what the path costs without the ingress and the agent's gateway. The
 * kept-alive figures are measured after a warm-up of each path (steady state, not the first
 * requests a freshly started process serves). A third path, a port link dialled straight to the
 * agent's gateway from this process, splits the difference between the agent's hop and the
 * scheduler's.
 */
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import type { Duplex } from 'node:stream';
import { median, table, timed } from './stats.js';
import { getRequest, HttpConnection } from './load.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { dialPortLink } from '../../scheduler/src/ingress/port-link-client.js';
import { portLinkKey } from '../../shared/src/port-link.js';

export interface IngressBenchContext {
  readonly schedulerUrl: string;
  readonly ingressUrl: string;
  readonly apiKey: string;
  /** The agent's runtime state directory. */
  readonly runtimeDir: string;
  readonly runs: number;
  /** For the middle path (the agent's gateway without the ingress): the database and the schedulers' key. */
  readonly databaseUrl: string;
  readonly secretKey: string;
}

const APP_PORT = 8000;
const SEQUENTIAL = 200;
const TOTAL = 2000;
const CONCURRENCY = 16;

/** One GET with a fresh connection through the ingress; resolves with the status. */
function viaIngress(ingress: URL, host: string, token: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: ingress.hostname, port: ingress.port, path: `/bench?svc_token=${token}`, headers: { host }, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end();
  });
}

/** The same GET written on a connection the driver opened to the guest port. */
async function direct(open: () => Promise<NodeJS.ReadWriteStream>): Promise<number> {
  const socket = await open();
  return new Promise((resolve, reject) => {
    let head = '';
    socket.on('data', (chunk: Buffer) => {
      if (head.length < 12) head += chunk.toString('latin1');
    });
    socket.on('end', () => {
      // Our end too: the forwarder keeps a half-open connection (and its process) otherwise.
      socket.end();
      resolve(Number(head.slice(9, 12)));
    });
    socket.on('error', reject);
    socket.write('GET /bench HTTP/1.1\r\nHost: guest\r\nConnection: close\r\n\r\n');
  });
}

/** Latencies of SEQUENTIAL requests, one after another on one kept-alive connection. */
async function sequentialKept(open: () => Promise<HttpConnection>): Promise<number[]> {
  const connection = await open();
  try {
    if ((await connection.send()) !== 200) throw new Error('the first request failed');
    const samples: number[] = [];
    for (let i = 0; i < SEQUENTIAL; i++) {
      samples.push(await timed(async () => {
        const status = await connection.send();
        if (status !== 200) throw new Error(`request answered ${status}`);
      }));
    }
    return samples;
  } finally {
    connection.close();
  }
}

/** Requests per second: TOTAL requests over CONCURRENCY kept-alive connections. */
async function throughputKept(open: () => Promise<HttpConnection>): Promise<number> {
  const connections = await Promise.all(Array.from({ length: CONCURRENCY }, open));
  try {
    return await throughput((i) => connections[i]!.send());
  } finally {
    for (const c of connections) c.close();
  }
}

/** Requests per second of TOTAL requests, CONCURRENCY at a time; worker i sends with `one(i)`. */
async function throughput(one: (worker: number) => Promise<number>): Promise<number> {
  let next = 0;
  const ms = await timed(() =>
    Promise.all(Array.from({ length: CONCURRENCY }, async (_, i) => {
      while (next++ < TOTAL) {
        const status = await one(i);
        if (status !== 200) throw new Error(`request answered ${status}`);
      }
    })),
  );
  return (TOTAL / ms) * 1000;
}

export async function benchIngress(ctx: IngressBenchContext): Promise<void> {
  const headers = { authorization: `Bearer ${ctx.apiKey}`, 'content-type': 'application/json' };
  const call = async (path: string, body?: unknown, method = 'POST') => {
    const res = await fetch(ctx.schedulerUrl + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const json = (await res.json().catch(() => ({}))) as Record<string, unknown>;
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  const id = (await call('/v1/desktops', { tier: 'default' })).id as string;
  await call(`/v1/desktops/${id}/wake?wait=true`, {});
  const app = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'guest-echo-app.mjs'));
  const put = await fetch(`${ctx.schedulerUrl}/v1/desktops/${id}/files/root/app.mjs`, { method: 'PUT', headers: { authorization: headers.authorization }, body: app });
  if (!put.ok) throw new Error(`PUT /root/app.mjs: ${put.status} ${await put.text()}`);
  await call(`/v1/desktops/${id}/exec`, { command: `setsid node /root/app.mjs ${APP_PORT} >/root/app.log 2>&1 </dev/null &` });
  // Until the app listens (a fixed pause was too short on a loaded host: ECONNREFUSED in the guest).
  const listening = await call(`/v1/desktops/${id}/exec`, {
    command: `bash -c 'for i in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/${APP_PORT}) 2>/dev/null && exit 0; sleep 0.05; done; cat /root/app.log; exit 1'`,
  });
  if (listening.exit_code !== 0) throw new Error(`the guest app did not listen on ${APP_PORT}: ${String(listening.stdout)}`);
  const exposure = await call(`/v1/desktops/${id}/ports`, { port: APP_PORT });
  const token = exposure.token as string;
  const host = new URL(exposure.url as string).hostname;
  const ingress = new URL(ctx.ingressUrl);
  const driver = await createSandboxDriver({ stateDir: ctx.runtimeDir });
  const openDirect = () => driver.openGuestPort(id, APP_PORT) as Promise<NodeJS.ReadWriteStream>;
  // Kept-alive connections: through the ingress (its links to the agent are kept too), and
  // straight into the guest port.
  const ingressUrl = new URL(`/bench?svc_token=${token}`, ingress);
  const viaIngressKept = async () => HttpConnection.dial(ingressUrl, { host });
  const sql = connectDatabase(ctx.databaseUrl, { max: 1 });
  const [row] = await sql<Array<{ host_id: string; generation: number; ingress_address: string }>>`
    select d.host_id, d.generation, h.ingress_address from desktops d join hosts h on h.id = d.host_id where d.id = ${id}`;
  await sql.end();
  const linkSecret = portLinkKey(ctx.secretKey, row!.host_id);
  const target = { desktopId: id, generation: row!.generation, port: APP_PORT };
  const gatewayKept = async () => new HttpConnection(await dialPortLink(linkSecret, row!.ingress_address, target), getRequest(new URL('http://guest/bench'), {}));
  const directKept = async () => new HttpConnection((await driver.openGuestPort(id, APP_PORT)) as unknown as Duplex, getRequest(new URL('http://guest/bench'), {}));
  try {
    await viaIngress(ingress, host, token);
    await direct(openDirect);
    const lat: number[] = [];
    const latDirect: number[] = [];
    for (let i = 0; i < SEQUENTIAL / 4; i++) {
      lat.push(await timed(() => viaIngress(ingress, host, token)));
      latDirect.push(await timed(() => direct(openDirect)));
    }
    // Warm-up, both paths alike: the ingress (every scheduler worker: connections spread over
    // them) and the agent run their relay code optimised, as they do once they have served a
    // few thousand requests, rather than the interpreter's first few hundred.
    await throughputKept(viaIngressKept);
    await throughputKept(directKept);
    const kept = await sequentialKept(viaIngressKept);
    const keptDirect = await sequentialKept(directKept);
    await throughputKept(gatewayKept);
    const keptGateway = await sequentialKept(gatewayKept);
    const rps: number[] = [];
    const rpsDirect: number[] = [];
    const rpsGateway: number[] = [];
    for (let i = 0; i < Math.max(3, Math.round(ctx.runs / 2)); i++) {
      rps.push(await throughputKept(viaIngressKept));
      rpsDirect.push(await throughputKept(directKept));
      rpsGateway.push(await throughputKept(gatewayKept));
    }
    table(`Port ingress: GET to an app in the desktop (${SEQUENTIAL} sequential on one kept-alive connection; ${TOTAL} over ${CONCURRENCY} kept-alive connections); baseline = the guest port opened through the sandbox driver`, [
      ['latency, kept-alive connection', median(kept), median(keptDirect), 'ms', 'adds ≤ 0.3 ms', kept],
      ['throughput, kept-alive connections', median(rps), median(rpsDirect), 'req/s', '≥ 0.8× direct', rps],
      ['latency, kept-alive, agent gateway without the ingress', median(keptGateway), median(keptDirect), 'ms', '(where the time goes)', keptGateway],
      ['throughput, kept-alive, agent gateway without the ingress', median(rpsGateway), median(rpsDirect), 'req/s', '(where the time goes)', rpsGateway],
      ['latency, a new connection each', median(lat), median(latDirect), 'ms', 'added latency = the difference', lat],
    ]);
    console.log(`ingress adds ${(median(kept) - median(keptDirect)).toFixed(2)} ms to a request on a kept-alive connection`);
  } finally {
    await driver.close();
    await call(`/v1/desktops/${id}/destroy?wait=true`, {}).catch(() => undefined);
  }
}

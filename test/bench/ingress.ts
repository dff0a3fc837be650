/**
 * Port ingress benchmark: HTTP requests to an app inside a desktop through the scheduler's
 * ingress (Host routing, token check, port link to the agent, the desktop's forwarder), against
 * the same requests sent straight into the guest port from this process through the sandbox
 * driver's forwarder — what the path costs without the ingress and the agent's gateway.
 */
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { median, table, timed } from './stats.js';

export interface IngressBenchContext {
  readonly schedulerUrl: string;
  readonly ingressUrl: string;
  readonly apiKey: string;
  /** The agent's runtime state directory. */
  readonly runtimeDir: string;
  readonly runs: number;
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

async function throughput(one: () => Promise<number>): Promise<number> {
  let next = 0;
  const ms = await timed(() =>
    Promise.all(Array.from({ length: CONCURRENCY }, async () => {
      while (next++ < TOTAL) {
        const status = await one();
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
  await fetch(`${ctx.schedulerUrl}/v1/desktops/${id}/files/root/app.mjs`, { method: 'PUT', headers: { authorization: headers.authorization }, body: app });
  await call(`/v1/desktops/${id}/exec`, { command: `setsid node /root/app.mjs ${APP_PORT} >/root/app.log 2>&1 </dev/null &` });
  await new Promise((r) => setTimeout(r, 500));
  const exposure = await call(`/v1/desktops/${id}/ports`, { port: APP_PORT });
  const token = exposure.token as string;
  const host = new URL(exposure.url as string).hostname;
  const ingress = new URL(ctx.ingressUrl);
  const driver = await createSandboxDriver({ stateDir: ctx.runtimeDir });
  const openDirect = () => driver.openGuestPort(id, APP_PORT) as Promise<NodeJS.ReadWriteStream>;
  try {
    await viaIngress(ingress, host, token);
    await direct(openDirect);
    const lat: number[] = [];
    const latDirect: number[] = [];
    for (let i = 0; i < SEQUENTIAL; i++) {
      lat.push(await timed(() => viaIngress(ingress, host, token)));
      latDirect.push(await timed(() => direct(openDirect)));
    }
    const rps: number[] = [];
    const rpsDirect: number[] = [];
    for (let i = 0; i < Math.max(3, Math.round(ctx.runs / 2)); i++) {
      rps.push(await throughput(() => viaIngress(ingress, host, token)));
      rpsDirect.push(await throughput(() => direct(openDirect)));
    }
    table(`Port ingress: GET to an app in the desktop, a new connection each (${SEQUENTIAL} sequential; ${TOTAL} at concurrency ${CONCURRENCY}); baseline = the guest port opened through the sandbox driver`, [
      ['latency, one request', median(lat), median(latDirect), 'ms', 'added latency = the difference', lat],
      ['throughput', median(rps), median(rpsDirect), 'req/s', 'higher is better', rps],
    ]);
  } finally {
    await driver.close();
    await call(`/v1/desktops/${id}/destroy?wait=true`, {}).catch(() => undefined);
  }
}

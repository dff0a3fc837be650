/**
 * Guest operation benchmarks: each measure through the API (HTTP, auth, database lookup, agent
 * link, agent, runtime) against the same work done straight on the sandbox driver, in the same
 * desktop, from this process — what the runtime itself costs. The driver is a second instance on
 * the agent's own state directory, the way an operator's tooling reaches a desktop.
 */
import { request } from 'node:http';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import type { RuntimeDriver } from '../../agent/src/runtime/driver.js';
import { median, percentile, table, timed } from './stats.js';

export interface GuestBenchContext {
  readonly schedulerUrl: string;
  readonly apiKey: string;
  /** The agent's runtime state directory. */
  readonly runtimeDir: string;
  readonly runs: number;
}

const CHUNK = 8 * 1024 * 1024;
const EXEC_RUNS = 50;
const CONCURRENT = 100;
const DESKTOPS = 5;

async function* once(buf: Buffer): AsyncGenerator<Buffer> {
  yield buf;
}

/**
 * A plain node:http request, as curl would make it: fetch's web streams add client-side cost
 * that is not the service's.
 */
function http(method: string, url: string, headers: Record<string, string>, body?: Buffer): Promise<{ status: number; bytes: number }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method, headers: body ? { ...headers, 'content-length': String(body.length) } : headers }, (res) => {
      let bytes = 0;
      res.on('data', (chunk: Buffer) => (bytes += chunk.length));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, bytes }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

async function drain(body: AsyncIterable<Buffer>): Promise<number> {
  let n = 0;
  for await (const part of body) n += part.length;
  return n;
}

export async function benchGuestOps(ctx: GuestBenchContext): Promise<void> {
  const auth = { authorization: `Bearer ${ctx.apiKey}` };
  const post = async (path: string, body: unknown) => {
    const res = await fetch(ctx.schedulerUrl + path, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const json = (await res.json()) as Record<string, unknown>;
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  const ids: string[] = [];
  for (let i = 0; i < DESKTOPS; i++) {
    const id = (await post('/v1/desktops', { tier: 'small' })).id as string;
    await post(`/v1/desktops/${id}/wake?wait=true`, {});
    ids.push(id);
  }
  const id = ids[0]!;
  const driver: RuntimeDriver = await createSandboxDriver({ stateDir: ctx.runtimeDir });
  const execApi = () => post(`/v1/desktops/${id}/exec`, { command: 'true' });
  const execDirect = (desktopId: string) => driver.exec(desktopId, { command: 'true', timeoutMs: 10_000, maxOutputBytes: 1024 });

  try {
    // Exec round trip of `true`, interleaved so both see the same machine state.
    await execApi();
    await execDirect(id);
    const viaApi: number[] = [];
    const direct: number[] = [];
    for (let i = 0; i < EXEC_RUNS; i++) {
      viaApi.push(await timed(execApi));
      direct.push(await timed(() => execDirect(id)));
    }
    table(`Exec round trip of \`true\` (ms, ${EXEC_RUNS} runs); baseline = the sandbox driver running it in the same desktop`, [
      ['POST /v1/desktops/{id}/exec', median(viaApi), median(direct), 'ms', 'ratio ≤ 1.5×, p50 < 15 ms'],
    ]);

    // 8 MiB chunks: a replacing write and a whole-file read.
    const data = Buffer.alloc(CHUNK, 7);
    const url = `${ctx.schedulerUrl}/v1/desktops/${id}/files/root/bench.bin`;
    const mbps = (ms: number) => CHUNK / 1e6 / (ms / 1000);
    const wApi: number[] = [];
    const rApi: number[] = [];
    const wDirect: number[] = [];
    const rDirect: number[] = [];
    for (let i = 0; i < Math.max(5, ctx.runs); i++) {
      wApi.push(mbps(await timed(async () => {
        const res = await http('PUT', url, auth, data);
        if (res.status !== 204) throw new Error(`PUT: ${res.status}`);
      })));
      rApi.push(mbps(await timed(async () => {
        const res = await http('GET', url, auth);
        if (res.status !== 200 || res.bytes !== CHUNK) throw new Error(`GET: ${res.status}, ${res.bytes} bytes`);
      })));
      wDirect.push(mbps(await timed(() => driver.writeFile(id, { path: '/root/direct.bin', appendAt: null }, once(data)))));
      rDirect.push(mbps(await timed(async () => {
        const read = await driver.readFile(id, { path: '/root/direct.bin', offset: null, length: CHUNK, maxWholeBytes: CHUNK });
        await drain(read.body);
      })));
    }
    table('File throughput, 8 MiB chunks (MB/s, higher is better); baseline = the sandbox driver alone', [
      ['PUT /v1/desktops/{id}/files/{path}', median(wApi), median(wDirect), 'MB/s', '≥ 300 MB/s'],
      ['GET /v1/desktops/{id}/files/{path}', median(rApi), median(rDirect), 'MB/s', '≥ 300 MB/s'],
    ]);

    // 100 concurrent execs spread over 5 desktops.
    const spread = async (one: (desktopId: string) => Promise<unknown>) => {
      const latencies: number[] = [];
      await Promise.all(Array.from({ length: CONCURRENT }, async (_, i) => {
        latencies.push(await timed(() => one(ids[i % DESKTOPS]!)));
      }));
      return latencies;
    };
    const cApi: number[] = [];
    const cDirect: number[] = [];
    for (let round = 0; round < 3; round++) {
      cApi.push(...(await spread((d) => post(`/v1/desktops/${d}/exec`, { command: 'true' }))));
      cDirect.push(...(await spread(execDirect)));
    }
    table(`${CONCURRENT} concurrent execs of \`true\` across ${DESKTOPS} desktops (ms per exec, 3 rounds); baseline = the sandbox driver`, [
      ['p50', percentile(cApi, 50), percentile(cDirect, 50), 'ms', 'lower is better'],
      ['p99', percentile(cApi, 99), percentile(cDirect, 99), 'ms', 'lower is better'],
    ], ['API', 'driver']);
  } finally {
    await driver.close();
    for (const d of ids) await post(`/v1/desktops/${d}/destroy?wait=true`, {}).catch(() => undefined);
  }
}

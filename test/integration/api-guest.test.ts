/**
 * The guest routes' own rules (docs/api.md §4.3, 4.4, 7), fast, with a real scheduler and a real agent on
 * the FakeDriver: bodies stream across the link both ways, a desktop that is not awake answers
 * 409, a host without a link answers 503 at once, and caps answer 400/413 before any guest work.
 * The same rules against the real sandbox runtime are in test/e2e/guest-ops.test.ts.
 */
import { createHash, randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler, awakeDesktop } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

const MiB = 1024 * 1024;
const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

let s: TestScheduler;
let agent: TestAgent;
let key: string;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url);
  key = await mintKey(s.databaseUrl, 'guest');
  call = api(s.url, key);
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

async function put(path: string, body: Uint8Array) {
  return fetch(s.url + path, { method: 'PUT', headers: { authorization: `Bearer ${key}` }, body });
}

describe('guest routes over the fake runtime', () => {
  it('streams a file up and down the agent link byte for byte', async () => {
    const id = await awakeDesktop(call);
    const data = randomBytes(8 * MiB);
    expect((await put(`/v1/desktops/${id}/files/root/blob`, data)).status).toBe(204);
    const whole = await fetch(`${s.url}/v1/desktops/${id}/files/root/blob`, { headers: { authorization: `Bearer ${key}` } });
    expect(whole.status).toBe(200);
    expect(whole.headers.get('content-length')).toBe(String(data.length));
    expect(sha(Buffer.from(await whole.arrayBuffer()))).toBe(sha(data));
    const window = await fetch(`${s.url}/v1/desktops/${id}/files/root/blob?offset=${MiB}&length=10`, { headers: { authorization: `Bearer ${key}` } });
    expect(Buffer.from(await window.arrayBuffer())).toEqual(data.subarray(MiB, MiB + 10));
    expect(window.headers.get('x-svc-file-size')).toBe(String(data.length));
    expect(window.headers.get('x-svc-eof')).toBe('false');
  });

  it('runs exec and detached exec', async () => {
    const id = await awakeDesktop(call);
    const sync = await call('POST', `/v1/desktops/${id}/exec`, { command: 'echo hi' });
    expect(sync.json).toEqual({ exit_code: 0, stdout: 'hi\n', stderr: '', stdout_truncated: false, stderr_truncated: false });
    const detached = await call('POST', `/v1/desktops/${id}/exec`, { command: 'exit 5', detached: true });
    expect(detached.status).toBe(202);
    const status = await call('GET', `/v1/desktops/${id}/processes/${detached.json.process_id}`);
    expect(status.json).toMatchObject({ status: 'exited', exit_code: 5 });
  });

  it('reads and resizes the display within 640-2560 x 480-1600, and keeps the size across a memory snapshot', async () => {
    const id = await awakeDesktop(call);
    expect((await call('GET', `/v1/desktops/${id}/display`)).json).toEqual({ width: 1024, height: 768 });
    const put = await call('PUT', `/v1/desktops/${id}/display`, { width: 1280, height: 800 });
    expect(put.status, put.text).toBe(200);
    expect(put.json).toEqual({ width: 1280, height: 800 });
    for (const body of [{ width: 639, height: 600 }, { width: 2561, height: 600 }, { width: 800, height: 479 }, { width: 800, height: 1601 }, { width: 800 }, { width: 800.5, height: 600 }, {}]) {
      expectProblem(await call('PUT', `/v1/desktops/${id}/display`, body), 400, JSON.stringify(body));
    }
    expect((await call('PUT', `/v1/desktops/${id}/display`, { width: 2560, height: 1600 })).json).toEqual({ width: 2560, height: 1600 });
    await call('POST', `/v1/desktops/${id}/hibernate?wait=true`);
    expectProblem(await call('GET', `/v1/desktops/${id}/display`), 409, 'hibernated');
    await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect((await call('GET', `/v1/desktops/${id}/display`)).json).toEqual({ width: 2560, height: 1600 });
  });

  it('answers 409 for a desktop that is not awake, before contacting any host', async () => {
    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    const res = await call('POST', `/v1/desktops/${created.json.id}/exec`, { command: 'true' });
    expectProblem(res, 409);
    expectProblem(await call('GET', `/v1/desktops/${created.json.id}/dir/`), 409);
  });

  it('answers 413 for a declared body over 8 MiB and 400 for bad paths, without guest work', async () => {
    const id = await awakeDesktop(call);
    const big = await put(`/v1/desktops/${id}/files/root/big`, Buffer.alloc(8 * MiB + 1));
    expect(big.status).toBe(413);
    expect(big.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect((await call('GET', `/v1/desktops/${id}/files-meta/root/big`)).status).toBe(404);
    expectProblem(await call('GET', `/v1/desktops/${id}/files/`), 400);
    expectProblem(await call('GET', `/v1/desktops/${id}/files/a%00`), 400);
    expectProblem(await call('DELETE', `/v1/desktops/${id}/files/.`), 400);
    // A long path is a path, not a 414: up to PATH_MAX.
    const long = `root/${'d/'.repeat(600)}f`;
    expectProblem(await call('GET', `/v1/desktops/${id}/files/${long}`), 404);
  });

  it('answers 503 at once when the host has no link', async () => {
    const id = await awakeDesktop(call);
    await agent.stop();
    const t0 = performance.now();
    const res = await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' });
    expectProblem(res, 503);
    expect(res.headers.get('retry-after')).toBe('5');
    // "At once": long before any guest or link deadline.
    expect(performance.now() - t0).toBeLessThan(2_000);
    agent = await startFakeAgent(s.url);
  });
});

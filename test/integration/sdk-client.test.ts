/**
 * The SDK against a real scheduler (real PostgreSQL, real sockets) and a real agent on the
 * FakeDriver: a desktop's whole life through the helpers — create with an idempotency key,
 * wake and wait, exec, upload and download (buffer, web stream, Node stream) checked by sha256,
 * hibernate, destroy — and the problems a client meets, thrown as typed exceptions: a missing
 * desktop and another org's desktop alike, a desktop that is not awake, a refused key, a failed
 * operation. The same flow on the real sandbox runtime is test/e2e/lifecycle.test.ts.
 */
import { createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  BadRequestProblem, ConflictProblem, NotFoundProblem, OperationFailedError, UnauthorizedProblem, UnavailableProblem, createCanto, unwrap, type Canto,
} from '../../sdk/src/index.js';
import { mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

const MiB = 1024 * 1024;
const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

let s: TestScheduler;
let agent: TestAgent;
let key: string;
let canto: Canto;
let other: Canto;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url);
  key = await mintKey(s.databaseUrl, 'sdk');
  canto = createCanto({ baseUrl: s.url, apiKey: key });
  other = createCanto({ baseUrl: s.url, apiKey: await mintKey(s.databaseUrl, 'sdk-other') });
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

describe('the SDK against a real scheduler', () => {
  it('takes a desktop through its life: create, wake, exec, files, hibernate, destroy', async () => {
    const key = `sdk-${randomBytes(6).toString('hex')}`;
    const desktop = await canto.createDesktop({ tier: 'small', idle_timeout_secs: 0 }, { idempotencyKey: key });
    expect(desktop).toMatchObject({ tier: 'small', state: expect.any(String) });
    // The same key answers the same desktop, not a second one.
    expect((await canto.createDesktop({ tier: 'small' }, { idempotencyKey: key })).id).toBe(desktop.id);
    expect((await canto.listDesktops()).filter((d) => d.id === desktop.id)).toHaveLength(1);

    const woke = await canto.wake(desktop.id, { wait: true });
    expect(woke).toMatchObject({ kind: 'wake', state: 'succeeded', desktop_id: desktop.id });
    expect((await canto.getDesktop(desktop.id)).state).toBe('awake');
    expect((await canto.listDesktops('awake')).map((d) => d.id)).toContain(desktop.id);

    expect(await canto.exec(desktop.id, 'echo hi')).toMatchObject({ exit_code: 0, stdout: 'hi\n' });
    const processId = await canto.execDetached(desktop.id, 'exit 5');
    expect(await canto.process(desktop.id, processId)).toMatchObject({ status: 'exited', exit_code: 5 });

    // A buffer, a web stream and a Node stream, each read back whole and checked by sha256.
    const data = randomBytes(3 * MiB + 17);
    await canto.files.upload(desktop.id, '/root/buffer.bin', data);
    expect(sha(await canto.files.readBytes(desktop.id, '/root/buffer.bin'))).toBe(sha(data));
    const chunks = [data.subarray(0, MiB), data.subarray(MiB)];
    await canto.files.upload(desktop.id, 'root/web stream.bin', Readable.toWeb(Readable.from(chunks)) as ReadableStream<Uint8Array>);
    await canto.files.upload(desktop.id, 'root/node-stream.bin', Readable.from(chunks));
    for (const path of ['root/web stream.bin', '/root/node-stream.bin']) {
      const download = await canto.files.download(desktop.id, path);
      expect(download.size).toBe(data.length);
      const hash = createHash('sha256');
      for await (const chunk of Readable.fromWeb(download.body as import('node:stream/web').ReadableStream<Uint8Array>)) hash.update(chunk as Buffer);
      expect(hash.digest('hex'), path).toBe(sha(data));
    }
    // Appends land only at the file's current size; a window reports size and end of file.
    await canto.files.upload(desktop.id, 'root/log.txt', 'one\n');
    await canto.files.upload(desktop.id, 'root/log.txt', 'two\n', { appendAt: 4 });
    const guard = (await canto.files.upload(desktop.id, 'root/log.txt', 'x', { appendAt: 1 }).catch((e: unknown) => e)) as ConflictProblem;
    expect(guard).toBeInstanceOf(ConflictProblem);
    expect(guard.body.currentSize).toBe(8);
    const window = await canto.files.download(desktop.id, 'root/log.txt', { offset: 4, length: 10 });
    expect(await new Response(window.body).text()).toBe('two\n');
    expect(window).toMatchObject({ size: 8, eof: true });
    expect(await canto.files.stat(desktop.id, 'root/log.txt')).toMatchObject({ path: 'root/log.txt', fileType: 'file', sizeBytes: 8 });
    expect((await canto.files.list(desktop.id, '/root')).entries.map((e) => e.name)).toEqual(['buffer.bin', 'log.txt', 'node-stream.bin', 'web stream.bin']);
    await canto.files.remove(desktop.id, 'root/log.txt');
    await expect(canto.files.stat(desktop.id, 'root/log.txt')).rejects.toBeInstanceOf(NotFoundProblem);

    // The raw typed client reaches every route, and throws the same problems.
    const ports = unwrap(await canto.api.GET('/v1/desktops/{id}/ports', { params: { path: { id: desktop.id } } }));
    expect(ports.ports).toEqual([]);

    const hibernated = await canto.hibernate(desktop.id, { wait: { timeoutMs: 30_000 } });
    expect(hibernated.state).toBe('succeeded');
    expect((await canto.getDesktop(desktop.id)).state).toBe('hibernated');
    await expect(canto.exec(desktop.id, 'true')).rejects.toBeInstanceOf(ConflictProblem);

    const destroying = await canto.destroy(desktop.id);
    expect(['pending', 'running', 'succeeded']).toContain(destroying.state);
    expect((await canto.waitForOperation(destroying)).state).toBe('succeeded');
    expect((await canto.getDesktop(desktop.id)).state).toBe('destroyed');
  });

  it('repeats of a lifecycle call with one key answer the one operation', async () => {
    const desktop = await canto.createDesktop({ tier: 'small' });
    const first = await canto.wake(desktop.id, { idempotencyKey: 'wake-once' });
    const again = await canto.wake(desktop.id, { idempotencyKey: 'wake-once' });
    expect(again.id).toBe(first.id);
    expect((await canto.waitForOperation(first.id)).state).toBe('succeeded');
  });

  it('throws one NotFoundProblem for a missing desktop and for another org’s, with the same detail', async () => {
    const mine = await canto.createDesktop({ tier: 'small' });
    const missing = (await canto.getDesktop('dsk_0000000000000000000000aa').catch((e: unknown) => e)) as NotFoundProblem;
    const foreign = (await other.getDesktop(mine.id).catch((e: unknown) => e)) as NotFoundProblem;
    for (const err of [missing, foreign]) {
      expect(err).toBeInstanceOf(NotFoundProblem);
      expect(err).toMatchObject({ status: 404, kind: 'not_found', type: 'about:blank', title: 'Not Found', method: 'GET' });
    }
    expect(foreign.detail).toBe(missing.detail);
    await expect(other.wake(mine.id)).rejects.toBeInstanceOf(NotFoundProblem);
    await expect(other.files.readBytes(mine.id, 'root/x')).rejects.toBeInstanceOf(NotFoundProblem);
    await expect(canto.getOperation('op_0000000000000000000000aa')).rejects.toBeInstanceOf(NotFoundProblem);
  });

  it('refuses a "." or ".." segment before sending anything: it would name another route', async () => {
    const desktop = await canto.createDesktop({ tier: 'small' });
    const made = await fetch(`${s.url}/v1/keys`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: '{}' });
    expect(made.status).toBe(201);
    const victim = (await made.json()) as { id: string };
    // What a path taken from a user of an app built on the SDK could be.
    await expect(canto.files.remove(desktop.id, `../../../keys/${victim.id}`)).rejects.toThrow(/"\.\." segment/);
    await expect(canto.files.readBytes(desktop.id, 'root/./x')).rejects.toBeInstanceOf(TypeError);
    await expect(canto.getDesktop('..')).rejects.toBeInstanceOf(TypeError);
    const listed = await fetch(`${s.url}/v1/keys`, { headers: { authorization: `Bearer ${key}` } });
    const keys = (await listed.json()) as { keys?: Array<{ id: string; revoked_at?: string | null }> } | Array<{ id: string; revoked_at?: string | null }>;
    const all = Array.isArray(keys) ? keys : (keys.keys ?? []);
    expect(all.find((k) => k.id === victim.id)).toMatchObject({ id: victim.id });
    expect(all.find((k) => k.id === victim.id)?.revoked_at ?? null).toBeNull();
  });

  it('throws typed problems for a refused key, a bad request and a failed operation', async () => {
    const stranger = createCanto({ baseUrl: s.url, apiKey: 'svc_sk_not-a-real-key' });
    await expect(stranger.listDesktops()).rejects.toBeInstanceOf(UnauthorizedProblem);
    const bad = (await canto.createDesktop({ tier: 'huge' as 'small' }).catch((e: unknown) => e)) as BadRequestProblem;
    expect(bad).toBeInstanceOf(BadRequestProblem);
    expect(bad.body.errors?.[0]?.field).toBe('body/tier');

    // A stale generation fails the operation at once (docs/api.md §3.4): the call throws 409 naming the
    // failed operation, and waiting for that operation throws it with its error.
    const desktop = await canto.createDesktop({ tier: 'small' });
    const stale = (await canto.wake(desktop.id, { expectedGeneration: desktop.generation + 7, wait: true }).catch((e: unknown) => e)) as ConflictProblem;
    expect(stale).toBeInstanceOf(ConflictProblem);
    expect(stale.operationId).toMatch(/^op_/);
    const failed = (await canto.waitForOperation(stale.operationId!).catch((e: unknown) => e)) as OperationFailedError;
    expect(failed).toBeInstanceOf(OperationFailedError);
    expect(failed.operation).toMatchObject({ id: stale.operationId, state: 'failed', kind: 'wake', error: { code: 'generation_mismatch' } });
    expect(failed.message).toContain('generation_mismatch');
    const allowed = await canto.waitForOperation(failed.operation.id, { allowFailure: true });
    expect(allowed.state).toBe('failed');
  });

  it("retries a guest read after the server's Retry-After while the host is unreachable, then hands back the 503", async () => {
    const desktop = await canto.createDesktop({ tier: 'small' });
    await canto.wake(desktop.id, { wait: true });
    await canto.files.upload(desktop.id, 'root/a.txt', 'a');
    await agent.stop();
    try {
      const waits: number[] = [];
      const patient = createCanto({ baseUrl: s.url, apiKey: key, retry: { maxAttempts: 3, sleep: async (ms) => void waits.push(ms) } });
      const err = (await patient.files.readBytes(desktop.id, 'root/a.txt').catch((e: unknown) => e)) as UnavailableProblem;
      expect(err).toBeInstanceOf(UnavailableProblem);
      expect(err.retryAfterSecs).toBeGreaterThan(0);
      // Two waits between three attempts, each exactly what the server asked for.
      expect(waits).toEqual([err.retryAfterSecs! * 1000, err.retryAfterSecs! * 1000]);
      // An exec is not safe to repeat: one attempt, no wait.
      await expect(patient.exec(desktop.id, 'true')).rejects.toBeInstanceOf(UnavailableProblem);
      expect(waits).toHaveLength(2);
    } finally {
      agent = await startFakeAgent(s.url);
    }
  });
});

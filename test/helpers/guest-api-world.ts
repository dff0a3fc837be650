/**
 * The world of the end-to-end guest-operation tests (e2e/guest-ops.test.ts,
 * e2e/guest-files.test.ts): a real scheduler and a real agent in-process on the sandbox runtime,
 * two orgs' API calls, and one awake desktop (with an env file and a setup script that exits 3),
 * plus the raw HTTP calls the tests make. Each test file gets its own (vitest loads this module
 * afresh for every file).
 */
import { createHash } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, expect } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler } from './scheduler.js';
import { startSandboxAgent, type SandboxAgent } from './agent.js';

export const isRoot = process.getuid?.() === 0;
export const MiB = 1024 * 1024;

export const sha256 = (data: Uint8Array) => createHash('sha256').update(data).digest('hex');

export let scheduler: TestScheduler;
export let agent: SandboxAgent;
export let key: string;
export let call: ReturnType<typeof api>;
export let other: ReturnType<typeof api>;
export let id: string;

/** Raw request with a binary body; answers status, headers and the body as bytes. */
export async function raw(method: string, path: string, body?: Uint8Array, headers: Record<string, string> = {}) {
  const res = await fetch(scheduler.url + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...headers },
    body,
  });
  const bytes = Buffer.from(await res.arrayBuffer());
  let json: any = null;
  try {
    json = JSON.parse(bytes.toString());
  } catch {
    json = null;
  }
  return { status: res.status, headers: res.headers, bytes, text: bytes.toString(), json };
}

/** A request whose path goes on the wire exactly as written. */
export function literalPath(method: string, path: string): Promise<{ status: number; body: string }> {
  const url = new URL(scheduler.url);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: url.hostname, port: url.port, method, path, headers: { authorization: `Bearer ${key}` } }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

export const exec = async (command: string, extra: Record<string, unknown> = {}) => {
  const res = await call('POST', `/v1/desktops/${id}/exec`, { command, ...extra });
  return res;
};

export async function createAwake(body: Record<string, unknown> = { tier: 'small' }): Promise<string> {
  const created = await call('POST', '/v1/desktops', body);
  expect(created.status, created.text).toBe(201);
  const woke = await call('POST', `/v1/desktops/${created.json.id}/wake?wait=true`);
  expect(woke.status, woke.text).toBe(200);
  expect(woke.json.state).toBe('succeeded');
  return created.json.id;
}

/** Starts the agent again on the same state directory, after a test halted it. */
export async function restartAgent(): Promise<void> {
  agent = await startSandboxAgent(scheduler.url, agent.stateDir);
}

/** Starts the world around the calling describe block; call it inside one. */
export function useAwakeDesktop(): void {
  beforeAll(async () => {
    scheduler = await startTestScheduler({ CANTO_OPERATION_DEADLINE_MS: '60000' });
    agent = await startSandboxAgent(scheduler.url);
    key = await mintKey(scheduler.databaseUrl, 'guest-ops');
    call = api(scheduler.url, key);
    other = api(scheduler.url, await mintKey(scheduler.databaseUrl, 'someone-else'));
    id = await createAwake({ tier: 'small', env: { GREETING: "hello 'guest'" }, setup_script: 'echo set up; exit 3' });
  }, 120_000);

  afterAll(async () => {
    await agent?.stop();
    await scheduler?.close();
  }, 120_000);
}

/**
 * The webhook SSRF guard on a deployment without the loopback opt-in: loopback and link-local
 * hosts in every spelling are refused at registration, and a host name that passes registration
 * but resolves to loopback is refused when a delivery connects: the delivery fails at once with a
 * clear error, is not retried, and no connection reaches the address. Resolution is real code in
 * both variants here: a name pinned by CANTO_WEBHOOK_HOSTS, and (where /etc/hosts has one) a
 * name the system resolver maps to loopback.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';
import { expectProblem } from '../helpers/problem.js';

type Call = ReturnType<typeof api>;

/** A name other than localhost that /etc/hosts maps to a loopback address, if there is one. */
function loopbackAliasFromHosts(): string | null {
  let text = '';
  try {
    text = readFileSync('/etc/hosts', 'utf8');
  } catch {
    return null;
  }
  for (const line of text.split('\n')) {
    const [address, ...names] = line.replace(/#.*/, '').trim().split(/\s+/);
    if (!address || !(address.startsWith('127.') || address === '::1')) continue;
    const alias = names.find((n) => n && !/(^|\.)localhost\.?$/i.test(n));
    if (alias) return alias;
  }
  return null;
}

let s: TestScheduler;
let agent: TestAgent;
let receiver: WebhookReceiver;
let call: Call;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  s = await startTestScheduler({
    CANTO_WEBHOOK_HOSTS: 'rebound.example.com=127.0.0.1,rebound6.example.com=::1',
    CANTO_WEBHOOK_POLL_MS: '50',
    CANTO_WEBHOOK_RETRY_BASE_MS: '50',
    CANTO_WEBHOOK_RETRY_MAX_MS: '100',
  });
  agent = await startFakeAgent(s.url);
  call = api(s.url, await mintKey(s.databaseUrl, 'webhook-ssrf'));
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
  await receiver?.close();
});

describe('at registration, without the loopback opt-in', () => {
  it.each([
    'https://localhost',
    'https://127.0.0.1',
    'https://[::1]',
    'https://0x7f000001',
    'https://2130706433',
    'https://169.254.169.254',
    'https://[fe80::1]',
    'https://127.1',
    'https://[::ffff:127.0.0.1]',
    'https://0.0.0.0',
    'https://[::]',
    'https://localhost.',
    'https://LocalHost:8443/hook',
  ])('refuses %s with 400', async (url) => {
    const res = await call('POST', '/v1/webhooks', { url, events: ['desktop.created'] });
    expectProblem(res, 400, url);
    expect(res.json.detail).toMatch(/loopback|link-local|unspecified/);
  });

  it('refuses plain http, even to a public host', async () => {
    expectProblem(await call('POST', '/v1/webhooks', { url: 'http://hooks.example.com/x', events: ['desktop.created'] }), 400);
  });
});

describe('at delivery time', () => {
  async function refusedDelivery(host: string) {
    const res = await call('POST', '/v1/webhooks', { url: `https://${host}:${receiver.port}/hook`, events: ['desktop.created'] });
    expect(res.status, res.text).toBe(201);
    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    expect(created.status).toBe(201);
    const [d] = await until(async () => {
      const log = (await call('GET', `/v1/webhooks/${res.json.id}/deliveries`)).json.deliveries;
      return log[0]?.state === 'failed' ? log : null;
    }, 10_000, `the delivery to ${host} to be refused`);
    return d;
  }

  it('refuses a name that resolves to 127.0.0.1, at once and for good, without connecting', async () => {
    const d = await refusedDelivery('rebound.example.com');
    expect(d).toMatchObject({ state: 'failed', attempts: 1, lastStatus: null, nextAttemptAt: null, deliveredAt: null });
    expect(d.lastError).toMatch(/^refused: .*loopback/);
    expect(receiver.connections()).toBe(0);
  });

  it('refuses a name that resolves to ::1', async () => {
    const d = await refusedDelivery('rebound6.example.com');
    expect(d).toMatchObject({ state: 'failed', attempts: 1, lastError: expect.stringMatching(/loopback/) });
    expect(receiver.connections()).toBe(0);
  });

  const alias = loopbackAliasFromHosts();
  it.skipIf(!alias)(`refuses a name the system resolver maps to loopback (${alias ?? 'none in /etc/hosts'})`, async () => {
    const d = await refusedDelivery(alias!);
    expect(d).toMatchObject({ state: 'failed', attempts: 1, lastError: expect.stringMatching(/loopback/) });
    expect(receiver.connections()).toBe(0);
  });
});

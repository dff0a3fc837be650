/**
 * Webhook attempts are shared out among orgs (webhooks/dispatcher.ts): an org whose receivers
 * hang until the timeout holds at most a quarter of the attempts in flight (here 1 of 4), so
 * another org's deliveries go out meanwhile instead of waiting behind them.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

let s: TestScheduler;
let agent: TestAgent;
let receiver: WebhookReceiver;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  s = await startTestScheduler({
    CANTO_WEBHOOK_ALLOW_LOOPBACK: 'true',
    CANTO_WEBHOOK_POLL_MS: '50',
    CANTO_WEBHOOK_CONCURRENCY: '4',
    // Far longer than the test: a hanging attempt holds its slot throughout.
    CANTO_WEBHOOK_TIMEOUT_MS: '60000',
  });
  agent = await startFakeAgent(s.url);
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
  await receiver?.close();
});

it("lets one org's hanging receivers hold only its share of the attempts, and another org's deliveries go out", async () => {
  const slow = api(s.url, await mintKey(s.databaseUrl, 'fair-slow'));
  const quick = api(s.url, await mintKey(s.databaseUrl, 'fair-quick'));
  for (const path of ['/slow-1', '/slow-2', '/slow-3']) {
    receiver.script(path, Array.from({ length: 10 }, () => 'hang' as const));
    expect((await slow('POST', '/v1/webhooks', { url: `${receiver.origin}${path}`, events: ['desktop.created'] })).status).toBe(201);
  }
  expect((await quick('POST', '/v1/webhooks', { url: `${receiver.origin}/quick`, events: ['desktop.created'] })).status).toBe(201);

  // Six deliveries of the slow org due, more than every slot.
  for (let i = 0; i < 2; i++) expect((await slow('POST', '/v1/desktops', { tier: 'small' })).status).toBe(201);
  await until(() => receiver.requests.some((r) => r.path.startsWith('/slow')), 10_000, 'a slow delivery to start');
  expect((await quick('POST', '/v1/desktops', { tier: 'small' })).status).toBe(201);
  await until(() => receiver.at('/quick').length === 1, 10_000, "the other org's delivery");
  expect(receiver.requests.filter((r) => r.path.startsWith('/slow'))).toHaveLength(1);
});

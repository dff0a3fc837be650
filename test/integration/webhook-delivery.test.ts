/**
 * Webhook delivery end to end (docs/api.md §6): a real scheduler (loopback receivers allowed, as for
 * local development) with a fake agent driving one desktop through its life, and a real HTTP
 * receiver on 127.0.0.1. Events arrive in order, signed so that both our verifier and Stripe's
 * accept them; failures are retried with the same delivery id; deleting an endpoint stops its
 * pending deliveries; a delivery in flight when the leader stops is sent again by the next one.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import Stripe from 'stripe';
import { verifySignature } from '../../scheduler/src/webhooks/signature.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { startWebhookReceiver, type ReceivedRequest, type WebhookReceiver } from '../helpers/webhook-receiver.js';
import { expectProblem } from '../helpers/problem.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

type Call = ReturnType<typeof api>;

const WEBHOOK_ENV = {
  CANTO_WEBHOOK_ALLOW_LOOPBACK: 'true',
  CANTO_WEBHOOK_POLL_MS: '50',
  CANTO_WEBHOOK_RETRY_BASE_MS: '100',
  CANTO_WEBHOOK_RETRY_MAX_MS: '400',
  CANTO_WEBHOOK_MAX_ATTEMPTS: '5',
  // Long enough that the leader-change test below stops the leader while its attempt still waits.
  CANTO_WEBHOOK_TIMEOUT_MS: '3000',
};

const stripe = new Stripe('sk_test_unused');

let s: TestScheduler;
let agent: TestAgent;
let receiver: WebhookReceiver;
let key: string;
let call: Call;

beforeAll(async () => {
  receiver = await startWebhookReceiver();
  s = await startTestScheduler(WEBHOOK_ENV);
  agent = await startFakeAgent(s.url);
  key = await mintKey(s.databaseUrl, 'webhook-delivery');
  call = api(s.url, key);
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
  await receiver?.close();
});

async function register(c: Call, path: string, events: string[]) {
  const res = await c('POST', '/v1/webhooks', { url: `${receiver.origin}${path}`, events });
  expect(res.status, res.text).toBe(201);
  return res.json as { id: string; secret: string; url: string };
}

async function deliveries(c: Call, endpointId: string) {
  const res = await c('GET', `/v1/webhooks/${endpointId}/deliveries`);
  expect(res.status, res.text).toBe(200);
  return res.json.deliveries as any[];
}

/** Creates a desktop and waits for it to be placed (which fires desktop.created). */
async function placedDesktop(c: Call): Promise<string> {
  const res = await c('POST', '/v1/desktops', { tier: 'small' });
  expect(res.status, res.text).toBe(201);
  await until(async () => (await c('GET', `/v1/desktops/${res.json.id}`)).json.state === 'hibernated', 10_000, 'placement');
  return res.json.id;
}

function expectSigned(request: ReceivedRequest, secret: string): any {
  const header = String(request.headers['svc-signature']);
  expect(header).toMatch(/^t=\d+,v1=[0-9a-f]{64}$/);
  expect(verifySignature(secret, request.body, header)).toBe(true);
  expect(verifySignature(secret + 'x', request.body, header)).toBe(false);
  expect(verifySignature(secret, request.body.replace('desktop', 'Desktop'), header)).toBe(false);
  // A third party's implementation of the same scheme accepts it too.
  return stripe.webhooks.constructEvent(request.body, header, secret);
}

describe('one desktop through its life', () => {
  it('delivers created, woken, hibernated and destroyed in order, signed, with the delivery log to match', async () => {
    const all = await register(call, '/life', ['desktop.created', 'desktop.woken', 'desktop.hibernated', 'desktop.destroyed']);
    const hibernatedOnly = await register(call, '/hibernated-only', ['desktop.hibernated']);

    const id = await placedDesktop(call);
    for (const action of ['wake', 'hibernate', 'destroy']) {
      const res = await call('POST', `/v1/desktops/${id}/${action}?wait=true`);
      expect(res.json?.state, `${action}: ${res.text}`).toBe('succeeded');
    }
    const got = await until(() => (receiver.at('/life').length >= 4 ? receiver.at('/life') : null), 15_000, 'four deliveries');
    expect(got).toHaveLength(4);

    const events = got.map((r) => expectSigned(r, all.secret));
    expect(events.map((e) => e.type)).toEqual(['desktop.created', 'desktop.woken', 'desktop.hibernated', 'desktop.destroyed']);
    for (const e of events) expect(e).toMatchObject({ desktopId: id, orgId: expect.stringMatching(/^org_/), occurredAt: expect.any(String), data: expect.any(Object) });
    expect(events[2].data.reason).toBe('requested');
    expect(Object.keys(events[0]).slice(0, 2)).toEqual(['type', 'desktopId']);
    // Each event has an id of its own, the same in every delivery of it.
    expect(new Set(events.map((e) => e.eventId)).size).toBe(events.length);
    for (const e of events) expect(e.eventId).toMatch(/^evt_[0-9a-v]{24}$/);

    for (const r of got) {
      expect(r.method).toBe('POST');
      expect(r.headers['content-type']).toBe('application/json');
      expect(r.headers['svc-webhook-event']).toBe(JSON.parse(r.body).type);
      expect(r.headers['svc-webhook-id']).toMatch(/^dlv_[0-9a-v]{24}$/);
    }

    const log = await until(async () => {
      const d = await deliveries(call, all.id);
      return d.length === 4 && d.every((x) => x.state === 'delivered') ? d : null;
    }, 5_000, 'the log to settle');
    // Newest first; ids match the Svc-Webhook-Id each request carried; payload is the exact body.
    expect(log.map((d) => d.eventType)).toEqual(['desktop.destroyed', 'desktop.hibernated', 'desktop.woken', 'desktop.created']);
    expect(log.map((d) => d.id)).toEqual(got.map((r) => r.headers['svc-webhook-id']).reverse());
    for (const [i, d] of log.entries()) {
      expect(d).toMatchObject({ state: 'delivered', attempts: 1, lastStatus: 200, lastError: null, nextAttemptAt: null });
      expect(new Date(d.deliveredAt).getTime()).toBeGreaterThanOrEqual(new Date(d.createdAt).getTime());
      expect(JSON.stringify(d.payload)).toBe(got[got.length - 1 - i]!.body);
    }

    // The second endpoint asked for desktop.hibernated only.
    await until(() => receiver.at('/hibernated-only').length === 1, 10_000, 'the hibernated-only delivery');
    expect(expectSigned(receiver.at('/hibernated-only')[0]!, hibernatedOnly.secret).type).toBe('desktop.hibernated');
  });
});

describe('retries', () => {
  it('retries a receiver that answers 500 twice and ends delivered after 3 attempts, under one delivery id', async () => {
    receiver.script('/flaky', [500, 500]);
    const endpoint = await register(call, '/flaky', ['desktop.created']);
    await placedDesktop(call);
    const [d] = await until(async () => {
      const log = await deliveries(call, endpoint.id);
      return log[0]?.state === 'delivered' ? log : null;
    }, 15_000, 'the flaky delivery');
    expect(d).toMatchObject({ state: 'delivered', attempts: 3, lastStatus: 200, lastError: null, nextAttemptAt: null });
    const seen = receiver.at('/flaky');
    expect(seen).toHaveLength(3);
    expect(new Set(seen.map((r) => r.headers['svc-webhook-id']))).toEqual(new Set([d.id]));
    for (const r of seen) expect(expectSigned(r, endpoint.secret).type).toBe('desktop.created');
  });

  it('gives up after the configured attempts: failed, lastStatus and lastError kept, nextAttemptAt null', async () => {
    receiver.script('/down', [503, 503, 503, 503, 503, 503]);
    const endpoint = await register(call, '/down', ['desktop.created']);
    await placedDesktop(call);
    const [d] = await until(async () => {
      const log = await deliveries(call, endpoint.id);
      return log[0]?.state === 'failed' ? log : null;
    }, 15_000, 'the delivery to fail');
    expect(d).toMatchObject({ state: 'failed', attempts: 5, lastStatus: 503, lastError: 'HTTP 503', nextAttemptAt: null, deliveredAt: null });
    expect(receiver.at('/down')).toHaveLength(5);
  });

  it('does not follow redirects', async () => {
    receiver.script('/moved', [302, 302, 302, 302, 302]);
    const endpoint = await register(call, '/moved', ['desktop.created']);
    await placedDesktop(call);
    const [d] = await until(async () => {
      const log = await deliveries(call, endpoint.id);
      return log[0]?.state === 'failed' ? log : null;
    }, 15_000, 'the redirected delivery to fail');
    expect(d).toMatchObject({ state: 'failed', attempts: 5, lastStatus: 302, lastError: expect.stringContaining('redirects are not followed') });
    expect(receiver.at('/moved')).toHaveLength(5);
    expect(receiver.at('/moved-redirected')).toHaveLength(0);
  });

  it('tries again a delivery this leader cannot sign, and sends it once the secret opens', async () => {
    const endpoint = await register(call, '/unsealed', ['desktop.created']);
    // What a replica started with another CANTO_SECRET_KEY finds: a secret that does not open.
    const sql = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      const [row] = await sql<Array<{ secret_sealed: Buffer }>>`SELECT secret_sealed FROM webhook_endpoints WHERE id = ${endpoint.id}`;
      const broken = Buffer.from(row!.secret_sealed);
      broken[broken.length - 1]! ^= 0xff;
      await sql`UPDATE webhook_endpoints SET secret_sealed = ${broken} WHERE id = ${endpoint.id}`;
      await placedDesktop(call);
      const [d] = await until(async () => {
        const log = await deliveries(call, endpoint.id);
        return log[0]?.attempts >= 1 ? log : null;
      }, 15_000, 'an attempt');
      expect(d).toMatchObject({ state: 'pending', lastStatus: null, lastError: 'internal error' });
      expect(receiver.at('/unsealed')).toHaveLength(0);
      // The key is right again.
      await sql`UPDATE webhook_endpoints SET secret_sealed = ${row!.secret_sealed} WHERE id = ${endpoint.id}`;
    } finally {
      await sql.end();
    }
    const [done] = await until(async () => {
      const log = await deliveries(call, endpoint.id);
      return log[0]?.state === 'delivered' ? log : null;
    }, 15_000, 'the delivery');
    expect(done.attempts).toBeGreaterThanOrEqual(2);
    expect(expectSigned(receiver.at('/unsealed')[0]!, endpoint.secret).type).toBe('desktop.created');
  });

  it('shows a pending retry with its next attempt time and error', async () => {
    receiver.script('/pending', [500, 500, 500, 500, 500]);
    const endpoint = await register(call, '/pending', ['desktop.created']);
    await placedDesktop(call);
    const [d] = await until(async () => {
      const log = await deliveries(call, endpoint.id);
      return log[0]?.attempts >= 1 && log[0].state === 'pending' ? log : null;
    }, 15_000, 'a pending retry');
    expect(d).toMatchObject({ state: 'pending', lastStatus: 500, lastError: 'HTTP 500', deliveredAt: null });
    expect(Date.parse(d.nextAttemptAt)).toBeGreaterThan(Date.parse(d.createdAt));
  });
});

describe('deleting an endpoint', () => {
  it('stops its pending deliveries', async () => {
    receiver.script('/doomed', Array(20).fill(500));
    const endpoint = await register(call, '/doomed', ['desktop.created']);
    await placedDesktop(call);
    await until(async () => (await deliveries(call, endpoint.id))[0]?.attempts >= 1, 10_000, 'a failed first attempt');
    expect((await call('DELETE', `/v1/webhooks/${endpoint.id}`)).status).toBe(204);
    const hitsAtDelete = receiver.at('/doomed').length;
    const deletedAt = Date.now();
    expectProblem(await call('GET', `/v1/webhooks/${endpoint.id}/deliveries`), 404);

    // Long enough for several more retries (waits are at most 400 ms here), proven by a later
    // event reaching another endpoint after the window.
    const marker = await register(call, '/marker', ['desktop.created']);
    await placedDesktop(call);
    await until(() => receiver.at('/marker').length === 1 && Date.now() - deletedAt > 2_000, 15_000, 'the marker delivery');
    expect((await deliveries(call, marker.id))[0].state).toBe('delivered');
    // At most the attempt already in flight when the endpoint went can still land.
    expect(receiver.at('/doomed').length).toBeLessThanOrEqual(hitsAtDelete + 1);
  });
});

describe('a leader that stops mid-delivery', () => {
  it('leaves the delivery to the next leader, which sends it again under the same id; settled ones are not resent', async () => {
    const hang = await register(call, '/hang', ['desktop.created']);
    const ok = await register(call, '/ok', ['desktop.created']);
    receiver.script('/hang', ['hang']);
    await placedDesktop(call);
    await until(() => receiver.at('/hang').length === 1 && receiver.at('/ok').length === 1, 10_000, 'the first attempts');
    await until(async () => (await deliveries(call, ok.id))[0]?.state === 'delivered', 5_000, 'the ok delivery to settle');
    const firstId = receiver.at('/hang')[0]!.headers['svc-webhook-id'];

    // The leader goes while the /hang attempt waits for an answer; a new scheduler takes over.
    await agent.stop();
    await s.close();
    s = await startTestScheduler({ ...WEBHOOK_ENV, CANTO_SECRET_KEY: s.env.CANTO_SECRET_KEY! }, s.databaseUrl);
    agent = await startFakeAgent(s.url);
    call = api(s.url, key);

    const [d] = await until(async () => {
      const log = await deliveries(call, hang.id);
      return log[0]?.state === 'delivered' ? log : null;
    }, 15_000, 'the next leader to deliver');
    expect(d.id).toBe(firstId);
    expect(d.attempts).toBe(1);
    expect(receiver.at('/hang').map((r) => r.headers['svc-webhook-id'])).toEqual([firstId, firstId]);
    expect(receiver.at('/ok')).toHaveLength(1);
  });
});

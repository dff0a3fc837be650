/**
 * Webhook signing (docs/api.md §6) checked against fixed vectors, against our own verifier and against
 * Stripe's independent implementation of the same scheme; plus the other pure pieces of
 * delivery: the retry schedule, the body an event renders to, and what a failed attempt says.
 */
import { createHmac } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import Stripe from 'stripe';
import {
  computeSignature,
  newWebhookSecret,
  signatureHeader,
  verifySignature,
  WEBHOOK_SECRET_PREFIX,
} from '../../scheduler/src/webhooks/signature.js';
import { nominalDelayMs, retryDelayMs } from '../../scheduler/src/webhooks/retry-schedule.js';
import { renderEventBody } from '../../scheduler/src/webhooks/dispatcher.js';
import { describeFailure, describeStatus } from '../../scheduler/src/webhooks/post-attempt.js';
import { RefusedAddress } from '../../scheduler/src/webhooks/guarded-connect.js';

const stripe = new Stripe('sk_test_unused');
const SECRET = 'svc_whsec_test-secret';
const BODY = '{"type":"desktop.created","desktopId":"dsk_0123456789abcdefghijklmn","data":{}}';

describe('signatures', () => {
  it('is lowercase hex HMAC-SHA256 over "<t>.<raw body>" with the secret as given', () => {
    const expected = createHmac('sha256', SECRET).update(`1700000000.${BODY}`).digest('hex');
    expect(computeSignature(SECRET, 1700000000, BODY)).toBe(expected);
    expect(signatureHeader(SECRET, 1700000000, BODY)).toBe(`t=1700000000,v1=${expected}`);
    expect(computeSignature(SECRET, 1700000000, Buffer.from(BODY))).toBe(expected);
  });

  it('verifies its own signatures within the tolerance only', () => {
    const now = 1_700_000_000;
    const header = signatureHeader(SECRET, now, BODY);
    expect(verifySignature(SECRET, BODY, header, { nowSecs: now })).toBe(true);
    expect(verifySignature(SECRET, Buffer.from(BODY), header, { nowSecs: now + 300 })).toBe(true);
    expect(verifySignature(SECRET, BODY, header, { nowSecs: now + 301 })).toBe(false);
    expect(verifySignature(SECRET, BODY, header, { nowSecs: now - 301 })).toBe(false);
    expect(verifySignature(SECRET, BODY, header, { nowSecs: now + 1000, toleranceSecs: 2000 })).toBe(true);
  });

  it('refuses a changed body, another secret, a changed timestamp and malformed headers', () => {
    const now = 1_700_000_000;
    const header = signatureHeader(SECRET, now, BODY);
    const v1 = header.split('v1=')[1]!;
    expect(verifySignature(SECRET, BODY + ' ', header, { nowSecs: now })).toBe(false);
    expect(verifySignature(`${SECRET}x`, BODY, header, { nowSecs: now })).toBe(false);
    expect(verifySignature(SECRET, BODY, `t=${now + 1},v1=${v1}`, { nowSecs: now })).toBe(false);
    for (const bad of ['', 'garbage', `v1=${v1}`, `t=${now}`, `t=abc,v1=${v1}`, `t=${now},v1=zz`, `t=${now},v0=${v1}`]) {
      expect(verifySignature(SECRET, BODY, bad, { nowSecs: now }), bad).toBe(false);
    }
  });

  it('accepts any matching v1 among several (a receiver rotating secrets)', () => {
    const now = 1_700_000_000;
    const good = computeSignature(SECRET, now, BODY);
    expect(verifySignature(SECRET, BODY, `t=${now},v1=${'0'.repeat(64)},v1=${good}`, { nowSecs: now })).toBe(true);
  });

  it("is accepted by Stripe's constructEvent, and a tampered body is not", () => {
    const t = Math.floor(Date.now() / 1000);
    const header = signatureHeader(SECRET, t, BODY);
    expect(stripe.webhooks.constructEvent(BODY, header, SECRET)).toEqual(JSON.parse(BODY));
    expect(stripe.webhooks.constructEvent(Buffer.from(BODY), header, SECRET)).toEqual(JSON.parse(BODY));
    expect(() => stripe.webhooks.constructEvent(BODY.replace('created', 'woken'), header, SECRET)).toThrow();
    expect(() => stripe.webhooks.constructEvent(BODY, signatureHeader(SECRET, t - 600, BODY), SECRET)).toThrow();
  });

  it('mints secrets of 256 random bits behind the documented prefix', () => {
    const a = newWebhookSecret();
    expect(a).toMatch(/^svc_whsec_[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(a.slice(WEBHOOK_SECRET_PREFIX.length), 'base64url')).toHaveLength(32);
    expect(newWebhookSecret()).not.toBe(a);
  });
});

describe('retry schedule', () => {
  const policy = { maxAttempts: 10, baseMs: 30_000, maxMs: 3_600_000 };

  it('doubles from the base up to the cap', () => {
    expect([1, 2, 3, 4, 5, 6, 7, 8, 9].map((n) => nominalDelayMs(n, policy))).toEqual([
      30_000, 60_000, 120_000, 240_000, 480_000, 960_000, 1_920_000, 3_600_000, 3_600_000,
    ]);
    expect(nominalDelayMs(500, policy)).toBe(3_600_000);
  });

  it('jitters each wait between half and all of its nominal length', () => {
    expect(retryDelayMs(1, policy, () => 0)).toBe(15_000);
    expect(retryDelayMs(1, policy, () => 0.999999)).toBe(30_000);
    expect(retryDelayMs(3, policy, () => 0.5)).toBe(90_000);
  });

  it('stops after maxAttempts attempts', () => {
    expect(retryDelayMs(9, policy)).not.toBeNull();
    expect(retryDelayMs(10, policy)).toBeNull();
    expect(retryDelayMs(1, { ...policy, maxAttempts: 1 })).toBeNull();
  });
});

describe('event bodies', () => {
  it('put type and desktopId first and keep every payload member', () => {
    const body = renderEventBody({
      orgId: 'org_x',
      type: 'desktop.hibernated',
      payload: { data: { reason: 'host_failure' }, occurredAt: '2030-01-01T00:00:00.000Z', orgId: 'org_x', desktopId: 'dsk_y', type: 'desktop.hibernated', extra: 1 },
    });
    expect(body).toBe(
      '{"type":"desktop.hibernated","desktopId":"dsk_y","orgId":"org_x","occurredAt":"2030-01-01T00:00:00.000Z","data":{"reason":"host_failure"},"extra":1}',
    );
  });
});

describe('what a failed attempt says', () => {
  it('uses fixed sentences that carry no addresses or internals', () => {
    const leak = (code: string) => Object.assign(new Error(`connect ${code} 10.1.2.3:443 /secret/path`), { code });
    expect(describeFailure(leak('ECONNREFUSED'), 1000)).toEqual({ kind: 'error', message: 'connection refused', permanent: false });
    expect(describeFailure(leak('ENOTFOUND'), 1000)).toMatchObject({ message: 'the host name did not resolve', permanent: false });
    expect(describeFailure(leak('ECONNRESET'), 1000)).toMatchObject({ message: 'connection closed before a response' });
    expect(describeFailure(leak('DEPTH_ZERO_SELF_SIGNED_CERT'), 1000)).toMatchObject({ message: 'TLS certificate not accepted (DEPTH_ZERO_SELF_SIGNED_CERT)' });
    expect(describeFailure(leak('ERR_TLS_CERT_ALTNAME_INVALID'), 1000)).toMatchObject({ message: expect.stringContaining('TLS certificate') });
    expect(describeFailure(leak('HPE_INVALID_CONSTANT'), 1000)).toMatchObject({ message: 'invalid HTTP response' });
    expect(describeFailure(new Error('/etc/passwd at 10.1.2.3'), 1000)).toMatchObject({ message: 'connection failed' });
    for (const code of ['ECONNREFUSED', 'ENOTFOUND', 'EWHATEVER']) expect(JSON.stringify(describeFailure(leak(code), 1000))).not.toMatch(/10\.1\.2\.3|secret/);
  });

  it('makes address refusals permanent', () => {
    expect(describeFailure(new RefusedAddress('link-local'), 1000)).toEqual({
      kind: 'error',
      message: 'refused: the endpoint host resolves to a link-local address, which webhooks may not reach',
      permanent: true,
    });
  });

  it('names the status of a non-2xx answer and says redirects are not followed', () => {
    expect(describeStatus(500)).toBe('HTTP 500');
    expect(describeStatus(301)).toBe('HTTP 301: redirects are not followed');
  });
});

/**
 * The ingress → agent opening line (shared/src/port-link.ts): signed, fresh, one target only, and
 * (`/2`) one link only.
 */
import { describe, expect, it } from 'vitest';
import { PORT_LINK_MAX_SKEW_MS, portLinkLine, ReplayGuard, verifyPortLink } from '../../shared/src/port-link.js';

const SECRET = 'join-token';
const TARGET = { desktopId: 'dsk_aaaaaaaaaaaaaaaaaaaaaaaa', generation: 7, port: 8080 };
const NOW = 1_800_000_000_000;

/** A `/1` line, as schedulers before 1.16 send: what the field-by-field cases below edit. */
const line = (secret = SECRET, target = TARGET, at = NOW) => portLinkLine(secret, target, at, 1).replace(/\n$/, '');
const line2 = (secret = SECRET, target = TARGET, at = NOW) => portLinkLine(secret, target, at).replace(/\n$/, '');
/** The target of a good line, else null. */
const verifyPortLinkLine = (secret: string, text: string, now: number) => verifyPortLink(secret, text, now)?.target ?? null;

describe('port link line', () => {
  it('round-trips a target signed with the shared secret', () => {
    expect(portLinkLine(SECRET, TARGET, NOW).endsWith('\n')).toBe(true);
    expect(verifyPortLinkLine(SECRET, line(), NOW)).toEqual(TARGET);
    expect(verifyPortLinkLine(SECRET, line(), NOW + PORT_LINK_MAX_SKEW_MS)).toEqual(TARGET);
  });

  it('refuses another secret, a stale or future line, and any edited field', () => {
    expect(verifyPortLinkLine('other', line(), NOW)).toBeNull();
    expect(verifyPortLinkLine(SECRET, line(), NOW + PORT_LINK_MAX_SKEW_MS + 1)).toBeNull();
    expect(verifyPortLinkLine(SECRET, line(), NOW - PORT_LINK_MAX_SKEW_MS - 1)).toBeNull();
    const good = line().split(' ');
    for (const [i, value] of [[1, 'dsk_bbbbbbbbbbbbbbbbbbbbbbbb'], [2, '8'], [3, '8081'], [4, String(NOW + 1)]] as const) {
      const edited = [...good];
      edited[i] = value;
      expect(verifyPortLinkLine(SECRET, edited.join(' '), NOW), `field ${i}`).toBeNull();
    }
  });

  it('refuses malformed lines without throwing', () => {
    for (const bad of [
      '',
      'CANTO-PORT/1',
      line().replace('CANTO-PORT/1', 'CANTO-PORT/2'),
      `${line()} extra`,
      line().replace(/[0-9a-f]{64}$/, 'zz'),
      line(SECRET, { ...TARGET, port: 0 }),
      line(SECRET, { ...TARGET, port: 70000 }),
      line(SECRET, { ...TARGET, desktopId: 'dsk_../../etc' }),
    ]) {
      expect(verifyPortLinkLine(SECRET, bad, NOW), bad).toBeNull();
    }
  });

  it('signs a /2 line with its nonce: each line differs, and neither the nonce nor the version can be changed', () => {
    const [a, b] = [line2(), line2()];
    expect(a.startsWith('CANTO-PORT/2 ')).toBe(true);
    expect(a).not.toBe(b);
    expect(verifyPortLink(SECRET, a, NOW)).toEqual({ target: TARGET, atMs: NOW, nonce: a.split(' ')[5] });
    const parts = a.split(' ');
    const otherNonce = [...parts];
    otherNonce[5] = b.split(' ')[5]!;
    expect(verifyPortLinkLine(SECRET, otherNonce.join(' '), NOW)).toBeNull();
    // A /1 signature does not pass as /2, nor a /2 one as /1.
    const v1 = line().split(' ');
    expect(verifyPortLinkLine(SECRET, ['CANTO-PORT/2', ...v1.slice(1, 5), parts[5], v1[5]].join(' '), NOW)).toBeNull();
    expect(verifyPortLinkLine(SECRET, ['CANTO-PORT/1', ...parts.slice(1, 5), parts[6]].join(' '), NOW)).toBeNull();
  });

  it('takes each /2 line once within the window, and /1 lines, which carry no nonce, as often as they come', () => {
    const guard = new ReplayGuard();
    const a = verifyPortLink(SECRET, line2(), NOW)!;
    expect(guard.take(a, NOW)).toBe(true);
    expect(guard.take(a, NOW + 1_000)).toBe(false);
    expect(guard.take(verifyPortLink(SECRET, line2(), NOW)!, NOW + 1_000)).toBe(true);
    const old = verifyPortLink(SECRET, line(), NOW)!;
    expect([guard.take(old, NOW), guard.take(old, NOW)]).toEqual([true, true]);
    // Past the window the nonce is forgotten; the line itself is stale by then.
    expect(guard.take(a, NOW + PORT_LINK_MAX_SKEW_MS + 2)).toBe(true);
    expect(verifyPortLink(SECRET, line2(), NOW)!.atMs).toBe(NOW);
  });
});

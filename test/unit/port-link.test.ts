/** The ingress → agent opening line (shared/src/port-link.ts): signed, fresh, one target only. */
import { describe, expect, it } from 'vitest';
import { PORT_LINK_MAX_SKEW_MS, portLinkLine, verifyPortLinkLine } from '../../shared/src/port-link.js';

const SECRET = 'join-token';
const TARGET = { desktopId: 'dsk_aaaaaaaaaaaaaaaaaaaaaaaa', generation: 7, port: 8080 };
const NOW = 1_800_000_000_000;

const line = (secret = SECRET, target = TARGET, at = NOW) => portLinkLine(secret, target, at).replace(/\n$/, '');

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
});

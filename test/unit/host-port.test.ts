/**
 * Addresses as settings, hello messages and URLs write them (shared/src/host-port.ts): what is
 * formatted parses back to the same host and port, IPv6 in brackets.
 */
import { describe, expect, it } from 'vitest';
import { formatHostPort, parseHostPort } from '../../shared/src/host-port.js';

describe('host:port', () => {
  it.each([
    ['127.0.0.1', 7011],
    ['0.0.0.0', 0],
    ['fd00::5', 7012],
    ['::1', 65535],
    ['gateway.internal', 80],
  ])('%s port %i round-trips', (host, port) => {
    expect(parseHostPort(formatHostPort(host, port))).toEqual({ host, port });
  });

  it('writes IPv6 hosts in brackets', () => {
    expect(formatHostPort('fd00::5', 7012)).toBe('[fd00::5]:7012');
    expect(formatHostPort('10.0.0.5', 7011)).toBe('10.0.0.5:7011');
  });

  it.each(['', ':80', 'host', 'host:', 'host:65536', 'host:123456', 'fd00::5:80', '[fd00::5]', '[x]:80', 'a b:80', 'host:80 '])(
    'refuses %j',
    (value) => {
      expect(parseHostPort(value)).toBeNull();
    },
  );
});

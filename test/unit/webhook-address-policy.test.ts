/**
 * The webhook SSRF guard's pure parts: which addresses are blocked (every IPv4 and IPv6 spelling
 * of loopback, link-local and unspecified), the URL rules at registration with and without the
 * loopback opt-in, the resolver step (a name is refused if any of its addresses is blocked), and
 * the connected-socket check on a real socket.
 */
import { createServer, connect, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { blockedAddress, blockedHost, classifyAddress } from '../../scheduler/src/webhooks/address-policy.js';
import { checkEndpointUrl } from '../../scheduler/src/webhooks/endpoint-url.js';
import { assertPeerAllowed, connectGuarded, RefusedAddress, resolveChecked, type ConnectPolicy } from '../../scheduler/src/webhooks/guarded-connect.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';

const strict = { allowLoopback: false };
const dev = { allowLoopback: true };

describe('classifyAddress', () => {
  it.each([
    ['127.0.0.1', 'loopback'],
    ['127.255.255.254', 'loopback'],
    ['0.0.0.0', 'unspecified'],
    ['0.1.2.3', 'unspecified'],
    ['169.254.169.254', 'link-local'],
    ['169.254.0.1', 'link-local'],
    ['224.0.0.1', 'multicast'],
    ['255.255.255.255', 'reserved'],
    ['::1', 'loopback'],
    ['0:0:0:0:0:0:0:1', 'loopback'],
    ['[::1]', 'loopback'],
    ['::', 'unspecified'],
    ['fe80::1', 'link-local'],
    ['fe80::1%eth0', 'link-local'],
    ['febf:ffff::1', 'link-local'],
    ['FE80::ABCD', 'link-local'],
    ['ff02::1', 'multicast'],
    ['::ffff:127.0.0.1', 'loopback'],
    ['::ffff:7f00:1', 'loopback'],
    ['[::ffff:7f00:1]', 'loopback'],
    ['0:0:0:0:0:ffff:7f00:0001', 'loopback'],
    ['::ffff:169.254.169.254', 'link-local'],
    ['::ffff:a9fe:a9fe', 'link-local'],
    ['::ffff:0:127.0.0.1', 'loopback'],
    ['::127.0.0.1', 'loopback'],
    ['::7f00:1', 'loopback'],
    ['64:ff9b::127.0.0.1', 'loopback'],
    ['64:ff9b::a9fe:a9fe', 'link-local'],
    ['::ffff:0.0.0.0', 'unspecified'],
    ['100.100.100.200', 'metadata'],
    ['::ffff:100.100.100.200', 'metadata'],
    ['fd00:ec2::254', 'metadata'],
    ['[FD00:EC2:0:0:0:0:0:254]', 'metadata'],
    ['fd20:ce::254', 'metadata'],
    ['168.63.129.16', 'metadata'],
    ['192.0.0.192', 'metadata'],
    ['::ffff:168.63.129.16', 'metadata'],
    ['2002:7f00:1::1', 'loopback'],
    ['2002:a9fe:a9fe::', 'link-local'],
    ['2001:0:4136:e378:8000:63bf:80ff:fffe', 'loopback'],
    ['64:ff9b:1::7f00:1', 'loopback'],
    ['64:ff9b:1::169.254.169.254', 'link-local'],
  ])('%s is %s', (address, range) => {
    expect(classifyAddress(address)).toBe(range);
  });

  it.each(['8.8.8.8', '10.0.0.1', '192.168.1.1', '203.0.113.7', '126.255.255.255', '128.0.0.1', '169.253.1.1', '169.255.0.1', '2001:db8::1', 'fec0::1', 'fe7f::1', 'fc00::1', '::ffff:8.8.8.8', '64:ff9b::8.8.8.8', '2002:808:808::1', '2001:0:4136:e378:8000:63bf:f7f7:f7f7', '64:ff9b:1::808:808', 'fd20:ce::253', '168.63.129.17', '100.100.100.201', '100.64.0.1', 'fd00:ec2::253'])(
    '%s is not blocked',
    (address) => {
      expect(classifyAddress(address)).toBeNull();
    },
  );

  it('is null for names and garbage', () => {
    for (const x of ['example.com', 'localhost', '', '127.0.0.1.5', '0x7f000001', '2130706433', '1.2.3']) expect(classifyAddress(x)).toBeNull();
  });

  it('lets the opt-in allow loopback only', () => {
    expect(blockedAddress('127.0.0.1', dev)).toBeNull();
    expect(blockedAddress('::1', dev)).toBeNull();
    expect(blockedAddress('::ffff:127.0.0.1', dev)).toBeNull();
    expect(blockedAddress('169.254.169.254', dev)).toBe('link-local');
    expect(blockedAddress('fe80::1', dev)).toBe('link-local');
    expect(blockedAddress('0.0.0.0', dev)).toBe('unspecified');
    expect(blockedHost('localhost', dev)).toBeNull();
    expect(blockedHost('localhost', strict)).toBe('loopback');
    expect(blockedHost('a.b.localhost.', strict)).toBe('loopback');
    expect(blockedHost('notlocalhost', strict)).toBeNull();
  });
});

describe('checkEndpointUrl', () => {
  it.each([
    'https://localhost',
    'https://127.0.0.1',
    'https://[::1]',
    'https://0x7f000001',
    'https://2130706433',
    'https://169.254.169.254',
    'https://[fe80::1]',
    'https://127.1',
    'https://0177.0.0.1',
    'https://0x7f.1',
    'https://127.0.0.1.',
    'https://[::ffff:127.0.0.1]',
    'https://[::ffff:169.254.169.254]',
    'https://0.0.0.0',
    'https://0',
    'https://[::]',
    'https://foo.localhost',
    'https://LOCALHOST.',
  ])('refuses %s', (url) => {
    const result = checkEndpointUrl(url, strict);
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.reason).toMatch(/loopback|link-local|unspecified/);
  });

  it.each([
    ['http://hooks.example.com', /https/],
    ['ws://hooks.example.com', /https/],
    ['javascript:alert(1)', /https/],
    ['//hooks.example.com/x', /absolute/],
    ['hooks.example.com', /absolute/],
    ['https://u:p@hooks.example.com', /userinfo/],
    ['https://u@hooks.example.com', /userinfo/],
    ['https://@hooks.example.com', /userinfo/],
    ['https://:@hooks.example.com', /userinfo/],
    [`https://hooks.example.com/${'a'.repeat(2000)}`, /2000/],
  ])('refuses %s', (url, reason) => {
    const result = checkEndpointUrl(url, strict);
    expect(result).toEqual({ ok: false, reason: expect.stringMatching(reason) });
  });

  it('accepts public https URLs and normalizes them', () => {
    expect(checkEndpointUrl('https://Hooks.Example.com/a?b=1', strict)).toEqual({ ok: true, url: 'https://hooks.example.com/a?b=1' });
    expect(checkEndpointUrl('https://8.8.8.8:8443', strict)).toEqual({ ok: true, url: 'https://8.8.8.8:8443/' });
    expect(checkEndpointUrl('https://[2001:db8::1]/x', strict)).toEqual({ ok: true, url: 'https://[2001:db8::1]/x' });
  });

  it('with the opt-in accepts loopback and plain http, but still refuses link-local and userinfo', () => {
    expect(checkEndpointUrl('http://127.0.0.1:9000/hook', dev)).toEqual({ ok: true, url: 'http://127.0.0.1:9000/hook' });
    expect(checkEndpointUrl('http://localhost/hook', dev).ok).toBe(true);
    expect(checkEndpointUrl('https://[::1]/hook', dev).ok).toBe(true);
    expect(checkEndpointUrl('http://169.254.169.254/', dev).ok).toBe(false);
    expect(checkEndpointUrl('http://u@127.0.0.1/', dev).ok).toBe(false);
    expect(checkEndpointUrl('ftp://127.0.0.1/', dev).ok).toBe(false);
  });
});

describe('resolveChecked', () => {
  const policy = (addresses: string[], extra: Partial<ConnectPolicy> = {}): ConnectPolicy => ({
    allowLoopback: false,
    hosts: {},
    lookup: async () => addresses,
    ...extra,
  });

  it('refuses a name if any of its addresses is blocked', async () => {
    await expect(resolveChecked('hooks.example.com', policy(['203.0.113.7', '127.0.0.1']))).rejects.toBeInstanceOf(RefusedAddress);
    await expect(resolveChecked('hooks.example.com', policy(['2001:db8::1', 'fe80::1']))).rejects.toMatchObject({ range: 'link-local' });
    await expect(resolveChecked('hooks.example.com', policy(['::ffff:127.0.0.1']))).rejects.toMatchObject({ range: 'loopback' });
  });

  it('returns every address of a name that is clean', async () => {
    expect(await resolveChecked('hooks.example.com', policy(['203.0.113.7', '2001:db8::1']))).toEqual(['203.0.113.7', '2001:db8::1']);
  });

  it('never asks the resolver about IP literals or pinned names, and checks them the same way', async () => {
    const never = policy([], { lookup: async () => { throw new Error('resolver called'); } });
    await expect(resolveChecked('127.0.0.1', never)).rejects.toBeInstanceOf(RefusedAddress);
    await expect(resolveChecked('[::1]', never)).rejects.toBeInstanceOf(RefusedAddress);
    expect(await resolveChecked('[2001:db8::1]', never)).toEqual(['2001:db8::1']);
    const pinned = { ...never, hosts: { 'hooks.example.com': '127.0.0.1', 'ok.example.com': '203.0.113.9' } };
    await expect(resolveChecked('HOOKS.example.com.', pinned)).rejects.toMatchObject({ range: 'loopback' });
    expect(await resolveChecked('ok.example.com', pinned)).toEqual(['203.0.113.9']);
    await expect(resolveChecked('localhost', never)).rejects.toBeInstanceOf(RefusedAddress);
  });

  it('asks the resolver about a host named like a property of every object, as about any other', async () => {
    for (const name of ['constructor', '__proto__', 'tostring', 'hasownproperty']) {
      expect(await resolveChecked(name, policy(['203.0.113.7']))).toEqual(['203.0.113.7']);
    }
  });

  it('reports a name without addresses as unresolvable', async () => {
    await expect(resolveChecked('hooks.example.com', policy([]))).rejects.toMatchObject({ code: 'ENOTFOUND' });
  });
});

describe('the connected-socket check', () => {
  let server: Server;
  let port: number;
  const sockets: Socket[] = [];

  beforeAll(async () => {
    server = createServer((s) => sockets.push(s));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as { port: number }).port;
  });

  afterAll(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  });

  it('refuses a socket whose peer is loopback, and allows it with the opt-in', async () => {
    const socket = connect({ host: '127.0.0.1', port });
    await new Promise((r) => socket.once('connect', r));
    try {
      expect(() => assertPeerAllowed(socket, strict)).toThrow(RefusedAddress);
      expect(() => assertPeerAllowed(socket, dev)).not.toThrow();
    } finally {
      socket.destroy();
    }
  });

  it('connectGuarded connects only where the policy allows', async () => {
    const url = new URL(`http://127.0.0.1:${port}/`);
    await expect(connectGuarded(url, { allowLoopback: false, hosts: {} }, new AbortController().signal)).rejects.toBeInstanceOf(RefusedAddress);
    const socket = await connectGuarded(url, { allowLoopback: true, hosts: {} }, new AbortController().signal);
    expect(socket.remoteAddress).toBe('127.0.0.1');
    socket.destroy();
  });
});

describe('webhook settings', () => {
  const base = { DATABASE_URL: 'postgres://x/y', CANTO_SECRET_KEY: 'k' };

  it('has documented defaults', () => {
    expect(loadSchedulerConfig(base).webhooks).toEqual({
      allowLoopback: false,
      timeoutMs: 10_000,
      maxAttempts: 10,
      retryBaseMs: 30_000,
      retryMaxMs: 3_600_000,
      pollMs: 1_000,
      concurrency: 16,
      hosts: {},
    });
  });

  it('parses the loopback flag and host pins, and refuses bad values', () => {
    const w = loadSchedulerConfig({ ...base, CANTO_WEBHOOK_ALLOW_LOOPBACK: 'true', CANTO_WEBHOOK_HOSTS: 'A.example.=127.0.0.1, b.example=::1' }).webhooks;
    expect(w.allowLoopback).toBe(true);
    expect(w.hosts).toEqual({ 'a.example': '127.0.0.1', 'b.example': '::1' });
    expect(Object.isFrozen(w)).toBe(true);
    expect(() => loadSchedulerConfig({ ...base, CANTO_WEBHOOK_ALLOW_LOOPBACK: 'yes' })).toThrow(/ALLOW_LOOPBACK/);
    expect(() => loadSchedulerConfig({ ...base, CANTO_WEBHOOK_HOSTS: 'a.example=not-an-ip' })).toThrow(/HOSTS/);
    expect(() => loadSchedulerConfig({ ...base, CANTO_WEBHOOK_RETRY_BASE_MS: '1000', CANTO_WEBHOOK_RETRY_MAX_MS: '10' })).toThrow(/RETRY_MAX/);
  });
});

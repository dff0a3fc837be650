/**
 * Which network addresses a webhook may reach. A webhook URL is chosen by an API client and
 * fetched by the scheduler, so without a guard it would let any client make the scheduler talk
 * to itself or to the machine's neighbours (server-side request forgery): the cloud metadata
 * service at 169.254.169.254, an admin port on 127.0.0.1, a database listening on ::1.
 *
 * The guard classifies an address into the ranges it must never reach: loopback (127.0.0.0/8,
 * ::1), link-local (169.254.0.0/16, fe80::/10), unspecified ("this network", 0.0.0.0/8 and ::;
 * on Linux 0.0.0.0 reaches the local host), multicast, the reserved 240.0.0.0/4, and the cloud
 * metadata services that sit outside link-local (100.100.100.200, fd00:ec2::254). IPv6 forms
 * that embed an IPv4 address (mapped `::ffff:a.b.c.d`, the old compatible `::a.b.c.d`, SIIT and
 * the NAT64 prefix 64:ff9b::/96) are judged by the IPv4 address inside, so `[::ffff:127.0.0.1]`
 * is loopback too. Deployments for local development may allow loopback; nothing else is ever
 * allowed.
 *
 * The same classification runs three times: on the URL's host at registration, on every address
 * a host name resolves to before connecting, and on the connected socket's peer address.
 */
import { isIP } from 'node:net';

export type BlockedRange = 'loopback' | 'link-local' | 'unspecified' | 'multicast' | 'reserved' | 'metadata';

export interface AddressPolicy {
  /** Local development: loopback addresses (and names) are allowed. */
  readonly allowLoopback: boolean;
}

/** The blocked range `address` (an IPv4 or IPv6 literal, brackets allowed) falls in, or null. */
export function classifyAddress(address: string): BlockedRange | null {
  const bare = stripBrackets(address);
  const family = isIP(bare);
  if (family === 4) return classifyV4(parseV4(bare));
  if (family === 6) return classifyV6(parseV6(bare));
  return null;
}

/** Why `address` may not be reached under `policy`, or null when it may. Non-IP input is null. */
export function blockedAddress(address: string, policy: AddressPolicy): BlockedRange | null {
  const range = classifyAddress(address);
  return range === 'loopback' && policy.allowLoopback ? null : range;
}

/**
 * Why a URL host may not be used under `policy`, or null. `host` is a WHATWG URL `hostname`,
 * which has already turned every IPv4 spelling (`0x7f000001`, `2130706433`, `127.1`,
 * `0177.0.0.1`) into dotted decimal and bracketed IPv6 into its canonical form. Names under
 * `localhost` are loopback by definition (RFC 6761) and never reach a resolver. Any other name
 * passes here and is judged by what it resolves to when a delivery connects.
 */
export function blockedHost(host: string, policy: AddressPolicy): BlockedRange | null {
  if (isLocalhostName(host)) return policy.allowLoopback ? null : 'loopback';
  return blockedAddress(host, policy);
}

export function isLocalhostName(host: string): boolean {
  const name = host.toLowerCase().replace(/\.$/, '');
  return name === 'localhost' || name.endsWith('.localhost');
}

export function stripBrackets(host: string): string {
  return host.startsWith('[') && host.endsWith(']') ? host.slice(1, -1) : host;
}

function parseV4(text: string): number[] {
  return text.split('.').map(Number);
}

function classifyV4([a = 0, b = 0, c = 0, d = 0]: number[]): BlockedRange | null {
  if (a === 0) return 'unspecified';
  // Clouds' metadata and platform services outside link-local: Alibaba Cloud's, Azure's wire
  // server (168.63.129.16) and Oracle Cloud's (192.0.0.192).
  if (a === 100 && b === 100 && c === 100 && d === 200) return 'metadata';
  if (a === 168 && b === 63 && c === 129 && d === 16) return 'metadata';
  if (a === 192 && b === 0 && c === 0 && d === 192) return 'metadata';
  if (a === 127) return 'loopback';
  if (a === 169 && b === 254) return 'link-local';
  if (a >= 224 && a <= 239) return 'multicast';
  if (a >= 240) return 'reserved';
  return null;
}

/** Eight 16-bit groups of an IPv6 literal (already validated by `isIP`); a zone id is dropped. */
function parseV6(text: string): number[] {
  let rest = text.replace(/%.*$/, '');
  const tail: number[] = [];
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(rest);
  if (dotted) {
    const [a = 0, b = 0, c = 0, d = 0] = parseV4(dotted[1]!);
    tail.push((a << 8) | b, (c << 8) | d);
    rest = rest.slice(0, -dotted[1]!.length);
    if (rest.endsWith(':') && !rest.endsWith('::')) rest = rest.slice(0, -1);
  }
  const groups = (s: string) => (s === '' ? [] : s.split(':').map((g) => parseInt(g, 16)));
  const [head, after] = rest.includes('::') ? rest.split('::') : [rest, null];
  const left = groups(head ?? '');
  const right = [...groups(after ?? ''), ...tail];
  const fill = after === null ? [] : new Array<number>(8 - left.length - right.length).fill(0);
  return after === null ? [...left, ...tail] : [...left, ...fill, ...right];
}

function classifyV6(g: number[]): BlockedRange | null {
  const zeros = (from: number, to: number) => g.slice(from, to).every((x) => x === 0);
  const embedded = () => classifyV4([g[6]! >> 8, g[6]! & 0xff, g[7]! >> 8, g[7]! & 0xff]);
  if (zeros(0, 8)) return 'unspecified';
  if (zeros(0, 7) && g[7] === 1) return 'loopback';
  if ((g[0]! & 0xffc0) === 0xfe80) return 'link-local';
  if ((g[0]! & 0xff00) === 0xff00) return 'multicast';
  // AWS's metadata service over IPv6, fd00:ec2::254, and Google Cloud's, fd20:ce::254 (in the
  // unique-local range, which is allowed).
  if (g[0] === 0xfd00 && g[1] === 0x0ec2 && zeros(2, 7) && g[7] === 0x254) return 'metadata';
  if (g[0] === 0xfd20 && g[1] === 0x00ce && zeros(2, 7) && g[7] === 0x254) return 'metadata';
  // 6to4 (2002:a.b.c.d::/48) carries an IPv4 address in its second and third groups.
  if (g[0] === 0x2002) return classifyV4([g[1]! >> 8, g[1]! & 0xff, g[2]! >> 8, g[2]! & 0xff]);
  // Teredo (2001:0::/32) carries the client's IPv4 address inverted in its last two groups.
  if (g[0] === 0x2001 && g[1] === 0) return classifyV4([(g[6]! >> 8) ^ 0xff, (g[6]! & 0xff) ^ 0xff, (g[7]! >> 8) ^ 0xff, (g[7]! & 0xff) ^ 0xff]);
  // The local-use NAT64 prefix (64:ff9b:1::/48, RFC 8215) translates to any IPv4 address.
  if (g[0] === 0x64 && g[1] === 0xff9b && g[2] === 1) return embedded();
  // ::ffff:a.b.c.d (mapped), ::ffff:0:a.b.c.d (SIIT), ::a.b.c.d (compatible), 64:ff9b::a.b.c.d (NAT64).
  if (zeros(0, 5) && g[5] === 0xffff) return embedded();
  if (zeros(0, 4) && g[4] === 0xffff && g[5] === 0) return embedded();
  if (zeros(0, 6)) return embedded();
  if (g[0] === 0x64 && g[1] === 0xff9b && zeros(2, 6)) return embedded();
  return null;
}

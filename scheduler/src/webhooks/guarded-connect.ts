/**
 * Opening the connection for a webhook delivery, with the SSRF guard applied at connect time.
 *
 * Checking a URL once at registration is not enough: a name can be registered while it points at
 * a public address and later be re-pointed at 127.0.0.1 (DNS rebinding). So every attempt
 * resolves the name itself, refuses if any answer is blocked, connects to one of the checked
 * addresses (never to the name, which a second lookup could answer differently), and finally
 * checks the connected socket's peer address. The last check is what holds even where a lookup
 * hook would be skipped, for example for IP literals.
 *
 * TLS runs over the checked TCP socket with the URL's host name for SNI and certificate checks,
 * so pinning the address does not weaken certificate validation.
 *
 * Names are asked of DNS directly (c-ares), not through getaddrinfo: getaddrinfo runs on libuv's
 * thread pool (four threads, shared with the file system and the database's own lookups) and
 * cannot be called off, so a tenant whose receiver's name server never answers held a thread per
 * attempt well past the attempt's timeout, and a few such attempts stalled the whole process.
 * A DNS query is cancelled with its attempt. `/etc/hosts` is read first, as getaddrinfo does
 * (hosts-file.ts), and `localhost` names are loopback (RFC 6761); the resolver's search domains
 * are not applied (receivers have fully qualified names; `CANTO_WEBHOOK_HOSTS` pins any other).
 */
import { Resolver } from 'node:dns/promises';
import { connect as netConnect, isIP, type Socket } from 'node:net';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';
import { HostsFile } from './hosts-file.js';
import { blockedAddress, blockedHost, isLocalhostName, stripBrackets, type AddressPolicy, type BlockedRange } from './address-policy.js';

export interface ConnectPolicy extends AddressPolicy {
  /** Static host name → address overrides, consulted before DNS (lower-case names, no trailing dot). */
  readonly hosts: Readonly<Record<string, string>>;
  /** Resolves a host name to its addresses; default: DNS (`dnsLookup`). Called off by `signal`. */
  readonly lookup?: (hostname: string, signal: AbortSignal) => Promise<string[]>;
}

/** A delivery the guard refused: retrying cannot help until the endpoint or DNS changes. */
export class RefusedAddress extends Error {
  constructor(readonly range: BlockedRange) {
    super(`the endpoint host resolves to a ${range} address, which webhooks may not reach`);
    this.name = 'RefusedAddress';
  }
}

const HOSTS_FILE = new HostsFile();

/** How long one DNS query waits for an answer before it is sent again (twice in all). */
const DNS_TRY_MS = 2_500;

/**
 * The IPv4 and IPv6 addresses of `hostname` from DNS, asked of the system's name servers (or
 * `servers`, `address:port`), without the thread pool; `signal` cancels the queries.
 */
export async function dnsLookup(hostname: string, signal: AbortSignal, servers?: string[], hostsFile = HOSTS_FILE): Promise<string[]> {
  if (isLocalhostName(hostname)) return ['127.0.0.1', '::1'];
  const listed = await hostsFile.lookup(hostname.toLowerCase().replace(/\.$/, ''));
  if (listed.length > 0) return listed;
  const resolver = new Resolver({ timeout: DNS_TRY_MS, tries: 2 });
  if (servers) resolver.setServers(servers);
  const cancel = () => resolver.cancel();
  signal.addEventListener('abort', cancel, { once: true });
  try {
    const answers = await Promise.allSettled([resolver.resolve4(hostname), resolver.resolve6(hostname)]);
    if (signal.aborted) throw signal.reason as Error;
    const addresses = answers.flatMap((a) => (a.status === 'fulfilled' ? a.value : []));
    const failed = answers.find((a) => a.status === 'rejected');
    // A name with only one family answers the other with ENODATA: that is not a failure.
    const code = (failed?.reason as { code?: unknown } | undefined)?.code;
    // Said as getaddrinfo would (the delivery log's "did not resolve"): a DNS server that refused
    // or timed out is not the receiver refusing a connection.
    if (addresses.length === 0 && failed && code !== 'ENODATA') throw Object.assign(new Error(`no address for the name (${String(code)})`), { code: 'ENOTFOUND' });
    return addresses;
  } finally {
    signal.removeEventListener('abort', cancel);
  }
}

/** Settles as `work` does, or rejects with `signal`'s reason once it aborts, whichever is first. */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/** Every address `hostname` (a WHATWG URL hostname) stands for, each one checked. */
export async function resolveChecked(hostname: string, policy: ConnectPolicy, signal = new AbortController().signal): Promise<string[]> {
  const byName = blockedHost(hostname, policy);
  if (byName) throw new RefusedAddress(byName);
  const bare = stripBrackets(hostname);
  const name = bare.toLowerCase().replace(/\.$/, '');
  // An own property only: a host named `constructor` or `__proto__` is not pinned by the prototype.
  const pinned = Object.hasOwn(policy.hosts, name) ? policy.hosts[name] : undefined;
  // Raced with the attempt as well: a lookup hook that does not heed the signal is still bounded.
  const addresses = isIP(bare) ? [bare] : pinned ? [pinned] : await untilAborted((policy.lookup ?? dnsLookup)(bare, signal), signal);
  if (addresses.length === 0) throw Object.assign(new Error('no address'), { code: 'ENOTFOUND' });
  for (const address of addresses) {
    const range = blockedAddress(address, policy);
    if (range) throw new RefusedAddress(range);
  }
  return addresses;
}

/** Throws `RefusedAddress` unless the socket's peer is an address the policy allows. */
export function assertPeerAllowed(socket: Socket, policy: AddressPolicy): void {
  const peer = socket.remoteAddress;
  // A connected TCP socket always has a peer; without one nothing can be vouched for.
  const range = peer ? blockedAddress(peer, policy) : 'unspecified';
  if (range) throw new RefusedAddress(range);
}

function settleOn<T>(emitter: Socket, event: string, value: () => T, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason as Error);
    const cleanup = () => {
      signal.removeEventListener('abort', onAbort);
      emitter.off('error', onError);
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    if (signal.aborted) return reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    emitter.once('error', onError);
    emitter.once(event, () => {
      cleanup();
      resolve(value());
    });
  });
}

/**
 * A connected, checked socket to `url`'s host: plain TCP for `http:`, TLS for `https:`. The
 * addresses are tried in resolver order. `signal` aborts at any stage (it carries the timeout).
 */
export async function connectGuarded(url: URL, policy: ConnectPolicy, signal: AbortSignal): Promise<Socket | TLSSocket> {
  const addresses = await resolveChecked(url.hostname, policy, signal);
  const port = Number(url.port) || (url.protocol === 'https:' ? 443 : 80);
  let lastError: unknown = null;
  for (const address of addresses) {
    const socket = netConnect({ host: address, port });
    let tls: TLSSocket | null = null;
    const destroy = () => socket.destroy();
    signal.addEventListener('abort', destroy, { once: true });
    try {
      await settleOn(socket, 'connect', () => undefined, signal);
      assertPeerAllowed(socket, policy);
      if (url.protocol !== 'https:') return socket;
      const host = stripBrackets(url.hostname).replace(/\.$/, '');
      // SNI carries names only; for an IP literal the certificate is checked against the IP.
      tls = tlsConnect({ socket, host, servername: isIP(host) ? undefined : host, ALPNProtocols: ['http/1.1'] });
      return await settleOn(tls as Socket, 'secureConnect', () => tls!, signal);
    } catch (err) {
      // Late errors from a socket being given up on must not go unhandled.
      for (const s of [tls, socket]) s?.on('error', () => {}).destroy();
      // The next address is for a host that could not be reached, not for one whose TLS failed.
      if (err instanceof RefusedAddress || signal.aborted || tls !== null) throw err;
      lastError = err;
    } finally {
      // From here on the caller owns the socket and its lifetime.
      signal.removeEventListener('abort', destroy);
    }
  }
  throw lastError;
}

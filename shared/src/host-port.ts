/**
 * `host:port`, with an IPv6 host in brackets: how listen settings, the agent's advertised
 * gateways and the URLs built from them write an address. One parser and one formatter, so an
 * address written by one part is read back the same by another.
 */

/** `host:port` or `[v6]:port` with a port of 0..65535; null for anything else. */
export function parseHostPort(value: string): { host: string; port: number } | null {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s[\]]+)):(\d{1,5})$/.exec(value);
  const port = m ? Number(m[3]) : Number.NaN;
  if (!m || port > 65535) return null;
  return { host: m[1] ?? m[2]!, port };
}

export function formatHostPort(host: string, port: number): string {
  return `${formatHost(host)}:${port}`;
}

/** The host as it goes before `:port` or into a URL: an IPv6 address in brackets. */
export function formatHost(host: string): string {
  return host.includes(':') ? `[${host}]` : host;
}

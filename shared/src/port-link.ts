/**
 * The port link: how the scheduler's ingress reaches a port inside a desktop (docs/api.md §4.7). The
 * ingress dials the agent's port gateway over TCP and opens with one line naming the desktop,
 * its generation and the guest port, signed with the host's port-link key:
 *
 *   CANTO-PORT/1 <desktop_id> <generation> <port> <unix ms> <hex HMAC-SHA256(key, "<desktop_id> <generation> <port> <unix ms>")>\n
 *
 * The agent answers `OK\n` and from then on relays raw bytes to the guest port, or `ERR <code>\n`
 * and closes. Each host has its own key, derived from the schedulers' secret key and the host id
 * (`portLinkKey`) and handed to the agent in the hello reply, over its authenticated link. So only
 * a scheduler can sign for any host, and an agent (or whoever takes one over) can sign for none
 * but its own: the join token, which every agent holds, is not the key. The gateway can therefore
 * listen on a routable address; the timestamp bounds replays to a minute, and the generation
 * fences a desktop that was recovered elsewhere.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import { isId } from './ids.js';

export const PORT_LINK_PREFIX = 'CANTO-PORT/1';
/** A line longer than this is refused unread. */
export const PORT_LINK_MAX_LINE = 256;
/** How far a line's timestamp may be from the agent's clock. */
export const PORT_LINK_MAX_SKEW_MS = 60_000;

/** What an agent answers instead of `OK`. */
export type PortLinkRefusal =
  /** The line is malformed, stale or badly signed. */
  | 'unauthorized'
  /** The desktop is not running here at that generation (hibernated, moved, destroyed). */
  | 'not_running'
  /** Nothing accepts connections on the guest port. */
  | 'refused'
  /** The agent cannot open the port now (stopping, overloaded). */
  | 'unavailable';

export interface PortTarget {
  readonly desktopId: string;
  readonly generation: number;
  readonly port: number;
}

/** The key of `hostId`'s lines: only holders of the schedulers' secret key can derive it. */
export function portLinkKey(schedulerSecret: string, hostId: string): string {
  return createHmac('sha256', schedulerSecret).update(`canto port link ${hostId}`).digest('hex');
}

function sign(secret: string, t: PortTarget, atMs: number): string {
  return createHmac('sha256', secret).update(`${t.desktopId} ${t.generation} ${t.port} ${atMs}`).digest('hex');
}

/** The opening line the ingress sends, newline included. */
export function portLinkLine(secret: string, target: PortTarget, nowMs = Date.now()): string {
  return `${PORT_LINK_PREFIX} ${target.desktopId} ${target.generation} ${target.port} ${nowMs} ${sign(secret, target, nowMs)}\n`;
}

/** The target of a well-formed, fresh and correctly signed line (without its newline), else null. */
export function verifyPortLinkLine(secret: string, line: string, nowMs = Date.now()): PortTarget | null {
  const parts = line.split(' ');
  if (parts.length !== 6 || parts[0] !== PORT_LINK_PREFIX) return null;
  const [, desktopId, gen, portText, atText, mac] = parts as [string, string, string, string, string, string];
  if (!isId('desktop', desktopId) || !/^\d{1,15}$/.test(gen) || !/^\d{1,5}$/.test(portText) || !/^\d{1,15}$/.test(atText)) return null;
  const port = Number(portText);
  const atMs = Number(atText);
  if (port < 1 || port > 65535 || Math.abs(nowMs - atMs) > PORT_LINK_MAX_SKEW_MS || !/^[0-9a-f]{64}$/.test(mac)) return null;
  const target = { desktopId, generation: Number(gen), port };
  const expected = Buffer.from(sign(secret, target, atMs), 'hex');
  return timingSafeEqual(expected, Buffer.from(mac, 'hex')) ? target : null;
}

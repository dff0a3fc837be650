/**
 * The port link: how the scheduler's ingress reaches a port inside a desktop (docs/api.md §4.7). The
 * ingress dials the agent's port gateway over TCP and opens with one line naming the desktop,
 * its generation and the guest port, signed with the host's port-link key:
 *
 *   CANTO-PORT/2 <desktop_id> <generation> <port> <unix ms> <nonce> <hex HMAC-SHA256(key, "2 <desktop_id> <generation> <port> <unix ms> <nonce>")>\n
 *
 * (`CANTO-PORT/1`, without the nonce, is what schedulers before protocol 1.16 send, and an agent
 * still takes it; a scheduler sends `/2` to an agent that speaks 1.16.)
 *
 * The agent answers `OK\n` and from then on relays raw bytes to the guest port, or `ERR <code>\n`
 * and closes. Each host has its own key, derived from the schedulers' secret key and the host id
 * (`portLinkKey`) and handed to the agent in the hello reply, over its authenticated link. So only
 * a scheduler can sign for any host, and an agent (or whoever takes one over) can sign for none
 * but its own: the join token, which every agent holds, is not the key. The gateway can therefore
 * listen on a routable address; the generation fences a desktop that was recovered elsewhere.
 * A line is good for one link: the timestamp bounds it to a minute, and within that minute the
 * agent takes each nonce once (`ReplayGuard`), so a line seen on the network (the link is plain
 * TCP) opens nothing more; a `/1` line, which has no nonce, stays good for its minute.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { isId } from './ids.js';

export const PORT_LINK_PREFIX = 'CANTO-PORT/1';
export const PORT_LINK_PREFIX_V2 = 'CANTO-PORT/2';
/** The protocol minor (of major 1) from which an agent takes `/2` lines. */
export const PORT_LINK_V2_MINOR = 16;
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

/** What a line signs: `/1`'s fields, or `/2`'s with its version and nonce (so neither passes for the other). */
function sign(secret: string, t: PortTarget, atMs: number, nonce: string | null): string {
  const fields = `${t.desktopId} ${t.generation} ${t.port} ${atMs}`;
  return createHmac('sha256', secret).update(nonce === null ? fields : `2 ${fields} ${nonce}`).digest('hex');
}

/** The opening line the ingress sends, newline included: `/2` (the default) or, to an agent older than 1.16, `/1`. */
export function portLinkLine(secret: string, target: PortTarget, nowMs = Date.now(), version: 1 | 2 = 2): string {
  const head = `${target.desktopId} ${target.generation} ${target.port} ${nowMs}`;
  if (version === 1) return `${PORT_LINK_PREFIX} ${head} ${sign(secret, target, nowMs, null)}\n`;
  const nonce = randomBytes(16).toString('hex');
  return `${PORT_LINK_PREFIX_V2} ${head} ${nonce} ${sign(secret, target, nowMs, nonce)}\n`;
}

/** A verified line: its target, when it was signed, and its nonce (null on a `/1` line). */
export interface PortLink {
  readonly target: PortTarget;
  readonly atMs: number;
  readonly nonce: string | null;
}

/** A well-formed, fresh and correctly signed line (without its newline), else null. */
export function verifyPortLink(secret: string, line: string, nowMs = Date.now()): PortLink | null {
  const parts = line.split(' ');
  const v2 = parts[0] === PORT_LINK_PREFIX_V2;
  if (parts.length !== (v2 ? 7 : 6) || (!v2 && parts[0] !== PORT_LINK_PREFIX)) return null;
  const [desktopId = '', gen = '', portText = '', atText = ''] = parts.slice(1, 5);
  const nonce = v2 ? parts[5]! : null;
  const mac = parts.at(-1)!;
  if (!isId('desktop', desktopId) || !/^\d{1,15}$/.test(gen) || !/^\d{1,5}$/.test(portText) || !/^\d{1,15}$/.test(atText)) return null;
  if (nonce !== null && !/^[0-9a-f]{32}$/.test(nonce)) return null;
  const port = Number(portText);
  const atMs = Number(atText);
  if (port < 1 || port > 65535 || Math.abs(nowMs - atMs) > PORT_LINK_MAX_SKEW_MS || !/^[0-9a-f]{64}$/.test(mac)) return null;
  const target = { desktopId, generation: Number(gen), port };
  const expected = Buffer.from(sign(secret, target, atMs, nonce), 'hex');
  return timingSafeEqual(expected, Buffer.from(mac, 'hex')) ? { target, atMs, nonce } : null;
}

/**
 * The nonces of the `/2` lines taken within the skew window: a line whose nonce was taken before
 * is a replay. Kept in the order taken (a Map's order), so the expired ones are dropped from the
 * front; at the ingress's rate that is a few thousand entries at most.
 */
export class ReplayGuard {
  private readonly seen = new Map<string, number>();

  /** Whether the line may open a link: `/1` lines always (they carry no nonce), `/2` lines once. */
  take(link: PortLink, nowMs = Date.now()): boolean {
    for (const [nonce, until] of this.seen) {
      if (until > nowMs) break;
      this.seen.delete(nonce);
    }
    if (link.nonce === null) return true;
    if (this.seen.has(link.nonce)) return false;
    // Past its signing time plus the skew allowed, the line is refused as stale anyway.
    this.seen.set(link.nonce, Math.max(nowMs, link.atMs + PORT_LINK_MAX_SKEW_MS) + 1);
    return true;
  }
}

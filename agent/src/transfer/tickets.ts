/**
 * Tickets of the transfer server: the bearer secrets another agent presents to fetch a desktop
 * being moved (shared/src/transfer.ts).
 *
 * A ticket is `ttk_` and 32 random bytes in base64url, bound to one desktop and the generation
 * the export saw, and valid for any number of requests until it expires or the desktop no longer
 * needs to be read from this host: a copy broken halfway resumes with the same ticket, but once
 * the desktop starts here again (its move rolled back) or is destroyed here (its move finished),
 * its tickets are revoked (moves.ts), not left working for the rest of their hour. The stop for a
 * move keeps them: the copy after a pre-copy fetches with the pre-copy's ticket.
 *
 * Only its SHA-256 is kept, so nothing in memory lets anyone fetch; a ticket is found by its
 * hash, then compared in constant time, so timing says nothing about the secret. A ticket for
 * another desktop is answered like a missing desktop (404): it proves its holder was sent by the
 * scheduler, but not for this one.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { ListingMode } from '../../../shared/src/transfer.js';

const TICKET_FORMAT = /^ttk_[A-Za-z0-9_-]{43}$/;
/**
 * The refusal of a well-formed ticket this source does not hold (never granted here, expired,
 * revoked, or granted by the agent before a restart): the one refusal a new export cures. The
 * importer tells it by this detail (transfer/client.ts); agents of earlier releases word it alike.
 */
export const TICKET_UNKNOWN = 'the transfer ticket is unknown or expired';

interface Ticket {
  readonly hash: Buffer;
  readonly desktopId: string;
  readonly generation: number;
  readonly expiresAt: number;
  /** How the export listed the units: the units route lists them the same way. */
  readonly listing: ListingMode;
}

export type TicketCheck =
  | { readonly ok: true; readonly generation: number; readonly listing: ListingMode }
  | { readonly ok: false; readonly status: 401 | 404; readonly detail: string };

function hashOf(ticket: string): Buffer {
  return createHash('sha256').update(ticket, 'latin1').digest();
}

export class TransferTickets {
  private readonly tickets = new Map<string, Ticket>();

  constructor(private readonly now: () => number = Date.now) {}

  issue(desktopId: string, generation: number, ttlMs: number, listing: ListingMode = 'hashed'): { ticket: string; expiresAt: number } {
    this.prune();
    const ticket = `ttk_${randomBytes(32).toString('base64url')}`;
    const hash = hashOf(ticket);
    const expiresAt = this.now() + ttlMs;
    this.tickets.set(hash.toString('hex'), { hash, desktopId, generation, expiresAt, listing });
    return { ticket, expiresAt };
  }

  /** Whether `presented` (null: none) lets its holder fetch `desktopId`, and at which generation. */
  check(presented: string | null, desktopId: string): TicketCheck {
    if (presented === null) return { ok: false, status: 401, detail: 'a transfer ticket is required (Authorization: Bearer …)' };
    if (!TICKET_FORMAT.test(presented)) return { ok: false, status: 401, detail: 'the transfer ticket is malformed' };
    const hash = hashOf(presented);
    const found = this.tickets.get(hash.toString('hex'));
    if (found === undefined || !timingSafeEqual(found.hash, hash)) {
      return { ok: false, status: 401, detail: TICKET_UNKNOWN };
    }
    if (this.now() >= found.expiresAt) {
      this.tickets.delete(hash.toString('hex'));
      return { ok: false, status: 401, detail: TICKET_UNKNOWN };
    }
    if (found.desktopId !== desktopId) return { ok: false, status: 404, detail: 'no such desktop for this ticket' };
    return { ok: true, generation: found.generation, listing: found.listing };
  }

  /** Drops every ticket of the desktop: it started or is destroyed here, and no move reads it now. */
  revoke(desktopId: string): void {
    for (const [key, ticket] of this.tickets) if (ticket.desktopId === desktopId) this.tickets.delete(key);
  }

  clear(): void {
    this.tickets.clear();
  }

  private prune(): void {
    const now = this.now();
    for (const [key, ticket] of this.tickets) if (now >= ticket.expiresAt) this.tickets.delete(key);
  }
}

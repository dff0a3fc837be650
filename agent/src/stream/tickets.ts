/**
 * The stream gateway's book of tickets and claims (docs/api.md §4.6).
 *
 * A ticket is a bearer secret for one connection: `stk_` and 32 random bytes in base64url. The
 * book keeps only its SHA-256 hash, so nothing in memory (or in a heap dump) lets anyone connect,
 * and looking a hash up in a map leaks nothing usable through timing. Redeeming a ticket deletes
 * it (single use) and turns it into a lease: the claim of a connection, held until the gateway
 * ends the lease when that connection closes.
 *
 * Claims: a `control` claim is held from its grant by the unused ticket, then by the lease, and
 * only one per desktop at a time; the desktop's exec and file operations ask `controlHeld`. View
 * claims (unused tickets and leases together) are capped per desktop.
 *
 * A ticket that expired or whose desktop was released leaves a tombstone for a while, so that
 * presenting it answers why (`expired_ticket`, `not_running`) instead of a bare `invalid_ticket`.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { StreamClaim } from '../../../shared/src/computer-use.js';
import { AgentFailure } from '../../../shared/src/protocol.js';

/** View claims (tickets and connections) one desktop may have at once. */
export const MAX_VIEW_CLAIMS = 8;
/** How long a dead ticket still answers with its reason. */
const TOMBSTONE_MS = 10 * 60_000;
const MAX_TOMBSTONES = 10_000;
const TICKET_FORMAT = /^stk_[A-Za-z0-9_-]{43}$/;

export type RefusalCode = 'invalid_ticket' | 'expired_ticket' | 'not_running';

/** A redeemed ticket: the claim of one connection. */
export interface Lease {
  readonly desktopId: string;
  readonly claim: StreamClaim;
}

interface Ticket {
  readonly hash: string;
  readonly desktopId: string;
  readonly claim: StreamClaim;
  readonly expiresAt: number;
  readonly timer: NodeJS.Timeout;
}

interface Tombstone {
  readonly code: RefusalCode;
  readonly until: number;
}

function hashOf(ticket: string): string {
  return createHash('sha256').update(ticket, 'latin1').digest('hex');
}

export class TicketBook {
  private readonly tickets = new Map<string, Ticket>();
  /** Insertion order is expiry order: every tombstone lives TOMBSTONE_MS. */
  private readonly tombstones = new Map<string, Tombstone>();
  private readonly leases = new Map<string, Set<Lease>>();

  constructor(private readonly ttlMs: number) {}

  /** Issues a ticket, or refuses the claim (`control_claimed`, `too_large`). */
  issue(desktopId: string, claim: StreamClaim): { ticket: string; expiresAt: number } {
    if (claim === 'control' && this.controlHeld(desktopId)) {
      throw new AgentFailure('control_claimed', 'another client holds the control claim', false);
    }
    if (claim === 'view' && this.viewClaims(desktopId) >= MAX_VIEW_CLAIMS) {
      throw new AgentFailure('too_large', `a desktop has at most ${MAX_VIEW_CLAIMS} view sessions at once`, false);
    }
    const ticket = `stk_${randomBytes(32).toString('base64url')}`;
    const hash = hashOf(ticket);
    const expiresAt = Date.now() + this.ttlMs;
    const timer = setTimeout(() => this.expire(hash), this.ttlMs);
    timer.unref();
    this.tickets.set(hash, { hash, desktopId, claim, expiresAt, timer });
    return { ticket, expiresAt };
  }

  /** Consumes a ticket and returns its lease, or the reason it is refused. */
  redeem(ticket: string): Lease | RefusalCode {
    if (!TICKET_FORMAT.test(ticket)) return 'invalid_ticket';
    const hash = hashOf(ticket);
    const found = this.tickets.get(hash);
    if (found === undefined) return this.tombstoneOf(hash) ?? 'invalid_ticket';
    if (Date.now() >= found.expiresAt) {
      this.expire(hash);
      return 'expired_ticket';
    }
    this.drop(found);
    const lease: Lease = { desktopId: found.desktopId, claim: found.claim };
    let set = this.leases.get(found.desktopId);
    if (set === undefined) this.leases.set(found.desktopId, (set = new Set()));
    set.add(lease);
    return lease;
  }

  /** The lease's connection closed: its claim is free. Idempotent. */
  end(lease: Lease): void {
    const set = this.leases.get(lease.desktopId);
    if (set?.delete(lease) && set.size === 0) this.leases.delete(lease.desktopId);
  }

  /** Drops the desktop's unused tickets and ends its leases. */
  release(desktopId: string): void {
    for (const ticket of [...this.tickets.values()]) {
      if (ticket.desktopId === desktopId) this.bury(ticket, 'not_running');
    }
    this.leases.delete(desktopId);
  }

  controlHeld(desktopId: string): boolean {
    for (const lease of this.leases.get(desktopId) ?? []) if (lease.claim === 'control') return true;
    for (const ticket of [...this.tickets.values()]) {
      if (ticket.desktopId !== desktopId || ticket.claim !== 'control') continue;
      // A timer may fire late: an expired ticket holds nothing.
      if (Date.now() < ticket.expiresAt) return true;
      this.expire(ticket.hash);
    }
    return false;
  }

  /** Forgets everything (the gateway is closing). */
  clear(): void {
    for (const ticket of this.tickets.values()) clearTimeout(ticket.timer);
    this.tickets.clear();
    this.tombstones.clear();
    this.leases.clear();
  }

  private viewClaims(desktopId: string): number {
    let n = 0;
    for (const lease of this.leases.get(desktopId) ?? []) if (lease.claim === 'view') n++;
    const now = Date.now();
    for (const ticket of this.tickets.values()) {
      if (ticket.desktopId === desktopId && ticket.claim === 'view' && now < ticket.expiresAt) n++;
    }
    return n;
  }

  private expire(hash: string): void {
    const ticket = this.tickets.get(hash);
    if (ticket !== undefined) this.bury(ticket, 'expired_ticket');
  }

  private drop(ticket: Ticket): void {
    clearTimeout(ticket.timer);
    this.tickets.delete(ticket.hash);
  }

  private bury(ticket: Ticket, code: RefusalCode): void {
    this.drop(ticket);
    this.prune();
    if (this.tombstones.size >= MAX_TOMBSTONES) {
      const oldest = this.tombstones.keys().next();
      if (oldest.done !== true) this.tombstones.delete(oldest.value);
    }
    this.tombstones.set(ticket.hash, { code, until: Date.now() + TOMBSTONE_MS });
  }

  private tombstoneOf(hash: string): RefusalCode | null {
    this.prune();
    return this.tombstones.get(hash)?.code ?? null;
  }

  private prune(): void {
    const now = Date.now();
    for (const [hash, stone] of this.tombstones) {
      if (stone.until > now) break;
      this.tombstones.delete(hash);
    }
  }
}

/**
 * Single-use tickets, the one mechanism behind the stream gateway's view/control tickets
 * (tickets.ts) and its terminal tickets (terminal-tickets.ts).
 *
 * A ticket is a bearer secret for one connection: a prefix (`stk_`, `ttk_`) and 32 random bytes
 * in base64url. The store keeps only its SHA-256 hash, so nothing in memory (or in a heap dump)
 * lets anyone connect, and looking a hash up in a map leaks nothing usable through timing. A
 * ticket carries a grant, whatever its user binds to it (a claim; a generation and a terminal's
 * size and program) along with the desktop. Redeeming a ticket deletes it (single use) and turns
 * its grant into a lease: the claim of a connection, held until the gateway ends the lease when
 * that connection closes.
 *
 * What a desktop may hold is the user's rule (`admit`), asked before every issue with the grants
 * the desktop holds now: its unused, unexpired tickets and its leases together, so that a client
 * cannot pile up claims by asking for tickets it never uses.
 *
 * A ticket that expired or whose desktop was released leaves a tombstone for a while, so that
 * presenting it answers why (`expired_ticket`, `not_running`) instead of a bare `invalid_ticket`.
 */
import { createHash, randomBytes } from 'node:crypto';

/** How long a dead ticket still answers with its reason. */
const TOMBSTONE_MS = 10 * 60_000;
const MAX_TOMBSTONES = 10_000;

export type RefusalCode = 'invalid_ticket' | 'expired_ticket' | 'not_running';

/** What every grant carries: the desktop it is for. */
export interface Grant {
  readonly desktopId: string;
}

export interface SingleUseTicketsOptions<G extends Grant> {
  /** The ticket's visible prefix, without the underscore (`stk`). */
  readonly prefix: string;
  readonly ttlMs: number;
  /** Throws (an AgentFailure) when the desktop, holding `held`, may not be granted one more. */
  admit(grant: G, held: readonly G[]): void;
}

interface Ticket<G> {
  readonly hash: string;
  readonly grant: G;
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

export class SingleUseTickets<G extends Grant> {
  private readonly tickets = new Map<string, Ticket<G>>();
  /** Insertion order is expiry order: every tombstone lives TOMBSTONE_MS. */
  private readonly tombstones = new Map<string, Tombstone>();
  private readonly leases = new Map<string, Set<G>>();
  private readonly format: RegExp;

  constructor(private readonly options: SingleUseTicketsOptions<G>) {
    this.format = new RegExp(`^${options.prefix}_[A-Za-z0-9_-]{43}$`);
  }

  /** Issues a ticket for the grant, unless `admit` refuses it (it throws). */
  issue(grant: G): { ticket: string; expiresAt: number } {
    this.options.admit(grant, this.held(grant.desktopId));
    const ticket = `${this.options.prefix}_${randomBytes(32).toString('base64url')}`;
    const hash = hashOf(ticket);
    const expiresAt = Date.now() + this.options.ttlMs;
    const timer = setTimeout(() => this.bury(hash, 'expired_ticket'), this.options.ttlMs);
    timer.unref();
    // The grant object itself becomes the lease: one object per ticket, so `end` finds exactly it.
    this.tickets.set(hash, { hash, grant, expiresAt, timer });
    return { ticket, expiresAt };
  }

  /** Consumes a ticket and returns its lease, or the reason it is refused. */
  redeem(ticket: string): G | RefusalCode {
    if (!this.format.test(ticket)) return 'invalid_ticket';
    const hash = hashOf(ticket);
    const found = this.tickets.get(hash);
    if (found === undefined) return this.tombstoneOf(hash) ?? 'invalid_ticket';
    if (Date.now() >= found.expiresAt) {
      this.bury(hash, 'expired_ticket');
      return 'expired_ticket';
    }
    clearTimeout(found.timer);
    this.tickets.delete(hash);
    const lease = found.grant;
    let set = this.leases.get(lease.desktopId);
    if (set === undefined) this.leases.set(lease.desktopId, (set = new Set()));
    set.add(lease);
    return lease;
  }

  /** The lease's connection closed: its claim is free. Idempotent. */
  end(lease: G): void {
    const set = this.leases.get(lease.desktopId);
    if (set?.delete(lease) && set.size === 0) this.leases.delete(lease.desktopId);
  }

  /** The desktop stopped: its unused tickets die and its leases end. */
  release(desktopId: string): void {
    for (const ticket of [...this.tickets.values()]) {
      if (ticket.grant.desktopId === desktopId) this.bury(ticket.hash, 'not_running');
    }
    this.leases.delete(desktopId);
  }

  /**
   * What the desktop holds now: its leases, then its unused tickets. A ticket's timer may fire
   * late, so expiry is checked here too: an expired ticket holds nothing.
   */
  held(desktopId: string): G[] {
    const held = [...(this.leases.get(desktopId) ?? [])];
    const now = Date.now();
    for (const ticket of this.tickets.values()) {
      if (ticket.grant.desktopId === desktopId && now < ticket.expiresAt) held.push(ticket.grant);
    }
    return held;
  }

  /** Forgets everything (the gateway is closing). */
  clear(): void {
    for (const ticket of this.tickets.values()) clearTimeout(ticket.timer);
    this.tickets.clear();
    this.tombstones.clear();
    this.leases.clear();
  }

  private bury(hash: string, code: RefusalCode): void {
    const ticket = this.tickets.get(hash);
    if (ticket === undefined) return;
    clearTimeout(ticket.timer);
    this.tickets.delete(hash);
    this.prune();
    if (this.tombstones.size >= MAX_TOMBSTONES) {
      const oldest = this.tombstones.keys().next();
      if (oldest.done !== true) this.tombstones.delete(oldest.value);
    }
    this.tombstones.set(hash, { code, until: Date.now() + TOMBSTONE_MS });
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

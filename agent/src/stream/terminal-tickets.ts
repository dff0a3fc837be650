/**
 * The stream gateway's book of terminal tickets.
 *
 * A terminal ticket is a bearer secret for one WebSocket: `ttk_` and 32 random bytes in base64url,
 * kept only as its SHA-256 hash, as stream tickets are (tickets.ts). It is bound to the desktop and
 * the generation the scheduler named, and to the terminal's size and program. Redeeming deletes it
 * (single use) and turns it into a lease held until the connection closes.
 *
 * Unused tickets and open terminals together are capped per desktop, so a client cannot pile up
 * programs inside a desktop (each holds a pty and its processes) by asking for tickets.
 */
import { createHash, randomBytes } from 'node:crypto';
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { TerminalSpec } from '../runtime/driver.js';
import type { RefusalCode } from './tickets.js';

/** Terminals (unused tickets and open sessions) one desktop may have at once. */
export const MAX_TERMINALS = 8;
const TOMBSTONE_MS = 10 * 60_000;
const MAX_TOMBSTONES = 10_000;
const TICKET_FORMAT = /^ttk_[A-Za-z0-9_-]{43}$/;

/** A redeemed terminal ticket: the terminal one connection opens. */
export interface TerminalLease {
  readonly desktopId: string;
  readonly generation: number;
  readonly spec: TerminalSpec;
}

interface Ticket extends TerminalLease {
  readonly hash: string;
  readonly expiresAt: number;
  readonly timer: NodeJS.Timeout;
}

function hashOf(ticket: string): string {
  return createHash('sha256').update(ticket, 'latin1').digest('hex');
}

export class TerminalTicketBook {
  private readonly tickets = new Map<string, Ticket>();
  /** Why a dead ticket is refused, in expiry order. */
  private readonly tombstones = new Map<string, { code: RefusalCode; until: number }>();
  private readonly leases = new Map<string, Set<TerminalLease>>();

  constructor(private readonly ttlMs: number) {}

  /** Issues a ticket; `too_large` when the desktop already has its share of terminals. */
  issue(desktopId: string, generation: number, spec: TerminalSpec): { ticket: string; expiresAt: number } {
    if (this.count(desktopId) >= MAX_TERMINALS) {
      throw new AgentFailure('too_large', `a desktop has at most ${MAX_TERMINALS} terminals at once`, false);
    }
    const ticket = `ttk_${randomBytes(32).toString('base64url')}`;
    const hash = hashOf(ticket);
    const expiresAt = Date.now() + this.ttlMs;
    const timer = setTimeout(() => this.bury(hash, 'expired_ticket'), this.ttlMs);
    timer.unref();
    this.tickets.set(hash, { hash, desktopId, generation, spec, expiresAt, timer });
    return { ticket, expiresAt };
  }

  /** Consumes a ticket and returns its lease, or the reason it is refused. */
  redeem(ticket: string): TerminalLease | RefusalCode {
    if (!TICKET_FORMAT.test(ticket)) return 'invalid_ticket';
    const hash = hashOf(ticket);
    const found = this.tickets.get(hash);
    if (found === undefined) return this.tombstoneOf(hash) ?? 'invalid_ticket';
    if (Date.now() >= found.expiresAt) {
      this.bury(hash, 'expired_ticket');
      return 'expired_ticket';
    }
    clearTimeout(found.timer);
    this.tickets.delete(hash);
    const lease: TerminalLease = { desktopId: found.desktopId, generation: found.generation, spec: found.spec };
    let set = this.leases.get(found.desktopId);
    if (set === undefined) this.leases.set(found.desktopId, (set = new Set()));
    set.add(lease);
    return lease;
  }

  /** The lease's connection closed. Idempotent. */
  end(lease: TerminalLease): void {
    const set = this.leases.get(lease.desktopId);
    if (set?.delete(lease) && set.size === 0) this.leases.delete(lease.desktopId);
  }

  /** The desktop stopped: its unused tickets die and its leases end. */
  release(desktopId: string): void {
    for (const ticket of [...this.tickets.values()]) {
      if (ticket.desktopId === desktopId) this.bury(ticket.hash, 'not_running');
    }
    this.leases.delete(desktopId);
  }

  clear(): void {
    for (const ticket of this.tickets.values()) clearTimeout(ticket.timer);
    this.tickets.clear();
    this.tombstones.clear();
    this.leases.clear();
  }

  private count(desktopId: string): number {
    let n = this.leases.get(desktopId)?.size ?? 0;
    const now = Date.now();
    for (const ticket of this.tickets.values()) if (ticket.desktopId === desktopId && now < ticket.expiresAt) n++;
    return n;
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

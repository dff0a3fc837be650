/**
 * The stream gateway's book of view and control tickets (docs/api.md §4.6), on the single-use
 * ticket store (single-use-tickets.ts): a ticket is `stk_…`, its grant a desktop and a claim.
 *
 * Claims: a `control` claim is held from its grant by the unused ticket, then by the lease, and
 * only one per desktop at a time; the desktop's exec and file operations ask `controlHeld`. View
 * claims (unused tickets and leases together) are capped per desktop.
 */
import type { StreamClaim } from '../../../shared/src/computer-use.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { SingleUseTickets } from './single-use-tickets.js';

/** View claims (tickets and connections) one desktop may have at once. */
export const MAX_VIEW_CLAIMS = 8;

/** A redeemed ticket: the claim of one connection. */
export interface Lease {
  readonly desktopId: string;
  readonly claim: StreamClaim;
  /** The desktop's generation when the ticket was granted; a session opens only at that one. */
  readonly generation?: number;
}

/** Refuses a claim the desktop may not have now (`control_claimed`, `too_large`). */
function admit(grant: Lease, held: readonly Lease[]): void {
  if (grant.claim === 'control' && held.some((lease) => lease.claim === 'control')) {
    throw new AgentFailure('control_claimed', 'another client holds the control claim', false);
  }
  if (grant.claim === 'view' && held.filter((lease) => lease.claim === 'view').length >= MAX_VIEW_CLAIMS) {
    throw new AgentFailure('too_large', `a desktop has at most ${MAX_VIEW_CLAIMS} view sessions at once`, false);
  }
}

export class TicketBook extends SingleUseTickets<Lease> {
  constructor(ttlMs: number) {
    super({ prefix: 'stk', ttlMs, admit });
  }

  controlHeld(desktopId: string): boolean {
    return this.held(desktopId).some((lease) => lease.claim === 'control');
  }
}

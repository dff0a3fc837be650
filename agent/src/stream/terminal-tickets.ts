/**
 * The stream gateway's book of terminal tickets, on the single-use ticket store
 * (single-use-tickets.ts): a ticket is `ttk_…`, bound to the desktop and the generation the
 * scheduler named, and to the terminal's size and program.
 *
 * Unused tickets and open terminals together are capped per desktop, so a client cannot pile up
 * programs inside a desktop (each holds a pty and its processes) by asking for tickets.
 */
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { TerminalSpec } from '../runtime/driver.js';
import { SingleUseTickets } from './single-use-tickets.js';

/** Terminals (unused tickets and open sessions) one desktop may have at once. */
export const MAX_TERMINALS = 8;

/** A redeemed terminal ticket: the terminal one connection opens. */
export interface TerminalLease {
  readonly desktopId: string;
  readonly generation: number;
  readonly spec: TerminalSpec;
}

export class TerminalTicketBook extends SingleUseTickets<TerminalLease> {
  constructor(ttlMs: number) {
    super({
      prefix: 'ttk',
      ttlMs,
      admit: (_grant, held) => {
        if (held.length >= MAX_TERMINALS) {
          throw new AgentFailure('too_large', `a desktop has at most ${MAX_TERMINALS} terminals at once`, false);
        }
      },
    });
  }
}

/**
 * The terminal ticket book on the single-use ticket store, without sockets: the per-desktop cap
 * counts unused tickets and open terminals together, a ticket is good once, and a dead ticket
 * says why it is refused. (The stream book's claims are covered through the gateway, in
 * stream-gateway.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import { AgentFailure } from '../../shared/src/protocol.js';
import { MAX_TERMINALS, TerminalTicketBook } from '../../agent/src/stream/terminal-tickets.js';
import { until } from '../helpers/wait.js';

const SPEC = { cols: 80, rows: 24, command: null };

function grant(desktopId = 'dsk_a', generation = 1) {
  return { desktopId, generation, spec: SPEC };
}

describe('terminal tickets', () => {
  it('are good once, and carry the generation and spec they were issued with', () => {
    const book = new TerminalTicketBook(60_000);
    const { ticket } = book.issue(grant('dsk_a', 7));
    expect(ticket).toMatch(/^ttk_[A-Za-z0-9_-]{43}$/);
    expect(book.redeem(ticket)).toEqual({ desktopId: 'dsk_a', generation: 7, spec: SPEC });
    expect(book.redeem(ticket)).toBe('invalid_ticket');
    expect(book.redeem(ticket.replace('ttk_', 'stk_'))).toBe('invalid_ticket');
    book.clear();
  });

  it('cap unused tickets and open terminals together, per desktop, and free a place when one ends', () => {
    const book = new TerminalTicketBook(60_000);
    const tickets = Array.from({ length: MAX_TERMINALS }, () => book.issue(grant()).ticket);
    const lease = book.redeem(tickets[0]!);
    if (typeof lease === 'string') throw new Error(lease);
    const refusal = (() => {
      try {
        book.issue(grant());
      } catch (err) {
        return err;
      }
      return null;
    })();
    expect(refusal).toBeInstanceOf(AgentFailure);
    expect((refusal as AgentFailure).code).toBe('too_large');
    expect(() => book.issue(grant('dsk_b'))).not.toThrow();
    book.end(lease);
    book.end(lease);
    expect(() => book.issue(grant())).not.toThrow();
    book.clear();
  });

  it('answer a released desktop\'s unused ticket with not_running, an expired one with expired_ticket', async () => {
    const book = new TerminalTicketBook(60_000);
    const released = book.issue(grant()).ticket;
    book.release('dsk_a');
    expect(book.redeem(released)).toBe('not_running');
    expect(book.held('dsk_a')).toEqual([]);

    const short = new TerminalTicketBook(30);
    const { ticket, expiresAt } = short.issue(grant());
    await until(() => Date.now() > expiresAt + 5, 5_000, 'the ticket to expire');
    expect(short.redeem(ticket)).toBe('expired_ticket');
    expect(short.held('dsk_a')).toEqual([]);
    book.clear();
    short.clear();
  });
});

/**
 * Terminals (docs/api.md §4.6): a single-use ticket for a WebSocket carrying a pty inside an awake
 * desktop. Like a stream ticket it is only a promise to the agent's stream gateway: the terminal's
 * bytes never pass through the scheduler. The WebSocket protocol is in
 * shared/src/terminal-protocol.ts and is repeated in the route's description for API users.
 */
import { Type } from '@sinclair/typebox';
import { TERMINAL_SIZE, WS_CLOSE } from '../../../../shared/src/terminal-protocol.js';
import type { App, AppDeps } from '../route-types.js';
import { errorResponses } from '../error-responses.js';
import { DesktopIdParams } from '../../api/schemas.js';
import { TerminalBody, TerminalTicketResponse } from '../../api/guest-schemas.js';

/** Per desktop, unused tickets and open terminals together (agent/src/stream/terminal-tickets.ts). */
const MAX_TERMINALS = 8;

const closeCodes = Object.entries(WS_CLOSE).map(([name, code]) => `${code} ${name}`).join(', ');

export function registerTerminalRoutes(app: App, deps: AppDeps): void {
  app.post(
    '/v1/desktops/:id/terminals',
    {
      schema: {
        summary: 'Get a single-use ticket for a terminal (a pty) inside an awake desktop',
        description:
          'Open the returned `ws://` URL as a WebSocket within 60 s; the ticket works once. The terminal runs the guest\'s ' +
          `login shell (or \`command\` with \`/bin/sh -c\`) as root inside the desktop with /root/.canto/env applied, TERM=xterm-256color, ` +
          `at \`cols\` x \`rows\` (default ${TERMINAL_SIZE.defaultCols}x${TERMINAL_SIZE.defaultRows}). ` +
          'Binary frames carry the terminal\'s bytes both ways. Text frames carry JSON control messages: send ' +
          '`{"type":"resize","cols":C,"rows":R}`; once the program exits and its output was sent you get ' +
          '`{"type":"exit","exit_code":N}` (128 + n for a signal) and a close with code 1000. Closing the socket ends the ' +
          'terminal and kills everything started in it that still holds it. Hibernate, destroy and moves close it with 1001. ' +
          `A refused ticket completes the upgrade and closes with a code and reason: ${closeCodes}. ` +
          `A desktop has at most ${MAX_TERMINALS} terminals (open or granted) at once: one more is 409. ` +
          'An open terminal does not keep the desktop awake: the idle timeout counts from the last wake. ' +
          'Terminals are not refused while a stream client holds the control claim.',
        params: DesktopIdParams,
        body: TerminalBody,
        response: { 201: Type.Ref(TerminalTicketResponse), ...errorResponses(400, 404, 409, 501, 504) },
      },
    },
    async (request, reply) => {
      const body = request.body;
      const ticket = await deps.guest.terminalTicket(request.orgId, request.params.id, {
        cols: body.cols ?? TERMINAL_SIZE.defaultCols,
        rows: body.rows ?? TERMINAL_SIZE.defaultRows,
        command: body.command ?? null,
      });
      return reply.code(201).send(ticket);
    },
  );
}

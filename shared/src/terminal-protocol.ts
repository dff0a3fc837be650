/**
 * The WebSocket forms of the stream gateway (agent/src/stream/gateway.ts), as clients see them.
 *
 * Terminal (`/terminal?ticket=ttk_…`): binary frames carry the terminal's bytes both ways; text
 * frames carry JSON control messages. In: `{"type":"resize","cols":C,"rows":R}`. Out, once the
 * program has exited and all its output was sent: `{"type":"exit","exit_code":N}` (128 + n for a
 * signal), then a close with code 1000. Closing the socket ends the terminal and kills what runs
 * in it.
 *
 * Screen (`/vnc?ticket=stk_…`, subprotocol `binary` as noVNC offers it): RFB in binary frames
 * both ways, exactly what the raw TCP form relays after its ticket line.
 *
 * A refused ticket or a desktop that cannot serve the session still completes the upgrade, then
 * closes with one of `WS_CLOSE`'s 4xxx codes and the reason's name as the close reason: a browser
 * sees neither the status nor the body of a refused upgrade, but it sees a close code.
 */
import { Type, type Static } from '@sinclair/typebox';

export const TERMINAL_SIZE = { minCols: 2, maxCols: 1000, minRows: 1, maxRows: 500, defaultCols: 80, defaultRows: 24 } as const;

/** The control message a terminal client sends in a text frame. */
export const TerminalResize = Type.Object(
  {
    type: Type.Literal('resize'),
    cols: Type.Integer({ minimum: TERMINAL_SIZE.minCols, maximum: TERMINAL_SIZE.maxCols }),
    rows: Type.Integer({ minimum: TERMINAL_SIZE.minRows, maximum: TERMINAL_SIZE.maxRows }),
  },
  { additionalProperties: false },
);
export type TerminalResize = Static<typeof TerminalResize>;

/** The last text frame of a terminal whose program exited. */
export interface TerminalExit {
  readonly type: 'exit';
  readonly exit_code: number;
}

/** Close codes of the gateway's WebSockets. */
export const WS_CLOSE = {
  /** The terminal's program exited (after the exit frame), or the VNC server ended. */
  done: 1000,
  /** The desktop stopped (hibernate, destroy, move) or the agent is shutting down. */
  going_away: 1001,
  /** A text frame that is not a valid control message. */
  bad_frame: 1008,
  invalid_ticket: 4401,
  not_running: 4409,
  expired_ticket: 4410,
  /** The session could not be started (for a terminal: the host cannot make terminals). */
  unavailable: 4503,
} as const;
export type WsCloseReason = keyof typeof WS_CLOSE;

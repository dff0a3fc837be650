/**
 * A terminal in the desktop: xterm.js over a terminal ticket's WebSocket (docs/api.md, terminals;
 * shared/src/terminal-protocol.ts). Binary frames carry the terminal's bytes both ways; the one
 * text frame in is `{"type":"resize"}`, sent whenever the fit addon changes the size to fill the
 * tab, and the one text frame out is `{"type":"exit","exit_code"}` once the shell has exited.
 * Leaving the tab closes the socket, which ends the terminal and what runs in it; a terminal does
 * not keep the desktop awake.
 */
import { Terminal } from '../../vendor/xterm/lib/xterm.mjs';
import { FitAddon } from '../../vendor/xterm-addon-fit/lib/addon-fit.mjs';
import { call, desktopPath } from '../api.js';
import { withAdoptedStyles } from '../adopted-styles.js';
import { fill, h } from '../dom.js';

/** What a close code of the gateway (WS_CLOSE) means to the person at the terminal. */
const CLOSED = {
  1001: 'The desktop stopped (hibernated, destroyed or moved); the terminal ended.',
  1008: 'The terminal refused a message from this page.',
  4401: 'The terminal ticket was refused.',
  4409: 'The desktop is not running any more.',
  4410: 'The terminal ticket expired before it was used.',
  4503: 'This desktop’s host cannot open terminals.',
};

/** The background matches `.terminal` in console.css, so the box's padding blends in. */
const THEME = { background: '#101418', foreground: '#e8e8e8' };

export const terminalTab = {
  id: 'terminal',
  title: 'Terminal',
  mount(el, { desktop }) {
    if (desktop.state !== 'awake') {
      fill(el, h('p', { class: 'muted', id: 'terminal-asleep' }, `A terminal can be opened while the desktop is awake; it is ${desktop.state}. Wake it from the desktop list.`));
      return () => {};
    }
    const status = h('p', { id: 'terminal-status', 'data-state': 'connecting' }, 'Opening a terminal…');
    const again = h('button', { type: 'button', id: 'terminal-again', hidden: true, onclick: () => start() }, 'Open a new terminal');
    const box = h('div', { id: 'terminal', class: 'terminal' });
    fill(el, h('div', { class: 'toolbar' }, status, again), box);

    const term = new Terminal({ fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace', fontSize: 14, scrollback: 2000, theme: THEME });
    const fit = new FitAddon();
    term.loadAddon(fit);
    withAdoptedStyles(document, () => term.open(box));
    const encoder = new TextEncoder();
    let ws = null;
    let gone = false;

    const show = (state, text) => {
      status.dataset.state = state;
      status.textContent = text;
      again.hidden = state !== 'exited' && state !== 'closed';
    };

    const send = (bytes) => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(bytes);
    };
    term.onData((data) => send(encoder.encode(data)));
    // Bytes that are not UTF-8 text (some mouse reports) arrive as a binary string.
    term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
    term.onResize(({ cols, rows }) => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }));
      box.dataset.cols = String(cols);
      box.dataset.rows = String(rows);
    });
    const resized = new ResizeObserver(() => fit.fit());
    resized.observe(box);

    const start = async () => {
      ws?.close(1000);
      ws = null;
      delete status.dataset.exitCode;
      term.reset();
      fit.fit();
      box.dataset.cols = String(term.cols);
      box.dataset.rows = String(term.rows);
      show('connecting', 'Opening a terminal…');
      let ticket;
      try {
        ticket = await call('POST', desktopPath(desktop.id, '/terminals'), { json: { cols: term.cols, rows: term.rows } });
      } catch (err) {
        show('closed', `Could not open a terminal: ${err.message}`);
        return;
      }
      if (gone) return;
      const socket = new WebSocket(ticket.url);
      socket.binaryType = 'arraybuffer';
      let exitCode = null;
      socket.addEventListener('open', () => {
        if (ws !== socket) return;
        show('open', 'Connected: a shell in the desktop.');
        // The size may have changed while the ticket was on its way.
        if (term.cols !== ticket.cols || term.rows !== ticket.rows) socket.send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
        term.focus();
      });
      socket.addEventListener('message', (event) => {
        if (typeof event.data !== 'string') {
          term.write(new Uint8Array(event.data));
          return;
        }
        const message = JSON.parse(event.data);
        if (message.type === 'exit') exitCode = message.exit_code;
      });
      socket.addEventListener('close', (event) => {
        if (ws !== socket || gone) return;
        ws = null;
        if (exitCode !== null) {
          status.dataset.exitCode = String(exitCode);
          show('exited', `The shell exited with status ${exitCode}.`);
        } else {
          show('closed', CLOSED[event.code] ?? `The terminal closed (${event.code}${event.reason ? ` ${event.reason}` : ''}).`);
        }
      });
      ws = socket;
    };

    void start();
    return () => {
      gone = true;
      resized.disconnect();
      ws?.close(1000);
      ws = null;
      term.dispose();
    };
  },
};

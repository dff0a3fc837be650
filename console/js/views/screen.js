/**
 * The live screen: noVNC connected to the desktop's screen stream over a WebSocket (the stream
 * ticket's `ws_url`, RFB in binary frames). It opens view-only: the ticket's `view` claim, which
 * the desktop's VNC server enforces, and noVNC sends no input. "Take control" asks for the
 * `control` claim, a new single-use ticket, and reconnects with it; only then do the keyboard and
 * mouse reach the desktop. One client holds control at a time, and while it is held the desktop's
 * exec and file routes answer 409, so "Give back control" returns to a view ticket, and leaving the
 * tab closes the connection, which frees the claim.
 */
import RFB from '../../vendor/novnc/core/rfb.js';
import { call, desktopPath } from '../api.js';
import { fill, h } from '../dom.js';

const SAYS = {
  connecting: 'Connecting…',
  view: 'Watching (view only). Take control to type and click in the desktop.',
  control: 'You have control: keyboard and mouse go to the desktop. Exec and file calls answer 409 until you give it back.',
  disconnected: 'Disconnected.',
};

export const screenTab = {
  id: 'screen',
  title: 'Live screen',
  mount(el, { desktop }) {
    if (desktop.state !== 'awake') {
      fill(el, h('p', { class: 'muted', id: 'screen-asleep' }, `The screen can be watched while the desktop is awake; it is ${desktop.state}. Wake it from the desktop list.`));
      return () => {};
    }
    const status = h('p', { id: 'screen-status', 'data-state': 'connecting' }, SAYS.connecting);
    const message = h('p', { id: 'screen-message', role: 'alert' });
    const take = h('button', { type: 'button', id: 'take-control', class: 'primary', hidden: true, onclick: () => switchTo('control') }, 'Take control');
    const giveBack = h('button', { type: 'button', id: 'release-control', hidden: true, onclick: () => switchTo('view') }, 'Give back control');
    const reconnect = h('button', { type: 'button', id: 'screen-reconnect', hidden: true, onclick: () => switchTo('view') }, 'Reconnect');
    const screen = h('div', { id: 'screen', class: 'screen' });
    let rfb = null;
    let gone = false;
    let busy = false;

    const show = (state, claim) => {
      status.dataset.state = state;
      status.textContent = SAYS[state];
      take.hidden = state !== 'view';
      giveBack.hidden = state !== 'control';
      reconnect.hidden = state !== 'disconnected';
      screen.dataset.claim = claim ?? '';
    };

    const say = (text, kind = '') => {
      message.className = kind;
      message.textContent = text;
    };

    /** Drops the current connection without reporting it: a deliberate switch or leaving the tab. */
    const drop = () => {
      const old = rfb;
      rfb = null;
      if (old !== null) old.disconnect();
    };

    const connect = (url, claim) => {
      const client = new RFB(screen, url, { wsProtocols: ['binary'], shared: true });
      client.viewOnly = claim === 'view';
      // The desktop is drawn to fit the tab, not the tab resized to the desktop.
      client.scaleViewport = true;
      client.resizeSession = false;
      client.addEventListener('connect', () => {
        if (rfb !== client) return;
        show(claim, claim);
        if (claim === 'control') client.focus();
      });
      client.addEventListener('disconnect', (event) => {
        if (rfb !== client) return;
        rfb = null;
        show('disconnected');
        if (!event.detail.clean) say('The screen stream ended unexpectedly (the desktop may have stopped, or the ticket was refused).', 'error');
      });
      client.addEventListener('securityfailure', (event) => say(`The desktop refused the stream: ${event.detail.reason ?? event.detail.status}`, 'error'));
      rfb = client;
    };

    /** Gets a ticket for `claim` first, so a refused control claim leaves the view as it was. */
    const switchTo = async (claim) => {
      if (busy) return;
      busy = true;
      try {
        const ticket = await call('POST', desktopPath(desktop.id, '/stream'), { json: { claim } });
        if (gone) return;
        if (!ticket.ws_url) {
          say('This desktop’s host is too old to stream its screen to a browser.', 'error');
          return;
        }
        drop();
        say('');
        show('connecting', claim);
        connect(ticket.ws_url, claim);
      } catch (err) {
        say(err.status === 409 && claim === 'control' ? 'Someone else holds control of this desktop.' : `Could not open the screen: ${err.message}`, 'error');
        if (rfb === null && !gone) show('disconnected');
      } finally {
        busy = false;
      }
    };

    fill(el, h('div', { class: 'toolbar' }, status, take, giveBack, reconnect), message, screen);
    void switchTo('view');
    return () => {
      gone = true;
      drop();
    };
  },
};

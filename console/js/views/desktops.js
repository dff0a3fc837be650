/**
 * The desktop list: live state (polled every two seconds), create, and the lifecycle actions
 * each state accepts (docs/decisions.md "Desktop states that accept each transition"), with a
 * screenshot thumbnail per awake desktop. The table is redrawn only when something in it changed,
 * so a button is never replaced under the pointer by an identical one.
 */
import { call, desktopPath } from '../api.js';
import { every, fill, h } from '../dom.js';
import { runOperation, showOperationsIn } from './operations.js';
import { thumbnailFor, dropThumbnailsExcept } from './thumbnails.js';

const POLL_MS = 2000;

/** The actions offered in each state; fork and destroy ask for a second click. */
const ACTIONS = {
  provisioning: ['wake', 'destroy'],
  hibernated: ['wake', 'fork', 'destroy'],
  awake: ['hibernate', 'destroy'],
  waking: [],
  hibernating: [],
};

const CONFIRM = { fork: 'Confirm fork (shares its state and secrets)', destroy: 'Confirm destroy (deletes its disk)' };
/** A fork makes 1 to 20 copies in one operation (docs/api.md §4.1). */
const FORK_COUNT = { min: 1, max: 20 };
const bodyOf = (action, forkCount) => (action === 'fork' ? { count: forkCount, acknowledge_shared_state: true } : undefined);

export const desktopsView = {
  mount(el) {
    const table = h('div', { id: 'desktops' }, h('p', { class: 'muted' }, 'Loading desktops…'));
    const message = h('p', { class: 'error', id: 'desktops-error', role: 'alert' });
    const ops = h('div');
    const tier = h('select', { id: 'new-tier', name: 'tier' }, ['small', 'default', 'large'].map((t) => h('option', { value: t }, t)));
    const create = h('button', { type: 'submit', class: 'primary', id: 'create-desktop' }, 'Create desktop');
    const form = h('form', { class: 'inline', id: 'create-form' }, h('label', { for: 'new-tier' }, 'Tier'), tier, create);
    let desktops = null;
    let drawn = '';
    const confirming = new Map();
    // Copies asked for per desktop, kept across redraws of the row while the fork is confirmed.
    const forkCounts = new Map();

    const refresh = async () => {
      const answer = await call('GET', '/desktops');
      desktops = answer.desktops.filter((d) => d.state !== 'destroyed');
      message.textContent = '';
      draw();
      // Refreshes stale thumbnails in place (the same <img> stays in the table).
      for (const d of desktops) if (d.state === 'awake') thumbnailFor(d.id);
    };

    const act = (desktop, action) => {
      if (CONFIRM[action] && confirming.get(desktop.id) !== action) {
        confirming.set(desktop.id, action);
        draw(true);
        return;
      }
      confirming.delete(desktop.id);
      const count = forkCounts.get(desktop.id) ?? 1;
      forkCounts.delete(desktop.id);
      void runOperation(desktop.id, action, bodyOf(action, count), () => void refresh().catch(() => {}));
      // The state changes at once (waking, hibernating): show it without waiting for the poll.
      setTimeout(() => void refresh().catch(() => {}), 300);
    };

    const row = (d) => {
      const pending = confirming.get(d.id);
      const actions = (ACTIONS[d.state] ?? []).map((action) =>
        h('button', { type: 'button', 'data-action': action, class: action === 'destroy' ? 'danger' : '', onclick: () => act(d, action) }, pending === action ? CONFIRM[action] : action[0].toUpperCase() + action.slice(1)),
      );
      if (pending === 'fork') {
        const count = h('input', { type: 'number', class: 'count', min: FORK_COUNT.min, max: FORK_COUNT.max, value: forkCounts.get(d.id) ?? 1, 'data-fork-count': d.id, 'aria-label': 'Copies' });
        count.addEventListener('input', () => {
          const n = Math.trunc(Number(count.value));
          if (n >= FORK_COUNT.min && n <= FORK_COUNT.max) forkCounts.set(d.id, n);
        });
        actions.unshift(h('label', { class: 'muted' }, 'Copies ', count));
      }
      return h(
        'tr',
        { 'data-desktop': d.id, 'data-state': d.state },
        h('td', {}, d.state === 'awake' ? thumbnailFor(d.id) : h('div', { class: 'thumb-empty' }, 'not awake')),
        h('td', {}, h('a', { href: `#/desktops/${encodeURIComponent(d.id)}/files`, class: 'path' }, d.id), h('div', { class: 'muted' }, `${d.tier}, ${d.billing_mode}`)),
        h('td', {}, h('span', { class: `state state-${d.state}` }, d.state), d.host_status === 'down' ? h('div', { class: 'error' }, 'host unreachable') : null),
        h('td', { class: 'actions' }, actions),
      );
    };

    const draw = (force = false) => {
      if (desktops === null) return;
      const signature = JSON.stringify([desktops.map((d) => [d.id, d.state, d.host_status]), [...confirming]]);
      if (!force && signature === drawn) return;
      drawn = signature;
      dropThumbnailsExcept(desktops.filter((d) => d.state === 'awake').map((d) => d.id));
      if (desktops.length === 0) {
        fill(
          table,
          h('p', { id: 'first-desktop' }, 'No desktops yet. Create your first desktop: pick a tier above and press ', h('strong', {}, 'Create desktop'), ', then ', h('strong', {}, 'Wake'), ' it.'),
        );
        return;
      }
      fill(
        table,
        h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'Screen'), h('th', {}, 'Desktop'), h('th', {}, 'State'), h('th', {}, 'Actions'))), h('tbody', {}, desktops.map(row))),
      );
    };

    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      create.disabled = true;
      try {
        const created = await call('POST', '/desktops', { json: { tier: tier.value } });
        message.textContent = '';
        desktops = [...(desktops ?? []).filter((d) => d.id !== created.id), created];
        draw();
      } catch (err) {
        message.textContent = `Could not create a desktop: ${err.message}`;
      } finally {
        create.disabled = false;
      }
    });

    fill(
      el,
      h('section', { class: 'card' }, h('h1', {}, 'Desktops'), form, message),
      h('section', { class: 'card' }, table),
      h('section', { class: 'card' }, h('h2', {}, 'Operations'), ops),
    );
    showOperationsIn(ops);
    const stop = every(POLL_MS, async () => {
      try {
        await refresh();
      } catch (err) {
        message.textContent = `Could not list desktops: ${err.message}`;
      }
    });
    return () => {
      stop();
      showOperationsIn(null);
    };
  },
};

/** A desktop of the caller's org, or null when there is none by that id (another org's included). */
export async function findDesktop(id) {
  try {
    return await call('GET', desktopPath(id));
  } catch (err) {
    if (err.status === 404 || err.status === 400) return null;
    throw err;
  }
}

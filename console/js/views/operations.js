/**
 * Operation progress: every lifecycle action the console starts (wake, hibernate, fork, destroy)
 * is a durable operation that answers 202 and settles later. Each one gets a line here that
 * follows it through pending → running → succeeded or failed, with the time it took. The list
 * outlives view changes, so progress started on one screen is still visible on the next.
 */
import { call, followOperation } from '../api.js';
import { fill, h } from '../dom.js';

const lines = [];
const MAX_LINES = 8;
let target = null;

/** Where the list draws itself; null detaches it. */
export function showOperationsIn(el) {
  target = el;
  draw();
}

function draw() {
  if (!target) return;
  if (lines.length === 0) {
    fill(target, h('p', { class: 'muted' }, 'No operations yet in this tab.'));
    return;
  }
  fill(
    target,
    h(
      'ul',
      { class: 'ops', id: 'operations' },
      lines.map((line) =>
        h(
          'li',
          { 'data-operation': line.id ?? '', 'data-kind': line.kind, 'data-desktop': line.desktopId, 'data-state': line.state },
          h('strong', {}, line.kind),
          h('span', { class: 'path' }, line.desktopId),
          line.state === 'pending' || line.state === 'running' ? h('progress', { title: line.state }) : null,
          h('span', { class: `op-state ${line.state === 'failed' ? 'error' : line.state === 'succeeded' ? 'ok' : ''}` }, line.state),
          h('span', { class: 'muted' }, line.detail ?? ''),
        ),
      ),
    ),
  );
}

/**
 * Starts a lifecycle operation (`POST /desktops/{id}/{kind}`) and follows it. `onSettled` runs
 * with the settled operation (to refresh a list). Errors refusing the request appear on its line.
 */
export async function runOperation(desktopId, kind, body, onSettled = () => {}) {
  const line = { id: null, kind, desktopId, state: 'requested', detail: '' };
  lines.unshift(line);
  lines.length = Math.min(lines.length, MAX_LINES);
  draw();
  const started = Date.now();
  try {
    const op = await call('POST', `/desktops/${encodeURIComponent(desktopId)}/${kind}`, { json: body ?? {} });
    line.id = op.id;
    const settled = await followOperation(op, (next) => {
      line.state = next.state;
      line.detail = next.state === 'running' ? 'in progress…' : '';
      draw();
    });
    const seconds = ((Date.now() - started) / 1000).toFixed(1);
    line.detail = settled.state === 'failed' ? (settled.error?.message ?? 'failed') : `in ${seconds} s`;
    if (kind === 'fork' && settled.result?.desktop_ids) line.detail += `: ${settled.result.desktop_ids.join(', ')}`;
    draw();
    onSettled(settled);
    return settled;
  } catch (err) {
    line.state = 'failed';
    line.detail = err.message;
    draw();
    onSettled(null);
    return null;
  }
}

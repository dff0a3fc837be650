/**
 * Usage and projected cost for the org this month (`GET /usage`): a table per desktop and a bar
 * chart of each desktop's projected cost. The chart is SVG built element by element, with sizes as
 * attributes: nothing needs an inline style, which the page's policy forbids.
 */
import { call } from '../api.js';
import { every, fill, formatCents, h } from '../dom.js';

const CHART_WIDTH = 640;
const BAR_HEIGHT = 20;
const LABEL_WIDTH = 230;

function hours(seconds) {
  return `${(seconds / 3600).toFixed(2)} h`;
}

function chart(rows) {
  const max = Math.max(1, ...rows.map((r) => r.projected_cost_cents));
  const span = CHART_WIDTH - LABEL_WIDTH - 70;
  return h(
    'svg',
    { class: 'chart', id: 'usage-chart', width: CHART_WIDTH, height: rows.length * (BAR_HEIGHT + 6) + 6, viewBox: `0 0 ${CHART_WIDTH} ${rows.length * (BAR_HEIGHT + 6) + 6}`, role: 'img', 'aria-label': 'Projected cost per desktop' },
    rows.map((r, i) => {
      const y = 6 + i * (BAR_HEIGHT + 6);
      const width = Math.max(1, Math.round((r.projected_cost_cents / max) * span));
      return h(
        'g',
        { 'data-desktop': r.desktop_id },
        h('text', { x: 0, y: y + BAR_HEIGHT - 6 }, r.desktop_id),
        h('rect', { class: 'bar', x: LABEL_WIDTH, y, width, height: BAR_HEIGHT, rx: 2 }, h('title', {}, `${r.desktop_id}: ${formatCents(r.projected_cost_cents)}`)),
        h('text', { x: LABEL_WIDTH + width + 6, y: y + BAR_HEIGHT - 6 }, formatCents(r.projected_cost_cents)),
      );
    }),
  );
}

export const usageView = {
  mount(el) {
    const body = h('div', { id: 'usage' }, h('p', { class: 'muted' }, 'Loading usage…'));
    fill(el, h('section', { class: 'card' }, h('h1', {}, 'Usage and projected cost'), body));
    const stop = every(15_000, async () => {
      let usage;
      try {
        usage = await call('GET', '/usage');
      } catch (err) {
        fill(body, h('p', { class: 'error' }, `Could not read usage: ${err.message}`));
        return;
      }
      const rows = [...usage.per_desktop].sort((a, b) => b.projected_cost_cents - a.projected_cost_cents);
      fill(
        body,
        h('p', {}, 'Projected cost this month: ', h('strong', { id: 'usage-total' }, formatCents(usage.org_projected_cost_cents)), ` (${hours(usage.org_awake_seconds_weighted)} weighted awake time, ${usage.org_desktop_months.toFixed(2)} desktop-months).`),
        rows.length === 0 ? h('p', { class: 'muted' }, 'No usage yet: a desktop counts from its first wake.') : chart(rows),
        rows.length === 0
          ? null
          : h(
              'table',
              {},
              h('thead', {}, h('tr', {}, h('th', {}, 'Desktop'), h('th', {}, 'Billing'), h('th', {}, 'Awake'), h('th', {}, 'Desktop-months'), h('th', {}, 'Projected'))),
              h('tbody', {}, rows.map((r) => h('tr', { 'data-desktop': r.desktop_id }, h('td', { class: 'path' }, r.desktop_id), h('td', {}, r.billing_mode), h('td', {}, hours(r.awake_seconds)), h('td', {}, r.desktop_months.toFixed(3)), h('td', {}, formatCents(r.projected_cost_cents))))),
            ),
      );
    });
    return stop;
  },
};

/**
 * Port exposures of a desktop: each published port with its URL, whether it needs a token and
 * whether it reaches the desktop now; publish a port and stop publishing it. A private exposure's
 * token is shown once, when it is created, as the API gives it only then.
 */
import { call, desktopPath } from '../api.js';
import { fill, h } from '../dom.js';

export const portsTab = {
  id: 'ports',
  title: 'Ports',
  mount(el, { desktop }) {
    const list = h('div', { id: 'ports' }, h('p', { class: 'muted' }, 'Loading ports…'));
    const message = h('p', { role: 'alert' });
    const port = h('input', { type: 'number', min: 1, max: 65535, id: 'new-port', required: true, placeholder: '8000' });
    const isPublic = h('input', { type: 'checkbox', id: 'new-port-public' });
    const form = h(
      'form',
      { class: 'inline', id: 'port-form' },
      h('label', { for: 'new-port' }, 'Guest port'),
      port,
      h('label', {}, isPublic, ' public (no token)'),
      h('button', { type: 'submit', class: 'primary' }, 'Publish'),
    );

    const refresh = async () => {
      const { ports } = await call('GET', desktopPath(desktop.id, '/ports'));
      if (ports.length === 0) {
        fill(list, h('p', { class: 'muted' }, 'No ports published. Start a server in the desktop, then publish its port here.'));
        return;
      }
      fill(
        list,
        h(
          'table',
          {},
          h('thead', {}, h('tr', {}, h('th', {}, 'Port'), h('th', {}, 'URL'), h('th', {}, 'Access'), h('th', {}, 'Status'), h('th', {}))),
          h(
            'tbody',
            {},
            ports.map((p) =>
              h(
                'tr',
                { 'data-port': p.port },
                h('td', {}, String(p.port)),
                h('td', {}, h('a', { href: p.url, target: '_blank', rel: 'noopener noreferrer', class: 'path port-url' }, p.url)),
                h('td', {}, p.public ? 'public' : 'token'),
                h('td', {}, p.status === 'bound' ? 'reachable' : 'desktop not awake (503)'),
                h('td', {}, h('button', { type: 'button', class: 'danger', onclick: () => unpublish(p.port) }, 'Remove')),
              ),
            ),
          ),
        ),
      );
    };

    const show = async (task) => {
      try {
        await task();
      } catch (err) {
        message.className = 'error';
        message.textContent = err.status === 501 ? 'Port publishing is not enabled on this deployment (CANTO_INGRESS_BASE_URL).' : err.message;
      }
    };

    const unpublish = (number) =>
      show(async () => {
        await call('DELETE', desktopPath(desktop.id, `/ports/${number}`));
        message.textContent = '';
        await refresh();
      });

    form.addEventListener('submit', (event) => {
      event.preventDefault();
      void show(async () => {
        const created = await call('POST', desktopPath(desktop.id, '/ports'), { json: { port: Number(port.value), public: isPublic.checked } });
        message.className = '';
        fill(
          message,
          created.token
            ? h('span', { class: 'once' }, 'Published at ', h('code', {}, created.url), '. Its token, shown only now: ', h('code', {}, created.token), ' (send it as the X-Svc-Token header).')
            : h('span', {}, 'Published at ', h('code', {}, created.url), ' for anyone.'),
        );
        await refresh();
      });
    });

    fill(el, form, message, list);
    void show(refresh);
    return () => {};
  },
};

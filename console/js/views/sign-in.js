/**
 * The first screen: what to do next on a fresh install. `canto up` (what `npm start` runs) prints
 * an API key once, on its first start; the user pastes it here. The key is checked against the API
 * before it is kept, and it is kept in this tab's session storage only.
 */
import { call, rememberKey } from '../api.js';
import { fill, h } from '../dom.js';

export const signInView = {
  mount(el, { done }) {
    const input = h('input', { type: 'password', class: 'key', id: 'api-key', name: 'api-key', autocomplete: 'off', placeholder: 'svc_sk_…', required: true });
    const status = h('p', { class: 'error', id: 'sign-in-error', role: 'alert' });
    const submit = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
    const form = h('form', { class: 'inline', id: 'sign-in' }, h('label', { for: 'api-key' }, 'API key'), input, submit);
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      const key = input.value.trim();
      submit.disabled = true;
      status.textContent = '';
      try {
        await call('GET', '/desktops', { key });
        rememberKey(key);
        done();
      } catch (err) {
        status.textContent = err.status === 401 ? 'That key was not accepted: check it and try again.' : `Could not sign in: ${err.message}`;
      } finally {
        submit.disabled = false;
      }
    });
    fill(
      el,
      h(
        'section',
        { class: 'card', id: 'welcome' },
        h('h1', {}, 'Welcome to Canto'),
        h('p', {}, 'Sign in with an API key of your organization to manage its desktops.'),
        h(
          'ol',
          { class: 'steps' },
          h('li', {}, 'Find the key: the first ', h('code', {}, 'npm start'), ' (', h('code', {}, 'canto up'), ') printed it once, on the line starting ', h('code', {}, 'API key:'), '. Lost it? On the scheduler\'s machine run ', h('code', {}, 'canto keys create --org default'), '.'),
          h('li', {}, 'Paste it below and sign in. It stays in this browser tab only and is forgotten when the tab closes.'),
          h('li', {}, 'Then create your first desktop and wake it.'),
        ),
        form,
        status,
      ),
    );
    input.focus();
    return () => {};
  },
};

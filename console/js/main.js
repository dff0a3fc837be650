/**
 * The console's shell: signs in, then shows one view at a time, chosen by the URL's hash
 * (`#/desktops`, `#/desktops/{id}/{tab}`, `#/usage`). The hash never carries the key. A view is a
 * module with `mount(element, context)` that answers its unmount function; the shell unmounts the
 * current view (stopping its polling) before mounting the next.
 */
import { currentKey, forgetKey, whenUnauthorized } from './api.js';
import { signInView } from './views/sign-in.js';
import { desktopsView } from './views/desktops.js';
import { desktopView } from './views/desktop.js';
import { usageView } from './views/usage.js';

const app = document.getElementById('app');
const nav = document.getElementById('nav');
const signOut = document.getElementById('sign-out');
let unmount = null;

function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  unmount?.();
  unmount = null;
  const signedIn = currentKey() !== null;
  nav.hidden = !signedIn;
  signOut.hidden = !signedIn;
  if (!signedIn) {
    unmount = signInView.mount(app, { done: () => go('#/desktops') });
    return;
  }
  const [section, id, tab] = location.hash.replace(/^#\/?/, '').split('/').map((part) => decodeURIComponent(part));
  for (const link of nav.querySelectorAll('a')) link.classList.toggle('active', link.dataset.nav === (section || 'desktops'));
  if (section === 'usage') unmount = usageView.mount(app, { go });
  else if (section === 'desktops' && id) unmount = desktopView.mount(app, { go, id, tab });
  else unmount = desktopsView.mount(app, { go });
}

signOut.addEventListener('click', () => {
  forgetKey();
  go('#/');
});
whenUnauthorized(() => {
  forgetKey();
  route();
});
window.addEventListener('hashchange', route);
route();

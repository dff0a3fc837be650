/**
 * One desktop, with a tab per thing to do in it. The tabs are the modules listed in
 * desktop-tabs.js, each with `mount(element, { desktop })` answering its unmount function: the
 * live screen and the terminal join that list as two more modules. A desktop of another org is
 * answered as missing by the API, and shown here exactly as a desktop that does not exist.
 */
import { fill, h } from '../dom.js';
import { DESKTOP_TABS } from './desktop-tabs.js';
import { findDesktop } from './desktops.js';

export const desktopView = {
  mount(el, { id, tab }) {
    let unmountTab = null;
    let gone = false;
    const body = h('div', { id: 'desktop-tab' });
    fill(el, h('section', { class: 'card' }, h('p', { class: 'muted' }, 'Loading…')));
    void (async () => {
      let desktop;
      try {
        desktop = await findDesktop(id);
      } catch (err) {
        fill(el, h('section', { class: 'card' }, h('p', { class: 'error' }, `Could not load the desktop: ${err.message}`)));
        return;
      }
      if (gone) return;
      if (desktop === null || desktop.state === 'destroyed') {
        fill(el, h('section', { class: 'card', id: 'desktop-missing' }, h('h1', {}, 'No such desktop'), h('p', {}, 'There is no desktop by that id in your organization. ', h('a', { href: '#/desktops' }, 'Back to the desktops'))));
        return;
      }
      const current = DESKTOP_TABS.find((t) => t.id === tab) ?? DESKTOP_TABS[0];
      fill(
        el,
        h(
          'section',
          { class: 'card' },
          h('p', {}, h('a', { href: '#/desktops' }, '← Desktops')),
          h('h1', { class: 'path' }, desktop.id),
          h('p', { class: 'muted' }, `${desktop.tier} desktop, ${desktop.state}`),
          h('nav', { class: 'tabs' }, DESKTOP_TABS.map((t) => h('a', { href: `#/desktops/${encodeURIComponent(id)}/${t.id}`, class: t === current ? 'active' : '', 'data-tab': t.id }, t.title))),
          body,
        ),
      );
      unmountTab = current.mount(body, { desktop });
    })();
    return () => {
      gone = true;
      unmountTab?.();
    };
  },
};

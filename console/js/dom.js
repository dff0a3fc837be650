/**
 * Building DOM without HTML strings: every text the API returns (names, paths, errors) is set as
 * text, never parsed as markup, so nothing a desktop holds can inject script into the console.
 */

/** `h('button', { class: 'primary', onclick }, 'Create')`: attributes, `on*` listeners, children. */
export function h(tag, attrs = {}, ...children) {
  const svg = ['svg', 'rect', 'text', 'g', 'line', 'title'].includes(tag);
  const el = svg ? document.createElementNS('http://www.w3.org/2000/svg', tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on') && typeof value === 'function') el.addEventListener(name.slice(2), value);
    else if (name === 'hidden' || name === 'disabled' || name === 'checked' || name === 'required' || name === 'multiple') el[name] = Boolean(value);
    else if (name === 'value') el.value = value;
    else el.setAttribute(name, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Bytes as a short human size. */
export function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = -1;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

/** Cents as dollars. */
export function formatCents(cents) {
  return `$${(cents / 100).toFixed(2)}`;
}

/** Starts `task` now and every `ms` until the returned stop function is called; one run at a time. */
export function every(ms, task) {
  let stopped = false;
  let timer = null;
  const run = async () => {
    try {
      await task();
    } catch (err) {
      console.warn(err);
    }
    if (!stopped) timer = setTimeout(run, ms);
  };
  void run();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

/**
 * Run-time styles under a Content-Security-Policy without 'unsafe-inline'. xterm.js writes its
 * theme, its measured cell size and its scrollbar colours into `<style>` elements it creates while
 * a terminal opens; the policy refuses every such element (and reports each one as a violation),
 * and xterm has no nonce option. While `open` runs, `document.createElement('style')` answers a
 * stand-in element instead, whose text goes into a constructed stylesheet adopted by the
 * document: stylesheets built through the CSSOM are not inline content, so the policy stays as
 * strict as it is and the rules still apply. Removing the stand-in (xterm does on dispose) drops
 * its stylesheet.
 */

/** Runs `open()` with `<style>` elements it creates replaced by adopted stylesheets. */
export function withAdoptedStyles(doc, open) {
  const original = doc.createElement;
  doc.createElement = function createElement(tag, options) {
    if (String(tag).toLowerCase() === 'style') return adoptedStyle(doc, original);
    return original.call(this, tag, options);
  };
  try {
    return open();
  } finally {
    // The override is an own property of this document; removing it restores the prototype's.
    delete doc.createElement;
  }
}

function adoptedStyle(doc, createElement) {
  const sheet = new CSSStyleSheet();
  const stand = createElement.call(doc, 'canto-adopted-style');
  stand.hidden = true;
  let text = '';
  Object.defineProperty(stand, 'textContent', {
    configurable: true,
    get: () => text,
    set(value) {
      text = value === null || value === undefined ? '' : String(value);
      sheet.replaceSync(text);
    },
  });
  const remove = stand.remove.bind(stand);
  stand.remove = () => {
    doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => s !== sheet);
    remove();
  };
  doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
  return stand;
}

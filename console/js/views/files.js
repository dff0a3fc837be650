/**
 * A file browser for an awake desktop: list a folder, go into its folders, upload files into it
 * and download its files. Files move in windows of the API's chunk cap (8 MiB): an upload is a
 * write of the first window then appends at the known offset, a download reads windows until the
 * API says the end is reached, then hands the bytes to the browser as a blob: download.
 */
import { call, CHUNK_BYTES, desktopPath, guestUrlPath } from '../api.js';
import { fill, formatBytes, h } from '../dom.js';

function parentOf(path) {
  const parts = path.split('/').filter(Boolean);
  parts.pop();
  return `/${parts.join('/')}`;
}

function join(folder, name) {
  return folder === '/' ? `/${name}` : `${folder}/${name}`;
}

export const filesTab = {
  id: 'files',
  title: 'Files',
  mount(el, { desktop }) {
    if (desktop.state !== 'awake') {
      fill(el, h('p', { class: 'muted', id: 'files-asleep' }, `Files can be read and written while the desktop is awake; it is ${desktop.state}. Wake it from the desktop list.`));
      return () => {};
    }
    let folder = '/root';
    const where = h('input', { type: 'text', class: 'path', id: 'files-path', value: folder });
    const go = h('form', { class: 'inline' }, h('label', { for: 'files-path' }, 'Folder'), where, h('button', { type: 'submit' }, 'Open'), h('button', { type: 'button', onclick: () => open(parentOf(folder)) }, 'Up'));
    const upload = h('input', { type: 'file', id: 'upload', multiple: true });
    const message = h('p', { id: 'files-message', role: 'alert' });
    const list = h('div', { id: 'files' });

    const say = (text, kind = '') => {
      message.className = kind;
      message.textContent = text;
    };

    const open = async (path) => {
      try {
        const listing = await call('GET', desktopPath(desktop.id, `/dir/${guestUrlPath(path)}`));
        folder = path;
        where.value = path;
        draw(listing);
      } catch (err) {
        say(`Could not open ${path}: ${err.message}`, 'error');
      }
    };

    const draw = (listing) => {
      const entries = [...listing.entries].sort((a, b) => (a.fileType === 'directory') === (b.fileType === 'directory') ? a.name.localeCompare(b.name) : a.fileType === 'directory' ? -1 : 1);
      if (entries.length === 0) {
        fill(list, h('p', { class: 'muted' }, 'This folder is empty.'));
        return;
      }
      fill(
        list,
        h(
          'table',
          {},
          h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Size'), h('th', {}, 'Modified'), h('th', {}))),
          h(
            'tbody',
            {},
            entries.map((entry) =>
              h(
                'tr',
                { 'data-name': entry.name },
                h('td', { class: 'path' }, entry.fileType === 'directory' ? h('a', { class: 'link-button', onclick: () => open(join(folder, entry.name)) }, `${entry.name}/`) : entry.name),
                h('td', {}, entry.fileType === 'file' ? formatBytes(entry.sizeBytes) : ''),
                h('td', { class: 'muted' }, new Date(entry.modifiedAt).toLocaleString()),
                h('td', {}, entry.fileType === 'file' ? h('button', { type: 'button', 'data-download': entry.name, onclick: () => download(entry.name) }, 'Download') : null),
              ),
            ),
          ),
          listing.truncated ? h('p', { class: 'muted' }, 'Only the first entries are shown.') : null,
        ),
      );
    };

    const download = async (name) => {
      const path = join(folder, name);
      say(`Downloading ${name}…`);
      try {
        const parts = [];
        for (let offset = 0; ; ) {
          const res = await call('GET', desktopPath(desktop.id, `/files/${guestUrlPath(path)}?offset=${offset}&length=${CHUNK_BYTES}`), { raw: true });
          const part = await res.arrayBuffer();
          parts.push(part);
          offset += part.byteLength;
          if (res.headers.get('x-svc-eof') !== 'false' || part.byteLength === 0) break;
        }
        const url = URL.createObjectURL(new Blob(parts, { type: 'application/octet-stream' }));
        const link = h('a', { href: url, download: name, hidden: true });
        document.body.append(link);
        link.click();
        link.remove();
        // The browser has taken the bytes once the click is handled; free them a little later.
        setTimeout(() => URL.revokeObjectURL(url), 60_000);
        say(`Downloaded ${name}.`, 'ok');
      } catch (err) {
        say(`Could not download ${name}: ${err.message}`, 'error');
      }
    };

    const send = async (file) => {
      const path = guestUrlPath(join(folder, file.name));
      for (let offset = 0; offset === 0 || offset < file.size; offset += CHUNK_BYTES) {
        const chunk = file.slice(offset, offset + CHUNK_BYTES);
        const query = offset === 0 ? '' : `?append=true&offset=${offset}`;
        await call('PUT', desktopPath(desktop.id, `/files/${path}${query}`), { body: chunk });
      }
    };

    upload.addEventListener('change', async () => {
      const files = [...upload.files];
      upload.value = '';
      for (const file of files) {
        say(`Uploading ${file.name} (${formatBytes(file.size)})…`);
        try {
          await send(file);
          say(`Uploaded ${file.name}.`, 'ok');
        } catch (err) {
          say(`Could not upload ${file.name}: ${err.message}`, 'error');
          break;
        }
      }
      await open(folder);
    });

    go.addEventListener('submit', (event) => {
      event.preventDefault();
      void open(where.value.trim() || '/');
    });

    fill(el, go, h('p', {}, h('label', { for: 'upload' }, 'Upload into this folder: '), upload), message, list);
    void open(folder);
    return () => {};
  },
};

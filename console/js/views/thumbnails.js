/**
 * Screenshot thumbnails of awake desktops: a quarter-scale PNG from `POST /desktops/{id}/screenshot`,
 * shown through a blob: URL (allowed by the page's img-src) and refreshed every ten seconds while
 * its desktop stays awake. Each desktop keeps one <img>, so a redrawn list does not flicker.
 */
import { call, desktopPath } from '../api.js';
import { h } from '../dom.js';

const REFRESH_MS = 10_000;
const thumbs = new Map();

/** The <img> for an awake desktop, fetching a new screenshot when the last one is stale. */
export function thumbnailFor(id) {
  let thumb = thumbs.get(id);
  if (!thumb) {
    thumb = { img: h('img', { class: 'thumb', alt: `screen of ${id}`, 'data-thumbnail': id }), url: null, at: 0, loading: false };
    thumbs.set(id, thumb);
  }
  if (!thumb.loading && Date.now() - thumb.at > REFRESH_MS) void load(id, thumb);
  return thumb.img;
}

async function load(id, thumb) {
  thumb.loading = true;
  try {
    const res = await call('POST', desktopPath(id, '/screenshot'), { json: { scale_percent: 25 }, raw: true });
    const url = URL.createObjectURL(await res.blob());
    if (thumb.url) URL.revokeObjectURL(thumb.url);
    thumb.url = url;
    thumb.img.src = url;
    thumb.at = Date.now();
  } catch {
    // A desktop going to sleep refuses screenshots (409): keep the last picture, try again later.
    thumb.at = Date.now();
  } finally {
    thumb.loading = false;
  }
}

/** Forgets the thumbnails of desktops that are no longer awake, freeing their blobs. */
export function dropThumbnailsExcept(awakeIds) {
  for (const [id, thumb] of thumbs) {
    if (awakeIds.includes(id)) continue;
    if (thumb.url) URL.revokeObjectURL(thumb.url);
    thumbs.delete(id);
  }
}

/**
 * The console's API client: plain `fetch` to the `/v1` API of the origin that served the page,
 * with the API key in the Authorization header. The key lives in this tab's session storage only:
 * never in a URL (so never in history, logs or a Referer) and never in local storage (so it goes
 * when the tab closes). Errors arrive as problem+json and are thrown as ApiError with the detail.
 */

const KEY_ITEM = 'canto.apiKey';
/** The file chunk cap of the API (docs/api.md §4.4): uploads and downloads move in windows this big. */
export const CHUNK_BYTES = 8 * 1024 * 1024;

export function currentKey() {
  return sessionStorage.getItem(KEY_ITEM);
}

export function rememberKey(key) {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

export class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

/** Called when the API refuses the key (401): the console goes back to sign-in. */
let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

/**
 * One API call. `json` is sent as a JSON body, `body` as raw bytes; `raw` returns the Response
 * itself (for binary answers). Otherwise answers the parsed JSON, or null for an empty body.
 */
export async function call(method, path, { json, body, raw = false, key = currentKey() } = {}) {
  const headers = { authorization: `Bearer ${key ?? ''}` };
  if (json !== undefined) headers['content-type'] = 'application/json';
  const res = await fetch(`/v1${path}`, {
    method,
    headers,
    body: json !== undefined ? JSON.stringify(json) : body,
    credentials: 'omit',
    cache: 'no-store',
  });
  if (!res.ok) {
    let detail = `${res.status} ${res.statusText}`;
    try {
      const problem = await res.json();
      if (problem && typeof problem.detail === 'string') detail = problem.detail;
    } catch {
      // Not problem+json (a proxy's page): the status line says enough.
    }
    if (res.status === 401 && key === currentKey()) onUnauthorized();
    throw new ApiError(res.status, detail);
  }
  if (raw) return res;
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

/** `/desktops/{id}` with the id encoded. */
export function desktopPath(id, rest = '') {
  return `/desktops/${encodeURIComponent(id)}${rest}`;
}

/** A guest path (`/root/a b`) as the URL tail the file routes take (`root/a%20b`). */
export function guestUrlPath(path) {
  return path.split('/').filter(Boolean).map(encodeURIComponent).join('/');
}

/**
 * Follows an operation until it settles, calling `progress(op)` on every change of state.
 * Answers the settled operation; a failed one is answered too (its `error` says why).
 */
export async function followOperation(op, progress = () => {}) {
  let last = op;
  progress(last);
  while (last.state === 'pending' || last.state === 'running') {
    await new Promise((r) => setTimeout(r, 400));
    const next = await call('GET', `/operations/${encodeURIComponent(last.id)}`);
    if (next.state !== last.state) progress(next);
    last = next;
  }
  return last;
}

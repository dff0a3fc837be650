/**
 * The ingress's own credential (docs/api.md §4.7): a private exposure's token arrives as query parameter
 * `svc_token` or header `X-Svc-Token`, and neither is forwarded (nor the parameter inside
 * `Referer`), so the guest app never sees it and `Authorization` stays the app's to use. A request
 * is admitted when any token it presents is right: one stale credential must not hide another.
 */
import type { IncomingMessage } from 'node:http';
import { hashToken, safeEqualHex } from '../crypto/secret-box.js';

export const TOKEN_QUERY_PARAM = 'svc_token';
export const TOKEN_HEADER = 'x-svc-token';
/** Tokens are `svc_pt_` and 43 base64url characters; anything much longer is not one. */
const MAX_TOKEN_LENGTH = 256;

/**
 * At most this many presented tokens are looked at (headers first): each costs a hash, and a
 * request's head could otherwise ask for hundreds.
 */
export const MAX_PRESENTED_TOKENS = 8;

/**
 * Every token the request presents, up to MAX_PRESENTED_TOKENS: each `X-Svc-Token` header (trimmed),
 * then each `svc_token` parameter, in the order they came. None takes precedence: a client may hold
 * a stale one beside the right one (a header its tooling always sends, a bookmarked URL with a
 * parameter appended), and all of them are removed before forwarding anyway.
 */
export function presentedTokens(req: IncomingMessage): string[] {
  const tokens = (req.headersDistinct[TOKEN_HEADER] ?? []).slice(0, MAX_PRESENTED_TOKENS).map((value) => value.trim());
  const query = queryOf(req.url ?? '');
  if (query === null) return tokens;
  for (const value of new URLSearchParams(query).getAll(TOKEN_QUERY_PARAM)) {
    if (tokens.length === MAX_PRESENTED_TOKENS) break;
    tokens.push(value);
  }
  return tokens;
}

/**
 * Whether any of `tokens` is the one whose sha256 is `tokenHash`. Each is checked as `tokenMatches`
 * does, whether an earlier one matched or not: the time taken depends on what was presented, not
 * on which one (if any) was right.
 */
export function anyTokenMatches(tokens: readonly string[], tokenHash: string | null): boolean {
  let matched = false;
  for (const token of tokens) matched = tokenMatches(token, tokenHash) || matched;
  return matched;
}

/** Whether `token` is the one whose sha256 is `tokenHash`, compared in constant time. */
export function tokenMatches(token: string | null, tokenHash: string | null): boolean {
  if (token === null || tokenHash === null || token.length === 0 || token.length > MAX_TOKEN_LENGTH) return false;
  return safeEqualHex(hashToken(token), tokenHash);
}

/**
 * Removes the ingress credential from the request before it is forwarded: the header, the query
 * parameter, and the parameter in `Referer`, where a browser repeats the URL of the page that
 * was opened with the token (an asset request that carries its own).
 */
export function stripToken(req: IncomingMessage): void {
  delete req.headers[TOKEN_HEADER];
  req.url = withoutTokenParam(req.url ?? '/');
  const referer = req.headers.referer;
  if (typeof referer === 'string') req.headers.referer = withoutTokenParam(referer);
}

/**
 * The URL without any `svc_token` parameter. The other parameters keep their exact bytes and
 * order: re-encoding them could change what the app receives.
 */
export function withoutTokenParam(url: string): string {
  const query = queryOf(url);
  if (query === null) return url;
  const path = url.slice(0, url.indexOf('?'));
  const kept = query.split('&').filter((pair) => {
    const name = pair.split('=', 1)[0]!;
    return decodeName(name) !== TOKEN_QUERY_PARAM;
  });
  return kept.length === 0 ? path : `${path}?${kept.join('&')}`;
}

function queryOf(url: string): string | null {
  const at = url.indexOf('?');
  return at === -1 ? null : url.slice(at + 1);
}

function decodeName(name: string): string {
  try {
    return decodeURIComponent(name.replace(/\+/g, ' '));
  } catch {
    return name;
  }
}

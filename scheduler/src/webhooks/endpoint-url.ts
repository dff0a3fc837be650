/**
 * The rules a webhook URL must pass at registration (docs/api.md §4.8): absolute `https://`, at most
 * 2000 characters, no userinfo, and a host that is not loopback or link-local in any spelling.
 * A deployment that allows loopback (local development) also accepts plain `http://`.
 *
 * The URL is parsed by the WHATWG parser, the same one that later tells the dispatcher where to
 * connect, so a host that passes here is exactly the host that will be dialled: there is no
 * second parser that could read `https://0x7f000001` or `https://a@127.0.0.1@b` differently.
 * Host names are only judged by name here (`localhost`); what they resolve to is checked on
 * every delivery, because DNS answers change.
 */
import { blockedHost, type AddressPolicy } from './address-policy.js';

export const WEBHOOK_URL_MAX_CHARS = 2000;

export type UrlCheck = { ok: true; url: string } | { ok: false; reason: string };

export function checkEndpointUrl(raw: string, policy: AddressPolicy): UrlCheck {
  if ([...raw].length > WEBHOOK_URL_MAX_CHARS) return refuse(`url must be at most ${WEBHOOK_URL_MAX_CHARS} characters`);
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return refuse('url must be an absolute URL');
  }
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && policy.allowLoopback)) {
    return refuse(policy.allowLoopback ? 'url must use https or http' : 'url must use https');
  }
  // The parser drops an empty userinfo (`https://@host`), so the raw authority is checked too.
  if (url.username || url.password || /^[a-z]+:\/\/[^/?#]*@/i.test(raw.trim())) return refuse('url must not contain userinfo');
  if (!url.hostname) return refuse('url must name a host');
  const range = blockedHost(url.hostname, policy);
  if (range) return refuse(`url host is a ${range} address, which webhooks may not reach`);
  return { ok: true, url: url.href };
}

function refuse(reason: string): UrlCheck {
  return { ok: false, reason };
}

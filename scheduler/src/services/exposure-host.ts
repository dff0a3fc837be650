/**
 * The host names of port exposures (docs/api.md §2.9): `{port}-{desktop_id}.{domain}`. The API builds
 * exposure URLs with `exposureUrl`; the ingress maps a request's Host header back to the desktop
 * and port with `parseExposureHost`. Both take the same settings, so a URL the API hands out is
 * always one the ingress recognizes.
 */
import { isId } from '../../../shared/src/ids.js';
import type { IngressSettings } from '../config.js';

export type ExposureDomain = Pick<IngressSettings, 'scheme' | 'domain' | 'urlPort'>;

export interface ExposureHost {
  readonly desktopId: string;
  readonly port: number;
}

export function exposureUrl(settings: ExposureDomain, desktopId: string, port: number): string {
  const suffix = settings.urlPort === null ? '' : `:${settings.urlPort}`;
  return `${settings.scheme}://${port}-${desktopId}.${settings.domain}${suffix}`;
}

/**
 * The desktop and port a Host header names, or null when it names none. Case does not matter
 * and a `:port` suffix is ignored (the ingress may sit behind a proxy on another port); the port
 * label must be written canonically (`8080`, not `08080`), so one exposure has one host name.
 */
export function parseExposureHost(settings: ExposureDomain, hostHeader: string | undefined): ExposureHost | null {
  if (!hostHeader) return null;
  const host = hostHeader.toLowerCase().replace(/:\d*$/, '').replace(/\.$/, '');
  const suffix = `.${settings.domain}`;
  if (!host.endsWith(suffix)) return null;
  const match = /^([1-9]\d{0,4})-(dsk_[0-9a-v]+)$/.exec(host.slice(0, -suffix.length));
  if (!match) return null;
  const port = Number(match[1]);
  const desktopId = match[2]!;
  if (port > 65535 || !isId('desktop', desktopId)) return null;
  return { desktopId, port };
}

/**
 * Port exposures (docs/api.md §2.9, 4.7): a guest TCP port of a desktop made reachable at
 * `https://{port}-{desktop_id}.{domain}` through the scheduler's ingress. A private exposure has
 * a token (`svc_pt_…`) that is shown once, in the create response, and stored only as its
 * sha256, which is all the ingress needs to check it. Another org's desktop answers exactly like
 * a missing one.
 *
 * Nothing is bound on the host when an exposure is created: the agent opens the guest port
 * lazily, per ingress connection, through its port gateway (shared/src/port-link.ts). So an
 * exposure is `bound` exactly when a connection could be made now — the desktop is awake and
 * its host is up with a port gateway — and `unbound` otherwise (hibernated, waking, moving, or
 * its host is down). Wake needs no rebind step for the same reason: the next connection after
 * the wake reaches the desktop's new generation.
 *
 * Listeners (the ingress) hear of an exposure created or deleted by this replica at once, and of
 * one deleted anywhere (another replica, a destroy) through a notification its row's trigger
 * sends: an exposure deleted on one replica must not keep carrying traffic through another. They
 * hear of every change of a desktop's row the same way (the desktop route notification), so a
 * desktop that stops running where its traffic was relayed to (hibernated, force-hibernated by
 * the leader, moved) stops carrying it through every replica.
 */
import { randomBytes } from 'node:crypto';
import type { Sql } from '../store/db.js';
import * as store from '../store/ports.js';
import { getDesktop } from '../store/desktops.js';
import { hashToken } from '../crypto/secret-box.js';
import { errors } from '../errors.js';
import type { CreatePortBody, PortExposureJson } from '../api/schemas.js';
import { exposureUrl, type ExposureDomain } from './exposure-host.js';
import { DESKTOP_ROUTE_CHANNEL } from '../store/notified-cache.js';
import type { DesktopState } from '../store/rows.js';
import { routeNotification } from './guest.js';

export const PORT_TOKEN_PREFIX = 'svc_pt_';

export type PortRoute = store.PortRouteRow;

export interface PortServiceDeps {
  sql: Sql;
  /** The ingress's domain; null when the deployment runs no ingress (create answers 501). */
  ingress: ExposureDomain | null;
}

/** Called after an exposure is created or deleted, so the ingress forgets what it cached. */
export type ExposureListener = (desktopId: string, port: number) => void;

/** Where a desktop runs, as a change of its row left it: what decides whether traffic to it may go on. */
export interface DesktopRunning {
  readonly state: DesktopState;
  readonly host_id: string | null;
  readonly generation: number;
}

/**
 * Called after a desktop's row changed, with where it runs now (null: the row is gone). With
 * `desktopId` null, changes may have gone unheard (the listen connection reconnected, or a
 * notification could not be read): any desktop may have changed.
 */
export type DesktopListener = (desktopId: string | null, now: DesktopRunning | null) => void;

export const EXPOSURE_DELETED_CHANNEL = 'canto_port_exposure_deleted';

export class PortService {
  private readonly listeners = new Set<ExposureListener>();
  private readonly desktopListeners = new Set<DesktopListener>();

  constructor(private readonly deps: PortServiceDeps) {}

  onChange(listener: ExposureListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  onDesktopChange(listener: DesktopListener): () => void {
    this.desktopListeners.add(listener);
    return () => this.desktopListeners.delete(listener);
  }

  /** Hears exposures deleted and desktops changed by any replica; answers the function that stops listening. */
  async listen(): Promise<() => Promise<void>> {
    const deleted = await this.deps.sql.listen(EXPOSURE_DELETED_CHANNEL, (payload) => {
      const at = payload.lastIndexOf(':');
      const port = Number(payload.slice(at + 1));
      if (at > 0 && Number.isInteger(port)) this.changed(payload.slice(0, at), port);
    });
    let desktops;
    try {
      desktops = await this.deps.sql.listen(
        DESKTOP_ROUTE_CHANNEL,
        (payload) => {
          const change = routeNotification(payload);
          this.desktopChanged(change?.key ?? null, change?.value ?? null);
        },
        // Called again after each reconnect: what changed meanwhile was not heard.
        () => this.desktopChanged(null, null),
      );
    } catch (err) {
      await deleted.unlisten().catch(() => {});
      throw err;
    }
    return async () => {
      await deleted.unlisten();
      await desktops.unlisten();
    };
  }

  async list(orgId: string, desktopId: string): Promise<PortExposureJson[]> {
    await this.desktop(orgId, desktopId);
    return (await store.listRoutes(this.deps.sql, desktopId)).map((row) => this.toJson(row));
  }

  async create(orgId: string, desktopId: string, body: CreatePortBody): Promise<PortExposureJson> {
    if (!this.deps.ingress) throw errors.ingressDisabled();
    const desktop = await this.desktop(orgId, desktopId);
    if (desktop.state !== 'awake') throw errors.notAwake(desktop.state);
    const isPublic = body.public ?? false;
    const token = isPublic ? null : PORT_TOKEN_PREFIX + randomBytes(32).toString('base64url');
    const row = await store.insertExposure(this.deps.sql, {
      orgId,
      desktopId,
      port: body.port,
      public: isPublic,
      tokenHash: token === null ? null : hashToken(token),
    });
    if (row === 'exists') throw errors.portAlreadyExposed();
    // It stopped being awake since the check above (a hibernate or destroy in between).
    if (row === 'not_awake') throw errors.notAwake((await this.desktop(orgId, desktopId)).state);
    this.changed(desktopId, body.port);
    const json = this.toJson(row);
    return token === null ? json : { ...json, token };
  }

  /** `portText` is the URL segment: anything that is not an exposed port is simply not found. */
  async remove(orgId: string, desktopId: string, portText: string): Promise<void> {
    await this.desktop(orgId, desktopId);
    const port = /^\d{1,5}$/.test(portText) ? Number(portText) : NaN;
    if (!(port >= 1 && port <= 65535) || !(await store.deleteExposure(this.deps.sql, desktopId, port))) throw errors.portNotFound();
    this.changed(desktopId, port);
  }

  /** The exposure an ingress request names, with where its desktop runs; null when there is none. */
  async route(desktopId: string, port: number): Promise<PortRoute | null> {
    return store.getRoute(this.deps.sql, desktopId, port);
  }

  private async desktop(orgId: string, desktopId: string) {
    const desktop = await getDesktop(this.deps.sql, orgId, desktopId);
    if (!desktop) throw errors.desktopNotFound();
    return desktop;
  }

  private changed(desktopId: string, port: number): void {
    for (const listener of this.listeners) listener(desktopId, port);
  }

  private desktopChanged(desktopId: string | null, now: DesktopRunning | null): void {
    for (const listener of this.desktopListeners) listener(desktopId, now);
  }

  private toJson(row: PortRoute): PortExposureJson {
    // The service's only writer of URLs; without an ingress, listed exposures (created while one
    // was configured) keep a URL on an empty domain rather than failing the list.
    const url = this.deps.ingress ? exposureUrl(this.deps.ingress, row.desktop_id, row.port) : '';
    return {
      id: row.id,
      port: row.port,
      public: row.public,
      url,
      status: isBound(row) ? 'bound' : 'unbound',
      created_at: row.created_at.toISOString(),
    };
  }
}

/**
 * Whether a connection to the exposure could be made now: the desktop is awake on a host that is
 * up (by its row, so every replica answers alike) and runs a port gateway.
 */
export function isBound(row: PortRoute): boolean {
  return row.desktop_state === 'awake' && row.host_status === 'ready' && row.ingress_address !== null;
}

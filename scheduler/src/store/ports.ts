/**
 * Port exposures (docs/api.md §2.9, 4.7): one row per exposed guest port of a desktop, unique per
 * (desktop, port). A private exposure stores only the sha256 of its token. Reads join the
 * desktop and its host, because an exposure's status and its route through the ingress both
 * depend on where the desktop runs now.
 */
import { newId } from '../../../shared/src/ids.js';
import type { Sql } from './db.js';
import type { DesktopState } from './rows.js';

export interface PortExposureRow {
  id: string;
  org_id: string;
  desktop_id: string;
  port: number;
  public: boolean;
  token_hash: string | null;
  created_at: Date;
}

/** An exposure with what decides whether it can carry traffic right now. */
export interface PortRouteRow extends PortExposureRow {
  desktop_state: DesktopState;
  generation: number;
  /** Null when the desktop is not placed on a host. */
  host_id: string | null;
  host_status: 'ready' | 'down' | null;
  /** The host's port gateway (`host:port`); null when the host has none or there is no host. */
  ingress_address: string | null;
  /** A move of the desktop is open: between its stop and its start on the target, links are refused. */
  moving: boolean;
  /** The protocol its host's agent speaks (which port-link line it takes); null without a host. */
  host_protocol: string | null;
}

export interface NewExposure {
  orgId: string;
  desktopId: string;
  port: number;
  public: boolean;
  tokenHash: string | null;
}

/**
 * Inserts the exposure while the desktop is awake: the desktop's row is share-locked for the
 * insert, so a destroy (which deletes a desktop's exposures in the transaction that marks it
 * destroyed) either sees the new row or makes the insert find the desktop no longer awake.
 * `exists` when the desktop already exposes that port, `not_awake` when it stopped being awake.
 */
export async function insertExposure(sql: Sql, e: NewExposure): Promise<PortRouteRow | 'exists' | 'not_awake'> {
  const [row] = await sql<PortExposureRow[]>`
    WITH awake AS (SELECT id FROM desktops WHERE id = ${e.desktopId} AND org_id = ${e.orgId} AND state = 'awake' FOR SHARE)
    INSERT INTO port_exposures (id, org_id, desktop_id, port, public, token_hash)
    SELECT ${newId('port')}, ${e.orgId}, awake.id, ${e.port}, ${e.public}, ${e.tokenHash} FROM awake
    ON CONFLICT (desktop_id, port) DO NOTHING
    RETURNING *`;
  if (row) return (await getRoute(sql, row.desktop_id, row.port)) ?? 'not_awake';
  return (await getRoute(sql, e.desktopId, e.port)) ? 'exists' : 'not_awake';
}

/** What a route reads beside the exposure: its desktop, the desktop's host, and whether it moves. */
function routeColumns(sql: Sql) {
  return sql`p.*, d.state AS desktop_state, d.generation, d.host_id, h.status AS host_status, h.ingress_address, h.protocol AS host_protocol,
    EXISTS (SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.kind = 'move' AND o.state IN ('pending', 'running')) AS moving`;
}

/** The desktop's exposures, by port. */
export async function listRoutes(sql: Sql, desktopId: string): Promise<PortRouteRow[]> {
  return sql<PortRouteRow[]>`
    SELECT ${routeColumns(sql)}
    FROM port_exposures p JOIN desktops d ON d.id = p.desktop_id LEFT JOIN hosts h ON h.id = d.host_id
    WHERE p.desktop_id = ${desktopId} ORDER BY p.port`;
}

/** One exposure, looked up by what an exposure URL names: the desktop id and the port. */
export async function getRoute(sql: Sql, desktopId: string, port: number): Promise<PortRouteRow | null> {
  const [row] = await sql<PortRouteRow[]>`
    SELECT ${routeColumns(sql)}
    FROM port_exposures p JOIN desktops d ON d.id = p.desktop_id LEFT JOIN hosts h ON h.id = d.host_id
    WHERE p.desktop_id = ${desktopId} AND p.port = ${port}`;
  return row ?? null;
}

/** Deletes every exposure of a desktop (it was destroyed: its URLs answer 404 from now on). */
export async function deleteExposuresOf(sql: Sql, desktopId: string): Promise<void> {
  await sql`DELETE FROM port_exposures WHERE desktop_id = ${desktopId}`;
}

/** Deletes the exposure; false when the desktop has none on that port. */
export async function deleteExposure(sql: Sql, desktopId: string, port: number): Promise<boolean> {
  const rows = await sql`DELETE FROM port_exposures WHERE desktop_id = ${desktopId} AND port = ${port} RETURNING id`;
  return rows.length === 1;
}

/**
 * Webhook endpoints and their delivery log, as the API sees them. Endpoint secrets are stored
 * sealed; deleting an endpoint deletes its deliveries with it (`ON DELETE CASCADE`), which is
 * also what stops the pending ones: the dispatcher only ever claims rows that still exist.
 */
import { newId } from '../../../shared/src/ids.js';
import { inTransaction, type Sql } from './db.js';

export interface WebhookEndpointRow {
  id: string;
  org_id: string;
  url: string;
  events: string[];
  secret_sealed: Buffer;
  created_at: Date;
}

export type DeliveryState = 'pending' | 'delivered' | 'failed';

export interface WebhookDeliveryRow {
  id: string;
  endpoint_id: string;
  event_type: string;
  body: string;
  state: DeliveryState;
  attempts: number;
  last_status: number | null;
  last_error: string | null;
  next_attempt_at: Date | null;
  created_at: Date;
  delivered_at: Date | null;
}

export interface NewEndpoint {
  orgId: string;
  url: string;
  events: string[];
  /** Seals the secret for the endpoint id minted here (the id is the sealing context). */
  sealSecret(endpointId: string): Buffer;
}

/**
 * Inserts an endpoint unless the org already has `cap` of them; null when it has. The org row is
 * locked for the count, so concurrent creates cannot both slip under the cap.
 */
export async function insertEndpoint(sql: Sql, e: NewEndpoint, cap: number): Promise<WebhookEndpointRow | null> {
  return inTransaction(sql, async (tx) => {
    // The same lock the desktop quota takes (store/desktops.ts heldByOrgLocked), which a desktop
    // insert's foreign-key lock on the org row does not conflict with.
    await tx`SELECT 1 FROM orgs WHERE id = ${e.orgId} FOR NO KEY UPDATE`;
    const [count] = await tx<Array<{ n: number }>>`SELECT count(*)::int AS n FROM webhook_endpoints WHERE org_id = ${e.orgId}`;
    if ((count?.n ?? 0) >= cap) return null;
    const id = newId('webhook');
    const [row] = await tx<WebhookEndpointRow[]>`
      INSERT INTO webhook_endpoints (id, org_id, url, events, secret_sealed)
      VALUES (${id}, ${e.orgId}, ${e.url}, ${e.events}, ${e.sealSecret(id)})
      RETURNING *`;
    return row!;
  });
}

export async function listEndpoints(sql: Sql, orgId: string): Promise<WebhookEndpointRow[]> {
  return sql<WebhookEndpointRow[]>`SELECT * FROM webhook_endpoints WHERE org_id = ${orgId} ORDER BY created_at, id`;
}

export async function endpointExists(sql: Sql, orgId: string, id: string): Promise<boolean> {
  const rows = await sql`SELECT 1 FROM webhook_endpoints WHERE id = ${id} AND org_id = ${orgId}`;
  return rows.length === 1;
}

/** Deletes the endpoint and, by cascade, its delivery log. False when the org has no such endpoint. */
export async function deleteEndpoint(sql: Sql, orgId: string, id: string): Promise<boolean> {
  const rows = await sql`DELETE FROM webhook_endpoints WHERE id = ${id} AND org_id = ${orgId} RETURNING id`;
  return rows.length === 1;
}

/** The endpoint's deliveries, newest first. */
export async function listDeliveries(sql: Sql, endpointId: string, limit: number): Promise<WebhookDeliveryRow[]> {
  return sql<WebhookDeliveryRow[]>`
    SELECT id, endpoint_id, event_type, body, state, attempts, last_status, last_error, next_attempt_at, created_at, delivered_at
    FROM webhook_deliveries WHERE endpoint_id = ${endpointId} ORDER BY seq DESC LIMIT ${limit}`;
}

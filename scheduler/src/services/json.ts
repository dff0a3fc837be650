/** Mapping of stored rows to the API's JSON shapes (docs/api.md §2.1, 2.5). */
import type { OperationRow } from '../store/rows.js';
import type { DesktopView } from '../store/desktop-reads.js';
import type { DesktopJson, OperationJson } from '../api/schemas.js';

export function toDesktopJson(row: DesktopView): DesktopJson {
  return {
    id: row.id,
    org_id: row.org_id,
    tier: row.tier,
    state: row.state,
    image_version: row.image_version,
    generation: row.generation,
    current_generation_id: row.current_generation_id,
    idle_timeout_secs: row.idle_timeout_secs,
    billing_mode: row.billing_mode,
    host_id: row.host_id ?? '',
    host_status: row.host_id === null ? null : (row.host_status ?? null),
  };
}

export function toOperationJson(row: OperationRow): OperationJson {
  return {
    id: row.id,
    desktop_id: row.desktop_id,
    kind: row.kind,
    state: row.state,
    result: row.result,
    error: row.error,
    created_at: row.created_at.toISOString(),
    settled_at: row.settled_at ? row.settled_at.toISOString() : null,
  };
}

/**
 * Reads of desktops as the API shows them, coalesced: every `GET /v1/desktops/{id}` that arrives
 * in one turn of the event loop is answered by one query (`id = ANY(…)`), so under load the
 * database round trip, the query's protocol messages and the pool hand-off are paid once per turn
 * instead of once per request. Nothing is cached: each read is sent after its request arrived,
 * so it sees every commit that preceded the request, on this replica or any other. A lone request
 * waits only for the end of its turn (`setImmediate`).
 *
 * Only the columns the API shows are read: the sealed env and setup script never leave the
 * database on a read.
 */
import type { Sql } from './db.js';
import type { DesktopRow } from './rows.js';

/** What `toDesktopJson` needs. */
export type DesktopView = Pick<DesktopRow,
  'id' | 'org_id' | 'tier' | 'state' | 'image_version' | 'generation' | 'current_generation_id' |
  'idle_timeout_secs' | 'billing_mode' | 'host_id' | 'host_status'>;

/** The API's columns, with the host's status. */
export const DESKTOP_VIEW_COLUMNS = `d.id, d.org_id, d.tier, d.state, d.image_version, d.generation, d.current_generation_id,
  d.idle_timeout_secs, d.billing_mode, d.host_id, h.status AS host_status`;

/** Larger batches go as several queries: one query's parameter stays small. */
const MAX_BATCH = 1_000;

interface Waiting {
  orgId: string;
  id: string;
  resolve(row: DesktopView | null): void;
  reject(err: unknown): void;
}

export class DesktopReads {
  private waiting: Waiting[] = [];
  private scheduled = false;

  constructor(private readonly sql: Sql) {}

  /** The desktop `id` of `orgId`; null when it does not exist or belongs to another org. */
  get(orgId: string, id: string): Promise<DesktopView | null> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ orgId, id, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.scheduled = false;
    const all = this.waiting;
    this.waiting = [];
    for (let i = 0; i < all.length; i += MAX_BATCH) void this.answer(all.slice(i, i + MAX_BATCH));
  }

  private async answer(batch: Waiting[]): Promise<void> {
    try {
      const ids = [...new Set(batch.map((w) => w.id))];
      const rows = await this.sql.unsafe<DesktopView[]>(
        `SELECT ${DESKTOP_VIEW_COLUMNS} FROM desktops d LEFT JOIN hosts h ON h.id = d.host_id WHERE d.id = ANY($1::text[])`,
        [ids],
        { prepare: true },
      );
      const byId = new Map(rows.map((r) => [r.id, r]));
      for (const w of batch) {
        const row = byId.get(w.id);
        // Another org's desktop answers exactly as a missing one.
        w.resolve(row !== undefined && row.org_id === w.orgId ? row : null);
      }
    } catch (err) {
      for (const w of batch) w.reject(err);
    }
  }
}

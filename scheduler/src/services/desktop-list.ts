/**
 * `GET /v1/desktops`, kept serialized. An org's list is read, rendered and written whole at every
 * call, and for a large org most of that work is redone for nothing: a dashboard polls a list that
 * changes a few times a minute. Each call therefore first asks the database for the list's
 * fingerprint (store/desktops.ts: a count and a hash sum over the row versions, computed by
 * Postgres over the same rows, no values sent), and when it equals the one the kept body was made
 * with, the kept bytes are the answer. Any change made anywhere, on any replica, is a new row
 * version and so a new fingerprint: nothing here can answer older than the database. Bodies are
 * kept with the fingerprint of the very rows they were made from (read in one statement).
 *
 * Kept per org and state filter, least recently used first out, within a byte budget per process.
 */
import type { Sql } from '../store/db.js';
import { desktopListFingerprint, listDesktopViewsFingerprinted } from '../store/desktops.js';
import type { DesktopState } from '../store/rows.js';
import type { DesktopJson } from '../api/schemas.js';
import { toDesktopJson } from './json.js';

/** Budget of kept bodies per process: 64 lists of 1,000 desktops (≈260 KB each). */
export const DEFAULT_LIST_CACHE_BYTES = 16 * 1024 * 1024;

interface Kept {
  readonly fingerprint: string;
  readonly body: Buffer;
}

export class DesktopList {
  /** Map order is use order: the first entry is the least recently used. */
  private readonly kept = new Map<string, Kept>();
  private keptBytes = 0;

  constructor(
    private readonly sql: Sql,
    private readonly maxBytes = DEFAULT_LIST_CACHE_BYTES,
  ) {}

  /** The list's body as `render` makes it from the desktops, kept or made now. */
  async body(orgId: string, state: DesktopState | null, render: (desktops: DesktopJson[]) => string): Promise<Buffer> {
    const key = `${orgId}\n${state ?? ''}`;
    // With nothing kept, the fingerprint could only be thrown away: the rows bring their own.
    if (this.kept.has(key)) {
      const fingerprint = await desktopListFingerprint(this.sql, orgId, state);
      // Looked up after the query: a concurrent call may have replaced or dropped it meanwhile.
      const hit = this.kept.get(key);
      if (hit !== undefined && hit.fingerprint === fingerprint) {
        this.keep(key, hit);
        return hit.body;
      }
    }
    // Kept with the fingerprint of these rows, read with them: the one above may be older.
    const read = await listDesktopViewsFingerprinted(this.sql, orgId, state);
    const body = Buffer.from(render(read.views.map(toDesktopJson)));
    if (body.length <= this.maxBytes) {
      while (this.kept.size > 0 && this.keptBytes + body.length > this.maxBytes) {
        const [oldest, kept] = this.kept.entries().next().value as [string, Kept];
        this.drop(oldest, kept);
      }
      this.keep(key, { fingerprint: read.fingerprint, body });
    }
    return body;
  }

  /** Bytes of the bodies kept now. */
  get bytes(): number {
    return this.keptBytes;
  }

  /**
   * Keeps `kept` for `key` as the most recently used, in place of what was kept for it (the same
   * body, or one a concurrent call kept meanwhile).
   */
  private keep(key: string, kept: Kept): void {
    const earlier = this.kept.get(key);
    if (earlier !== undefined) this.drop(key, earlier);
    this.kept.set(key, kept);
    this.keptBytes += kept.body.length;
  }

  private drop(key: string, kept: Kept): void {
    this.kept.delete(key);
    this.keptBytes -= kept.body.length;
  }
}

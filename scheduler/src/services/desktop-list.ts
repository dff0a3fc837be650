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
 * A list that did change is mostly the same rows, so it is made again from what changed: the
 * list's ids and row versions are read (with the list's fingerprint, in one statement), only the
 * rows whose version is not kept are read whole, and the body is the kept rendering of every other
 * row, joined in the list's order. Reading the ids and versions of 1,000 rows costs about a third
 * of reading them whole, and nothing is rendered again. The rows read whole must be the very
 * versions the listing named; one that changed again in between sends the call to a full read,
 * so a body never mixes versions its fingerprint does not describe. A list that changed the last
 * time it was asked for is likely to change again (a dashboard over desktops being created): its
 * listing, which says both whether and what changed, is asked for at once, without the
 * fingerprint first; once it comes back unchanged, the fingerprint is asked for again.
 *
 * Kept per org and state filter, least recently used first out, within a byte budget per process.
 */
import type { Sql } from '../store/db.js';
import { desktopListFingerprint, desktopViewsVersioned, listDesktopVersions, listDesktopViewsFingerprinted, type VersionedView } from '../store/desktops.js';
import type { DesktopState } from '../store/rows.js';
import type { DesktopJson } from '../api/schemas.js';
import { toDesktopJson } from './json.js';

/** Budget of kept lists per process: 32 lists of 1,000 desktops (≈260 KB each, kept twice: body and rows). */
export const DEFAULT_LIST_CACHE_BYTES = 16 * 1024 * 1024;

/** A list with more changed rows than this share of its rows is read whole again. */
const PATCH_AT_MOST = 0.5;

/** Renders the list's body from its desktops (the route's serializer). */
export type RenderList = (desktops: DesktopJson[]) => string;

/** How a call was answered: the kept body, a kept body with changed rows read again, or a full read. */
export type ListAnswer = 'kept' | 'patched' | 'full';

interface Kept {
  readonly fingerprint: string;
  readonly body: Buffer;
  /** Each row's rendering, by id, with the row version it was rendered from. */
  readonly rows: ReadonlyMap<string, { readonly version: string; readonly json: string }>;
  /** What the entry counts against the budget: the body, and the rows' renderings as much again. */
  readonly size: number;
  /** Made because the list had changed since it was last kept. */
  readonly changed: boolean;
}

export class DesktopList {
  /** Map order is use order: the first entry is the least recently used. */
  private readonly kept = new Map<string, Kept>();
  private keptBytes = 0;
  /** Calls answered each way since this process started: what the kept lists saved (tests, diagnostics). */
  readonly answers: Record<ListAnswer, number> = { kept: 0, patched: 0, full: 0 };

  constructor(
    private readonly sql: Sql,
    private readonly maxBytes = DEFAULT_LIST_CACHE_BYTES,
  ) {}

  /** The list's body as `render` makes it from the desktops, kept or made now. */
  async body(orgId: string, state: DesktopState | null, render: RenderList): Promise<Buffer> {
    const key = `${orgId}\n${state ?? ''}`;
    // With nothing kept, the fingerprint could only be thrown away: the rows bring their own.
    let hit = this.kept.get(key);
    if (hit !== undefined && !hit.changed) {
      const fingerprint = await desktopListFingerprint(this.sql, orgId, state);
      // Looked up after the query: a concurrent call may have replaced or dropped it meanwhile.
      hit = this.kept.get(key);
      if (hit !== undefined && hit.fingerprint === fingerprint) {
        this.keep(key, hit);
        this.answers.kept++;
        return hit.body;
      }
    }
    // A list that changed since it was kept, or changed the last time it was asked for (and so
    // likely again: its listing, which says both whether and what, is asked for at once).
    if (hit !== undefined) {
      const again = await this.patched(orgId, state, hit, render);
      if (again !== null) {
        this.answers[again.answer]++;
        return this.store(key, again.kept).body;
      }
    }
    // Kept with the fingerprint of these rows, read with them: the one above may be older.
    const read = await listDesktopViewsFingerprinted(this.sql, orgId, state);
    const rows = new Map<string, { version: string; json: string }>();
    const envelope = envelopeOf(render);
    const parts = read.views.map((view) => {
      const json = renderRow(envelope, render, view);
      rows.set(view.id, { version: view.row_version, json });
      return json;
    });
    this.answers.full++;
    return this.store(key, made(envelope, parts, read.fingerprint, rows, hit !== undefined)).body;
  }

  /** Bytes counted against the budget now. */
  get bytes(): number {
    return this.keptBytes;
  }

  /**
   * The list made again from `kept` and the rows that changed since, or null when a full read
   * is the better way (most rows changed) or the only safe one (a row changed again meanwhile).
   */
  private async patched(orgId: string, state: DesktopState | null, kept: Kept, render: RenderList): Promise<{ kept: Kept; answer: ListAnswer } | null> {
    const listing = await listDesktopVersions(this.sql, orgId, state);
    // Unchanged after all: the kept body, asked for by its fingerprint again next time.
    if (listing.fingerprint === kept.fingerprint) return { kept: { ...kept, changed: false }, answer: 'kept' };
    const stale = listing.rows.filter((r) => kept.rows.get(r.id)?.version !== r.row_version).map((r) => r.id);
    if (stale.length > listing.rows.length * PATCH_AT_MOST) return null;
    const fresh = new Map((stale.length === 0 ? [] : await desktopViewsVersioned(this.sql, orgId, stale)).map((v) => [v.id, v]));
    const envelope = envelopeOf(render);
    const rows = new Map<string, { version: string; json: string }>();
    const parts: string[] = [];
    for (const { id, row_version: version } of listing.rows) {
      let row = kept.rows.get(id);
      if (row?.version !== version) {
        const view = fresh.get(id);
        // Gone or changed again since the listing: its version is not the one the fingerprint counts.
        if (view?.row_version !== version) return null;
        row = { version, json: renderRow(envelope, render, view) };
      }
      rows.set(id, row);
      parts.push(row.json);
    }
    return { kept: made(envelope, parts, listing.fingerprint, rows, true), answer: 'patched' };
  }

  /** Keeps `made` when it fits the budget, dropping the least recently used lists to make room. */
  private store(key: string, made: Kept): Kept {
    if (made.size > this.maxBytes) return made;
    while (this.kept.size > 0 && this.keptBytes + made.size > this.maxBytes) {
      const [oldest, kept] = this.kept.entries().next().value as [string, Kept];
      this.drop(oldest, kept);
    }
    this.keep(key, made);
    return made;
  }

  /**
   * Keeps `kept` for `key` as the most recently used, in place of what was kept for it (the same
   * body, or one a concurrent call kept meanwhile).
   */
  private keep(key: string, kept: Kept): void {
    const earlier = this.kept.get(key);
    if (earlier !== undefined) this.drop(key, earlier);
    this.kept.set(key, kept);
    this.keptBytes += kept.size;
  }

  private drop(key: string, kept: Kept): void {
    this.kept.delete(key);
    this.keptBytes -= kept.size;
  }
}

/** What `render` puts around the rows: its rendering of no desktop is `head` + `tail`. */
interface Envelope {
  readonly head: string;
  readonly tail: string;
}

function envelopeOf(render: RenderList): Envelope {
  const empty = render([]);
  const at = empty.lastIndexOf('[]');
  if (at < 0) throw new Error('the list renderer does not render an array of desktops');
  return { head: empty.slice(0, at + 1), tail: empty.slice(at + 1) };
}

/** One row as `render` renders it inside the list. */
function renderRow(envelope: Envelope, render: RenderList, view: VersionedView): string {
  const one = render([toDesktopJson(view)]);
  if (!one.startsWith(envelope.head) || !one.endsWith(envelope.tail)) throw new Error('the list renderer renders one desktop unlike a list of them');
  return one.slice(envelope.head.length, one.length - envelope.tail.length);
}

function made(envelope: Envelope, parts: string[], fingerprint: string, rows: ReadonlyMap<string, { version: string; json: string }>, changed: boolean): Kept {
  const body = Buffer.from(envelope.head + parts.join(',') + envelope.tail);
  return { fingerprint, body, rows, size: body.length * 2, changed };
}

/**
 * Read-through caches that Postgres keeps honest, for the two lookups every guest operation makes
 * before it reaches the agent: which org an API key belongs to, and where an awake desktop runs.
 * On this hot path each database round trip costs two process wake-ups, which measured as much as
 * the agent link itself. A third maps the org a JWT names to its id.
 *
 * A trigger on the cached table sends `pg_notify(channel, key)` for every changed or deleted row
 * (migration `change notifications`); each replica listens and drops that key. A channel may
 * instead carry the row's new value (`listenValues`; desktop routes, migration `desktop route
 * notifications`): the cache then takes that value, if it would keep it, in place of the old one,
 * so the first lookup after a change reads no row. Notifications of one channel arrive in the
 * order their transactions committed, so the last one heard is the newest state. Notifications are
 * lost while the listen connection reconnects, so the cache is emptied each time listening
 * (re)starts, and caches nothing before the first start. A lookup that was in flight while its
 * key was dropped (or the cache emptied) is served but not kept, since it may have read the row
 * before the change; a drop of another key says nothing about this one's row, so it does not
 * stop the lookup being kept (in a busy fleet some desktop changes every few milliseconds). A
 * time limit bounds what a missed notification could cost.
 *
 * What a stale entry can do is bounded by who uses it: the agent fences every command by
 * generation (a stale desktop route gets `not_running`, which evicts it), and an API key revoked
 * by another replica's transaction is refused here once the notification arrives, within
 * milliseconds (docs/decisions.md).
 */
import type { Sql } from './db.js';

export const API_KEY_CHANGED_CHANNEL = 'canto_api_key_changed';
/** A desktop row's id; replicas of this version hear `DESKTOP_ROUTE_CHANNEL` instead, older ones still this. */
export const DESKTOP_CHANGED_CHANNEL = 'canto_desktop_changed';
export const ORG_CHANGED_CHANNEL = 'canto_org_changed';
export const DESKTOP_ROUTE_CHANNEL = 'canto_desktop_route';

export interface NotifiedCacheOptions {
  /** The longest an entry is served without a fresh read. */
  readonly ttlMs: number;
  readonly maxEntries: number;
  readonly now?: () => number;
}

export class NotifiedCache<V> {
  private readonly entries = new Map<string, { value: V; expiresAt: number }>();
  /** The lookups in flight per key; a drop of the key marks them, and then they are not kept. */
  private readonly loading = new Map<string, Set<{ dropped: boolean }>>();
  /** Bumped when the cache is emptied: a lookup in flight across that is not kept either. */
  private generation = 0;
  /** False until listening starts: before that, a change could go unheard. */
  private listening = false;
  private readonly now: () => number;

  constructor(private readonly options: NotifiedCacheOptions) {
    this.now = options.now ?? Date.now;
  }

  /** Starts listening on `channel`, whose payload is a changed row's key; answers the function that stops it. */
  listen(sql: Sql, channel: string): Promise<() => Promise<void>> {
    return this.subscribe(sql, channel, (key) => this.evict(key));
  }

  /**
   * Starts listening on `channel`, whose payload `parse` reads as a row's key and new value (null:
   * the row is gone). A value `keep` accepts replaces the entry; any other drops it. A lookup in
   * flight is not kept either way: it may have read the row before this change. A payload `parse`
   * cannot read (null) names no row, so every entry goes.
   */
  listenValues(
    sql: Sql,
    channel: string,
    parse: (payload: string) => { readonly key: string; readonly value: V | null } | null,
    keep: (value: V) => boolean,
  ): Promise<() => Promise<void>> {
    return this.subscribe(sql, channel, (payload) => {
      const change = parse(payload);
      if (change === null) return this.clear();
      this.evict(change.key);
      if (change.value !== null && this.listening && keep(change.value)) this.store(change.key, change.value);
    });
  }

  private async subscribe(sql: Sql, channel: string, onPayload: (payload: string) => void): Promise<() => Promise<void>> {
    const sub = await sql.listen(
      channel,
      onPayload,
      // Called again after each reconnect: what changed meanwhile was not heard.
      () => {
        this.clear();
        this.listening = true;
      },
    );
    return async () => {
      this.listening = false;
      this.clear();
      await sub.unlisten();
    };
  }

  /**
   * The cached value of `key`, else `load()`'s answer, kept when `keep` says so (a cache of
   * positive answers only never turns a new row into a stale "missing").
   */
  async get(key: string, load: () => Promise<V | null>, keep: (value: V) => boolean): Promise<V | null> {
    const hit = this.entries.get(key);
    if (hit !== undefined && hit.expiresAt > this.now()) return hit.value;
    if (hit !== undefined) this.entries.delete(key);
    const lookup = { dropped: false };
    const generation = this.generation;
    const inFlight = this.loading.get(key) ?? new Set();
    inFlight.add(lookup);
    this.loading.set(key, inFlight);
    let value: V | null;
    try {
      value = await load();
    } finally {
      inFlight.delete(lookup);
      if (inFlight.size === 0 && this.loading.get(key) === inFlight) this.loading.delete(key);
    }
    if (value !== null && this.listening && !lookup.dropped && generation === this.generation && keep(value)) this.store(key, value);
    return value;
  }

  private store(key: string, value: V): void {
    // Map order is insertion order: when full, the oldest entry goes.
    if (!this.entries.has(key) && this.entries.size >= this.options.maxEntries) this.entries.delete(this.entries.keys().next().value!);
    this.entries.set(key, { value, expiresAt: this.now() + this.options.ttlMs });
  }

  evict(key: string): void {
    for (const lookup of this.loading.get(key) ?? []) lookup.dropped = true;
    this.entries.delete(key);
  }

  clear(): void {
    this.generation++;
    this.entries.clear();
  }

  get size(): number {
    return this.entries.size;
  }
}

/**
 * The replica registry: every scheduler replica keeps a row in `replicas` with the URL agents
 * reach it at, its version and fingerprints of the settings all replicas must share, refreshed
 * every `refreshMs`. From the rows it reads back, each replica knows the live fleet:
 *
 * - agents learn the list from whichever replica they reach and keep a link to each, so every
 *   replica can serve guest operations over its own links (agents/gateway.ts pushes changes);
 * - host health asks since when heartbeats have been recorded without a gap (a replica records
 *   them from its start; see `recordingSince`);
 * - settings that differ between live replicas are logged, once per replica and setting, with
 *   fingerprints only (a different `CANTO_SECRET_KEY` shows as two hashes, never as keys);
 * - each row also says which hosts' agents are linked to that replica, so the admin API and
 *   `canto status` show a partial partition: a host that some replicas reach and others (the
 *   leader, say) do not.
 *
 * A replica that starts says so on a notification channel, and every live replica reads the rows
 * again at once: agents then hear of the new replica from the ones they are linked to within
 * milliseconds rather than at the next refresh, which narrows the moment after a start when the new
 * replica serves calls without a link to every host (services/first-link.ts waits out what is left).
 *
 * A replica that stops deletes its row; one that crashed ages out after `liveMs` and is pruned
 * after an hour.
 */
import type { Logger } from '../../../shared/src/log.js';
import type { Sql } from '../store/db.js';
import { liveReplicas, pruneReplicas, removeReplica, upsertReplica, type ReplicaRecord, type ReplicaRow } from '../store/replicas.js';

export interface ReplicaRegistryOptions {
  readonly sql: Sql;
  readonly self: ReplicaRecord;
  readonly refreshMs: number;
  /** A replica not refreshed for this long is no longer live. */
  readonly liveMs: number;
  readonly logger: Logger;
  /** The hosts whose agents are linked to this replica now, written with each refresh. */
  readonly linkedHosts: () => readonly string[];
}

export interface ReplicaAddress {
  readonly id: string;
  readonly url: string;
}

const PRUNE_AFTER_MS = 3_600_000;
/** Notified by a replica that has just registered; the payload is its id. */
export const REPLICA_JOINED_CHANNEL = 'canto_replica_joined';
/** How often each replica refreshes its row, and how long a row counts as live without one. */
export const REPLICA_REFRESH_MS = 1_000;
export const REPLICA_LIVE_MS = 5_000;

export class ReplicaRegistry {
  private live: readonly ReplicaRow[] = [];
  private timer: NodeJS.Timeout | null = null;
  private refreshing: Promise<void> | null = null;
  /** A notification came while a refresh was reading: read once more after it. */
  private again = false;
  private unlisten: (() => Promise<void>) | null = null;
  private readonly listeners = new Set<(replicas: readonly ReplicaAddress[]) => void>();
  private readonly warned = new Set<string>();
  private readonly log: Logger;

  constructor(private readonly options: ReplicaRegistryOptions) {
    this.log = options.logger.child({ component: 'replicas' });
  }

  get self(): ReplicaRecord {
    return this.options.self;
  }

  async start(): Promise<void> {
    const { sql, self } = this.options;
    await upsertReplica(sql, self, true, this.options.liveMs, this.options.linkedHosts());
    const sub = await sql.listen(REPLICA_JOINED_CHANNEL, (id) => {
      if (id === self.id) return;
      if (this.refreshing) this.again = true;
      else void this.refresh(false);
    });
    this.unlisten = () => sub.unlisten();
    try {
      await sql.notify(REPLICA_JOINED_CHANNEL, self.id);
    } catch (err) {
      // The start fails: nothing of it is left listening.
      await this.unlisten().catch(() => undefined);
      this.unlisten = null;
      throw err;
    }
    await this.refresh(false);
    this.timer = setInterval(() => void this.refresh(true), this.options.refreshMs);
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.unlisten?.().catch(() => undefined);
    this.unlisten = null;
    await this.refreshing;
    await removeReplica(this.options.sql, this.options.self.id).catch((err: unknown) => {
      this.log.warn({ err: (err as Error).message }, 'could not remove this replica from the registry; it ages out');
    });
  }

  /** The live replicas as of the last refresh, this one included. */
  replicas(): readonly ReplicaRow[] {
    return this.live;
  }

  /** Addresses agents dial: the live replicas. */
  addresses(): ReplicaAddress[] {
    const known = this.live.some((r) => r.id === this.options.self.id) ? this.live : [...this.live, this.options.self];
    return known.map((r) => ({ id: r.id, url: r.url }));
  }

  /**
   * Since when heartbeats have been recorded without a gap: the start of the longest-running live
   * replica (each records heartbeats from its start). Null before the first refresh.
   */
  recordingSince(): Date | null {
    const starts = this.live.map((r) => r.started_at.getTime());
    return starts.length === 0 ? null : new Date(Math.min(...starts));
  }

  /** Called with the new list whenever the set of live replicas or their URLs change. */
  onChange(listener: (replicas: readonly ReplicaAddress[]) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private refresh(write: boolean): Promise<void> {
    this.refreshing ??= this.doRefresh(write).finally(() => {
      this.refreshing = null;
      if (this.again && this.unlisten !== null) {
        this.again = false;
        void this.refresh(false);
      }
    });
    return this.refreshing;
  }

  private async doRefresh(write: boolean): Promise<void> {
    const { sql, self, liveMs } = this.options;
    try {
      if (write) await upsertReplica(sql, self, false, liveMs, this.options.linkedHosts());
      const rows = await liveReplicas(sql, liveMs);
      const before = addressKey(this.live);
      this.live = rows;
      if (addressKey(rows) !== before) {
        this.log.info({ replicas: rows.map((r) => ({ id: r.id, url: r.url })) }, 'live replicas changed');
        const addresses = this.addresses();
        for (const listener of this.listeners) listener(addresses);
      }
      this.compareSettings(rows);
      // About once a minute per replica, with no timer of its own: rows of crashed replicas go.
      if (Math.random() < this.options.refreshMs / 60_000) await pruneReplicas(sql, PRUNE_AFTER_MS);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'replica registry refresh failed');
    }
  }

  private compareSettings(rows: readonly ReplicaRow[]): void {
    const mine = this.options.self.settings;
    for (const other of rows) {
      if (other.id === this.options.self.id) continue;
      for (const name of new Set([...Object.keys(mine), ...Object.keys(other.settings)])) {
        const here = mine[name] ?? null;
        const there = other.settings[name] ?? null;
        const key = `${other.id} ${name} ${String(there)}`;
        if (here === there || this.warned.has(key)) continue;
        this.warned.add(key);
        this.log.error({ setting: name, here, there, replica: other.id }, 'another live replica has a different setting; every replica must share it');
      }
    }
  }
}

function addressKey(rows: readonly ReplicaRow[]): string {
  return rows.map((r) => `${r.id}=${r.url}`).sort().join(' ');
}

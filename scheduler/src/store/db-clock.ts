/**
 * The database's clock, as read from this replica. Every time the records hold comes from the
 * database's `now()`: when an operation started, when a host was last heard from, when a replica
 * started. A replica that measured an age against one of them with its own clock was off by its
 * skew: one whose clock ran minutes ahead failed operations as past their deadline at their first
 * retryable error, skipped the grace a new leader gives silent hosts, and billed a move's stop at a
 * time the database never saw. Ages are measured on this clock instead.
 *
 * It is the database's `now()` read at a sync, plus the time elapsed since on the monotonic clock
 * (half the round trip counted on each side), so a step of this machine's wall clock does not
 * move it; it syncs again every SYNC_MS. Before its first sync (or when it cannot reach the
 * database) it reads this machine's clock.
 */
import type { Sql } from './db.js';

const SYNC_MS = 30_000;

export class DatabaseClock {
  /** The database's time at the last sync, and the monotonic time it corresponds to. */
  private at: { readonly db: number; readonly mono: number } | null = null;
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly sql: Sql) {}

  /** Milliseconds since the epoch, as the database's `now()` would say it. */
  now(): number {
    return this.at === null ? Date.now() : this.at.db + (performance.now() - this.at.mono);
  }

  /** Reads the database's clock; rejects when the database cannot be reached. */
  async sync(): Promise<void> {
    const before = performance.now();
    const [row] = await this.sql<Array<{ now: Date }>>`SELECT now() AS now`;
    const after = performance.now();
    this.at = { db: row!.now.getTime(), mono: (before + after) / 2 };
  }

  /** Syncs now, then every SYNC_MS; a failed sync keeps the last reading. */
  async start(): Promise<void> {
    await this.sync().catch(() => undefined);
    this.timer ??= setInterval(() => void this.sync().catch(() => undefined), SYNC_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}

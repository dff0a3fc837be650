/**
 * Idle timeout: an awake desktop whose `idle_timeout_secs` has elapsed since its last wake (not
 * since guest activity, docs/api.md §3.2) is hibernated through an ordinary operation, reason
 * `idle_timeout`. An ephemeral fork is destroyed instead (docs/api.md §4.1), awake or not. Leader-only.
 */
import type { Logger } from '../../../shared/src/log.js';
import type { Sql } from '../store/db.js';
import { idleDesktops } from '../store/desktops.js';
import { ApiError } from '../errors.js';
import type { LifecycleService } from '../services/lifecycle.js';
import type { DesktopRow } from '../store/rows.js';
import { LeaseLost } from '../store/leases.js';
import type { SettleFence } from '../store/operations.js';

/** How many due desktops one sweep looks at. */
export const IDLE_SWEEP_BATCH = 50;

export class IdleSweeper {
  private timer: NodeJS.Timeout | null = null;
  private readonly log: Logger;

  constructor(
    private readonly sql: Sql,
    private readonly lifecycle: LifecycleService,
    private readonly intervalMs: number,
    logger: Logger,
    /**
     * The term this replica leads in, or null (engine/leader.ts): a sweep starts only in one,
     * and each request it makes is fenced on it.
     */
    private readonly term: () => SettleFence | null,
  ) {
    this.log = logger.child({ component: 'idle-sweeper' });
  }

  start(): void {
    if (!this.timer) this.timer = setInterval(() => void this.sweep(), this.intervalMs);
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  async sweep(): Promise<void> {
    const term = this.term();
    if (term === null) return;
    try {
      for (const d of await idleDesktops(this.sql, IDLE_SWEEP_BATCH)) {
        try {
          const kind = d.ephemeral ? 'destroy' : 'hibernate';
          // Only if nothing that made it due changed since it was read: a PATCH of its timeout
          // answered 200 meanwhile must hold, and so must a wake, from which the timeout counts.
          const stillDue = (now: DesktopRow) =>
            now.state === d.state && now.idle_timeout_secs === d.idle_timeout_secs && now.last_woken_at?.getTime() === d.last_woken_at?.getTime();
          await this.lifecycle.request(d.org_id, d.id, kind, { expectedGeneration: null, idempotencyKey: null, reason: 'idle_timeout', stillDue, term });
          this.log.info({ desktopId: d.id, kind }, 'idle timeout');
        } catch (err) {
          // 409: an operation on it is already open, or it changed state meanwhile.
          if (!(err instanceof ApiError)) throw err;
        }
      }
    } catch (err) {
      if (err instanceof LeaseLost) this.log.info('idle sweep stopped: another replica leads now');
      else this.log.error({ err }, 'idle sweep failed');
    }
  }
}

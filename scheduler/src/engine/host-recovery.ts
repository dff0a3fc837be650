/**
 * Host failure recovery (SPEC 3.2): when a host has not been heard from for the grace period,
 * its awake desktops are force-hibernated — state `hibernated`, generation bumped, meter closed,
 * `desktop.hibernated` with `data.reason: "host_failure"`. Their disks stay on the host.
 *
 * The generation bump is what fences the host if it returns: its agent then holds an older
 * generation than the scheduler, and on its next hello the engine reconciles every desktop the
 * host still runs (see `reconcile` in steps.ts), hibernating it with the new generation so its
 * memory becomes the snapshot the next wake restores. Leader-only.
 */
import type { Logger } from '../../../shared/src/log.js';
import { inTransaction, type Sql } from '../store/db.js';
import { transition } from '../store/desktops.js';
import { closeMeter, recordEvent } from '../store/events.js';
import { desktopsOnSilentHosts } from '../store/hosts.js';

export class HostRecovery {
  private timer: NodeJS.Timeout | null = null;
  private leadingSince = 0;
  private readonly log: Logger;

  constructor(
    private readonly sql: Sql,
    private readonly connectedHosts: () => string[],
    private readonly graceMs: number,
    private readonly intervalMs: number,
    logger: Logger,
  ) {
    this.log = logger.child({ component: 'host-recovery' });
  }

  start(): void {
    // A host's heartbeats reach only the leader, so a new leader (or one back after an outage)
    // sees stale timestamps everywhere: every host gets a full grace period from now first.
    this.leadingSince = Date.now();
    if (!this.timer) this.timer = setInterval(() => void this.sweep(), this.intervalMs);
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  async sweep(): Promise<void> {
    if (Date.now() - this.leadingSince < this.graceMs) return;
    try {
      for (const d of await desktopsOnSilentHosts(this.sql, this.graceMs, this.connectedHosts())) {
        await inTransaction(this.sql, async (tx) => {
          const moved = await transition(tx, d.id, ['awake'], 'hibernated');
          if (!moved) return;
          await closeMeter(tx, d.id);
          await recordEvent(tx, {
            orgId: moved.org_id,
            desktopId: d.id,
            type: 'desktop.hibernated',
            data: { reason: 'host_failure', host_id: d.host_id, memory_snapshot: false },
          });
        });
        this.log.warn({ desktopId: d.id, hostId: d.host_id }, 'host silent past the grace period: desktop force-hibernated');
      }
    } catch (err) {
      this.log.error({ err }, 'host recovery sweep failed');
    }
  }
}

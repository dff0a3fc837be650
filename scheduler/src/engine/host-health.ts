/**
 * Host health, on the leader: application heartbeats, recorded by every replica in
 * `hosts.last_seen_at`, decide. A host no replica has heard from for `downMs` reads `down` at
 * once: nothing is placed there, its desktops show `host_status: "down"`, and guest operations on
 * them already answer 503 on every replica (each drops its own silent link, agents/gateway.ts).
 *
 * After the grace period (docs/api.md §3.2) its awake desktops are force-hibernated: state `hibernated`,
 * generation bumped, meter closed at the moment the host was last heard from (not at the sweep:
 * nothing is billed for time nobody could see it run), `desktop.hibernated` with
 * `data.reason: "host_failure"`. Their disks stay on the host. If it returns, its agent stops
 * them before it reports ready (fleet/hello-fence.ts), keeping their memory for the next wake.
 *
 * Heartbeats are only recorded while some replica runs and reaches the database. After a gap
 * with none (the whole deployment was down, or the database was out of reach: fleet/registry.ts),
 * a host is judged only once heartbeats have been recorded for a full grace period again: silence
 * nobody could have heard is not a failure. Nor is a host failed while the leader's own link to
 * it is alive (it drops a link silent for `downMs`): heartbeats it could not record are not
 * silence. Each desktop's transaction checks its host again, locked, so a hello committed
 * meanwhile (whose fence read the desktop as awake) wins over the force-hibernate.
 */
import type { Logger } from '../../../shared/src/log.js';
import { inTransaction, type Sql } from '../store/db.js';
import { transition } from '../store/desktops.js';
import { closeMeter, recordEvent } from '../store/events.js';
import { assertTerm, LeaseLost } from '../store/leases.js';
import type { SettleFence } from '../store/operations.js';
import { awakeWithoutOperation, desktopsOnSilentHosts, markSilentHostsDown, stillSilent } from '../store/hosts.js';

export interface HostHealthOptions {
  readonly sql: Sql;
  /** The database's clock (store/db-clock.ts): the times compared here are the database's. */
  readonly clock?: { now(): number };
  /** Silence after which a host is `down`. */
  readonly downMs: number;
  /** Silence after which its awake desktops are force-hibernated. */
  readonly graceMs: number;
  readonly intervalMs: number;
  /** Since when heartbeats have been recorded without a gap (fleet/registry.ts). */
  recordingSince(): Date | null;
  /** Whether this replica's link to the host is alive (agents/gateway.ts). */
  isLinked(hostId: string): boolean;
  /**
   * The term this replica leads in, or null (engine/leader.ts): a sweep starts only in one, and
   * its writes (a host marked down, a desktop force-hibernated) are fenced on it.
   */
  term(): SettleFence | null;
  readonly logger: Logger;
  /** Told of each host found silent, for metrics. */
  onDown?(hostId: string, silentMs: number): void;
}

export class HostHealth {
  private timer: NodeJS.Timeout | null = null;
  private sweeping: Promise<void> | null = null;
  private leadingSince = 0;
  private readonly log: Logger;

  constructor(private readonly options: HostHealthOptions) {
    this.log = options.logger.child({ component: 'host-health' });
  }

  private now(): number {
    return this.options.clock?.now() ?? Date.now();
  }

  start(): void {
    this.leadingSince = this.now();
    if (!this.timer) this.timer = setInterval(() => void this.sweep(), this.options.intervalMs);
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.sweeping;
  }

  sweep(): Promise<void> {
    this.sweeping ??= this.doSweep().finally(() => (this.sweeping = null));
    return this.sweeping;
  }

  private async doSweep(): Promise<void> {
    const { sql, downMs, graceMs } = this.options;
    const term = this.options.term();
    if (term === null) return;
    try {
      for (const h of await markSilentHostsDown(sql, downMs, (id) => this.options.isLinked(id), term)) {
        const silentMs = this.now() - h.last_seen_at.getTime();
        this.log.warn({ hostId: h.id, last_heard: h.last_seen_at.toISOString(), silent_ms: silentMs }, 'host down: no heartbeat');
        this.options.onDown?.(h.id, silentMs);
      }
      // Silence counts from when heartbeats were being recorded at all (see the module comment).
      const since = Math.max(this.options.recordingSince()?.getTime() ?? this.leadingSince, 0);
      if (this.now() - since < graceMs) return;
      for (const d of await desktopsOnSilentHosts(sql, graceMs)) {
        if (this.options.isLinked(d.host_id)) continue;
        const done = await inTransaction(sql, async (tx) => {
          if (!(await stillSilent(tx, d.host_id, graceMs))) return false;
          // Under the desktop's lock, as an API request takes it: an operation recorded since the
          // sweep read it (a destroy, a move) keeps the desktop as that operation found it.
          if (!(await awakeWithoutOperation(tx, d.id))) return false;
          // After the lock waits, and held to the commit.
          await assertTerm(tx, term);
          const moved = await transition(tx, d.id, ['awake'], 'hibernated');
          if (!moved) return false;
          await closeMeter(tx, d.id, d.last_seen_at);
          await recordEvent(tx, {
            orgId: moved.org_id,
            desktopId: d.id,
            type: 'desktop.hibernated',
            // Not known yet: the host is unreachable. Should it return, its hello fence stops the
            // desktop keeping its memory where it can (the next desktop.woken says `restored`);
            // should it never, the disk is lost with it too. `false` told webhook consumers the
            // programs were lost when they mostly were not.
            data: { reason: 'host_failure', cause: 'host_silent', host_id: d.host_id, memory_snapshot: null },
          });
          return true;
        });
        if (done) this.log.warn({ desktopId: d.id, hostId: d.host_id, last_heard: d.last_seen_at.toISOString() }, 'host silent past the grace period: desktop force-hibernated');
      }
    } catch (err) {
      if (err instanceof LeaseLost) this.log.info('host health sweep stopped: another replica leads now');
      else this.log.error({ err }, 'host health sweep failed');
    }
  }
}

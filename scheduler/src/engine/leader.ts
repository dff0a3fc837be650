/**
 * Leadership: the one place leader-only work is switched on and off. A replica holds the
 * `leader` lease row while it renews it in time; `establish` runs when it gains the lease and
 * `revoke` when it loses it (or stops). Nothing else asks "am I leader?" except request paths
 * that must answer 503 on a follower.
 *
 * The local view is conservative: leadership counts as lost as soon as a renewal is overdue by
 * the TTL measured from when that renewal was sent, even if the database has not answered yet.
 */
import type { Logger } from '../../../shared/src/log.js';
import type { Sql } from '../store/db.js';
import { acquireLease, releaseLease } from '../store/leases.js';

export const LEADER_LEASE = 'leader';

export interface LeadershipHooks {
  establish(): Promise<void>;
  revoke(): Promise<void>;
}

export class Leadership {
  private leader = false;
  private validUntil = 0;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private transitioning: Promise<void> = Promise.resolve();
  private readonly log: Logger;

  constructor(
    private readonly sql: Sql,
    readonly holder: string,
    private readonly ttlMs: number,
    private readonly renewMs: number,
    private readonly hooks: LeadershipHooks,
    logger: Logger,
  ) {
    this.log = logger.child({ component: 'leadership', holder });
  }

  isLeader(): boolean {
    return this.leader && Date.now() < this.validUntil;
  }

  async start(): Promise<void> {
    await this.round();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.transitioning;
    if (this.leader) {
      this.leader = false;
      await this.hooks.revoke().catch((err: unknown) => this.log.error({ err }, 'revoke failed'));
      await releaseLease(this.sql, LEADER_LEASE, this.holder).catch(() => {});
    }
  }

  private async round(): Promise<void> {
    if (this.stopped) return;
    const sentAt = Date.now();
    let held = false;
    try {
      held = await acquireLease(this.sql, LEADER_LEASE, this.holder, this.ttlMs);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'lease renewal failed');
      held = this.leader && Date.now() < this.validUntil;
    }
    if (held) this.validUntil = sentAt + this.ttlMs;
    if (held !== this.leader && !this.stopped) {
      this.leader = held;
      this.transitioning = held ? this.gain() : this.lose();
      await this.transitioning;
    }
    if (!this.stopped) this.timer = setTimeout(() => void this.round(), this.renewMs);
  }

  private async gain(): Promise<void> {
    this.log.info('became leader');
    await this.hooks.establish().catch((err: unknown) => this.log.error({ err }, 'establishing leadership failed'));
  }

  private async lose(): Promise<void> {
    this.log.warn('lost leadership');
    await this.hooks.revoke().catch((err: unknown) => this.log.error({ err }, 'revoking leadership failed'));
  }
}

/**
 * Leadership: the one place leader-only work is switched on and off. A replica holds the
 * `leader` lease row while it renews it in time; `establish` runs when it gains the lease (with
 * the term's epoch) and `revoke` when it loses it (or stops). Nothing else asks "am I leader?"
 * except the engine's own fence on the commands it sends.
 *
 * The local view is conservative: leadership counts as lost as soon as a renewal is overdue by
 * the TTL measured from when that renewal was sent, even if the database has not answered yet.
 * A renewal that finds a new epoch (the lease lapsed in between) ends the old term and starts a
 * new one, so work of the old term is never carried on under the new epoch.
 *
 * Handover: a leader that stops expires its lease at once and notifies the others, which try to
 * take it the moment the notification arrives instead of at their next round. Followers try every
 * renewal interval otherwise, so a dead leader is replaced within TTL plus one interval.
 */
import type { Logger } from '../../../shared/src/log.js';
import type { Sql } from '../store/db.js';
import { acquireLease, LEADER_LEASE, LEASE_RELEASED_CHANNEL, releaseLease } from '../store/leases.js';

export { LEADER_LEASE };

export interface LeaderTerm {
  readonly holder: string;
  readonly epoch: number;
}

export interface LeadershipHooks {
  establish(term: LeaderTerm): Promise<void>;
  revoke(): Promise<void>;
}

export class Leadership {
  private leader = false;
  private epoch = 0;
  private validUntil = 0;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private rounding: Promise<void> | null = null;
  private again = false;
  private unlisten: (() => Promise<void>) | null = null;
  private readonly log: Logger;

  constructor(
    private readonly sql: Sql,
    readonly holder: string,
    private readonly ttlMs: number,
    private readonly renewMs: number,
    private readonly hooks: LeadershipHooks,
    logger: Logger,
  ) {
    this.log = logger.child({ component: 'leadership', replica: holder });
  }

  isLeader(): boolean {
    return this.leader && Date.now() < this.validUntil;
  }

  /** This replica's term while it leads; null otherwise. */
  term(): LeaderTerm | null {
    return this.isLeader() ? { holder: this.holder, epoch: this.epoch } : null;
  }

  async start(): Promise<void> {
    const sub = await this.sql.listen(LEASE_RELEASED_CHANNEL, (name) => {
      if (name === LEADER_LEASE && !this.leader) void this.round();
    });
    this.unlisten = () => sub.unlisten();
    await this.round();
  }

  /** Hands the lease over at once (expired and announced), then stops leader-only work. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.unlisten?.().catch(() => {});
    await this.rounding;
    if (this.leader) {
      this.leader = false;
      await releaseLease(this.sql, LEADER_LEASE, this.holder).then(
        () => this.log.info({ epoch: this.epoch }, 'released the leader lease'),
        (err: unknown) => this.log.warn({ err: (err as Error).message }, 'could not release the leader lease; it expires by itself'),
      );
      await this.hooks.revoke().catch((err: unknown) => this.log.error({ err }, 'revoke failed'));
    }
  }

  /** One attempt to take or renew the lease; concurrent calls coalesce into one more round. */
  private round(): Promise<void> {
    if (this.rounding) {
      this.again = true;
      return this.rounding;
    }
    this.rounding = this.attempt().finally(() => {
      this.rounding = null;
      if (this.again && !this.stopped) {
        this.again = false;
        void this.round();
      }
    });
    return this.rounding;
  }

  private async attempt(): Promise<void> {
    if (this.stopped) return;
    if (this.timer) clearTimeout(this.timer);
    const sentAt = Date.now();
    let held = false;
    let epoch = 0;
    try {
      ({ held, epoch } = await acquireLease(this.sql, LEADER_LEASE, this.holder, this.ttlMs));
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'lease renewal failed');
      held = this.isLeader();
      epoch = this.epoch;
    }
    if (this.stopped) return;
    if (held) this.validUntil = sentAt + this.ttlMs;
    if (this.leader && (!held || epoch !== this.epoch)) {
      this.leader = false;
      this.log.warn({ epoch: this.epoch, next_epoch: held ? epoch : null }, 'lost the leader lease');
      await this.hooks.revoke().catch((err: unknown) => this.log.error({ err }, 'revoking leadership failed'));
    }
    if (held && !this.leader && !this.stopped) {
      this.leader = true;
      this.epoch = epoch;
      this.log.info({ epoch }, 'took the leader lease');
      await this.hooks.establish({ holder: this.holder, epoch }).catch((err: unknown) => this.log.error({ err }, 'establishing leadership failed'));
    }
    if (!this.stopped) this.timer = setTimeout(() => void this.round(), this.renewMs);
  }
}

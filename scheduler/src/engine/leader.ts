/**
 * Leadership: the one place leader-only work is switched on and off. A replica holds the
 * `leader` lease row while it renews it in time; `establish` runs when it gains the lease (with
 * the term's epoch) and `revoke` when it loses it (or stops). Nothing else asks "am I leader?"
 * except the engine's own fence on the commands it sends.
 *
 * The local view is conservative: leadership counts as lost as soon as a renewal is overdue by
 * the TTL measured from when that renewal was sent, even if the database has not answered yet,
 * and only an answer of the database extends it (a renewal that failed does not). It runs on a
 * monotonic clock: a step of the wall clock must not stretch it. A renewal that finds a new
 * epoch (the lease lapsed in between) ends the old term and starts a new one, so work of the old
 * term is never carried on under the new epoch.
 *
 * `establish` and `revoke` run one after another on a chain of their own, not in the renewal
 * round: a revoke waits for the engine's steps in flight (seconds), and a renewal held behind it
 * would let the lease lapse, which starts yet another term. A term whose `establish` failed is
 * given up (revoked) and established again at the next round, instead of leading with nothing
 * running.
 *
 * Handover: a leader that stops expires its lease at once and notifies the others, which try to
 * take it the moment the notification arrives instead of at their next round. Followers try every
 * renewal interval otherwise, so a dead leader is replaced within TTL plus one interval.
 */
import { randomUUID } from 'node:crypto';
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
  /** This process, beside its replica id, in the lease (store/leases.ts `LeaseInstance`). */
  private readonly instance = randomUUID();
  private everHeld = false;
  /** `establish` and `revoke`, in the order the rounds asked for them. */
  private hooksChain: Promise<void> = Promise.resolve();
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
    return this.leader && performance.now() < this.validUntil;
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
    await this.hooksChain;
  }

  /** Hands the lease over at once (expired and announced), then stops leader-only work. */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.unlisten?.().catch(() => {});
    await this.rounding;
    await this.hooksChain;
    if (this.leader) {
      this.leader = false;
      await releaseLease(this.sql, LEADER_LEASE, this.holder, this.ttlMs).then(
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
    const sentAt = performance.now();
    let held = false;
    let epoch = 0;
    let answered = false;
    try {
      // Bounded by the TTL: an answer later than that could not keep this replica leader anyway.
      ({ held, epoch } = await acquireLease(this.sql, LEADER_LEASE, this.holder, this.ttlMs, { id: this.instance, fresh: !this.everHeld }, this.ttlMs));
      answered = true;
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'lease renewal failed');
      // Still within what the last answer granted, or not: nothing is extended without one.
      held = this.isLeader();
      epoch = this.epoch;
    }
    if (this.stopped) return;
    if (answered && held) {
      this.validUntil = sentAt + this.ttlMs;
      this.everHeld = true;
    }
    if (this.leader && (!held || epoch !== this.epoch)) {
      this.leader = false;
      this.log.warn({ epoch: this.epoch, next_epoch: held ? epoch : null }, 'lost the leader lease');
      this.hook(() => this.hooks.revoke(), 'revoking leadership failed');
    }
    if (held && !this.leader && !this.stopped) {
      this.leader = true;
      this.epoch = epoch;
      this.log.info({ epoch }, 'took the leader lease');
      this.hook(async () => {
        try {
          await this.hooks.establish({ holder: this.holder, epoch });
        } catch (err) {
          // Leading with nothing running would last the whole term: give it up, and take it
          // again (the same epoch while the lease holds) at the next round.
          this.log.error({ err, epoch }, 'establishing leadership failed; trying again');
          if (this.leader && this.epoch === epoch) this.leader = false;
          await this.hooks.revoke();
        }
      }, 'revoking a term that failed to start failed');
    }
    // Armed before the hooks have run: the next renewal must not wait for them.
    if (!this.stopped) this.timer = setTimeout(() => void this.round(), this.renewMs);
  }

  /** Runs a hook after those asked for before it. */
  private hook(work: () => Promise<void>, failed: string): void {
    this.hooksChain = this.hooksChain.then(work).catch((err: unknown) => this.log.error({ err }, failed));
  }
}

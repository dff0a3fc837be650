/**
 * Leader terms, as this agent has seen them. The scheduler's leader sends lifecycle commands with
 * the epoch of its lease term (scheduler/src/store/leases.ts); replicas announce a new term as
 * soon as it begins, and every hello reply carries the current one. A lifecycle command from an
 * older term than the newest seen here comes from a deposed leader that has not noticed yet: it
 * is refused with `stale_epoch` and does nothing. Guest operations are not fenced here (any
 * replica serves them); lifecycle commands are also fenced per desktop by generation.
 *
 * Kept in memory only: a restarted agent learns the current term from the first hello reply,
 * before any command can reach it on that link.
 */
import { AgentFailure } from '../../shared/src/protocol.js';

export class LeaderEpochs {
  private highest = 0;

  /** The newest term seen; 0 before any. */
  get current(): number {
    return this.highest;
  }

  observe(epoch: number): void {
    if (epoch > this.highest) this.highest = epoch;
  }

  /** Refuses a command of an older term; a command without one (an older scheduler) passes. */
  admit(epoch: number | undefined): void {
    if (epoch === undefined) return;
    if (epoch < this.highest) {
      throw new AgentFailure('stale_epoch', `leader epoch ${epoch} is older than ${this.highest} seen here`, false);
    }
    this.highest = epoch;
  }
}

/**
 * The host's bound on CPU-heavy lifecycle work. Starts (a cold boot or a restore from memory),
 * hibernates (a memory dump) and forks of different desktops run in parallel, but each costs tens
 * to hundreds of milliseconds of CPU, so a burst larger than the cores can take makes every one of
 * them crawl, all toward the scheduler's command timeout at once. At most `limit` run at once;
 * later ones wait in arrival order, inside their desktop's turn (desktop-queue.ts), and check
 * their fences once they have a slot, so a command that went stale while it waited is refused,
 * not run. The default, four per core, leaves the bursts measured (10 wakes, 30 and 60 cold
 * creates on two cores) as fast as without a bound, within the noise: half of a wake's time is
 * spent waiting (on the kernel, on X starting), and fewer slots (two per core) made the slowest of
 * ten wakes slower. Limit 0 removes the bound.
 *
 * Cheap or freeing commands (prepare, destroy, inspect) and moves (bounded by the drain's own
 * parallelism, and mostly waiting on the network) do not take a slot.
 */
import { availableParallelism } from 'node:os';

export function defaultLifecycleSlots(cores: number = availableParallelism()): number {
  return Math.max(4, 4 * cores);
}

export class LifecycleSlots {
  private busy = 0;
  private readonly waiting: Array<() => void> = [];

  /** `limit` commands at once; 0 for no bound. */
  constructor(readonly limit: number) {}

  /** Commands holding a slot now. */
  get running(): number {
    return this.busy;
  }

  /** Commands waiting for one. */
  get queued(): number {
    return this.waiting.length;
  }

  /** Runs `work` once a slot is free; the slot passes to the next waiter when it settles. */
  async run<T>(work: () => Promise<T>): Promise<T> {
    if (this.limit > 0 && this.busy >= this.limit) {
      // The slot is handed over by the finishing command, so `busy` never drops in between and
      // a newcomer cannot overtake the queue.
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else {
      this.busy++;
    }
    try {
      return await work();
    } finally {
      const next = this.waiting.shift();
      if (next !== undefined) next();
      else this.busy--;
    }
  }
}

/**
 * When a failed delivery attempt is tried again. The wait doubles after each failure from
 * `baseMs` up to `maxMs` (exponential backoff), and half of each wait is random ("equal
 * jitter"): receivers that failed together, say during one outage, are not hit again in
 * lock-step when they come back, while every wait stays at least half its nominal length so a
 * struggling receiver still gets room. After `maxAttempts` attempts the delivery fails for good.
 *
 * With the defaults (10 attempts, 30 s base, 1 h cap) the nominal waits are 30 s, 1, 2, 4, 8, 16
 * and 32 min and then 1 h twice: about three hours of retrying in all (between half that and
 * all of it with jitter).
 */

export interface RetryPolicy {
  /** Attempts in all, the first included. */
  readonly maxAttempts: number;
  /** Nominal wait after the first failed attempt. */
  readonly baseMs: number;
  /** Cap on the nominal wait. */
  readonly maxMs: number;
}

/** The nominal (jitter-free) wait after `attemptsMade` failed attempts. */
export function nominalDelayMs(attemptsMade: number, policy: RetryPolicy): number {
  const doublings = Math.max(0, attemptsMade - 1);
  // 2^31 keeps the product finite; the cap is reached long before for any sane base.
  return Math.min(policy.maxMs, policy.baseMs * 2 ** Math.min(doublings, 31));
}

/**
 * The wait before the next attempt after `attemptsMade` attempts have failed, or null when no
 * attempt is left. `random` returns a number in [0, 1).
 */
export function retryDelayMs(attemptsMade: number, policy: RetryPolicy, random: () => number = Math.random): number | null {
  if (attemptsMade >= policy.maxAttempts) return null;
  const nominal = nominalDelayMs(attemptsMade, policy);
  return Math.round(nominal / 2 + random() * (nominal / 2));
}

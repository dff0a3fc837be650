/**
 * Desktop tiers: the sizes a desktop can be created with, their resource limits (enforced by the
 * runtime), their weight on awake seconds and their prices (docs/api.md §4.9). Prices are in cents.
 */
import { Type, type TLiteral } from '@sinclair/typebox';

export const TIERS = ['small', 'default', 'large'] as const;
export type Tier = (typeof TIERS)[number];

/** The tier as a wire schema (API bodies, agent commands), made from TIERS: the one definition. */
export const TierSchema = Type.Union(TIERS.map((t) => Type.Literal(t)) as Array<TLiteral<Tier>>);

export interface TierSpec {
  readonly vcpus: number;
  readonly memoryMb: number;
  /** Process-count limit inside the desktop (pids cgroup). */
  readonly maxPids: number;
  /** Multiplier applied to awake seconds for `weighted_awake_seconds`. */
  readonly weight: number;
  readonly monthlyCents: number;
  /**
   * Storage slots a placed desktop holds on its host, awake or not: its disk and its memory
   * snapshot, which grows with the tier's memory (one slot per 4 GiB).
   */
  readonly slots: number;
}

export const TIER_SPECS: Readonly<Record<Tier, TierSpec>> = {
  small: { vcpus: 2, memoryMb: 4096, maxPids: 1024, weight: 0.5, monthlyCents: 600, slots: 1 },
  default: { vcpus: 4, memoryMb: 8192, maxPids: 2048, weight: 1.0, monthlyCents: 1200, slots: 2 },
  large: { vcpus: 8, memoryMb: 16384, maxPids: 4096, weight: 2.0, monthlyCents: 2400, slots: 4 },
};

/** The hourly rate is the monthly price divided by 667 (docs/api.md §4.9). */
export const HOURS_PER_BILLING_MONTH = 667;

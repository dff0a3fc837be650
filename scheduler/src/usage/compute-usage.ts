/**
 * The `GET /v1/usage` report (docs/api.md §4.9), computed from plain rows so it can be tested without a
 * database.
 *
 * Two quantities are measured per desktop, both as the overlap of time spans with the query range
 * [start, end]: awake time (the union of its meter intervals; an interval still open is counted up
 * to `now`) and lifetime (from creation to destruction, or to `now` while it exists). Awake time,
 * weighted by tier, drives hourly billing; lifetime, expressed in 30-day "desktop months", drives
 * monthly billing.
 *
 * All span arithmetic is done in integer milliseconds, which `Date` guarantees. The reported
 * seconds and months are divided once at the end (millisecond precision is kept, so values may be
 * fractional), and cents are computed from the integer milliseconds as an exact ratio and rounded
 * half-up with BigInt arithmetic (see `rounding.ts`) so that a cost that is exactly n.5 cents never
 * turns into n.4999… and rounds down.
 */
import { HOURS_PER_BILLING_MONTH, TIER_SPECS, type Tier } from '../../../shared/src/tiers.js';
import { roundHalfUpRatio, toExactInteger } from './rounding.js';

export { parseUsageRange, type UsageRange } from './usage-range.js';

export type BillingMode = 'monthly' | 'hourly';

export interface UsageDesktop {
  id: string;
  tier: Tier;
  billingMode: BillingMode;
  createdAt: Date;
  destroyedAt: Date | null;
}

/** One stretch of metered awake time. `endedAt === null` means the meter is still open. */
export interface MeterInterval {
  desktopId: string;
  startedAt: Date;
  endedAt: Date | null;
}

export interface UsageQuery {
  start: Date;
  end: Date;
  /** Where open meter intervals and live desktops' lifetimes end. */
  now: Date;
}

export interface UsageLine {
  desktop_id: string;
  awake_seconds: number;
  weighted_awake_seconds: number;
  desktop_months: number;
  billing_mode: string;
  projected_cost_cents: number;
}

export interface UsageReport {
  per_desktop: UsageLine[];
  org_awake_seconds_weighted: number;
  org_desktop_months: number;
  org_projected_cost_cents: number;
}

const MS_PER_SECOND = 1000;
const MS_PER_HOUR = 3_600_000;
/** docs/api.md §4.9: a desktop month is 30 days. */
export const MS_PER_DESKTOP_MONTH = 30 * 86_400 * MS_PER_SECOND;

interface Span {
  start: number;
  end: number;
}

/** Clips `span` to `range`; returns null when nothing of positive length is left. */
function clip(span: Span, range: Span): Span | null {
  const start = Math.max(span.start, range.start);
  const end = Math.min(span.end, range.end);
  return end > start ? { start, end } : null;
}

/**
 * Total length of the union of the spans. Meter intervals of one desktop should never overlap,
 * but if a bug or a replayed write ever produced overlapping rows, summing them would bill the
 * same second twice; the union bills it once.
 */
function unionLengthMs(spans: Span[]): number {
  const sorted = [...spans].sort((a, b) => a.start - b.start);
  let total = 0;
  let current: Span | null = null;
  for (const span of sorted) {
    if (current !== null && span.start <= current.end) {
      current.end = Math.max(current.end, span.end);
      continue;
    }
    if (current !== null) total += current.end - current.start;
    current = { ...span };
  }
  if (current !== null) total += current.end - current.start;
  return total;
}

/**
 * Projected cost in whole cents, exactly rounded half-up.
 * hourly:  awake_seconds / 3600 × (monthlyCents / 667) = awakeMs × monthlyCents / (3_600_000 × 667)
 * monthly: desktop_months × monthlyCents = lifetimeMs × monthlyCents / 2_592_000_000
 * The hourly rate is deliberately not rounded before multiplying (600/667 ≈ 0.8996 ¢/h), because
 * docs/api.md §4.9 defines it as the quotient, not as a rounded 0.9 ¢.
 */
function projectedCents(mode: BillingMode, tier: Tier, awakeMs: number, lifetimeMs: number): number {
  const monthlyCents = toExactInteger(TIER_SPECS[tier].monthlyCents, 'monthlyCents');
  if (mode === 'hourly') {
    const numerator = toExactInteger(awakeMs, 'awake milliseconds') * monthlyCents;
    const denominator = BigInt(MS_PER_HOUR) * toExactInteger(HOURS_PER_BILLING_MONTH, 'HOURS_PER_BILLING_MONTH');
    return roundHalfUpRatio(numerator, denominator);
  }
  const numerator = toExactInteger(lifetimeMs, 'lifetime milliseconds') * monthlyCents;
  return roundHalfUpRatio(numerator, BigInt(MS_PER_DESKTOP_MONTH));
}

export function computeUsage(
  desktops: UsageDesktop[],
  intervals: MeterInterval[],
  query: UsageQuery,
): UsageReport {
  const range: Span = { start: query.start.getTime(), end: query.end.getTime() };
  const now = query.now.getTime();

  const awakeSpans = new Map<string, Span[]>();
  for (const interval of intervals) {
    const span = clip({ start: interval.startedAt.getTime(), end: interval.endedAt?.getTime() ?? now }, range);
    if (span === null) continue;
    const list = awakeSpans.get(interval.desktopId);
    if (list === undefined) awakeSpans.set(interval.desktopId, [span]);
    else list.push(span);
  }

  const lines: UsageLine[] = [];
  // Kept in integer (or half-integer, for weight 0.5) milliseconds so the org totals are exact
  // sums, divided once; summing the per-line floats would accumulate rounding error.
  let orgWeightedMs = 0;
  let orgLifetimeMs = 0;
  let orgCents = 0;

  for (const desktop of desktops) {
    const lifetime = clip(
      { start: desktop.createdAt.getTime(), end: desktop.destroyedAt?.getTime() ?? now },
      range,
    );
    const lifetimeMs = lifetime === null ? 0 : lifetime.end - lifetime.start;
    const awakeMs = unionLengthMs(awakeSpans.get(desktop.id) ?? []);
    // A desktop that did not exist during the range has nothing to report. Awake time without
    // lifetime overlap would mean inconsistent rows; it is still reported rather than silently
    // dropped from the bill.
    if (lifetimeMs === 0 && awakeMs === 0) continue;

    const weightedMs = awakeMs * TIER_SPECS[desktop.tier].weight;
    const cents = projectedCents(desktop.billingMode, desktop.tier, awakeMs, lifetimeMs);
    lines.push({
      desktop_id: desktop.id,
      awake_seconds: awakeMs / MS_PER_SECOND,
      weighted_awake_seconds: weightedMs / MS_PER_SECOND,
      desktop_months: lifetimeMs / MS_PER_DESKTOP_MONTH,
      billing_mode: desktop.billingMode,
      projected_cost_cents: cents,
    });
    orgWeightedMs += weightedMs;
    orgLifetimeMs += lifetimeMs;
    orgCents += cents;
  }

  lines.sort((a, b) => (a.desktop_id < b.desktop_id ? -1 : a.desktop_id > b.desktop_id ? 1 : 0));

  return {
    per_desktop: lines,
    org_awake_seconds_weighted: orgWeightedMs / MS_PER_SECOND,
    org_desktop_months: orgLifetimeMs / MS_PER_DESKTOP_MONTH,
    // The org total is the sum of the already-rounded lines, not the rounding of the exact org
    // total: an invoice whose lines do not add up to its total is a support ticket, and the
    // difference is at most half a cent per desktop.
    org_projected_cost_cents: orgCents,
  };
}

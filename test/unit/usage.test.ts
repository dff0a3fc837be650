import { describe, expect, it } from 'vitest';
import {
  computeUsage,
  parseUsageRange,
  type MeterInterval,
  type UsageDesktop,
} from '../../scheduler/src/usage/compute-usage.js';
import { roundHalfUpRatio } from '../../scheduler/src/usage/rounding.js';

// A fixed 30-day range, so that "the whole range" is exactly one desktop month.
const DAY = 86_400_000;
const HOUR = 3_600_000;
const START = Date.UTC(2025, 0, 1);
const END = START + 30 * DAY;
const at = (ms: number): Date => new Date(ms);
const query = { start: at(START), end: at(END), now: at(END) };

function desktop(over: Partial<UsageDesktop> & { id: string }): UsageDesktop {
  return {
    tier: 'default',
    billingMode: 'hourly',
    // Created long before the range and never destroyed: lifetime overlap = the whole range.
    createdAt: at(START - 100 * DAY),
    destroyedAt: null,
    ...over,
  };
}

function awake(desktopId: string, startMs: number, endMs: number | null): MeterInterval {
  return { desktopId, startedAt: at(startMs), endedAt: endMs === null ? null : at(endMs) };
}

describe('computeUsage: awake time and cost', () => {
  it('small hourly desktop awake exactly one hour', () => {
    const report = computeUsage(
      [desktop({ id: 'd1', tier: 'small' })],
      [awake('d1', START + DAY, START + DAY + HOUR)],
      query,
    );
    // awake = 3600 s; weighted = 3600 × 0.5 = 1800 s.
    // cents = 3600/3600 × 600/667 = 0.89955… → 1.
    // desktop_months = 30 days / 30 days = 1.
    expect(report.per_desktop).toEqual([
      {
        desktop_id: 'd1',
        awake_seconds: 3600,
        weighted_awake_seconds: 1800,
        desktop_months: 1,
        billing_mode: 'hourly',
        projected_cost_cents: 1,
      },
    ]);
  });

  it('default hourly desktop awake 667 hours costs exactly the monthly price', () => {
    // Whole range is 720 h; awake for the first 667 h.
    const report = computeUsage([desktop({ id: 'd1' })], [awake('d1', START, START + 667 * HOUR)], query);
    // awake = 667 × 3600 = 2 401 200 s; cents = 667 × 1200/667 = 1200 exactly.
    expect(report.per_desktop[0]?.awake_seconds).toBe(2_401_200);
    expect(report.per_desktop[0]?.weighted_awake_seconds).toBe(2_401_200);
    expect(report.per_desktop[0]?.projected_cost_cents).toBe(1200);
  });

  it('large monthly desktop alive for the whole range is one desktop month', () => {
    const report = computeUsage(
      [desktop({ id: 'd1', tier: 'large', billingMode: 'monthly' })],
      [awake('d1', START, START + 2 * HOUR)],
      query,
    );
    // desktop_months = 1; cents = 1 × 2400 = 2400 (awake time does not matter for monthly).
    // weighted = 7200 s × 2.0 = 14 400 s.
    expect(report.per_desktop[0]).toMatchObject({
      desktop_months: 1,
      projected_cost_cents: 2400,
      awake_seconds: 7200,
      weighted_awake_seconds: 14_400,
      billing_mode: 'monthly',
    });
  });

  it('rounds an exact half cent up (monthly)', () => {
    // 1/2400 of 30 days = 2 592 000 000 / 2400 = 1 080 000 ms (18 min).
    // months = 1/2400; cents = 1200/2400 = 0.5 → 1.
    const created = END - 1_080_000;
    const report = computeUsage(
      [desktop({ id: 'd1', billingMode: 'monthly', createdAt: at(created) })],
      [],
      query,
    );
    expect(report.per_desktop[0]?.desktop_months).toBeCloseTo(1 / 2400, 15);
    expect(report.per_desktop[0]?.projected_cost_cents).toBe(1);
  });

  it('rounds just under a half cent down (monthly)', () => {
    // 1 079 999 ms → cents = 1 079 999 × 1200 / 2 592 000 000 = 0.49999953… → 0.
    const report = computeUsage(
      [desktop({ id: 'd1', billingMode: 'monthly', createdAt: at(END - 1_079_999) })],
      [],
      query,
    );
    expect(report.per_desktop[0]?.projected_cost_cents).toBe(0);
  });

  it('rounds an exact half cent up where naive floating point gives x.4999… (hourly)', () => {
    // 1000.5 s of default hourly: 1000.5/3600 × 1200/667 = 1 000 500 × 1200 / (3 600 000 × 667)
    // = 1 200 600 000 / 2 401 200 000 = 0.5 exactly → 1.
    // In doubles, 1000.5 / 3600 * (1200 / 667) = 0.49999999999999994, which Math.round sends to 0.
    expect(1000.5 / 3600 * (1200 / 667)).toBeLessThan(0.5);
    const report = computeUsage([desktop({ id: 'd1' })], [awake('d1', START, START + 1_000_500)], query);
    expect(report.per_desktop[0]?.awake_seconds).toBe(1000.5);
    expect(report.per_desktop[0]?.projected_cost_cents).toBe(1);
  });

  it('same trap for a monthly desktop: 27.5 cents is not 27.4999…', () => {
    // 59 400 000 ms × 1200 / 2 592 000 000 = 27.5 exactly → 28.
    // Naively 59 400 000 / 1000 / 2 592 000 × 1200 = 27.499999999999996.
    const report = computeUsage(
      [desktop({ id: 'd1', billingMode: 'monthly', createdAt: at(END - 59_400_000) })],
      [],
      query,
    );
    expect(report.per_desktop[0]?.projected_cost_cents).toBe(28);
  });

  it('keeps millisecond precision in awake seconds', () => {
    // 1234 ms → 1.234 s; small weight 0.5 → 0.617 s.
    const report = computeUsage(
      [desktop({ id: 'd1', tier: 'small' })],
      [awake('d1', START + 10, START + 1244)],
      query,
    );
    expect(report.per_desktop[0]?.awake_seconds).toBe(1.234);
    expect(report.per_desktop[0]?.weighted_awake_seconds).toBe(0.617);
  });
});

describe('computeUsage: clipping', () => {
  it('clips intervals that start before or end after the range', () => {
    const report = computeUsage(
      [desktop({ id: 'd1' })],
      [
        // 2 h before START to 1 h after START → 1 h inside.
        awake('d1', START - 2 * HOUR, START + HOUR),
        // 1 h before END to 5 h after END → 1 h inside.
        awake('d1', END - HOUR, END + 5 * HOUR),
        // Entirely before the range → 0.
        awake('d1', START - 10 * HOUR, START - 9 * HOUR),
      ],
      { ...query, now: at(END + DAY) },
    );
    // 2 h = 7200 s; cents = 2 × 1200/667 = 3.598… → 4.
    expect(report.per_desktop[0]?.awake_seconds).toBe(7200);
    expect(report.per_desktop[0]?.projected_cost_cents).toBe(4);
  });

  it('ends an open interval at now', () => {
    const now = START + 10 * DAY;
    const report = computeUsage(
      [desktop({ id: 'd1', tier: 'large' })],
      [awake('d1', now - 3 * HOUR, null)],
      { ...query, now: at(now) },
    );
    // awake = 3 h = 10 800 s; weighted = 21 600 s; cents = 3 × 2400/667 = 10.794… → 11.
    // Lifetime ends at now too: 10 days / 30 days = 1/3 month.
    expect(report.per_desktop[0]).toMatchObject({
      awake_seconds: 10_800,
      weighted_awake_seconds: 21_600,
      projected_cost_cents: 11,
    });
    expect(report.per_desktop[0]?.desktop_months).toBeCloseTo(1 / 3, 15);
  });

  it("ends a destroyed desktop's lifetime at destroyedAt", () => {
    // Created 5 days before START, destroyed 15 days after START → 15 days inside.
    // months = 15/30 = 0.5; cents = 0.5 × 600 = 300.
    const report = computeUsage(
      [
        desktop({
          id: 'd1',
          tier: 'small',
          billingMode: 'monthly',
          createdAt: at(START - 5 * DAY),
          destroyedAt: at(START + 15 * DAY),
        }),
      ],
      [],
      query,
    );
    expect(report.per_desktop[0]).toMatchObject({ desktop_months: 0.5, projected_cost_cents: 300, awake_seconds: 0 });
  });

  it('sums multiple intervals and counts overlapping ones once', () => {
    const report = computeUsage(
      [desktop({ id: 'd1' })],
      [
        awake('d1', START + HOUR, START + 2 * HOUR), // 1 h
        awake('d1', START + 5 * HOUR, START + 7 * HOUR), // 2 h
        awake('d1', START + 6 * HOUR, START + 8 * HOUR), // overlaps the previous by 1 h → +1 h
      ],
      query,
    );
    // Union = 1 h + [5 h, 8 h] = 4 h = 14 400 s; cents = 4 × 1200/667 = 7.196… → 7.
    expect(report.per_desktop[0]?.awake_seconds).toBe(14_400);
    expect(report.per_desktop[0]?.projected_cost_cents).toBe(7);
  });

  it('omits desktops whose lifetime does not overlap the range and ignores unknown ids', () => {
    const report = computeUsage(
      [
        desktop({ id: 'before', createdAt: at(START - 10 * DAY), destroyedAt: at(START - DAY) }),
        desktop({ id: 'after', createdAt: at(END + DAY) }),
        desktop({ id: 'touching', createdAt: at(START - DAY), destroyedAt: at(START) }),
        desktop({ id: 'inside' }),
      ],
      [awake('ghost', START, START + HOUR)],
      { ...query, now: at(END + 2 * DAY) },
    );
    expect(report.per_desktop.map((line) => line.desktop_id)).toEqual(['inside']);
  });

  it('reports nothing for an empty range', () => {
    const report = computeUsage([desktop({ id: 'd1' })], [awake('d1', START, END)], {
      ...query,
      end: at(START),
    });
    expect(report).toEqual({
      per_desktop: [],
      org_awake_seconds_weighted: 0,
      org_desktop_months: 0,
      org_projected_cost_cents: 0,
    });
  });
});

describe('computeUsage: org totals', () => {
  it('sums lines, sorts by desktop id, and adds up rounded cents', () => {
    const report = computeUsage(
      [
        desktop({ id: 'dc', tier: 'small' }),
        desktop({ id: 'da', tier: 'large', billingMode: 'monthly', createdAt: at(START + 15 * DAY) }),
        desktop({ id: 'db' }),
      ],
      [
        awake('dc', START, START + HOUR), // small: 3600 s, weighted 1800, 600/667 = 0.8996 → 1 ¢
        awake('db', START, START + HOUR), // default: 3600 s, weighted 3600, 1200/667 = 1.799 → 2 ¢
        awake('da', START + 15 * DAY, START + 15 * DAY + HOUR), // large: weighted 7200
      ],
      query,
    );
    // da: months = 15/30 = 0.5; cents = 0.5 × 2400 = 1200.
    // db, dc: months = 1 each.
    expect(report.per_desktop.map((line) => [line.desktop_id, line.projected_cost_cents])).toEqual([
      ['da', 1200],
      ['db', 2],
      ['dc', 1],
    ]);
    // weighted: 7200 + 3600 + 1800 = 12 600 s.
    expect(report.org_awake_seconds_weighted).toBe(12_600);
    // months: 0.5 + 1 + 1 = 2.5.
    expect(report.org_desktop_months).toBe(2.5);
    // cents: 1200 + 2 + 1 = 1203. The exact unrounded total would be
    // 1200 + 1.799… + 0.899… = 1202.698… → 1203 as well, but the total is defined as the sum of
    // rounded lines so an invoice always adds up.
    expect(report.org_projected_cost_cents).toBe(1203);
  });

  it('org cents are the sum of rounded lines, not the rounded exact sum', () => {
    // Three default monthly desktops each alive 1 080 000 ms → 0.5 ¢ each → 1 ¢ each → 3 ¢.
    // Rounding the exact sum instead would give 1.5 → 2 ¢.
    const created = at(END - 1_080_000);
    const report = computeUsage(
      ['a', 'b', 'c'].map((id) => desktop({ id, billingMode: 'monthly', createdAt: created })),
      [],
      query,
    );
    expect(report.org_projected_cost_cents).toBe(3);
  });
});

describe('roundHalfUpRatio', () => {
  it('rounds ties up and everything else to nearest', () => {
    expect(roundHalfUpRatio(1n, 2n)).toBe(1);
    expect(roundHalfUpRatio(3n, 2n)).toBe(2);
    expect(roundHalfUpRatio(49n, 100n)).toBe(0);
    expect(roundHalfUpRatio(51n, 100n)).toBe(1);
    expect(roundHalfUpRatio(0n, 7n)).toBe(0);
    expect(roundHalfUpRatio(14n, 7n)).toBe(2);
  });
});

describe('parseUsageRange', () => {
  const now = at(END);

  it('parses explicit bounds', () => {
    expect(parseUsageRange({ start: String(START), end: String(END) }, now)).toEqual({
      start: at(START),
      end: at(END),
    });
  });

  it('defaults end to now and start to 30 days before end', () => {
    expect(parseUsageRange({}, now)).toEqual({ start: at(END - 30 * DAY), end: at(END) });
    expect(parseUsageRange({ end: String(START) }, now)).toEqual({ start: at(START - 30 * DAY), end: at(START) });
    expect(parseUsageRange({ start: String(START) }, now)).toEqual({ start: at(START), end: at(END) });
  });

  it('floors the default start at the epoch', () => {
    expect(parseUsageRange({ end: '1000' }, now)).toEqual({ start: at(0), end: at(1000) });
  });

  it('accepts an empty range and the largest representable time', () => {
    expect(parseUsageRange({ start: '5', end: '5' }, now)).toEqual({ start: at(5), end: at(5) });
    expect(parseUsageRange({ start: '0', end: '8640000000000000' }, now)).toEqual({
      start: at(0),
      end: at(8.64e15),
    });
  });

  it.each([
    ['non-numeric start', { start: 'yesterday' }],
    ['empty start', { start: '' }],
    ['negative end', { end: '-1' }],
    ['decimal', { start: '1.5' }],
    ['exponent', { end: '1e12' }],
    ['whitespace', { start: ' 12' }],
    ['hex', { start: '0x10' }],
    ['beyond 8.64e15', { end: '8640000000000001' }],
    ['absurdly long', { start: '9'.repeat(400) }],
    ['start after end', { start: '2000', end: '1000' }],
    ['start after defaulted end', { start: String(END + 1) }],
  ])('refuses %s', (_name, input) => {
    const result = parseUsageRange(input, now);
    expect(result).toHaveProperty('error');
  });

  it('refuses a repeated parameter that arrives as an array', () => {
    const input = { start: ['1', '2'] } as unknown as { start: string };
    expect(parseUsageRange(input, now)).toHaveProperty('error');
  });
});

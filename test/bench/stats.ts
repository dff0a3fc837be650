/** Small statistics and table printing shared by the benchmarks. */
import { performance } from 'node:perf_hooks';

export function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const rank = (p / 100) * (s.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return s[lo]! + (s[hi]! - s[lo]!) * (rank - lo);
}

export const median = (xs: number[]) => percentile(xs, 50);

export async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await fn();
  return performance.now() - t;
}

/**
 * One figure: what was measured, its median, the baseline's median (measured in the same run),
 * the unit, the goal, and the samples behind the median when the section kept them (for p99).
 */
export type Row = [measure: string, value: number, baseline: number, unit: string, target: string, samples?: number[]];

/** Every figure printed so far, by section, for the closing summary and `--json`. */
const recorded: Array<{ section: string; row: Row }> = [];

/** Rates are better high: their bad tail is the low one. */
const isRate = (unit: string) => unit.endsWith('/s');

/** The 99th percentile on the bad side: slowest 1 % of latencies, lowest 1 % of rates. */
export function tail(samples: number[] | undefined, unit: string): number | null {
  if (!samples || samples.length === 0) return null;
  return percentile(samples, isRate(unit) ? 1 : 99);
}

/** A markdown table; the ratio is value / baseline. The rows also go into the run's summary. */
export function table(title: string, rows: Row[], columns = ['median', 'baseline median']): void {
  console.log(`\n${title}`);
  console.log(`| measure | ${columns[0]} | ${columns[1]} | ratio | target |`);
  console.log('|---|---:|---:|---:|---|');
  for (const row of rows) {
    const [name, value, base, unit, target] = row;
    console.log(`| ${name} | ${value.toFixed(1)} ${unit} | ${base.toFixed(1)} ${unit} | ${(value / base).toFixed(2)}× | ${target} |`);
    recorded.push({ section: title.split(' (')[0]!.split(';')[0]!, row });
  }
}

/** The summary as data: one entry per figure, for `--json` and for tracking over time. */
export function summary(): Array<{
  section: string; measure: string; unit: string; median: number; p99: number | null; samples: number;
  goal: string; baseline_median: number; ratio: number;
}> {
  return recorded.map(({ section, row: [measure, value, baseline, unit, goal, samples] }) => ({
    section, measure, unit, median: value, p99: tail(samples, unit), samples: samples?.length ?? 0,
    goal, baseline_median: baseline, ratio: value / baseline,
  }));
}

/**
 * The closing table: every figure of the run in one place, its median and bad-side p99 (the
 * slowest 1 % of a latency, the lowest 1 % of a rate; a dash where the section kept no samples),
 * its goal, and the ratio to its baseline measured in the same run.
 */
export function printSummary(): void {
  const rows = summary();
  if (rows.length === 0) return;
  const n = (x: number) => (Math.abs(x) >= 100 ? x.toFixed(0) : x.toFixed(1));
  console.log('\nSummary (p99 = worst 1 %: slowest latencies, lowest rates)');
  console.log('| section | measure | median | p99 | goal | baseline | ratio |');
  console.log('|---|---|---:|---:|---|---:|---:|');
  for (const r of rows) {
    const p99 = r.p99 === null ? '—' : `${n(r.p99)} ${r.unit}`;
    console.log(`| ${r.section} | ${r.measure} | ${n(r.median)} ${r.unit} | ${p99} | ${r.goal} | ${n(r.baseline_median)} ${r.unit} | ${r.ratio.toFixed(2)}× |`);
  }
}

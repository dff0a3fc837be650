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

export type Row = [measure: string, value: number, baseline: number, unit: string, target: string];

/** A markdown table; the ratio is value / baseline. */
export function table(title: string, rows: Row[], columns = ['median', 'baseline median']): void {
  console.log(`\n${title}`);
  console.log(`| measure | ${columns[0]} | ${columns[1]} | ratio | target |`);
  console.log('|---|---:|---:|---:|---|');
  for (const [name, value, base, unit, target] of rows) {
    console.log(`| ${name} | ${value.toFixed(1)} ${unit} | ${base.toFixed(1)} ${unit} | ${(value / base).toFixed(2)}× | ${target} |`);
  }
}

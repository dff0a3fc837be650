/**
 * Parsing of the `start` and `end` query parameters of `GET /v1/usage` (docs/api.md §4.9, 7).
 *
 * Both are Unix milliseconds written as plain decimal digits. Anything else — signs, decimals,
 * exponents, whitespace, an empty value, a repeated parameter — is refused rather than coerced,
 * because `Number()` would happily turn "1e3" or " 12 " into a date nobody meant. Values above
 * 8.64e15 ms are outside what a JavaScript `Date` can represent and are refused too.
 *
 * Defaults when a bound is omitted: `end` is `now` and `start` is 30 days (one desktop month)
 * before `end`, floored at the epoch. A range whose start is after its end is an error; an empty
 * range (start === end) is allowed and simply reports nothing.
 */

export interface UsageRange {
  start: Date;
  end: Date;
}

/** Largest time value a `Date` accepts (ECMA-262 §21.4.1.1). */
const MAX_DATE_MS = 8.64e15;
const DEFAULT_RANGE_MS = 30 * 86_400_000;
const DIGITS = /^\d+$/;

function parseBound(name: string, value: unknown): number | { error: string } {
  if (typeof value !== 'string' || !DIGITS.test(value)) {
    return { error: `${name} must be Unix milliseconds as a decimal integer` };
  }
  const ms = Number(value);
  if (ms > MAX_DATE_MS) return { error: `${name} is out of range (maximum ${MAX_DATE_MS})` };
  return ms;
}

export function parseUsageRange(
  query: { start?: string; end?: string },
  now: Date,
): UsageRange | { error: string } {
  // Undefined means "omitted"; the values are checked as unknown because a query-string parser
  // may hand over an array for a repeated parameter whatever the declared type says.
  const rawStart: unknown = query.start;
  const rawEnd: unknown = query.end;

  let end = now.getTime();
  if (rawEnd !== undefined) {
    const parsed = parseBound('end', rawEnd);
    if (typeof parsed !== 'number') return parsed;
    end = parsed;
  }

  let start = Math.max(0, end - DEFAULT_RANGE_MS);
  if (rawStart !== undefined) {
    const parsed = parseBound('start', rawStart);
    if (typeof parsed !== 'number') return parsed;
    start = parsed;
  }

  if (start > end) return { error: 'start must not be after end' };
  return { start: new Date(start), end: new Date(end) };
}

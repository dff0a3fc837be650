/**
 * Exact half-up rounding of a non-negative rational number to an integer.
 *
 * Prices are computed as a ratio of integers (milliseconds × cents over a fixed number of
 * milliseconds), and the ratio is often exactly n.5. Binary floating point cannot represent most
 * of these quotients: 1000.5 s of default-tier hourly time is exactly 0.5 cent, but the obvious
 * `1000.5 / 3600 * (1200 / 667)` evaluates to 0.49999999999999994 and `Math.round` gives 0.
 * Rounding to 9 decimals first would hide that particular error but is still a heuristic with its
 * own edge cases, so the cost code keeps the numerator and denominator as integers and rounds with
 * BigInt arithmetic, which is exact for any input size (milliseconds × cents can pass 2^53).
 */

/**
 * Returns `numerator / denominator` rounded half-up (ties go up), exactly.
 * Both arguments must be non-negative integers and the denominator positive.
 */
export function roundHalfUpRatio(numerator: bigint, denominator: bigint): number {
  if (denominator <= 0n) throw new RangeError('denominator must be positive');
  if (numerator < 0n) throw new RangeError('numerator must be non-negative');
  // floor(n/d + 1/2) = floor((2n + d) / 2d); BigInt division truncates, which is floor here
  // because both operands are non-negative.
  const rounded = (2n * numerator + denominator) / (2n * denominator);
  return Number(rounded);
}

/** Converts a JavaScript number that must be a safe integer (milliseconds, cents) to BigInt. */
export function toExactInteger(value: number, what: string): bigint {
  if (!Number.isSafeInteger(value)) throw new RangeError(`${what} must be a safe integer, got ${value}`);
  return BigInt(value);
}

/**
 * The one way tests wait: poll a condition until it holds, or fail saying what was awaited.
 * Polling starts at 5 ms and backs off to 25 ms, so a fast condition is seen at once and a slow
 * one costs little. Tests wait for a condition, never for a fixed time.
 */
export async function until<T>(check: () => Promise<T> | T, timeoutMs = 10_000, what = 'condition'): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let pause = 5;
  for (;;) {
    const value = await check();
    if (value) return value as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, pause));
    pause = Math.min(25, pause * 2);
  }
}

/**
 * Screen geometry shared by the runtime drivers, so that every driver crops and scales a
 * screenshot to exactly the same size (docs/api.md §4.5: the reported size is post-crop, post-scale).
 */
import type { DisplaySize, ScreenRegion } from './driver.js';

/**
 * The part of `region` on a screen of `screen`'s size. A region reaching past an edge is cut at
 * it; one starting past an edge keeps its last row or column, so a capture is never empty.
 */
export function clampRegion(region: ScreenRegion, screen: DisplaySize): ScreenRegion {
  const x = Math.min(Math.max(0, region.x), screen.width - 1);
  const y = Math.min(Math.max(0, region.y), screen.height - 1);
  return {
    x,
    y,
    width: Math.max(1, Math.min(region.width, screen.width - x)),
    height: Math.max(1, Math.min(region.height, screen.height - y)),
  };
}

/** The size of an image of `size` downscaled to `percent` (1-100), never below one pixel. */
export function scaledSize(size: DisplaySize, percent: number | null): DisplaySize {
  if (percent === null || percent >= 100) return { width: size.width, height: size.height };
  return {
    width: Math.max(1, Math.round((size.width * percent) / 100)),
    height: Math.max(1, Math.round((size.height * percent) / 100)),
  };
}

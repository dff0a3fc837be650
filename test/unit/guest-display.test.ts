/** Parsing the X server's geometry from `xrandr --current` (agent/src/runtime/sandbox/guest-display.ts). */
import { describe, expect, it } from 'vitest';
import { parseCurrent } from '../../agent/src/runtime/sandbox/computer-use/guest-display.js';

describe('parseCurrent', () => {
  it('reads the current size from the Screen line', () => {
    const text = 'Screen 0: minimum 1 x 1, current 1280 x 800, maximum 2560 x 1600\nscreen connected 1280x800+0+0 0mm x 0mm\n';
    expect(parseCurrent(text)).toEqual({ width: 1280, height: 800 });
  });

  it('gives null when there is no Screen line', () => {
    expect(parseCurrent("Can't open display :0\n")).toBeNull();
    expect(parseCurrent('')).toBeNull();
  });
});

/**
 * Pointer actions covering each kind and option once, for the tests of what a batch becomes: the
 * xdotool script's words (input-script.test.ts) and the guest helper's pointer steps
 * (input-parts.test.ts).
 */
import type { InputAction } from '../../shared/src/computer-use.js';

export const POINTER_ACTIONS: readonly InputAction[] = [
  { type: 'mouse_move', x: 10, y: 20 },
  { type: 'click' },
  { type: 'click', x: 5, y: 6, button: 'right' },
  { type: 'click', button: 'middle', double: true },
  { type: 'button_press', button: 'left' },
  { type: 'button_release', button: 'right' },
  { type: 'drag', from: { x: 100, y: 200 }, to: { x: 301, y: 400 } },
];

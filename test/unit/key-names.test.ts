/**
 * Key combos are checked against libX11's keysym names before they reach the guest: xdotool only
 * warns about a name it does not know and goes on, so the guest could answer nothing better than
 * a failed action (a 500 for what is the client's typo).
 */
import { describe, expect, it } from 'vitest';
import { inputBatchProblem, isKeyName } from '../../shared/src/computer-use.js';
import { KEYSYM_NAMES } from '../../shared/src/keysym-names.js';

describe('isKeyName', () => {
  it('knows keysym names, case-sensitive as libX11 is', () => {
    for (const name of ['Return', 'Escape', 'F5', 'a', 'A', '1', 'plus', 'KP_Enter', 'ISO_Left_Tab', 'XF86AudioPlay', 'Thai_baht']) {
      expect(isKeyName(name), name).toBe(true);
    }
    for (const name of ['true', 'return', 'RETURN', 'XF86Bogus', 'Hyper', 'Fx', '', 'ctrl ']) expect(isKeyName(name), name).toBe(false);
  });

  it("takes xdotool's modifier aliases in any case", () => {
    for (const name of ['ctrl', 'Ctrl', 'CTRL', 'control', 'alt', 'meta', 'super', 'Super', 'shift']) expect(isKeyName(name), name).toBe(true);
  });

  it('takes keysyms by code: a Unicode code point or a raw value', () => {
    for (const name of ['U20AC', 'U1F600', 'U10FFFF', '0x61', '0xff0d']) expect(isKeyName(name), name).toBe(true);
    for (const name of ['u20ac', 'U20', 'U110000', '0x', '0x123456789']) expect(isKeyName(name), name).toBe(false);
  });

  it('holds the whole table libX11 compiles, not a sample', () => {
    expect(KEYSYM_NAMES.size).toBeGreaterThan(2400);
    expect(KEYSYM_NAMES.has('')).toBe(false);
  });
});

describe('inputBatchProblem on key combos', () => {
  it('names the action and the unknown key', () => {
    expect(inputBatchProblem([{ type: 'mouse_move', x: 1, y: 1 }, { type: 'key', combo: 'ctrl+return' }])).toMatch(
      /^actions\[1\]\.combo: "return" is not a key name; .*case-sensitive/,
    );
    expect(inputBatchProblem([{ type: 'key', combo: 'true' }])).toMatch(/"true" is not a key name/);
  });

  it('passes combos of known keys', () => {
    expect(inputBatchProblem([{ type: 'key', combo: 'ctrl+shift+Return' }, { type: 'key', combo: 'super+U20AC' }])).toBeNull();
  });
});

/**
 * Input batches played by the guest helper (its `xinput` operation,
 * agent/guest/helper/op-xinput.pl) over one connection to the X server, instead of as a script
 * with one xdotool process per action (guest-input.ts): the same X requests xdotool makes for
 * the same actions, in the same order, with the same pauses. A move warps the pointer (xdotool's
 * mousemove); a button or a key goes down and up through the XTEST extension (its click,
 * mousedown, mouseup and key).
 *
 * Typed text of printable ASCII, tabs and line breaks goes the same way (each character's key,
 * with Shift when it is on the key's second level); other text runs as the script, whose binder
 * handles characters the keymap lacks.
 *
 * Keys are named as xdotool names them: a combo's `+`-separated tokens, each an alias (`ctrl`,
 * `shift`, `alt`, `super`, `meta`, `enter`, `return`, any case) or a keysym name. The names known
 * here are those of the keys a combo usually holds; a batch with any other runs as the script,
 * so every name xdotool takes still works and every one it refuses still fails the same way. The
 * helper, which knows the keyboard mapping, also leaves a batch to the script when a key's keysym
 * is not on a key's first level (xdotool would add Shift, or bind a spare key): it answers so
 * before it sends anything.
 */
import { INPUT_LIMITS, type InputAction, type MouseButton, type ScrollDirection } from '../../../../../shared/src/computer-use.js';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { CursorPosition } from '../../driver.js';
import { GuestCall, type GuestTarget } from '../guest/guest-call.js';

export const BUTTONS: Readonly<Record<MouseButton, number>> = { left: 1, middle: 2, right: 3 };
export const SCROLL_BUTTONS: Readonly<Record<ScrollDirection, number>> = { up: 4, down: 5, left: 6, right: 7 };

/**
 * Between a drag's press and its first motion, and between its last motion and the release.
 * X delivers the events in order anyway; the pauses are for toolkits whose drag-and-drop talks
 * to the drop target asynchronously (XDND) and drops nothing if the release comes first.
 */
export const DRAG_PAUSE_MS = 50;

/**
 * xdotool types `\n` as the Linefeed keysym, which GUI toolkits ignore, and `\r` as Return. A
 * person ends a line with Return, so every line break (`\r\n`, `\n` or `\r`) becomes one Return.
 */
export function typedText(text: string): string {
  return text.replace(/\r\n|\n/g, '\r');
}

/** xdotool's aliases (xdo_util.h), matched in any case. */
const ALIASES: Readonly<Record<string, string>> = {
  alt: 'Alt_L', ctrl: 'Control_L', control: 'Control_L', meta: 'Meta_L', super: 'Super_L', shift: 'Shift_L', enter: 'Return', return: 'Return',
};

/** Keysym values (X11/keysymdef.h) of the names known here; names are case-sensitive, as in Xlib. */
export const KEYSYMS: ReadonlyMap<string, number> = new Map<string, number>([
  ...[...'abcdefghijklmnopqrstuvwxyz0123456789'].map((c): [string, number] => [c, c.charCodeAt(0)]),
  ['space', 0x20], ['apostrophe', 0x27], ['comma', 0x2c], ['minus', 0x2d], ['period', 0x2e], ['slash', 0x2f],
  ['semicolon', 0x3b], ['equal', 0x3d], ['bracketleft', 0x5b], ['backslash', 0x5c], ['bracketright', 0x5d], ['grave', 0x60],
  ['BackSpace', 0xff08], ['Tab', 0xff09], ['Return', 0xff0d], ['Pause', 0xff13], ['Scroll_Lock', 0xff14], ['Escape', 0xff1b],
  ['Home', 0xff50], ['Left', 0xff51], ['Up', 0xff52], ['Right', 0xff53], ['Down', 0xff54], ['Prior', 0xff55], ['Page_Up', 0xff55],
  ['Next', 0xff56], ['Page_Down', 0xff56], ['End', 0xff57], ['Print', 0xff61], ['Insert', 0xff63], ['Menu', 0xff67],
  ['Num_Lock', 0xff7f], ['KP_Enter', 0xff8d], ['Delete', 0xffff],
  ...Array.from({ length: 24 }, (_, i): [string, number] => [`F${i + 1}`, 0xffbe + i]),
  ['Shift_L', 0xffe1], ['Shift_R', 0xffe2], ['Control_L', 0xffe3], ['Control_R', 0xffe4], ['Caps_Lock', 0xffe5],
  ['Meta_L', 0xffe7], ['Meta_R', 0xffe8], ['Alt_L', 0xffe9], ['Alt_R', 0xffea], ['Super_L', 0xffeb], ['Super_R', 0xffec],
]);

/** A combo's keysyms in order, or null when a token is not known here (xdotool then takes it). */
export function keysymsOf(combo: string): number[] | null {
  const syms: number[] = [];
  for (const token of combo.split('+')) {
    const sym = KEYSYMS.get(ALIASES[token.toLowerCase()] ?? token);
    if (sym === undefined) return null;
    syms.push(sym);
  }
  return syms;
}

/**
 * The batch as the helper's steps (op-xinput.pl lists them); null when it types beyond printable
 * ASCII, or names a key not known here: the script runs it.
 */
export function xinputSteps(actions: readonly InputAction[]): string[] | null {
  const steps: Array<string | number> = [];
  const click = (b: number) => steps.push('p', b, 'r', b);
  for (const action of actions) {
    switch (action.type) {
      case 'mouse_move':
        steps.push('m', action.x, action.y);
        break;
      case 'click': {
        const b = BUTTONS[action.button ?? 'left'];
        if (action.x !== undefined && action.y !== undefined) steps.push('m', action.x, action.y);
        click(b);
        if (action.double === true) {
          steps.push('s', INPUT_LIMITS.doubleClickGapMs);
          click(b);
        }
        break;
      }
      case 'button_press':
        steps.push('p', BUTTONS[action.button]);
        break;
      case 'button_release':
        steps.push('r', BUTTONS[action.button]);
        break;
      case 'drag': {
        const b = BUTTONS[action.button ?? 'left'];
        const { from, to } = action;
        if (from) steps.push('m', from.x, from.y);
        steps.push('p', b, 's', DRAG_PAUSE_MS);
        if (from) steps.push('m', Math.round((from.x + to.x) / 2), Math.round((from.y + to.y) / 2));
        else steps.push('h', to.x, to.y);
        steps.push('m', to.x, to.y, 's', DRAG_PAUSE_MS, 'r', b);
        break;
      }
      case 'scroll':
        for (let i = 0; i < (action.amount ?? 1); i++) click(SCROLL_BUTTONS[action.direction]);
        break;
      case 'key': {
        // xdotool presses a combo's keys in order and releases them in the same order.
        const syms = keysymsOf(action.combo);
        if (syms === null) return null;
        for (const sym of syms) steps.push('k', sym);
        for (const sym of syms) steps.push('u', sym);
        break;
      }
      case 'wait':
        steps.push('s', action.ms);
        break;
      case 'type': {
        // Printable ASCII, tabs and line breaks (typedText makes them Return); anything else is
        // the binder's and xdotool's (guest-input.ts).
        const text = typedText(action.text);
        if (!/^[\x20-\x7e\t\r]*$/.test(text)) return null;
        // `delay_ms` per keystroke (the contract's): half of it after the press, half after the release.
        const half = (action.delay_ms ?? INPUT_LIMITS.defaultDelayMs) * 500;
        for (const ch of text) steps.push('c', ch === '\r' ? 0xff0d : ch === '\t' ? 0xff09 : ch.charCodeAt(0), half);
        break;
      }
    }
  }
  return steps.map(String);
}

/**
 * Plays the steps through the guest helper (`xinput`): the cursor it read back after them, or
 * null when it found a key it would not press as xdotool does, having sent nothing.
 */
export async function guestXInput(target: GuestTarget, steps: readonly string[], timeoutMs: number): Promise<CursorPosition | null> {
  const call = await GuestCall.start(target, 'xinput', steps, { timeoutMs });
  const fields = await call.status();
  if (fields.length === 1 && fields[0] === 'script') return null;
  if (fields.length !== 2 || !fields.every((f) => /^-?[0-9]{1,5}$/.test(f))) {
    throw new AgentFailure('runtime_error', 'guest helper sent a malformed reply', true);
  }
  return { x: Number(fields[0]), y: Number(fields[1]) };
}

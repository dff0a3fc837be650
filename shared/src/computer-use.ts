/**
 * Computer use (docs/api.md §4.5, 4.6, 8): the input actions an API client sends and the limits on a
 * batch, shared by the scheduler (which validates the request) and the agent link (which carries
 * the same actions to the host). Field names are the API's, so nothing is translated on the way.
 *
 * Decisions the contract (docs/api.md) leaves open (docs/decisions.md): `button` is `left`, `middle` or `right`
 * (default `left`); scroll `direction` is `up`, `down`, `left` or `right`; `from` and `to` are
 * `{x, y}` in screen pixels. Coordinates are integers 0-32767; a point off the screen is clamped
 * to its edge by the X server.
 */
import { Type, type Static } from '@sinclair/typebox';
import { KEYSYM_NAMES } from './keysym-names.js';

export const INPUT_LIMITS = {
  maxActions: 50,
  maxTotalTextBytes: 32 * 1024,
  maxTotalWaitMs: 10_000,
  maxTextBytes: 8192,
  maxDelayMs: 500,
  defaultDelayMs: 12,
  maxScrollAmount: 50,
  maxWaitMs: 5000,
  maxComboTokens: 8,
  /** Gap between the two clicks of a double click. */
  doubleClickGapMs: 120,
  /** Deadline of a whole batch in the guest (504 past it). */
  batchTimeoutMs: 60_000,
} as const;

/** docs/api.md §8: the screenshot transfer cap. */
export const SCREENSHOT_MAX_BYTES = 8 * 1024 * 1024;

export const MOUSE_BUTTONS = ['left', 'middle', 'right'] as const;
export type MouseButton = (typeof MOUSE_BUTTONS)[number];
export const SCROLL_DIRECTIONS = ['up', 'down', 'left', 'right'] as const;
export type ScrollDirection = (typeof SCROLL_DIRECTIONS)[number];

const Coordinate = Type.Integer({ minimum: 0, maximum: 32767 });
const Point = Type.Object({ x: Coordinate, y: Coordinate }, { additionalProperties: false });
const Button = Type.Union(MOUSE_BUTTONS.map((b) => Type.Literal(b)));
const Direction = Type.Union(SCROLL_DIRECTIONS.map((d) => Type.Literal(d)));
const strict = { additionalProperties: false } as const;

export const InputAction = Type.Union([
  Type.Object({ type: Type.Literal('mouse_move'), x: Coordinate, y: Coordinate }, strict),
  Type.Object(
    {
      type: Type.Literal('click'),
      x: Type.Optional(Coordinate),
      y: Type.Optional(Coordinate),
      button: Type.Optional(Button),
      double: Type.Optional(Type.Boolean()),
    },
    // Both coordinates or neither (inputBatchProblem): where to click, or where the pointer is.
    { ...strict, description: 'Give x and y together, or neither to click where the pointer is' },
  ),
  Type.Object({ type: Type.Literal('button_press'), button: Button }, strict),
  Type.Object({ type: Type.Literal('button_release'), button: Button }, strict),
  Type.Object({ type: Type.Literal('drag'), from: Type.Optional(Point), to: Point, button: Type.Optional(Button) }, strict),
  Type.Object(
    { type: Type.Literal('scroll'), direction: Direction, amount: Type.Optional(Type.Integer({ minimum: 1, maximum: INPUT_LIMITS.maxScrollAmount })) },
    strict,
  ),
  Type.Object(
    {
      type: Type.Literal('type'),
      // Byte length is checked by inputBatchProblem: JSON Schema counts characters.
      text: Type.String({ minLength: 1, pattern: '^[^\\u0000]*$' }),
      delay_ms: Type.Optional(Type.Integer({ minimum: 0, maximum: INPUT_LIMITS.maxDelayMs })),
    },
    strict,
  ),
  Type.Object({ type: Type.Literal('key'), combo: Type.String({ minLength: 1, maxLength: 512 }) }, strict),
  Type.Object({ type: Type.Literal('wait'), ms: Type.Integer({ minimum: 1, maximum: INPUT_LIMITS.maxWaitMs }) }, strict),
]);
export type InputAction = Static<typeof InputAction>;

/** xdotool's own modifier names, which it matches ignoring case (`ctrl`, `Ctrl`, `CTRL`). */
const MODIFIER_ALIASES = new Set(['alt', 'ctrl', 'control', 'meta', 'super', 'shift']);
/** Keysyms by code: a Unicode code point (`U20AC`) or a raw keysym value (`0xff0d`). */
const KEYSYM_BY_CODE = /^(U(?:[0-9A-Fa-f]{4,5}|10[0-9A-Fa-f]{4})|0x[0-9A-Fa-f]{1,8})$/;

/**
 * Whether xdotool in the guest will find this key: a keysym name as libX11 spells it
 * (case-sensitive: `Return`, not `return`), one of xdotool's modifier aliases, or a keysym by code.
 * Checked here because xdotool only warns about an unknown name and goes on, so the guest could
 * answer nothing better than a failed action.
 */
export function isKeyName(token: string): boolean {
  return KEYSYM_NAMES.has(token) || MODIFIER_ALIASES.has(token.toLowerCase()) || KEYSYM_BY_CODE.test(token);
}

/**
 * The batch rules a schema cannot express, or null when the batch is valid: text byte lengths
 * and NUL, the totals over the batch, and the key combo's tokens.
 */
export function inputBatchProblem(actions: readonly InputAction[]): string | null {
  if (actions.length > INPUT_LIMITS.maxActions) return `at most ${INPUT_LIMITS.maxActions} actions per batch`;
  let textBytes = 0;
  let waitMs = 0;
  for (const [i, action] of actions.entries()) {
    if (action.type === 'type') {
      const bytes = Buffer.byteLength(action.text, 'utf8');
      if (bytes > INPUT_LIMITS.maxTextBytes) return `actions[${i}].text is over ${INPUT_LIMITS.maxTextBytes} bytes`;
      if (action.text.includes('\0')) return `actions[${i}].text contains NUL`;
      textBytes += bytes;
    } else if (action.type === 'wait') {
      waitMs += action.ms;
    } else if (action.type === 'key') {
      const tokens = action.combo.split('+');
      if (tokens.length > INPUT_LIMITS.maxComboTokens) return `actions[${i}].combo has more than ${INPUT_LIMITS.maxComboTokens} keys`;
      const unknown = tokens.find((t) => !isKeyName(t));
      if (unknown !== undefined) {
        return `actions[${i}].combo: ${JSON.stringify(unknown)} is not a key name; use X keysym names joined by "+" (names are case-sensitive: ctrl+shift+t, Return, Escape, F5, a, plus, XF86AudioPlay)`;
      }
    } else if (action.type === 'click' && (action.x === undefined) !== (action.y === undefined)) {
      return `actions[${i}] needs both x and y, or neither`;
    }
  }
  if (textBytes > INPUT_LIMITS.maxTotalTextBytes) return `the batch's text is over ${INPUT_LIMITS.maxTotalTextBytes} bytes`;
  if (waitMs > INPUT_LIMITS.maxTotalWaitMs) return `the batch's waits are over ${INPUT_LIMITS.maxTotalWaitMs} ms`;
  return null;
}

/** docs/api.md §4.6: what a stream ticket lets its holder do. */
export const STREAM_CLAIMS = ['view', 'control'] as const;
export type StreamClaim = (typeof STREAM_CLAIMS)[number];

/**
 * Input batches (docs/api.md §4.5) that type beyond printable ASCII, or name keys the guest
 * helper does not press itself (input-steps.ts plays the others over one X connection), as a
 * script.
 *
 * Such a batch runs inside the desktop as one shell script, one exec, so it
 * costs a single guest round trip however many actions it holds, and its actions reach the X
 * server in order with no host-side gaps between them. The script runs one xdotool process per
 * action. Chaining the whole batch into a single xdotool would save about 3 ms per action (one
 * process and X connection each: in a desktop, 20 moves take 64 ms as 20 processes and 9 ms
 * chained; a one-action batch takes ≈10 ms in all), but `type` swallows the rest of its command
 * line, a chain has one exit status for all of it, and xdotool reports an unknown key name only
 * as a warning on stderr; one process per action lets the script stop at the first action that
 * fails and say which one it was. Within an action, xdotool's own chaining and `sleep` compose
 * the steps (move then click, the drag sequence) without extra processes.
 *
 * Every argument is single-quoted, so client text never reaches the shell as syntax. The final
 * cursor is read back from the X server after the last action, never computed.
 *
 * Characters on no key of the keymap (é, €, 日) are bound to spare keycodes before they are typed.
 * Left to itself, xdotool binds each such character to a scratch keycode, presses it and unbinds
 * it, one keymap change per character; but an X client reloads the keymap lazily, at its first
 * lookup after the MappingNotify, and gets the server's map as it is by then: a client that
 * lags reads a key with a later character's binding or with none, and drops or changes it (a
 * loaded desktop lost the € of `é€日本`). So each `type` first binds all its off-map characters
 * at once (the binder below), clients see that one change before the first key, and the
 * bindings stay: later lookups, and later batches typing the same characters, find them stable.
 * In a desktop the step costs ≈6 ms when all is bound already and 10-25 ms when it binds 33
 * characters, while typing a bound character saves xdotool's two keymap changes; text without
 * off-map characters runs no such step.
 */
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { INPUT_LIMITS, type InputAction } from '../../../../../shared/src/computer-use.js';
import type { CursorPosition, ExecOutcome, ExecSpec } from '../../driver.js';
import { guestFile } from '../guest/guest-programs.js';
import { BUTTONS, DRAG_PAUSE_MS, SCROLL_BUTTONS, typedText, xinputSteps } from './input-steps.js';

type Exec = (spec: ExecSpec) => Promise<ExecOutcome>;

const XDOTOOL = '/usr/bin/xdotool';
/**
 * Between wheel clicks. The X server does not merge button events: every notch reaches the
 * client as its own press and release (the integration test counts them), so none is needed.
 */
const SCROLL_DELAY_MS = 0;
/** xdotool's `--repeat 2 --delay 120` also sleeps after the second click; a chained sleep does not. */
const DOUBLE_CLICK_GAP_S = '0.12';

/** Exec budget: generous, since a loaded host slows xdotool and its X connection. */
const BASE_TIMEOUT_MS = 10_000;
const PER_ACTION_MS = 500;
/** Added to each typed character's delay: xdotool's own work, more for remapped keysyms. */
const PER_CHAR_MS = 10;
/** Added per typed segment with off-map characters: binding them (six short processes). */
const PER_BINDING_MS = 200;
/**
 * The batch deadline (docs/decisions.md): the caps allow hours of typing (32 KiB at 500 ms per
 * key), and a batch still typing after the deadline has no caller, so it is killed (504).
 */
export const MAX_TIMEOUT_MS = INPUT_LIMITS.batchTimeoutMs;

const FAILURE_PREFIX = 'input action ';

/**
 * POSIX single quoting. A run of quotes is closed once and escaped as `\'` each, the standard
 * `'\''` with the re-opening merged, so 32 KiB of client text stays well under the kernel's
 * 128 KiB limit on one argv string (the script is one) whatever it holds.
 */
export function shellQuote(word: string): string {
  return `'${word.replace(/'+/g, (run) => `'${"\\'".repeat(run.length)}'`)}'`;
}

function seconds(ms: number): string {
  return String(ms / 1000);
}

/** A word the script builds itself (the drag's halfway point), written as it is. */
interface ShellSyntax {
  readonly sh: string;
}
type Word = string | ShellSyntax;

/** xdotool's argv for one action, after the program name. */
function xdotoolWords(action: InputAction): Word[] {
  switch (action.type) {
    case 'mouse_move':
      return ['mousemove', String(action.x), String(action.y)];
    case 'click': {
      const b = String(BUTTONS[action.button ?? 'left']);
      const move = action.x !== undefined && action.y !== undefined ? ['mousemove', String(action.x), String(action.y)] : [];
      const click = ['click', '--delay', '0', b];
      return action.double === true ? [...move, ...click, 'sleep', DOUBLE_CLICK_GAP_S, ...click] : [...move, ...click];
    }
    case 'button_press':
      return ['mousedown', String(BUTTONS[action.button])];
    case 'button_release':
      return ['mouseup', String(BUTTONS[action.button])];
    case 'drag': {
      const b = String(BUTTONS[action.button ?? 'left']);
      const { to, from } = action;
      // A motion halfway before the one to `to`: a drag source starts its drag on the first
      // motion past its threshold and looks for the drop target on the next one.
      const mid: Word[] = from
        ? [String(Math.round((from.x + to.x) / 2)), String(Math.round((from.y + to.y) / 2))]
        : [{ sh: `"$(((X + ${Math.trunc(to.x)}) / 2))"` }, { sh: `"$(((Y + ${Math.trunc(to.y)}) / 2))"` }];
      const pause = seconds(DRAG_PAUSE_MS);
      return [
        ...(from ? ['mousemove', String(from.x), String(from.y)] : []),
        'mousedown', b, 'sleep', pause,
        'mousemove', ...mid, 'mousemove', String(to.x), String(to.y),
        'sleep', pause, 'mouseup', b,
      ];
    }
    case 'scroll':
      return ['click', '--repeat', String(action.amount ?? 1), '--delay', String(SCROLL_DELAY_MS), String(SCROLL_BUTTONS[action.direction])];
    case 'type':
      // `--` because the text may start with '-'; `type` takes every later word as text.
      return typeWords(action.delay_ms, typedText(action.text));
    case 'key':
      return ['key', '--delay', '0', '--', action.combo];
    case 'wait':
      // Not an xdotool call: inputScript runs /bin/sleep for it.
      return [];
  }
}

/**
 * Off-map characters per segment of typed text. A slot is one XKB group of a spare keycode
 * (xdotool locks the group in for the key, so the group travels in the key event's state, not in
 * a keymap change). Xvfb's US map leaves 19 keycodes empty: the lowest stays empty for xdotool's
 * own remapping, the other 18 give 72 slots. A segment is bound while the previous segment's
 * characters stay bound, so a client still reading the previous segment's keys when the next one
 * is bound still finds them: two segments must fit in the 72.
 */
export const SEGMENT_CHARS = 36;
/** Root window property listing the slots the binder owns, `keycode.group.keysym`, oldest first. */
const KEYS_PROPERTY = '_CANTO_INPUT_KEYS';
/** Serializes binders of concurrent batches; the guest init creates /run/canto at every boot. */
export const KEYMAP_LOCK = '/run/canto/keymap.lock';

/**
 * Code points from U+00A0 up need a binding. Below are ASCII, all on the US map (a line break is
 * typed as Return), and C1 controls, which have no keysym: xdotool skips them.
 */
function offMap(ch: string): boolean {
  return (ch.codePointAt(0) ?? 0) >= 0xa0;
}

/**
 * Typed text cut into runs of at most SEGMENT_CHARS distinct off-map characters, each typed by its
 * own xdotool after its binding step. Nearly every text is one segment.
 */
export function typingSegments(text: string): string[] {
  const segments: string[] = [];
  let seen = new Set<string>();
  let start = 0;
  let at = 0;
  for (const ch of text) {
    if (offMap(ch) && !seen.has(ch)) {
      if (seen.size === SEGMENT_CHARS) {
        segments.push(text.slice(start, at));
        start = at;
        seen = new Set();
      }
      seen.add(ch);
    }
    at += ch.length;
  }
  segments.push(text.slice(start));
  return segments;
}

/**
 * The binder, an awk program (agent/guest/input-binder.awk; byte semantics under LC_ALL=C). Input: `xmodmap -pk`; env W: the
 * segment's text; K: the previous segment's; P: `xprop` of KEYS_PROPERTY. It computes the keysym
 * xdotool will look for, as xdotool does (Latin-1 keeps its legacy keysym, the rest is
 * 0x1000000 + the code point), for each of W's characters from U+00A0 up, and binds every one
 * the map does not have anywhere: to a free group of a keycode it owns, else to a newly claimed
 * empty keycode (never the lowest, xdotool's scratch), else (the rule for running out) to the
 * slot it bound least recently among those holding none of W's or K's characters; what finds
 * no slot is left to xdotool's remapping. A slot gets the keysym on both levels, so no Shift is
 * involved. It pipes the changed keycodes' lines to `xmodmap -`, which has the server apply them
 * before it exits, and prints the new property. A property entry the map no longer shows (a new
 * keymap was loaded) is dropped.
 */
/**
 * `k TEXT PREVIOUS` binds TEXT's off-map characters. Best effort: when the keymap cannot be
 * changed, xdotool still types everything by remapping, with the race this avoids.
 */
function binderFunction(): string {
  const xprop = `/usr/bin/xprop -root`;
  return (
    `k() { { /usr/bin/flock 9; v=$(/usr/bin/xmodmap -pk | W=$1 K=$2 P=$(${xprop} -notype ${KEYS_PROPERTY} 2>&1) LC_ALL=C /usr/bin/awk ${shellQuote(guestFile('input-binder.awk'))}) && ` +
    `[ -n "$v" ] && ${xprop} -f ${KEYS_PROPERTY} 8s -set ${KEYS_PROPERTY} "$v"; } 9>>${KEYMAP_LOCK}; }`
  );
}

/**
 * The contract's `delay_ms` is per keystroke. This platform's xdotool (3.20160805) waits half its
 * `--delay` per character (it halves the delay for the press and release pair, then waits half of
 * that after each), so it is given twice the delay.
 */
function typeWords(delayMs: number | undefined, text: Word): Word[] {
  return ['type', '--delay', String(2 * (delayMs ?? INPUT_LIMITS.defaultDelayMs)), '--', text];
}

function shellWords(words: readonly Word[]): string {
  return words.map((w) => (typeof w === 'string' ? shellQuote(w) : w.sh)).join(' ');
}

/** Actions after which the same xdotool reads the cursor: their words end where a chain may go on. */
const POINTER_ACTIONS: ReadonlySet<InputAction['type']> = new Set(['mouse_move', 'click', 'button_press', 'button_release', 'drag', 'scroll']);
const CURSOR_WORDS = ['getmouselocation', '--shell'];

/**
 * The script: a prologue, one line per action, and the cursor read. `x N TYPE ARGS…` runs
 * xdotool and stops the script (exit 3, a line on stderr) when it fails or warns that a key
 * name is unknown, which xdotool does and then exits 0 having pressed the rest of the combo.
 * xdotool's output goes to fd 3, /dev/null until the last action. When that action is a pointer
 * action, its own xdotool reads the cursor after it (one process and X connection fewer, about
 * 3 ms of a one-move batch's 13), and fd 3 is the script's stdout for it; otherwise (`type`
 * would take the words as text, `key` as a key name) a last xdotool of its own reads it.
 */
export function inputScript(actions: readonly InputAction[]): string {
  const lines = [
    // The user's env file is sourced first and may set either; xdotool needs a UTF-8 locale
    // to read multibyte text ("Invalid multi-byte sequence" under C).
    'DISPLAY=:0 LC_ALL=C.UTF-8; export DISPLAY LC_ALL; exec 3>/dev/null',
    `f() { printf '${FAILURE_PREFIX}%s (%s) failed: %s\\n' "$1" "$2" "$3" >&2; exit 3; }`,
    `x() { n=$1 t=$2; shift 2; e=$(${XDOTOOL} "$@" 2>&1 >&3) && case $e in *'No such key name'*) false;; esac || f "$n" "$t" "$e"; }`,
  ];
  const last = actions.at(-1);
  const chained = last !== undefined && POINTER_ACTIONS.has(last.type);
  // Only a batch that types off-map characters carries the binder: ASCII typing pays nothing.
  if (actions.some((a) => a.type === 'type' && [...a.text].some(offMap))) lines.push('prev=', binderFunction());
  for (const [i, action] of actions.entries()) {
    const head = shellWords([String(i), action.type]);
    if (action.type === 'type' && [...action.text].some(offMap)) {
      // Each segment's text is written once, into $seg, for both the binder and xdotool; $prev
      // is the previous segment's, whose characters the binder keeps bound.
      for (const segment of typingSegments(typedText(action.text))) {
        lines.push(`seg=${shellQuote(segment)}; k "$seg" "$prev"; prev=$seg; x ${head} ${shellWords(typeWords(action.delay_ms, { sh: '"$seg"' }))}`);
      }
      continue;
    }
    if (action.type === 'wait') {
      lines.push(`/bin/sleep ${shellQuote(seconds(action.ms))} || f ${head} 'sleep failed'`);
      continue;
    }
    if (action.type === 'drag' && action.from === undefined) {
      // The halfway point needs the drag's start, which only the X server knows here. Cut out
      // of `X=10\nY=20\n…` by expansion: the output is data, never evaluated.
      lines.push(`p=$(${XDOTOOL} getmouselocation --shell 2>&1) || f ${head} "$p"; X=\${p#*X=} Y=\${p#*Y=}; X=\${X%%[!0-9]*} Y=\${Y%%[!0-9]*}`);
    }
    if (chained && i === actions.length - 1) lines.push(`exec 3>&1; x ${head} ${shellWords([...xdotoolWords(action), ...CURSOR_WORDS])}`);
    else lines.push(`x ${head} ${shellWords(xdotoolWords(action))}`);
  }
  if (!chained) lines.push(`${XDOTOOL} ${CURSOR_WORDS.join(' ')} || { echo 'reading the cursor failed' >&2; exit 4; }`);
  return `${lines.join('\n')}\n`;
}

/** `X=10\nY=20\nSCREEN=0\nWINDOW=…` (getmouselocation --shell) → the cursor. */
export function parseCursor(stdout: string): CursorPosition | null {
  const x = /^X=(\d+)$/m.exec(stdout);
  const y = /^Y=(\d+)$/m.exec(stdout);
  return x && y ? { x: Number(x[1]), y: Number(y[1]) } : null;
}

/** The batch's own waits and typing delays plus room for xdotool itself, capped at MAX_TIMEOUT_MS. */
export function inputTimeoutMs(actions: readonly InputAction[]): number {
  let ms = BASE_TIMEOUT_MS;
  for (const action of actions) {
    ms += PER_ACTION_MS;
    if (action.type === 'wait') ms += action.ms;
    // Code points: xdotool types one key per character, however many bytes it has.
    if (action.type === 'type') {
      const chars = [...action.text];
      ms += chars.length * ((action.delay_ms ?? INPUT_LIMITS.defaultDelayMs) + PER_CHAR_MS);
      if (chars.some(offMap)) ms += typingSegments(action.text).length * PER_BINDING_MS;
    }
  }
  return Math.min(ms, MAX_TIMEOUT_MS);
}

function clip(text: string): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length > 300 ? `${flat.slice(0, 300)}…` : flat;
}

/** Plays xinput steps (input-steps.ts) in the desktop: the cursor after them, or null to run the batch as the script. */
export type PlaySteps = (steps: readonly string[], timeoutMs: number) => Promise<CursorPosition | null>;

/**
 * Runs the batch and returns where the cursor ended: through `play` when given and the batch
 * types nothing (input-steps.ts), unless the helper finds a key it cannot press as xdotool
 * would; as the script otherwise. An exec timeout is the exec's own
 * `AgentFailure('timeout')`, passed through. A failed action is not retryable: the actions
 * before it have happened.
 */
export async function runInput(exec: Exec, actions: readonly InputAction[], play?: PlaySteps): Promise<CursorPosition> {
  const steps = play === undefined ? null : xinputSteps(actions);
  if (play !== undefined && steps !== null) {
    let cursor: CursorPosition | null;
    try {
      cursor = await play(steps, inputTimeoutMs(actions));
    } catch (err) {
      if (!(err instanceof AgentFailure) || err.code !== 'runtime_error') throw err;
      throw new AgentFailure('runtime_error', `input failed: ${clip(err.message)}`, false);
    }
    if (cursor !== null) return cursor;
  }
  const out = await exec({ command: inputScript(actions), timeoutMs: inputTimeoutMs(actions), maxOutputBytes: 64 * 1024 });
  if (out.exitCode !== 0) {
    const at = out.stderr.indexOf(FAILURE_PREFIX);
    const message = at >= 0 ? clip(out.stderr.slice(at)) : `input failed (exit ${out.exitCode}): ${clip(out.stderr)}`;
    throw new AgentFailure('runtime_error', message, false);
  }
  const cursor = parseCursor(out.stdout);
  if (cursor === null) {
    throw new AgentFailure('runtime_error', `the X server did not report the cursor: ${clip(out.stderr)}`, false);
  }
  return cursor;
}

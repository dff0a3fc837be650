/**
 * The input batch script (agent/src/runtime/sandbox/computer-use/guest-input.ts), run by the real
 * /bin/sh with a stand-in xdotool that records its argv: what xdotool would receive is checked
 * word for word, so the quoting is tested by the shell that parses it, not by reading the script.
 * Stand-ins for xmodmap and xprop keep a small keymap and the root property in files, so the
 * binder of off-map characters runs for real (awk, flock) against a keymap the test controls. Its
 * pure parts (quoting, typed text, cursor, timeout) are input-parts.test.ts.
 */
import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { INPUT_LIMITS, type InputAction } from '../../shared/src/computer-use.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import type { ExecOutcome, ExecSpec } from '../../agent/src/runtime/driver.js';
import {
  inputScript, inputTimeoutMs, KEYMAP_LOCK, runInput, SEGMENT_CHARS, shellQuote, typingSegments,
} from '../../agent/src/runtime/sandbox/computer-use/guest-input.js';
import { failure } from '../helpers/agent-failure.js';
import { NASTY } from '../helpers/nasty-text.js';
import { POINTER_ACTIONS } from '../helpers/input-actions.js';
import { typedText } from '../../agent/src/runtime/sandbox/computer-use/input-steps.js';

/**
 * Stand-ins that append one record each to a log, NUL-separated fields ending in \x01: xdotool
 * its env and argv, `xmodmap -` what it was asked to bind, `xprop -set` the property it set.
 */
let dir: string;
let fake: string;
let log: string;
let keymap: string;
let property: string;

/** `xmodmap -pk` of the stand-in keymap: 8, 10, 12, 13 and 14 are empty (8 stays xdotool's). */
const KEYMAP = [
  'There are 2 KeySyms per KeyCode; KeyCodes range from 8 to 15.',
  '',
  '    KeyCode\tKeysym (Keysym)\t...',
  '    Value  \tValue   (Name) \t...',
  '',
  '      8    \t',
  '      9    \t0x0061 (a)\t0x0041 (A)\t',
  '     10    \t',
  '     11    \t0x00fc (udiaeresis)\t0x00dc (Udiaeresis)\t',
  '     12    \t',
  '     13    \t',
  '     14    \t0x0000 (NoSymbol)\t0x0000 (NoSymbol)\t',
  '     15    \t0xff0d (Return)\t',
  '',
].join('\n');

/** Applies `keycode N = SYMS` lines from stdin to the stand-in keymap, as the X server would. */
const APPLY = String.raw`NR == FNR { if ($1 == "keycode") { l = sprintf("%7d    \t", $2); for (i = 4; i <= NF; i++) l = l ($i == "NoSymbol" ? "0x0000" : $i) " (x)\t"; n[$2] = l } next }
($1 in n) { print n[$1]; next }
{ print }`;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'canto-input-script-'));
  fake = join(dir, 'xdotool');
  log = join(dir, 'calls');
  keymap = join(dir, 'keymap');
  property = join(dir, 'property');
  const record = (fields: string) => `{ ${fields} printf '\\001\\0'; } >> ${shellQuote(log)}`;
  writeFileSync(
    fake,
    [
      '#!/bin/sh',
      record(`printf '%s\\0' xdotool "$DISPLAY" "$LC_ALL"; for a; do printf '%s\\0' "$a"; done;`),
      'case "$1" in',
      "  key) case \"$*\" in *Bogus*) echo \"(symbol) No such key name 'Bogus'. Ignoring it.\" >&2;; esac;;",
      '  type) case "$*" in *FAIL*) echo "xdo_enter_text_window reported an error" >&2; exit 1;; esac;;',
      '  mousemove) case "$*" in *666*) echo "XWarpPointer failed" >&2; exit 1;; esac;;',
      'esac',
      // Chained after an action, as a command of its own: the cursor, as the real one prints it.
      'for a; do [ "$a" = getmouselocation ] && printf "X=${FAKE_X:-7}\\nY=${FAKE_Y:-9}\\nSCREEN=0\\nWINDOW=42\\n"; done; exit 0',
      '',
    ].join('\n'),
  );
  writeFileSync(
    join(dir, 'xmodmap'),
    [
      '#!/bin/sh',
      `case "$1" in -pk) cat ${shellQuote(keymap)};; -) in=$(cat)`,
      `  ${record(`printf 'xmodmap\\0%s\\0' "$in";`)}`,
      `  printf '%s\\n' "$in" | awk ${shellQuote(APPLY)} - ${shellQuote(keymap)} > ${shellQuote(`${keymap}.new`)} && mv ${shellQuote(`${keymap}.new`)} ${shellQuote(keymap)};; esac`,
      '',
    ].join('\n'),
  );
  writeFileSync(
    join(dir, 'xprop'),
    [
      '#!/bin/sh',
      'set=; for a; do [ "$a" = -set ] && set=1; v=$a; done',
      `if [ -n "$set" ]; then ${record(`printf 'xprop\\0%s\\0' "$v";`)}; printf '%s' "$v" > ${shellQuote(property)}`,
      `elif [ -f ${shellQuote(property)} ]; then printf '_CANTO_INPUT_KEYS = "%s"\\n' "$(cat ${shellQuote(property)})"`,
      "else echo '_CANTO_INPUT_KEYS:  not found.'; fi",
      '',
    ].join('\n'),
  );
  for (const tool of ['xdotool', 'xmodmap', 'xprop']) chmodSync(join(dir, tool), 0o755);
  resetKeymap();
});

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** A fresh X server: the stand-in keymap as it starts, no property. */
function resetKeymap(): void {
  writeFileSync(keymap, KEYMAP);
  rmSync(property, { force: true });
}

/** exec as the guest would do it, with the stand-ins in the tools' place and the user's env set. */
async function fakeExec(spec: ExecSpec): Promise<ExecOutcome> {
  expect(spec.command.split('/usr/bin/xdotool').length).toBeGreaterThan(1);
  const command = spec.command
    .replaceAll('/usr/bin/xdotool', fake)
    .replaceAll('/usr/bin/xmodmap', join(dir, 'xmodmap'))
    .replaceAll('/usr/bin/xprop', join(dir, 'xprop'))
    .replaceAll(KEYMAP_LOCK, join(dir, 'lock'));
  const out = spawnSync('/bin/sh', ['-c', command], {
    encoding: 'utf8',
    // What a user's env file might export: the script must set its own.
    env: { PATH: '/usr/bin:/bin', DISPLAY: ':99', LC_ALL: 'C', IFS: '0123456789', prev: 'x', W: 'y', K: 'z', P: '"' },
    timeout: spec.timeoutMs,
  });
  return { exitCode: out.status ?? 128, stdout: out.stdout, stderr: out.stderr, stdoutTruncated: false, stderrTruncated: false };
}

/** Every stand-in call of one batch, in order: the tool and its fields. */
async function records(actions: InputAction[]): Promise<string[][]> {
  writeFileSync(log, '');
  expect(await runInput(fakeExec, actions)).toEqual({ x: 7, y: 9 });
  return readFileSync(log, 'utf8')
    .split('\u0001\0')
    .slice(0, -1)
    .map((r) => r.split('\0').slice(0, -1));
}

/** Every xdotool call of one batch: its argv, after checking the env it saw. */
async function calls(actions: InputAction[]): Promise<string[][]> {
  return (await records(actions))
    .filter(([tool]) => tool === 'xdotool')
    .map(([, display, lcAll, ...argv]) => {
      expect([display, lcAll]).toEqual([':0', 'C.UTF-8']);
      return argv;
    });
}

const CURSOR = ['getmouselocation', '--shell'];

describe('inputScript', () => {
  it('an empty batch only reads the cursor', async () => {
    expect(await calls([])).toEqual([CURSOR]);
    expect(inputScript([]).match(/xdotool/g)).toHaveLength(2); // x() and the cursor read
  });

  it('gives each action its xdotool words', async () => {
    const seen = await calls([
      ...POINTER_ACTIONS,
      { type: 'scroll', direction: 'up' },
      { type: 'scroll', direction: 'down', amount: 3 },
      { type: 'scroll', direction: 'left', amount: 2 },
      { type: 'scroll', direction: 'right', amount: 50 },
      { type: 'type', text: 'hello' },
      { type: 'type', text: 'x', delay_ms: 0 },
      { type: 'key', combo: 'ctrl+shift+Return' },
      { type: 'wait', ms: 1 },
      { type: 'mouse_move', x: 32767, y: 0 },
    ]);
    expect(seen).toEqual([
      ['mousemove', '10', '20'],
      ['click', '--delay', '0', '1'],
      ['mousemove', '5', '6', 'click', '--delay', '0', '3'],
      ['click', '--delay', '0', '2', 'sleep', '0.12', 'click', '--delay', '0', '2'],
      ['mousedown', '1'],
      ['mouseup', '3'],
      ['mousemove', '100', '200', 'mousedown', '1', 'sleep', '0.05', 'mousemove', '201', '300', 'mousemove', '301', '400', 'sleep', '0.05', 'mouseup', '1'],
      ['click', '--repeat', '1', '--delay', '0', '4'],
      ['click', '--repeat', '3', '--delay', '0', '5'],
      ['click', '--repeat', '2', '--delay', '0', '6'],
      ['click', '--repeat', '50', '--delay', '0', '7'],
      ['type', '--delay', '24', '--', 'hello'],
      ['type', '--delay', '0', '--', 'x'],
      ['key', '--delay', '0', '--', 'ctrl+shift+Return'],
      // The last action, a pointer action, reads the cursor in its own xdotool.
      ['mousemove', '32767', '0', ...CURSOR],
    ]);
    expect(INPUT_LIMITS.doubleClickGapMs).toBe(120);
  });

  it('a drag without a start reads the cursor for its halfway point', async () => {
    const seen = await calls([{ type: 'drag', to: { x: 101, y: 49 }, button: 'middle' }]);
    // The stand-in cursor is at (7, 9): halfway to (101, 49) is (54, 29).
    expect(seen).toEqual([
      CURSOR,
      ['mousedown', '2', 'sleep', '0.05', 'mousemove', '54', '29', 'mousemove', '101', '49', 'sleep', '0.05', 'mouseup', '2', ...CURSOR],
    ]);
  });

  it('passes nasty text to xdotool type as one exact word', async () => {
    for (const text of NASTY.filter((t) => t !== '')) {
      const seen = await calls([{ type: 'type', text, delay_ms: 5 }]);
      expect(seen, JSON.stringify(text)).toEqual([['type', '--delay', '10', '--', typedText(text)], CURSOR]);
    }
    const seen = await calls([{ type: 'type', text: '$((1+1))' }, { type: 'type', text: "'$(id)'" }]);
    expect(seen.slice(0, 2).map((argv) => argv[4])).toEqual(['$((1+1))', "'$(id)'"]);
  });

  it('waits run in order between actions and take their time', async () => {
    const t0 = performance.now();
    const seen = await calls([{ type: 'mouse_move', x: 1, y: 1 }, { type: 'wait', ms: 150 }, { type: 'mouse_move', x: 2, y: 2 }]);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(150);
    expect(seen).toEqual([['mousemove', '1', '1'], ['mousemove', '2', '2', ...CURSOR]]);
  });

  it('stays under the 128 KiB argv string limit for the largest batch of quotes', () => {
    const limit = 128 * 1024;
    for (const unit of ["'", "'x", "''x"]) {
      const text = unit.repeat(Math.floor(INPUT_LIMITS.maxTextBytes / unit.length));
      const batch: InputAction[] = Array.from({ length: 4 }, () => ({ type: 'type', text }));
      batch.push(...Array.from({ length: 46 }, (): InputAction => ({ type: 'drag', to: { x: 32767, y: 32767 }, button: 'right' })));
      expect(Buffer.byteLength(inputScript(batch)), JSON.stringify(unit)).toBeLessThan(limit);
    }
    // Off-map text with as many segments as it can have (36 new characters every 36) and quotes.
    const text = Array.from({ length: 2730 }, (_, i) => `'${String.fromCodePoint(0x100 + (i % 1792))}`).join('');
    expect(Buffer.byteLength(text)).toBeLessThanOrEqual(INPUT_LIMITS.maxTextBytes);
    const batch: InputAction[] = Array.from({ length: 4 }, () => ({ type: 'type', text }));
    batch.push(...Array.from({ length: 46 }, (): InputAction => ({ type: 'drag', to: { x: 32767, y: 32767 }, button: 'right' })));
    expect(Buffer.byteLength(inputScript(batch))).toBeLessThan(limit);
  });
});

/** The keysym xdotool looks for to type `ch`, spelled as xmodmap prints it. */
function keysym(ch: string): string {
  const cp = ch.codePointAt(0) ?? 0;
  return `0x${(cp < 0x100 ? cp : 0x1000000 + cp).toString(16).padStart(4, '0')}`;
}
/** A keycode's groups as the binder writes them: each character on both levels. */
const groups = (chars: string) => [...chars].map((c) => `${keysym(c)} ${keysym(c)}`).join(' ');
/** Property entries `keycode.group.keysym` for characters bound from `keycode.group` on. */
const entries = (keycode: number, group: number, chars: string) => [...chars].map((c, i) => `${keycode}.${group + i}.${keysym(c)}`);
/** The binder's calls in a batch's records: the keymap lines (sorted) and the property set. */
const binds = (seen: string[][]) =>
  seen.filter(([tool]) => tool !== 'xdotool').map(([tool, value = '']) => (tool === 'xmodmap' ? [tool, ...value.split('\n').sort()] : [tool, value]));
/** `n` distinct CJK characters from U+4E00 + `from`. */
const cjk = (from: number, n: number) => Array.from({ length: n }, (_, i) => String.fromCodePoint(0x4e00 + from + i)).join('');

describe('binding off-map characters', () => {
  it('ASCII text has no binding step', async () => {
    expect(inputScript([{ type: 'type', text: "plain 'ASCII' ~\n\t\u007f" }, { type: 'key', combo: 'ctrl+a' }])).not.toMatch(/xmodmap|xprop|awk|flock/);
    resetKeymap();
    expect((await records([{ type: 'type', text: 'hello\n' }])).map(([tool]) => tool)).toEqual(['xdotool', 'xdotool']);
  });

  it('binds every off-map character first, to the keysym xdotool looks for, then types the text', async () => {
    resetKeymap();
    const text = 'aé€日ü😀\u00a0é\n';
    const seen = await records([{ type: 'type', text, delay_ms: 0 }]);
    expect(seen.map(([tool]) => tool)).toEqual(['xmodmap', 'xprop', 'xdotool', 'xdotool']);
    // ü is on keycode 11 already; 8, the lowest empty keycode, is left to xdotool. Latin-1 keeps
    // its legacy keysym (é is 0xe9, eacute), the rest is 0x1000000 + the code point.
    expect(binds(seen)).toEqual([
      ['xmodmap', 'keycode 10 = 0x00e9 0x00e9 0x10020ac 0x10020ac 0x10065e5 0x10065e5 0x101f600 0x101f600', 'keycode 12 = 0x00a0 0x00a0'],
      ['xprop', '10.1.0x00e9 10.2.0x10020ac 10.3.0x10065e5 10.4.0x101f600 12.1.0x00a0'],
    ]);
    expect(groups('é€')).toBe('0x00e9 0x00e9 0x10020ac 0x10020ac');
    expect(seen[2]?.slice(3)).toEqual(['type', '--delay', '0', '--', typedText(text)]);

    // A later batch finds them bound and changes nothing; a new character takes the next slot.
    expect(binds(await records([{ type: 'type', text: '€ 日 😀!' }, { type: 'type', text: 'é' }]))).toEqual([]);
    expect(binds(await records([{ type: 'type', text: '日本' }]))).toEqual([
      ['xmodmap', `keycode 12 = ${groups('\u00a0本')}`],
      ['xprop', [...entries(10, 1, 'é€日😀'), ...entries(12, 1, '\u00a0本')].join(' ')],
    ]);
  });

  it('recycles the slots bound least recently, never one the current or the previous segment types', async () => {
    resetKeymap();
    const [a, b, c] = [cjk(0, 8), cjk(16, 8), cjk(32, 3)];
    await records([{ type: 'type', text: a }]);
    await records([{ type: 'type', text: b }]);
    // All 16 slots are taken. a[0] and a[1], bound first, are typed just before c: c takes the
    // next oldest.
    const seen = await records([{ type: 'type', text: a.slice(0, 2) }, { type: 'type', text: c }]);
    expect(binds(seen)).toEqual([
      ['xmodmap', `keycode 10 = ${groups(a.slice(0, 2) + c.slice(0, 2))}`, `keycode 12 = ${groups(c[2] + a.slice(5))}`],
      ['xprop', [...entries(10, 1, a.slice(0, 2)), ...entries(12, 2, a.slice(5)), ...entries(13, 1, b.slice(0, 4)), ...entries(14, 1, b.slice(4)), ...entries(10, 3, c.slice(0, 2)), ...entries(12, 1, c[2] ?? '')].join(' ')],
    ]);
    expect(seen.filter(([tool]) => tool === 'xdotool').map((r) => r.at(-1))).toEqual([a.slice(0, 2), c, '--shell']);
  });

  it('leaves what finds no slot to xdotool, and ignores property entries the keymap does not show', async () => {
    resetKeymap();
    // Keycode 10 was reset (a new keymap); 9 is a real key, never the binder's.
    writeFileSync(property, `10.1.${keysym('丁')} 9.2.0x1234567`);
    const text = cjk(0, 18);
    const seen = await records([{ type: 'type', text }]);
    expect(binds(seen)).toEqual([
      ['xmodmap', ...[10, 12, 13, 14].map((k, i) => `keycode ${k} = ${groups(text.slice(i * 4, i * 4 + 4))}`)],
      ['xprop', [10, 12, 13, 14].flatMap((k, i) => entries(k, 1, text.slice(i * 4, i * 4 + 4))).join(' ')],
    ]);
    expect(seen.find(([tool, , , cmd]) => tool === 'xdotool' && cmd === 'type')?.at(-1)).toBe(text);
  });

  it('types everything when the keymap cannot be read', async () => {
    rmSync(keymap);
    const seen = await records([{ type: 'type', text: 'é€日' }]);
    expect(seen.map(([tool]) => tool)).toEqual(['xdotool', 'xdotool']);
    expect(seen[0]?.at(-1)).toBe('é€日');
    resetKeymap();
  });

  it('cuts text into segments of at most SEGMENT_CHARS distinct off-map characters', async () => {
    expect(typingSegments('plain')).toEqual(['plain']);
    expect(typingSegments('日'.repeat(1000))).toEqual(['日'.repeat(1000)]);
    const text = [...cjk(0, 80)].map((ch, i) => `${ch}x${cjk(0, 1 + (i % 7))}`).join('');
    const segments = typingSegments(text);
    expect(segments.join('')).toBe(text);
    // A segment starts at the character that would be one too many, so the third holds the
    // repeats of earlier characters that follow it too.
    const distinct = segments.map((seg) => new Set([...seg].filter((ch) => ch !== 'x')).size);
    expect(distinct.slice(0, 2)).toEqual([SEGMENT_CHARS, SEGMENT_CHARS]);
    expect(distinct).toHaveLength(3);
    expect(distinct[2]).toBeLessThanOrEqual(SEGMENT_CHARS);
    // Each segment is typed by its own xdotool, after its binding step.
    resetKeymap();
    const seen = await records([{ type: 'type', text, delay_ms: 3 }]);
    const typed = seen.filter(([tool, , , cmd]) => tool === 'xdotool' && cmd === 'type');
    expect(typed.map((r) => r.slice(3, -1))).toEqual(segments.map(() => ['type', '--delay', '6', '--']));
    expect(typed.map((r) => r.at(-1))).toEqual(segments);
    expect(seen[0]?.[0]).toBe('xmodmap');
  });
});

describe('runInput failures', () => {
  it('stops at a failed action and names it', async () => {
    writeFileSync(log, '');
    const err = await failure(
      runInput(fakeExec, [{ type: 'mouse_move', x: 1, y: 1 }, { type: 'type', text: 'FAIL' }, { type: 'mouse_move', x: 2, y: 2 }]),
    );
    expect([err.code, err.retryable]).toEqual(['runtime_error', false]);
    expect(err.message).toBe('input action 1 (type) failed: xdo_enter_text_window reported an error');
    // Nothing after the failed action ran, not even the cursor read.
    expect(readFileSync(log, 'utf8').split('\u0001\0')).toHaveLength(3);
  });

  it('names a failed last pointer action, whose xdotool was to read the cursor too', async () => {
    writeFileSync(log, '');
    const err = await failure(runInput(fakeExec, [{ type: 'click' }, { type: 'mouse_move', x: 666, y: 1 }]));
    expect(err.message).toBe('input action 1 (mouse_move) failed: XWarpPointer failed');
    expect(readFileSync(log, 'utf8').split('\u0001\0')).toHaveLength(3);
  });

  it('treats an unknown key name as a failure although xdotool exits 0', async () => {
    const err = await failure(runInput(fakeExec, [{ type: 'key', combo: 'ctrl+Bogus' }]));
    expect(err.message).toBe("input action 0 (key) failed: (symbol) No such key name 'Bogus'. Ignoring it.");
  });

  it('reports a cursor the X server did not give', async () => {
    const exec = async (): Promise<ExecOutcome> => ({ exitCode: 0, stdout: '', stderr: '', stdoutTruncated: false, stderrTruncated: false });
    expect((await failure(runInput(exec, []))).code).toBe('runtime_error');
    const broken = async (): Promise<ExecOutcome> => ({
      exitCode: 4, stdout: '', stderr: "Error: Can't open display: :0\nreading the cursor failed\n", stdoutTruncated: false, stderrTruncated: false,
    });
    expect((await failure(runInput(broken, []))).message).toBe("input failed (exit 4): Error: Can't open display: :0 reading the cursor failed");
  });

  it('passes the exec timeout through', async () => {
    const specs: ExecSpec[] = [];
    const exec = async (spec: ExecSpec): Promise<ExecOutcome> => {
      specs.push(spec);
      throw new AgentFailure('timeout', 'command did not finish', true);
    };
    expect((await failure(runInput(exec, [{ type: 'wait', ms: 4000 }]))).code).toBe('timeout');
    expect(specs[0]?.timeoutMs).toBe(inputTimeoutMs([{ type: 'wait', ms: 4000 }]));
  });
});

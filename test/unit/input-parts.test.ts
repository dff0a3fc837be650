/**
 * The pure parts of the input batch script (agent/src/runtime/sandbox/computer-use/guest-input.ts):
 * shell quoting (checked by the real /bin/sh), typed text, the cursor answer, the batch's
 * timeout, and the steps the guest helper plays (input-steps.ts). The script itself, run against stand-ins, is input-script.test.ts.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import {
  inputTimeoutMs,
  MAX_TIMEOUT_MS,
  parseCursor,
  shellQuote,
} from '../../agent/src/runtime/sandbox/computer-use/guest-input.js';
import { KEYSYMS, keysymsOf, typedText, xinputSteps } from '../../agent/src/runtime/sandbox/computer-use/input-steps.js';
import { NASTY } from '../helpers/nasty-text.js';
import { POINTER_ACTIONS } from '../helpers/input-actions.js';

describe('shellQuote', () => {
  it('gives back every string exactly through /bin/sh', () => {
    for (const s of NASTY) {
      const out = spawnSync('/bin/sh', ['-c', `printf %s ${shellQuote(s)}`], { encoding: 'utf8' });
      expect(out.stdout, JSON.stringify(s)).toBe(s);
    }
  });

  it('escapes a run of quotes once', () => {
    expect(shellQuote("it's")).toBe(`'it'\\''s'`);
    expect(shellQuote("'''")).toBe(`''\\'\\'\\'''`);
    expect(shellQuote('plain')).toBe(`'plain'`);
  });
});

describe('typedText', () => {
  it('turns every line break into one carriage return (xdotool types it as Return)', () => {
    expect(typedText('a\nb\r\nc\rd\n\ne')).toBe('a\rb\rc\rd\r\re');
    expect(typedText('no breaks')).toBe('no breaks');
  });
});

describe('parseCursor', () => {
  it('reads X and Y from getmouselocation --shell', () => {
    expect(parseCursor('X=10\nY=768\nSCREEN=0\nWINDOW=1234\n')).toEqual({ x: 10, y: 768 });
    expect(parseCursor('X=0\nY=0\n')).toEqual({ x: 0, y: 0 });
  });

  it('gives null without both coordinates', () => {
    expect(parseCursor('')).toBeNull();
    expect(parseCursor('X=10\n')).toBeNull();
    expect(parseCursor("Error: Can't open display: :0\n")).toBeNull();
    expect(parseCursor('WINDOW=X=1\nY=2\n')).toBeNull();
  });
});

describe('inputTimeoutMs', () => {
  it('adds waits and typing to a base and caps the total', () => {
    const empty = inputTimeoutMs([]);
    expect(empty).toBeGreaterThanOrEqual(5_000);
    const waits = inputTimeoutMs([{ type: 'wait', ms: 5000 }, { type: 'wait', ms: 3000 }]);
    expect(waits - empty).toBeGreaterThanOrEqual(8000);
    // Characters, not bytes: 100 three-byte characters at 40 ms each.
    const typed = inputTimeoutMs([{ type: 'type', text: '日'.repeat(100), delay_ms: 40 }]);
    expect(typed - empty).toBeGreaterThanOrEqual(4000);
    expect(typed - empty).toBeLessThan(8000);
    expect(inputTimeoutMs([{ type: 'type', text: 'x'.repeat(8192), delay_ms: 500 }])).toBe(MAX_TIMEOUT_MS);
    // Binding off-map characters takes time of its own, per segment.
    expect(inputTimeoutMs([{ type: 'type', text: 'é'.repeat(10) }])).toBeGreaterThan(inputTimeoutMs([{ type: 'type', text: 'e'.repeat(10) }]));
  });
});

describe('xinputSteps', () => {
  it("gives each action xdotool's events in order, with its pauses", () => {
    expect(xinputSteps([
      ...POINTER_ACTIONS,
      { type: 'drag', to: { x: 7, y: 8 }, button: 'middle' },
      { type: 'scroll', direction: 'up' },
      { type: 'scroll', direction: 'right', amount: 2 },
      { type: 'key', combo: 'ctrl+shift+Return' },
      { type: 'wait', ms: 250 },
    ])?.join(' ')).toBe([
      'm 10 20',
      'p 1 r 1',
      'm 5 6 p 3 r 3',
      'p 2 r 2 s 120 p 2 r 2',
      'p 1',
      'r 3',
      'm 100 200 p 1 s 50 m 201 300 m 301 400 s 50 r 1',
      'p 2 s 50 h 7 8 m 7 8 s 50 r 2',
      'p 4 r 4',
      'p 7 r 7 p 7 r 7',
      // Pressed in order and released in the same order, as xdotool does.
      `k ${0xffe3} k ${0xffe1} k ${0xff0d} u ${0xffe3} u ${0xffe1} u ${0xff0d}`,
      's 250',
    ].join(' '));
    expect(xinputSteps([])).toEqual([]);
  });

  it('types printable ASCII, tabs and line breaks, delay_ms per keystroke: half after the press, half after the release', () => {
    // `\r\n` is one line break, one Return.
    expect(xinputSteps([{ type: 'type', text: 'aB\t\r\n\n' }, { type: 'type', text: ' ', delay_ms: 0 }])?.join(' ')).toBe(
      `c 97 6000 c 66 6000 c ${0xff09} 6000 c ${0xff0d} 6000 c ${0xff0d} 6000 c 32 0`,
    );
  });

  it('leaves a batch that types other text, or names a key not known here, to the script', () => {
    expect(xinputSteps([{ type: 'mouse_move', x: 1, y: 1 }, { type: 'type', text: 'a é' }])).toBeNull();
    expect(xinputSteps([{ type: 'type', text: '\u0007' }])).toBeNull();
    expect(xinputSteps([{ type: 'key', combo: 'ctrl+Nonexistent_Key' }, { type: 'click' }])).toBeNull();
  });
});

describe('keysymsOf', () => {
  it("reads xdotool's aliases in any case and keysym names exactly", () => {
    expect(keysymsOf('CTRL+Alt+super+Shift+META+enter+Return')).toEqual([0xffe3, 0xffe9, 0xffeb, 0xffe1, 0xffe7, 0xff0d, 0xff0d]);
    expect(keysymsOf('a')).toEqual([0x61]);
    expect(keysymsOf('F12')).toEqual([0xffc9]);
    for (const unknown of ['TAB', 'A', 'ctrl++a', '', 'ctrl+a c', '38', 'eacute']) expect(keysymsOf(unknown), unknown).toBeNull();
  });

  it.skipIf(!existsSync('/usr/include/X11/keysymdef.h'))('gives the values X11/keysymdef.h gives', () => {
    const header = readFileSync('/usr/include/X11/keysymdef.h', 'utf8');
    for (const [name, sym] of KEYSYMS) {
      const defined = new RegExp(`^#define XK_${name}\\s+0x([0-9a-f]+)`, 'm').exec(header);
      expect(defined, name).not.toBeNull();
      expect(Number.parseInt(defined![1]!, 16), name).toBe(sym);
    }
  });
});

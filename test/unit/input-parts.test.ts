/**
 * The pure parts of the input batch script (agent/src/runtime/sandbox/computer-use/guest-input.ts):
 * shell quoting (checked by the real /bin/sh), typed text, the cursor answer, the batch's
 * timeout and the pointer steps the guest helper plays. The script itself, run against stand-ins, is input-script.test.ts.
 */
import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import {
  inputTimeoutMs,
  MAX_TIMEOUT_MS,
  parseCursor,
  pointerSteps,
  shellQuote,
  typedText,
} from '../../agent/src/runtime/sandbox/computer-use/guest-input.js';
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

describe('pointerSteps', () => {
  it("gives each pointer action xdotool's events in order, with its pauses", () => {
    expect(pointerSteps([
      ...POINTER_ACTIONS,
      { type: 'drag', to: { x: 7, y: 8 }, button: 'middle' },
      { type: 'scroll', direction: 'up' },
      { type: 'scroll', direction: 'right', amount: 2 },
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
      's 250',
    ].join(' '));
    expect(pointerSteps([])).toEqual([]);
  });

  it('leaves a batch that types or presses keys to the script', () => {
    expect(pointerSteps([{ type: 'mouse_move', x: 1, y: 1 }, { type: 'type', text: 'a' }])).toBeNull();
    expect(pointerSteps([{ type: 'key', combo: 'Return' }, { type: 'click' }])).toBeNull();
  });
});

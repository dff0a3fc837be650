/**
 * The input batch script (agent/src/runtime/sandbox/guest-input.ts), run by the real /bin/sh with
 * a stand-in xdotool that records its argv: what xdotool would receive is checked word for word,
 * so the quoting is tested by the shell that parses it, not by reading the script.
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
  inputScript,
  inputTimeoutMs,
  MAX_TIMEOUT_MS,
  parseCursor,
  runInput,
  shellQuote,
  typedText,
} from '../../agent/src/runtime/sandbox/guest-input.js';
import { failure } from '../helpers/agent-failure.js';

const NASTY = [
  '',
  "it's",
  "'''",
  "'x'x'",
  '$(touch /tmp/pwned) `id` ${HOME} $HOME',
  'back\\slash\\\\ and \\n',
  'line1\nline2\r\n\ttab',
  '-starts-with-dash',
  '--',
  '"double" \'single\'',
  'é€日本語 😀 \u00a0',
  '* ? [a] ~ # ; & | < > ( ) { } !',
];

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
  });
});

/** A stand-in xdotool: appends its env and argv, NUL-separated, one record per call. */
let dir: string;
let fake: string;
let log: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'canto-input-script-'));
  fake = join(dir, 'xdotool');
  log = join(dir, 'calls');
  writeFileSync(
    fake,
    [
      '#!/bin/sh',
      `{ printf '%s\\0' "$DISPLAY" "$LC_ALL"; for a; do printf '%s\\0' "$a"; done; printf '\\001\\0'; } >> ${shellQuote(log)}`,
      'case "$1" in',
      '  getmouselocation) printf "X=${FAKE_X:-7}\\nY=${FAKE_Y:-9}\\nSCREEN=0\\nWINDOW=42\\n";;',
      "  key) case \"$*\" in *Bogus*) echo \"(symbol) No such key name 'Bogus'. Ignoring it.\" >&2;; esac;;",
      '  type) case "$*" in *FAIL*) echo "xdo_enter_text_window reported an error" >&2; exit 1;; esac;;',
      'esac',
      '',
    ].join('\n'),
  );
  chmodSync(fake, 0o755);
});

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** exec as the guest would do it, with the stand-in in xdotool's place and the user's env set. */
async function fakeExec(spec: ExecSpec): Promise<ExecOutcome> {
  expect(spec.command.split('/usr/bin/xdotool').length).toBeGreaterThan(1);
  const out = spawnSync('/bin/sh', ['-c', spec.command.replaceAll('/usr/bin/xdotool', fake)], {
    encoding: 'utf8',
    // What a user's env file might export: the script must set its own.
    env: { PATH: '/usr/bin:/bin', DISPLAY: ':99', LC_ALL: 'C', IFS: '0123456789' },
    timeout: spec.timeoutMs,
  });
  return { exitCode: out.status ?? 128, stdout: out.stdout, stderr: out.stderr, stdoutTruncated: false, stderrTruncated: false };
}

/** Every xdotool call of one batch: its argv, after checking the env it saw. */
async function calls(actions: InputAction[]): Promise<string[][]> {
  writeFileSync(log, '');
  expect(await runInput(fakeExec, actions)).toEqual({ x: 7, y: 9 });
  const records = readFileSync(log, 'utf8').split('\u0001\0').slice(0, -1);
  return records.map((r) => {
    const [display, lcAll, ...argv] = r.split('\0').slice(0, -1);
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
      { type: 'mouse_move', x: 10, y: 20 },
      { type: 'click' },
      { type: 'click', x: 5, y: 6, button: 'right' },
      { type: 'click', button: 'middle', double: true },
      { type: 'button_press', button: 'left' },
      { type: 'button_release', button: 'right' },
      { type: 'drag', from: { x: 100, y: 200 }, to: { x: 301, y: 400 } },
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
      ['type', '--delay', '12', '--', 'hello'],
      ['type', '--delay', '0', '--', 'x'],
      ['key', '--delay', '0', '--', 'ctrl+shift+Return'],
      ['mousemove', '32767', '0'],
      CURSOR,
    ]);
    expect(INPUT_LIMITS.doubleClickGapMs).toBe(120);
  });

  it('a drag without a start reads the cursor for its halfway point', async () => {
    const seen = await calls([{ type: 'drag', to: { x: 101, y: 49 }, button: 'middle' }]);
    // The stand-in cursor is at (7, 9): halfway to (101, 49) is (54, 29).
    expect(seen).toEqual([
      CURSOR,
      ['mousedown', '2', 'sleep', '0.05', 'mousemove', '54', '29', 'mousemove', '101', '49', 'sleep', '0.05', 'mouseup', '2'],
      CURSOR,
    ]);
  });

  it('passes nasty text to xdotool type as one exact word', async () => {
    for (const text of NASTY.filter((t) => t !== '')) {
      const seen = await calls([{ type: 'type', text, delay_ms: 5 }]);
      expect(seen, JSON.stringify(text)).toEqual([['type', '--delay', '5', '--', typedText(text)], CURSOR]);
    }
    const seen = await calls([{ type: 'type', text: '$((1+1))' }, { type: 'type', text: "'$(id)'" }]);
    expect(seen.slice(0, 2).map((argv) => argv[4])).toEqual(['$((1+1))', "'$(id)'"]);
  });

  it('waits run in order between actions and take their time', async () => {
    const t0 = performance.now();
    const seen = await calls([{ type: 'mouse_move', x: 1, y: 1 }, { type: 'wait', ms: 150 }, { type: 'mouse_move', x: 2, y: 2 }]);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(150);
    expect(seen).toEqual([['mousemove', '1', '1'], ['mousemove', '2', '2'], CURSOR]);
  });

  it('stays under the 128 KiB argv string limit for the largest batch of quotes', () => {
    const limit = 128 * 1024;
    for (const unit of ["'", "'x", "''x"]) {
      const text = unit.repeat(Math.floor(INPUT_LIMITS.maxTextBytes / unit.length));
      const batch: InputAction[] = Array.from({ length: 4 }, () => ({ type: 'type', text }));
      batch.push(...Array.from({ length: 46 }, (): InputAction => ({ type: 'drag', to: { x: 32767, y: 32767 }, button: 'right' })));
      expect(Buffer.byteLength(inputScript(batch)), JSON.stringify(unit)).toBeLessThan(limit);
    }
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

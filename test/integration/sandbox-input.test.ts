/**
 * Input batches against a real sandbox desktop (Xvfb + openbox): the sandbox driver's `input`,
 * which runs agent/src/runtime/sandbox/guest-input.ts. An `xev` window inside the desktop records
 * what the X server delivered (key symbols and the bytes they stand for, buttons, pointer
 * positions), so every assertion is about events an application would see. Needs root. The
 * desktop is destroyed in afterAll; batch timings are printed for the docs.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { InputAction } from '../../shared/src/computer-use.js';
import { newId } from '../../shared/src/ids.js';
import { typedText } from '../../agent/src/runtime/sandbox/computer-use/input-steps.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { failure } from '../helpers/agent-failure.js';
import { isRoot, median, stopwatch } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';
import { mappingChangesWhileTyping, parseXev, type XEvent } from '../helpers/xev.js';

if (!isRoot) console.warn('sandbox input tests skipped: they need root (namespaces, cgroups)');

const XEV_LOG = '/tmp/xev.log';

const { timings, timed } = stopwatch();

/** The root window property where the input binder keeps its slots (guest-input.ts). */
const KEYS_PROPERTY = '_CANTO_INPUT_KEYS';

describe.skipIf(!isRoot)('sandbox driver input', () => {
  let base: string;
  let driver: SandboxDriver;
  let id: string;
  let xevPid = 0;
  /** The xev window's client area, in root coordinates. */
  let win: { x: number; y: number; width: number; height: number };
  /** Bytes of the xev log already looked at. */
  let mark = 0;

  // One test saturates the desktop's CPU on purpose, and a full suite run loads the host too:
  // the helper's own commands get room to finish (what is checked is the input, not their speed).
  async function sh(command: string): Promise<string> {
    const out = await driver.exec(id, { command, timeoutMs: 30_000, maxOutputBytes: 4 * 1024 * 1024 });
    expect(out.exitCode, `${command}: ${out.stderr}`).toBe(0);
    return out.stdout;
  }

  /** The events xev logged since the last call, once `done` holds for them. */
  async function eventsUntil(done: (events: XEvent[]) => boolean, what: string): Promise<XEvent[]> {
    let events: XEvent[] = [];
    let raw = '';
    await until(async () => {
      raw = await sh(`tail -c +${mark + 1} ${XEV_LOG}`);
      events = parseXev(raw);
      return done(events);
    }, 30_000, what);
    mark += Buffer.byteLength(raw);
    return events;
  }

  /** Skips whatever earlier steps left in the log. */
  async function markNow(): Promise<void> {
    mark = Number((await sh(`wc -c < ${XEV_LOG}`)).trim());
  }

  /**
   * Skips everything sent so far, once xev has logged it: xev reads events in order, so a Pause
   * key sent now arrives after them all. A log read while xev lags (it fetches the keymap again
   * after every change, which off-map typing makes for each key) would still be growing.
   */
  async function caughtUp(): Promise<void> {
    await input([{ type: 'key', combo: 'Pause' }]);
    await eventsUntil((ev) => ev.some((e) => e.type === 'KeyRelease' && e.keysym === 'Pause'), 'xev to catch up');
  }

  const input = (actions: InputAction[]) => driver.input(id, actions);
  /** The events of a typed text that ends in `z`. */
  const typedEvents = (what: string) => eventsUntil((ev) => ev.some((e) => e.type === 'KeyRelease' && e.keysym === 'z'), what);
  /** The text the key presses carried. */
  const typedBytes = (events: XEvent[]) =>
    Buffer.concat(events.filter((e) => e.type === 'KeyPress').map((e) => e.bytes)).toString('utf8');
  const inside = (dx: number, dy: number) => ({ x: win.x + dx, y: win.y + dy });
  const presses = (events: XEvent[]) => events.filter((e) => e.type === 'ButtonPress');

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-input-test-'));
    driver = await createSandboxDriver({ stateDir: join(base, 'state') });
    id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    // A window mapped while openbox is still starting can stay unmapped for good: wait for the
    // window manager to publish its work area first.
    await until(async () => {
      const out = await driver.exec(id, { command: 'DISPLAY=:0 /usr/bin/xprop -root _NET_WORKAREA', timeoutMs: 5_000, maxOutputBytes: 65536 });
      return out.stdout.includes('_NET_WORKAREA(CARDINAL)');
    }, 20_000, 'openbox');
    // Output to a file, stdin from /dev/null: the background xev holds none of exec's pipes.
    xevPid = Number(
      (
        await sh(
          `DISPLAY=:0 LANG=C.UTF-8 /usr/bin/xev -geometry 500x400+40+40 -event keyboard -event mouse > ${XEV_LOG} 2>&1 < /dev/null & echo $!`,
        )
      ).trim(),
    );
    // Mapped and framed by openbox (its parent is no longer the root), so it will not move.
    const info = await until(async () => {
      const out = await driver.exec(id, {
        command: "DISPLAY=:0 /usr/bin/xwininfo -name 'Event Tester' -children -stats",
        timeoutMs: 5_000,
        maxOutputBytes: 65536,
      });
      const framed = /Map State: IsViewable/.test(out.stdout) && !/Parent window id: .*the root window/.test(out.stdout);
      return out.exitCode === 0 && framed ? out.stdout : null;
    }, 10_000, 'the xev window');
    const num = (label: string) => Number(new RegExp(`${label}:\\s+(\\d+)`).exec(info)?.[1]);
    win = { x: num('Absolute upper-left X'), y: num('Absolute upper-left Y'), width: num('Width'), height: num('Height') };
    expect(win.width).toBe(500);
    // A click gives the window the keyboard focus, as a user's would.
    await input([{ type: 'click', ...inside(250, 200) }]);
    await eventsUntil((ev) => ev.some((e) => e.type === 'ButtonRelease'), 'the focusing click');
    // No server autorepeat: a key press and release that load holds apart for longer than its
    // delay (660 ms) would otherwise log extra presses.
    await sh('DISPLAY=:0 /usr/bin/xset r off');
  });

  afterAll(async () => {
    if (xevPid > 0) await driver.exec(id, { command: `kill ${xevPid}`, timeoutMs: 5_000, maxOutputBytes: 1024 }).catch(() => undefined);
    if (id) await driver?.destroy(id);
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
    const summary = Object.fromEntries(Object.entries(timings).map(([k, v]) => [k, { median: median(v), runs: v.length }]));
    console.log('sandbox input timings (ms):', JSON.stringify(summary));
  });

  it('mouse_move puts the cursor exactly there and returns it; off-screen points are clamped', async () => {
    for (const p of [inside(10, 10), inside(123, 321), { x: 0, y: 0 }]) {
      expect(await input([{ type: 'mouse_move', ...p }])).toEqual(p);
      expect(await input([])).toEqual(p);
    }
    expect(await input([{ type: 'mouse_move', x: 5000, y: 32767 }])).toEqual({ x: 1023, y: 767 });
    for (let i = 0; i < 10; i++) await timed('mouse_move', () => input([{ type: 'mouse_move', x: 100 + i, y: 100 }]));
    for (let i = 0; i < 10; i++) await timed('empty batch', () => input([]));
  });

  it('click moves first when given a point; buttons and double click reach the window there', async () => {
    await markNow();
    const p = inside(200, 100);
    expect(await timed('click at', () => input([{ type: 'click', ...p }]))).toEqual(p);
    const q = inside(300, 150);
    expect(await input([{ type: 'mouse_move', ...q }, { type: 'click', button: 'right' }, { type: 'click', button: 'middle' }])).toEqual(q);
    let events = await eventsUntil((ev) => ev.filter((e) => e.type === 'ButtonRelease').length >= 3, 'three clicks');
    expect(presses(events).map((e) => [e.button, e.root])).toEqual([[1, p], [3, q], [2, q]]);

    await input([{ type: 'click', ...p, double: true }]);
    events = await eventsUntil((ev) => presses(ev).length >= 2, 'a double click');
    const [a, b] = presses(events);
    expect([a?.button, b?.button, a?.root, b?.root]).toEqual([1, 1, p, p]);
    const gap = (b?.time ?? 0) - (a?.time ?? 0);
    expect(gap).toBeGreaterThanOrEqual(110);
    expect(gap).toBeLessThan(400);
  });

  it('returns the cursor where the batch put it while the window manager holds pointer events back', async () => {
    // openbox grabs the buttons on client windows synchronously (click to focus): after a press
    // the X server holds every later pointer event until openbox lets them through. Stopped, it
    // holds them for as long as a loaded host might, and longer.
    await markNow();
    const openbox = (await sh('pidof openbox')).trim();
    const p = inside(150, 120);
    const q = inside(260, 180);
    await sh(`kill -STOP ${openbox}`);
    try {
      expect(await input([{ type: 'click', ...p }])).toEqual(p);
      const resumed = sleep(300).then(() => sh(`kill -CONT ${openbox}`));
      expect(await input([{ type: 'mouse_move', ...q }, { type: 'click', button: 'right' }])).toEqual(q);
      await resumed;
    } finally {
      await sh(`kill -CONT ${openbox}`);
    }
    const events = await eventsUntil((ev) => ev.filter((e) => e.type === 'ButtonRelease').length >= 2, 'two clicks');
    expect(presses(events).map((e) => [e.button, e.root])).toEqual([[1, p], [3, q]]);
  });

  it('button_press and button_release hold a button across actions', async () => {
    await markNow();
    const p = inside(50, 60);
    await input([{ type: 'mouse_move', ...p }, { type: 'button_press', button: 'left' }, { type: 'mouse_move', ...inside(70, 80) }, { type: 'button_release', button: 'left' }]);
    const events = await eventsUntil((ev) => ev.some((e) => e.type === 'ButtonRelease'), 'press and release');
    const press = events.find((e) => e.type === 'ButtonPress');
    const release = events.find((e) => e.type === 'ButtonRelease');
    expect([press?.button, press?.root, release?.button, release?.root]).toEqual([1, p, 1, inside(70, 80)]);
    // The motion in between carries Button1Mask (0x100).
    expect(events.some((e) => e.type === 'MotionNotify' && e.state !== null && (e.state & 0x100) !== 0)).toBe(true);
  });

  it('drag presses at from, moves with the button held, and releases at to', async () => {
    await markNow();
    const from = inside(100, 100);
    const to = inside(400, 300);
    expect(await timed('drag', () => input([{ type: 'drag', from, to }]))).toEqual(to);
    let events = await eventsUntil((ev) => ev.some((e) => e.type === 'ButtonRelease'), 'a drag');
    const held = events.filter((e) => e.type === 'MotionNotify' && (e.state ?? 0) & 0x100).map((e) => e.root);
    expect(events.find((e) => e.type === 'ButtonPress')?.root).toEqual(from);
    expect(held).toContainEqual(inside(250, 200));
    expect(held.at(-1)).toEqual(to);
    expect(events.find((e) => e.type === 'ButtonRelease')?.root).toEqual(to);

    // Without from: from wherever the cursor is, here with the right button.
    await markNow();
    const start = inside(20, 20);
    expect(await input([{ type: 'mouse_move', ...start }, { type: 'drag', to: inside(60, 100), button: 'right' }])).toEqual(inside(60, 100));
    events = await eventsUntil((ev) => ev.some((e) => e.type === 'ButtonRelease'), 'a drag without from');
    expect(events.find((e) => e.type === 'ButtonPress')).toMatchObject({ button: 3, root: start });
    expect(events.filter((e) => e.type === 'MotionNotify' && (e.state ?? 0) & 0x400).map((e) => e.root)).toContainEqual(inside(40, 60));
    expect(events.find((e) => e.type === 'ButtonRelease')).toMatchObject({ button: 3, root: inside(60, 100) });
  });

  it('scroll clicks the wheel buttons, one press per notch', async () => {
    await markNow();
    const p = inside(250, 250);
    await input([
      { type: 'mouse_move', ...p },
      { type: 'scroll', direction: 'down', amount: 5 },
      { type: 'scroll', direction: 'up' },
      { type: 'scroll', direction: 'left', amount: 2 },
      { type: 'scroll', direction: 'right', amount: 3 },
    ]);
    const events = await eventsUntil((ev) => presses(ev).length >= 11, 'eleven wheel notches');
    expect(presses(events).map((e) => e.button)).toEqual([5, 5, 5, 5, 5, 4, 6, 6, 7, 7, 7]);
    expect(presses(events).every((e) => e.root?.x === p.x && e.root.y === p.y)).toBe(true);
  });

  it('types arbitrary UTF-8 text exactly, line breaks as Return', async () => {
    await markNow();
    const text = `-Hi! it's "$(id)" \`x\` \\ $HOME\né€日本 ~{|}\r\nend`;
    await timed('type nasty', () => input([{ type: 'type', text }]));
    // Its last key: the second `d` (the first is in `$(id)`).
    const events = await eventsUntil((ev) => ev.filter((e) => e.type === 'KeyRelease' && e.keysym === 'd').length >= 2, 'the typed text');
    const keyPresses = events.filter((e) => e.type === 'KeyPress');
    const typed = Buffer.concat(keyPresses.map((e) => e.bytes)).toString('utf8');
    expect(typed).toBe(typedText(text));
    // A shifted character is typed with Shift held, and a line break is the Return key.
    const shifted = keyPresses.find((e) => e.keysym === 'H');
    expect((shifted?.state ?? 0) & 0x1).toBe(1);
    expect(keyPresses.filter((e) => e.keysym === 'Return')).toHaveLength(2);
    // é, € and 日 are on no key of the US map: they were bound to spare keycodes before the
    // first key, so the keymap did not change while the text was typed.
    expect(keyPresses.map((e) => e.keysym)).toEqual(expect.arrayContaining(['eacute', 'U20AC', 'U65E5']));
    expect(mappingChangesWhileTyping(events)).toBe(0);
  });

  it('off-map characters arrive exactly on a loaded desktop, and a later batch reuses their bindings', async () => {
    // Two busy loops in the guest take both cores from xev, which reads each key's binding
    // lazily: with a keymap change per character, it read some with a later one's.
    const loads = (await sh("for i in 1 2; do sh -c 'while :; do :; done' >/dev/null 2>&1 </dev/null & echo $!; done")).trim().split(/\s+/);
    expect(loads).toHaveLength(2);
    try {
      let text = '';
      for (let round = 0; round < 5; round++) {
        // 33 characters no earlier round typed, 30 of them new each round: from the third
        // round on, the binder recycles the slots of earlier rounds.
        const cjk = Array.from({ length: 30 }, (_, i) => String.fromCodePoint(0x5000 + round * 64 + i)).join('');
        text = `a€éß${cjk}z`;
        await markNow();
        await timed('type 33 off-map chars, loaded (delay 0)', () => input([{ type: 'type', text, delay_ms: 0 }]));
        const events = await typedEvents('the loaded round');
        expect(typedBytes(events), `round ${round}`).toBe(text);
        expect(mappingChangesWhileTyping(events)).toBe(0);
      }
      // The same characters again: all bound already, so the keymap does not change at all.
      const bound = await sh(`DISPLAY=:0 /usr/bin/xprop -root ${KEYS_PROPERTY}`);
      expect(bound).toContain(`.0x${(0x1000000 + 0x5000 + 4 * 64).toString(16)}`);
      await markNow();
      await timed('type 33 bound off-map chars, loaded (delay 0)', () => input([{ type: 'type', text, delay_ms: 0 }]));
      const events = await typedEvents('the repeated text');
      expect(typedBytes(events)).toBe(text);
      expect(events.filter((e) => e.type === 'MappingNotify')).toEqual([]);
      expect(await sh(`DISPLAY=:0 /usr/bin/xprop -root ${KEYS_PROPERTY}`)).toBe(bound);
    } finally {
      await driver.exec(id, { command: `kill ${loads.join(' ')}`, timeoutMs: 30_000, maxOutputBytes: 1024 });
    }
  }, 120_000);

  it('key presses a combo: ctrl+a arrives as a with Control held', async () => {
    await markNow();
    await input([{ type: 'key', combo: 'ctrl+a' }, { type: 'key', combo: 'shift+Tab' }, { type: 'key', combo: 'F5' }]);
    const events = await eventsUntil((ev) => ev.some((e) => e.type === 'KeyRelease' && e.keysym === 'F5'), 'three combos');
    const keys = events.filter((e) => e.type === 'KeyPress');
    expect(keys.map((e) => e.keysym)).toEqual(['Control_L', 'a', 'Shift_L', 'ISO_Left_Tab', 'F5']);
    expect(keys[1]).toMatchObject({ state: 0x4, bytes: Buffer.from([1]) });
  });

  it('a failing action stops the batch and is reported as a runtime error', async () => {
    const a = inside(11, 12);
    const err = await failure(input([{ type: 'mouse_move', ...a }, { type: 'key', combo: 'ctrl+Nonexistent_Key' }, { type: 'mouse_move', ...inside(99, 99) }]));
    expect(err.code).toBe('runtime_error');
    expect(err.message).toMatch(/^input action 1 \(key\) failed: .*No such key name 'Nonexistent_Key'/);
    expect(await input([])).toEqual(a);
  });

  it('a pointer batch fails within seconds, saying why, when the X server does not answer', async () => {
    // Pointer batches are played by the guest helper over one X connection (op-xinput.pl).
    await sh('kill -STOP $(pidof Xvfb)');
    try {
      const t0 = performance.now();
      const err = await failure(input([{ type: 'click', ...inside(5, 5) }]));
      expect([err.code, err.retryable]).toEqual(['runtime_error', false]);
      expect(err.message).toMatch(/^input failed: X session down: the X server did not answer/);
      expect(performance.now() - t0).toBeLessThan(5_000);
    } finally {
      await sh('kill -CONT $(pidof Xvfb)');
    }
    expect(await input([{ type: 'mouse_move', ...inside(7, 8) }])).toEqual(inside(7, 8));
  });

  it('waits take their time between actions', async () => {
    const t0 = performance.now();
    expect(await input([{ type: 'mouse_move', x: 1, y: 1 }, { type: 'wait', ms: 300 }, { type: 'mouse_move', x: 2, y: 3 }])).toEqual({ x: 2, y: 3 });
    expect(performance.now() - t0).toBeGreaterThanOrEqual(300);
  });

  it('types delay_ms per keystroke, through the helper (ASCII) and through xdotool (beyond it)', async () => {
    await markNow();
    for (const text of ['abcde', 'abcdé']) {
      const t0 = performance.now();
      await input([{ type: 'type', text, delay_ms: 60 }]);
      expect(performance.now() - t0, text).toBeGreaterThanOrEqual(5 * 60);
    }
    const events = await eventsUntil((ev) => ev.filter((e) => e.type === 'KeyPress' && e.keysym !== 'Shift_L').length >= 10, 'the ten letters');
    expect(events.filter((e) => e.type === 'KeyPress' && e.keysym !== 'Shift_L').map((e) => e.keysym).join(' ')).toBe('a b c d e a b c d eacute');
  });

  it('timings: typing, and one xdotool per action against one chained xdotool', async () => {
    await markNow();
    for (let i = 0; i < 10; i++) await timed('type 20 chars (delay 12)', () => input([{ type: 'type', text: 'abcdefghijklmnopqrst' }]));
    for (let i = 0; i < 10; i++) await timed('type 20 chars (delay 0)', () => input([{ type: 'type', text: 'abcdefghijklmnopqrst', delay_ms: 0 }]));
    const moves = (n: number): InputAction[] => Array.from({ length: n }, (_, i) => ({ type: 'mouse_move', x: 10 + i, y: 10 }));
    for (let i = 0; i < 10; i++) await timed('batch of 20 mouse_move', () => input(moves(20)));
    for (let i = 0; i < 10; i++) await timed('batch of 50 mouse_move', () => input(moves(50)));
    // The same 20 moves in one exec as 20 xdotool processes and as one chained xdotool.
    const separate = Array.from({ length: 20 }, (_, i) => `/usr/bin/xdotool mousemove ${10 + i} 20`).join('\n');
    const chained = `/usr/bin/xdotool ${Array.from({ length: 20 }, (_, i) => `mousemove ${10 + i} 20`).join(' ')}`;
    for (let i = 0; i < 10; i++) {
      await timed('exec: 20 separate xdotool', () => sh(`export DISPLAY=:0\n${separate}`));
      await timed('exec: 20 moves chained in one xdotool', () => sh(`export DISPLAY=:0\n${chained}`));
      await timed('exec: true', () => sh('true'));
    }
    // Everything typed arrived (200 + 200 characters).
    const events = await eventsUntil((ev) => ev.filter((e) => e.type === 'KeyPress').length >= 400, 'the typed letters');
    expect(events.filter((e) => e.type === 'KeyPress')).toHaveLength(400);

    // Off-map text: what binding costs against xdotool remapping each character itself.
    const offMap = (n: number) => Array.from({ length: 33 }, (_, i) => String.fromCodePoint(0x7000 + n * 64 + i)).join('');
    for (let i = 0; i < 10; i++) {
      await timed('exec: xdotool remapping 33 chars itself', () => sh(`DISPLAY=:0 LC_ALL=C.UTF-8 /usr/bin/xdotool type --delay 0 -- ${offMap(20 + i)}`));
    }
    await caughtUp();
    // Each batch is read before the next: a batch two later rebinds most of its keycodes, and xev
    // decodes a key with the keymap of when it reads it (the binder spares one batch of lag).
    const batch = async (what: string, text: string) => {
      await timed(what, () => input([{ type: 'type', text, delay_ms: 0 }]));
      return typedBytes(await eventsUntil((ev) => ev.filter((e) => e.type === 'KeyPress').length >= 33, 'the off-map characters'));
    };
    const offMapTyped: string[] = [];
    for (let i = 0; i < 10; i++) offMapTyped.push(await batch('type 33 off-map chars to bind (delay 0)', offMap(i)));
    for (let i = 0; i < 10; i++) offMapTyped.push(await batch('type 33 bound off-map chars (delay 0)', offMap(9)));
    expect(offMapTyped.join('')).toBe([...Array.from({ length: 10 }, (_, i) => offMap(i)), ...Array.from({ length: 10 }, () => offMap(9))].join(''));
  });
});

/**
 * Screenshots of the sandbox driver against the real machine: the framebuffer Xvfb writes in the
 * desktop's `fb/`, the live screen size from the guest helper's `xsize`, a window opened in the
 * guest showing up, exact sizes for regions and scales, resizes (the driver's and a guest user's
 * own xrandr), and a dead X server. Needs root. One desktop serves the file; a second, throwaway
 * one has its X server killed, a third is never started; all are destroyed in afterAll. Timings (medians) are printed for
 * the docs, and nothing asserts on them.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, open, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import type { DisplaySize, Screenshot, ScreenshotSpec } from '../../agent/src/runtime/driver.js';
import { guestHelperProgram } from '../../agent/src/runtime/sandbox/guest/guest-helper.js';
import { desktopPaths } from '../../agent/src/runtime/sandbox/host/layout.js';
import {
  captureScreenshot,
  FRAMEBUFFER_FILE,
  parseXwdHeader,
  PNG_FAST,
  toRgb,
  type XwdLayout,
} from '../../agent/src/runtime/sandbox/computer-use/screenshot.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { failure } from '../helpers/agent-failure.js';
import { isRoot } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';

const execFileAsync = promisify(execFile);

if (!isRoot) console.warn('sandbox screenshot tests skipped: they need root (namespaces, cgroups)');

const MiB = 1024 * 1024;
const SHOTS = 30;

type Rgb = readonly [number, number, number];

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b);
  return Math.round((sorted[sorted.length >> 1] ?? NaN) * 100) / 100;
};

async function timedMedian(n: number, fn: () => Promise<unknown>): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await fn();
    times.push(performance.now() - t0);
  }
  return median(times);
}

async function pixelAt(shot: Screenshot, x: number, y: number): Promise<Rgb> {
  const { data, info } = await sharp(shot.png).raw().toBuffer({ resolveWithObject: true });
  const i = (y * info.width + x) * info.channels;
  return [data[i] ?? -1, data[i + 1] ?? -1, data[i + 2] ?? -1];
}

const spec = (over: Partial<ScreenshotSpec> = {}): ScreenshotSpec => ({
  region: null,
  scalePercent: null,
  maxBytes: 64 * MiB,
  ...over,
});

describe.skipIf(!isRoot)('sandbox driver screenshots', () => {
  let base: string;
  let driver: SandboxDriver;
  let id: string;
  let doomed: string;
  let stopped: string;
  const timings: Record<string, number> = {};

  async function sh(desktopId: string, command: string): Promise<string> {
    const out = await driver.exec(desktopId, { command, timeoutMs: 10_000, maxOutputBytes: MiB });
    expect(out.exitCode, `exit code of ${command}: ${out.stderr}`).toBe(0);
    return out.stdout.trim();
  }

  const shot = (over: Partial<ScreenshotSpec> = {}) => driver.screenshot(id, spec(over));

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-screenshot-test-'));
    driver = await createSandboxDriver({ stateDir: join(base, 'state') });
    id = newId('desktop');
    doomed = newId('desktop');
    for (const desktop of [id, doomed]) {
      await driver.prepare(desktop, 'small');
      await driver.start({ desktopId: desktop, tier: 'small', firstBoot: null });
    }
    stopped = newId('desktop');
    await driver.prepare(stopped, 'small');
  });

  afterAll(async () => {
    for (const desktop of [id, doomed, stopped]) if (desktop) await driver?.destroy(desktop);
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
    console.log('sandbox screenshot timings (ms, medians):', JSON.stringify(timings));
  });

  it('the xsize helper compiles under strict', async () => {
    const { stderr } = await execFileAsync('perl', ['-Mstrict', '-w', '-c', '-e', guestHelperProgram('xsize')]);
    expect(stderr.trim()).toBe('-e syntax OK');
  });

  it('captures the screen, and shows what the guest draws', async () => {
    const first = await shot();
    expect([first.width, first.height]).toEqual([1024, 768]);
    const meta = await sharp(first.png).metadata();
    expect([meta.format, meta.width, meta.height]).toEqual(['png', 1024, 768]);

    await sh(id, 'xsetroot -solid "#ff0000"');
    expect(await pixelAt(await shot(), 900, 700)).toEqual([255, 0, 0]);

    // A window: xmessage, green all over, at a known place; openbox decorates it.
    await driver.spawnDetached(id, {
      processId: newId('process'),
      command: `exec xmessage -bg '#00ff00' -fg '#00ff00' -geometry 300x200+100+100 hello`,
    });
    // A window mapped while openbox is still starting stays unmapped (its MapRequest is lost), so
    // while the window is not there, it is asked to map again.
    await until(async () => {
      const [r, g, b] = await pixelAt(await shot(), 250, 200);
      if (r === 0 && g === 255 && b === 0) return true;
      await driver.exec(id, {
        command: `xdotool search --name '^xmessage$' windowmap 2>/dev/null`,
        timeoutMs: 5_000,
        maxOutputBytes: MiB,
      });
      return false;
    }, 10_000, 'the window in the screenshot');
    const after = await shot();
    expect(await pixelAt(after, 900, 700)).toEqual([255, 0, 0]);
    expect(after.png.equals(first.png)).toBe(false);
  });

  it('crops, clamps and scales to exact sizes', async () => {
    const region = await shot({ region: { x: 200, y: 150, width: 100, height: 50 } });
    expect([region.width, region.height]).toEqual([100, 50]);
    expect((await sharp(region.png).metadata()).width).toBe(100);
    // The window's green at (250, 175) is (50, 25) in the region.
    expect(await pixelAt(region, 50, 25)).toEqual([0, 255, 0]);

    const clamped = await shot({ region: { x: 1000, y: 700, width: 500, height: 500 } });
    expect([clamped.width, clamped.height]).toEqual([24, 68]);

    const half = await shot({ scalePercent: 50 });
    expect([half.width, half.height]).toEqual([512, 384]);
    const meta = await sharp(half.png).metadata();
    expect([meta.width, meta.height]).toEqual([512, 384]);

    const both = await shot({ region: { x: 10, y: 10, width: 333, height: 101 }, scalePercent: 33 });
    expect([both.width, both.height]).toEqual([110, 33]);

    const small = await shot({ scalePercent: 10 });
    expect([small.width, small.height]).toEqual([102, 77]);
  });

  it('fails with too_large over maxBytes', async () => {
    expect((await failure(shot({ maxBytes: 100 }))).code).toBe('too_large');
  });

  it('puts screen-like content up for the timings: windows full of text', async () => {
    await sh(id, 'xsetroot -solid "#336699"');
    const windows = {
      xfd: 'exec xfd -fn fixed -geometry +440+10',
      xmessage: 'exec xmessage -geometry +470+330 "$(ls -la /usr/bin | head -30)"',
    };
    for (const command of Object.values(windows)) await driver.spawnDetached(id, { processId: newId('process'), command });
    for (const name of Object.keys(windows)) {
      await until(
        async () => /IsViewable/.test(await sh(id, `xwininfo -name ${name} 2>/dev/null | grep 'Map State' || true`)),
        10_000,
        `${name} on the screen`,
      );
    }
  });

  it('follows resizes by the driver and by a guest user', async () => {
    expect(await driver.setDisplay(id, { width: 800, height: 600 })).toEqual({ width: 800, height: 600 });
    const s800 = await shot();
    expect([s800.width, s800.height]).toEqual([800, 600]);
    // A region past the new edge keeps the last column.
    expect((await shot({ region: { x: 900, y: 0, width: 10, height: 10 } })).width).toBe(1);

    // xrandr run by the guest itself, behind the driver's back.
    await sh(id, 'xrandr --fb 640x480');
    const s640 = await shot();
    expect([s640.width, s640.height]).toEqual([640, 480]);

    await driver.setDisplay(id, { width: 2560, height: 1600 });
    const max = await shot();
    expect([max.width, max.height]).toEqual([2560, 1600]);
    timings['screenshot 2560x1600'] = await timedMedian(SHOTS, () => shot());
    timings['screenshot 2560x1600 at 50%'] = await timedMedian(SHOTS, () => shot({ scalePercent: 50 }));

    await driver.setDisplay(id, { width: 1024, height: 768 });
    const back = await shot();
    expect([back.width, back.height]).toEqual([1024, 768]);
  });

  it('times a 1024x768 screenshot and its parts', async () => {
    await driver.setDisplay(id, { width: 1024, height: 768 });
    const screen: DisplaySize = { width: 1024, height: 768 };
    for (let i = 0; i < 5; i++) await shot(); // warm helpers and sharp
    timings['screenshot 1024x768'] = await timedMedian(SHOTS, () => shot());
    timings['screenshot 1024x768 region 400x300'] = await timedMedian(SHOTS, () =>
      shot({ region: { x: 100, y: 100, width: 400, height: 300 } }),
    );
    timings['screenshot 1024x768 at 50%'] = await timedMedian(SHOTS, () => shot({ scalePercent: 50 }));
    // Almost nothing to read or encode: the fixed cost, mostly the `xsize` helper call.
    timings['screenshot region 1x1'] = await timedMedian(SHOTS, () => shot({ region: { x: 0, y: 0, width: 1, height: 1 } }));
    const fbDir = desktopPaths(join(base, 'state'), id).fb;
    timings['host part (size known)'] = await timedMedian(SHOTS, () =>
      captureScreenshot(fbDir, spec(), () => Promise.resolve(screen)),
    );
    timings['helper round trip (stat /)'] = await timedMedian(SHOTS, () => driver.statPath(id, '/'));

    // The host part piece by piece, as screenshot.ts does it.
    const file = join(fbDir, FRAMEBUFFER_FILE);
    const header = Buffer.alloc(100);
    let found: XwdLayout | undefined;
    timings['open + header'] = await timedMedian(SHOTS, async () => {
      const fh = await open(file, 'r');
      const size = (await fh.stat()).size;
      await fh.read(header, 0, 100, 0);
      found = parseXwdHeader(header, size);
      await fh.close();
    });
    const layout = found as XwdLayout;
    const fh = await open(file, 'r');
    const length = (screen.height - 1) * layout.stride + screen.width * 4;
    let rows = Buffer.allocUnsafeSlow(length);
    timings['read rows'] = await timedMedian(SHOTS, async () => {
      rows = Buffer.allocUnsafeSlow(length);
      await fh.read(rows, 0, length, layout.pixelOffset);
    });
    await fh.close();
    let rgb: Buffer = Buffer.alloc(0);
    timings['BGRX to RGB'] = await timedMedian(SHOTS, async () => {
      rgb = toRgb(rows, screen.width, screen.height, layout.stride, layout.shifts);
    });
    let png: Buffer = Buffer.alloc(0);
    timings['PNG encode'] = await timedMedian(SHOTS, async () => {
      png = await sharp(rgb, { raw: { ...screen, channels: 3 } }).png(PNG_FAST).toBuffer();
    });
    timings['PNG bytes'] = png.length;
  });

  it('refuses stopped and unknown desktops', async () => {
    expect((await failure(driver.screenshot(newId('desktop'), spec()))).code).toBe('not_found');
    expect((await failure(driver.screenshot(stopped, spec()))).code).toBe('not_running');
  });

  it('fails with runtime_error once the X server is down', async () => {
    expect((await driver.screenshot(doomed, spec())).width).toBe(1024);
    // The guest's own pid namespace holds one Xvfb: the throwaway desktop's.
    await sh(doomed, 'kill -9 "$(pidof Xvfb)"');
    const err = await until(
      () => driver.screenshot(doomed, spec()).then(() => null, (e: unknown) => e as { code?: string; message?: string }),
      10_000,
      'the screenshot to fail',
    );
    expect(err.code).toBe('runtime_error');
    expect(err.message).toMatch(/X session down/);
  });
});

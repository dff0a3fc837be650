/**
 * Screenshots from an Xvfb framebuffer file (agent/src/runtime/sandbox/screenshot.ts), on
 * synthetic XWD files: exact pixels of the decoded PNGs for the whole screen, a region, a clamped
 * region and a scale, with a framebuffer wider and taller than the screen (as after a resize), and
 * rejection of files a hostile guest could put in place of Xvfb's.
 */
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DisplaySize, ScreenshotSpec } from '../../agent/src/runtime/driver.js';
import { captureScreenshot, FRAMEBUFFER_FILE, toRgb } from '../../agent/src/runtime/sandbox/computer-use/screenshot.js';
import { failure } from '../helpers/agent-failure.js';

type Rgb = readonly [number, number, number];

interface XwdOptions {
  readonly width: number;
  readonly height: number;
  /** Bytes per line; defaults to width × 4. */
  readonly stride?: number;
  readonly ncolors?: number;
  /** 0: least significant byte first (Xvfb on x86), 1: most significant first. */
  readonly byteOrder?: 0 | 1;
  readonly pixel: (x: number, y: number) => Rgb;
  /** Header fields to overwrite, by index (see XWDFileHeader). */
  readonly patch?: Readonly<Record<number, number>>;
}

/** An XWD file as Xvfb writes it: header, window name, colormap, 32-bit TrueColor pixels. */
function xwd(o: XwdOptions): Buffer {
  const stride = o.stride ?? o.width * 4;
  const ncolors = o.ncolors ?? 256;
  const name = Buffer.from('Xvfb test:0.0\0', 'latin1');
  const headerSize = 100 + name.length;
  const fields = [
    headerSize, 7, 2, 24, o.width, o.height, 0, o.byteOrder ?? 0, 32, 0, 32, 32, stride, 4,
    0xff0000, 0x00ff00, 0x0000ff, 8, 256, ncolors, o.width, o.height, 0, 0, 0,
  ];
  for (const [i, v] of Object.entries(o.patch ?? {})) fields[Number(i)] = v;
  const header = Buffer.alloc(100);
  fields.forEach((v, i) => header.writeUInt32BE(v >>> 0, 4 * i));
  const colors = Buffer.alloc(ncolors * 12, 0x5a);
  const pixels = Buffer.alloc(stride * o.height, 0xee); // padding past the width: never shown
  for (let y = 0; y < o.height; y++) {
    for (let x = 0; x < o.width; x++) {
      const [r, g, b] = o.pixel(x, y);
      const value = ((r << 16) | (g << 8) | b) >>> 0;
      if ((o.byteOrder ?? 0) === 0) pixels.writeUInt32LE(value, y * stride + x * 4);
      else pixels.writeUInt32BE(value, y * stride + x * 4);
    }
  }
  return Buffer.concat([header, name, colors, pixels]);
}

/** Every pixel differs from its neighbours in all three channels. */
const pattern = (x: number, y: number): Rgb => [(x * 7 + 3) & 255, (y * 5 + 11) & 255, (x * 3 + y * 13) & 255];

async function decode(png: Buffer): Promise<{ width: number; height: number; at: (x: number, y: number) => Rgb }> {
  const { data, info } = await sharp(png).raw().toBuffer({ resolveWithObject: true });
  expect(info.channels).toBe(3);
  return {
    width: info.width,
    height: info.height,
    at: (x, y) => {
      const i = (y * info.width + x) * 3;
      return [data[i] ?? -1, data[i + 1] ?? -1, data[i + 2] ?? -1];
    },
  };
}

const spec = (over: Partial<ScreenshotSpec> = {}): ScreenshotSpec => ({
  region: null,
  scalePercent: null,
  maxBytes: 10 * 1024 * 1024,
  ...over,
});

describe('screenshots from an XWD framebuffer', () => {
  let base: string;
  let n = 0;
  /** The screen as the X server reports it: smaller than the framebuffer, as after a resize. */
  const screen: DisplaySize = { width: 40, height: 30 };
  const size = (s: DisplaySize = screen) => () => Promise.resolve(s);

  /** A fresh fb directory holding `content` as the framebuffer file. */
  async function fbDir(content: Buffer | null): Promise<string> {
    const dir = join(base, `fb${n++}`);
    await mkdir(dir);
    if (content !== null) await writeFile(join(dir, FRAMEBUFFER_FILE), content);
    return dir;
  }

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-xwd-test-'));
  });

  afterAll(async () => {
    if (base) await rm(base, { recursive: true, force: true });
  });

  it('captures the current screen: the top-left of a wider framebuffer, with its stride', async () => {
    const dir = await fbDir(xwd({ width: 64, height: 48, stride: 72 * 4, pixel: pattern }));
    const shot = await captureScreenshot(dir, spec(), size());
    expect([shot.width, shot.height]).toEqual([40, 30]);
    const img = await decode(shot.png);
    expect([img.width, img.height]).toEqual([40, 30]);
    for (let y = 0; y < 30; y++) for (let x = 0; x < 40; x++) expect(img.at(x, y), `${x},${y}`).toEqual(pattern(x, y));
  });

  it('converts any width and row alignment to RGB (the word path and the byte path agree)', () => {
    let seed = 3;
    const random = () => (seed = (seed * 1103515245 + 12345) >>> 0);
    for (const [red, green, blue] of [[16, 8, 0], [8, 16, 24], [0, 24, 8]] as const) {
      for (let width = 1; width <= 13; width++) {
        for (const height of [1, 2, 3, 5]) {
          const stride = (width + 3) * 4;
          const rows = Buffer.allocUnsafeSlow((height - 1) * stride + width * 4);
          for (let i = 0; i < rows.length; i += 4) rows.writeUInt32LE(random(), i);
          const expected = Buffer.alloc(width * height * 3);
          for (let y = 0, o = 0; y < height; y++) {
            for (let x = 0; x < width; x++, o += 3) {
              const v = rows.readUInt32LE(y * stride + x * 4);
              expected[o] = (v >>> red) & 255;
              expected[o + 1] = (v >>> green) & 255;
              expected[o + 2] = (v >>> blue) & 255;
            }
          }
          const got = toRgb(rows, width, height, stride, { red, green, blue });
          expect(got.equals(expected), `${width}x${height} shifts ${red},${green},${blue}`).toBe(true);
        }
      }
    }
  });

  it('reads most-significant-byte-first files too', async () => {
    const dir = await fbDir(xwd({ width: 48, height: 32, byteOrder: 1, pixel: pattern }));
    const img = await decode((await captureScreenshot(dir, spec(), size())).png);
    for (let y = 0; y < 30; y++) for (let x = 0; x < 40; x++) expect(img.at(x, y), `${x},${y}`).toEqual(pattern(x, y));
  });

  it('crops to a region, and clamps a region to the screen', async () => {
    const dir = await fbDir(xwd({ width: 64, height: 48, stride: 70 * 4, pixel: pattern }));
    const cases = [
      { region: { x: 5, y: 7, width: 10, height: 6 }, at: [5, 7], size: [10, 6] },
      // Reaches past the screen's edge (not the framebuffer's): cut at the screen.
      { region: { x: 35, y: 25, width: 20, height: 20 }, at: [35, 25], size: [5, 5] },
      // Starts past the edge: the last column and row.
      { region: { x: 100, y: 100, width: 3, height: 3 }, at: [39, 29], size: [1, 1] },
      { region: { x: 0, y: 0, width: 40, height: 1 }, at: [0, 0], size: [40, 1] },
    ];
    for (const c of cases) {
      const shot = await captureScreenshot(dir, spec({ region: c.region }), size());
      const img = await decode(shot.png);
      expect([shot.width, shot.height, img.width, img.height], JSON.stringify(c.region)).toEqual([...c.size, ...c.size]);
      const [x0 = 0, y0 = 0] = c.at;
      for (let y = 0; y < img.height; y++) {
        for (let x = 0; x < img.width; x++) expect(img.at(x, y), `${x},${y}`).toEqual(pattern(x0 + x, y0 + y));
      }
    }
  });

  it('scales to the exact size scaledSize gives, keeping the picture', async () => {
    // Left half red, right half blue: away from the seam the scaled colors are exact.
    const halves = (x: number): Rgb => (x < 20 ? [255, 0, 0] : [0, 0, 255]);
    const dir = await fbDir(xwd({ width: 64, height: 48, stride: 66 * 4, pixel: halves }));
    const shot = await captureScreenshot(dir, spec({ scalePercent: 50 }), size());
    expect([shot.width, shot.height]).toEqual([20, 15]);
    const img = await decode(shot.png);
    expect([img.width, img.height]).toEqual([20, 15]);
    expect(img.at(2, 7)).toEqual([255, 0, 0]);
    expect(img.at(17, 7)).toEqual([0, 0, 255]);

    const odd = await captureScreenshot(dir, spec({ region: { x: 1, y: 1, width: 33, height: 17 }, scalePercent: 33 }), size());
    expect([odd.width, odd.height]).toEqual([11, 6]);
    const tiny = await captureScreenshot(dir, spec({ scalePercent: 1 }), size());
    expect([tiny.width, tiny.height]).toEqual([1, 1]);
    const full = await captureScreenshot(dir, spec({ scalePercent: 100 }), size());
    expect([full.width, full.height]).toEqual([40, 30]);
  });

  it('encodes again, smaller, over maxBytes, and only then fails with too_large', async () => {
    // Photo-like: smooth color waves with a little noise, where PNG filtering pays off.
    let seed = 7;
    const noise = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) % 9) - 4;
    const photo = (x: number, y: number): Rgb => [
      Math.round(128 + 100 * Math.sin(x / 9 + y / 13)) + noise(),
      Math.round(128 + 90 * Math.cos(x / 5 - y / 7)) + noise(),
      Math.round(128 + 80 * Math.sin((x + y) / 4)) + noise(),
    ];
    const big: DisplaySize = { width: 160, height: 120 };
    const dir = await fbDir(xwd({ ...big, pixel: photo }));
    const fast = await captureScreenshot(dir, spec(), size(big));
    const small = await captureScreenshot(dir, spec({ maxBytes: fast.png.length - 1 }), size(big));
    expect(small.png.length).toBeLessThan(fast.png.length);
    // The same pixels: PNG is lossless whatever the settings.
    const raw = (png: Buffer) => sharp(png).raw().toBuffer();
    expect((await raw(small.png)).equals(await raw(fast.png))).toBe(true);

    const err = await failure(captureScreenshot(dir, spec({ maxBytes: small.png.length - 1 }), size(big)));
    expect(err.code).toBe('too_large');
    expect((await captureScreenshot(dir, spec({ maxBytes: small.png.length }), size(big))).png.length).toBe(small.png.length);
  });

  it('refuses a symlink, a FIFO, a directory and a missing file', async () => {
    const real = await fbDir(xwd({ width: 40, height: 30, pixel: pattern }));
    const linked = await fbDir(null);
    await symlink(join(real, FRAMEBUFFER_FILE), join(linked, FRAMEBUFFER_FILE));
    expect((await failure(captureScreenshot(linked, spec(), size()))).code).toBe('runtime_error');

    const fifo = await fbDir(null);
    execFileSync('mkfifo', [join(fifo, FRAMEBUFFER_FILE)]);
    expect((await failure(captureScreenshot(fifo, spec(), size()))).code).toBe('runtime_error');

    const dir = await fbDir(null);
    await mkdir(join(dir, FRAMEBUFFER_FILE));
    expect((await failure(captureScreenshot(dir, spec(), size()))).code).toBe('runtime_error');

    expect((await failure(captureScreenshot(await fbDir(null), spec(), size()))).code).toBe('runtime_error');
  });

  it('refuses truncated files', async () => {
    const whole = xwd({ width: 40, height: 30, pixel: pattern });
    for (const length of [0, 50, 99, 200, whole.length - 1]) {
      const dir = await fbDir(whole.subarray(0, length));
      const err = await failure(captureScreenshot(dir, spec(), size()));
      expect(err.code, `${length} bytes`).toBe('runtime_error');
    }
  });

  it('refuses headers with absurd or unsupported values', async () => {
    const patches: Array<Record<number, number>> = [
      { 0: 20 }, // header size below the header
      { 0: 0x7fffffff }, // header size beyond the file
      { 1: 6 }, // XWD version
      { 2: 1 }, // XYPixmap
      { 4: 0 }, // width 0
      { 4: 0xffffffff, 12: 0xffffffff }, // absurd width and stride
      { 5: 100000 }, // absurd height
      { 7: 2 }, // byte order
      { 11: 24 }, // 24 bits per pixel
      { 12: 39 * 4 }, // stride shorter than a row
      { 12: 40 * 4 + 2 }, // stride not whole words
      { 13: 3 }, // PseudoColor
      { 14: 0x00ff00 }, // red and green share a byte
      { 16: 0x0000f0 }, // a mask that is not a whole byte
      { 19: 0xffffffff }, // colormap entries
    ];
    for (const patch of patches) {
      const dir = await fbDir(xwd({ width: 40, height: 30, pixel: pattern, patch }));
      const err = await failure(captureScreenshot(dir, spec(), size()));
      expect(err.code, JSON.stringify(patch)).toBe('runtime_error');
    }
  });

  it('refuses a screen the framebuffer cannot hold, and passes on the X server failure', async () => {
    const dir = await fbDir(xwd({ width: 40, height: 30, pixel: pattern }));
    const err = await failure(captureScreenshot(dir, spec(), size({ width: 41, height: 30 })));
    expect(err.code).toBe('runtime_error');
    const down = await captureScreenshot(dir, spec(), () => Promise.reject(new Error('X session down'))).catch((e: Error) => e);
    expect((down as Error).message).toBe('X session down');
    // A missing file and a dead X server: the X server's failure is the one reported.
    const both = await captureScreenshot(await fbDir(null), spec(), () => Promise.reject(new Error('X session down'))).catch(
      (e: Error) => e,
    );
    expect((both as Error).message).toBe('X session down');
  });
});

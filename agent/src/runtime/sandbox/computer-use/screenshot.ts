/**
 * Screenshots of a sandbox desktop, read from Xvfb's framebuffer file instead of asked of the X
 * server. Xvfb runs with `-fbdir` (guest-init.ts), so its screen lives in a shared mapping of an
 * XWD file that the host sees in the desktop's `fb/` directory: a screenshot is one positioned
 * read of the rows it needs, a byte shuffle to RGB, and a PNG encode, with no process spawned and
 * no X round trip for the pixels. The one thing the file cannot tell is the screen's current size:
 * its header keeps the startup size (the maximum, 2560x1600) after an `xrandr --fb` resize, which
 * only narrows the visible top-left part of the same framebuffer. That size is asked of the X
 * server itself, live, by the guest helper's `xsize` (a user may resize with xrandr at any time);
 * the framebuffer is opened and its header checked while that call runs.
 *
 * The guest is root and can replace the file, so it is treated as hostile input: opened without
 * following a symlink or blocking on a FIFO, required to be a regular file, every header field
 * checked against the file's size and sane bounds, and only the needed rows read. What the guest
 * can achieve this way is a wrong picture of its own screen, or a `runtime_error`.
 *
 * Measured on a 2-core machine of the project's kind, 1024x768 of screen-like content (windows
 * full of text on a solid background, a 59 KB PNG), medians: `xsize` through a warm helper
 * ≈1.3 ms (the X part is ≈0.1 ms, the rest is the helper round trip; a cold helper, before the
 * warm ones are up, ≈20 ms), open and header ≈0.2 ms, the rows (768 × the 10 KiB stride) ≈0.9 ms,
 * BGRX → RGB ≈2 ms, PNG ≈3 ms: ≈8.5 ms in all, ≈23 ms at 2560x1600. The helper route being well
 * under 3 ms, no other way to learn the size was needed. test/integration/sandbox-screenshot.test.ts
 * prints the current numbers.
 */
import { constants as fsc } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { endianness } from 'node:os';
import { join } from 'node:path';
import sharp from 'sharp';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { DisplaySize, ScreenRegion, Screenshot, ScreenshotSpec } from '../../driver.js';
import { clampRegion, scaledSize } from '../../screen-geometry.js';
import { GuestCall, type GuestTarget } from '../guest/guest-call.js';
import { X_ANSWER_SEC } from '../guest/guest-helper.js';

/** The file Xvfb keeps screen 0 in, inside its `-fbdir`. */
export const FRAMEBUFFER_FILE = 'Xvfb_screen0';

/** XWDFileHeader: 25 CARD32 fields, big-endian, then the window name and the colormap. */
const XWD_HEADER_BYTES = 100;
const XWD_FILE_VERSION = 7;
const Z_PIXMAP = 2;
const TRUE_COLOR = 4;
/** One XWDColor entry: pixel CARD32, red/green/blue CARD16, flags and pad bytes. */
const XWD_COLOR_BYTES = 12;
/**
 * Bounds on what a header may claim. Xvfb writes a 160-byte header, 256 colors and a
 * 2560x1600 screen; anything far beyond is not Xvfb's and would only make the agent read and
 * allocate a lot for nothing.
 */
const MAX_HEADER_BYTES = 4096;
const MAX_COLORS = 65536;
const MAX_SIDE = 8192;
const MAX_PIXEL_BYTES = 64 * 1024 * 1024;

/** `xsize` answers within the helper's own X deadline; this only covers the helper itself. */
const XSIZE_MS = (X_ANSWER_SEC + 3) * 1000;

/**
 * PNG settings, measured on screen-like content at 1024x768 (and 2560x1600): zlib level 2 with
 * no filtering took ≈3 ms (≈8 ms) for 59 KB (176 KB); level 1 was no faster and 60 % larger;
 * level 3 ≈25 % slower for 10 % less; level 6 ≈2.5× the time for 35 % less; adaptive filtering
 * costs 25-30 ms (130 ms), and sharp's `effort` or `palette` (a quantizer) ≈30 ms. A screenshot is
 * latency-bound and a screen of windows and text is far under the transfer cap, so level 2.
 */
export const PNG_FAST = { compressionLevel: 2, adaptiveFiltering: false } as const;
/**
 * Photo-like content is where filtering pays: a synthetic photo at 2560x1600 was 11.3 MiB
 * unfiltered at any level, over the 8 MiB cap, and 5.6 MiB with adaptive filtering at level 6
 * (≈0.3 s; level 9 saved nothing more for 4× the time). So an image over the limit gets this
 * second encode before it is refused.
 */
const PNG_SMALL = { compressionLevel: 6, adaptiveFiltering: true } as const;

/** Where a pixel's red, green and blue bytes sit in a 32-bit word read in the host's byte order. */
interface ChannelShifts {
  readonly red: number;
  readonly green: number;
  readonly blue: number;
}

/** The pixel layout an XWD header describes, checked against the file it came from. */
export interface XwdLayout {
  /** The framebuffer's size (Xvfb's startup size), not the screen's current one. */
  readonly width: number;
  readonly height: number;
  /** Bytes from one row to the next. */
  readonly stride: number;
  /** File offset of pixel (0, 0). */
  readonly pixelOffset: number;
  readonly shifts: ChannelShifts;
}

function invalid(message: string): AgentFailure {
  return new AgentFailure('runtime_error', `the framebuffer is not usable: ${message}`, false);
}

/** The byte a channel mask selects (0 for 0xff, 1 for 0xff00, ...), or null for any other mask. */
function maskByte(mask: number): number | null {
  for (let byte = 0; byte < 4; byte++) if (mask === (0xff << (8 * byte)) >>> 0) return byte;
  return null;
}

/**
 * The layout of a 32-bit TrueColor ZPixmap, the only kind Xvfb writes at depth 24; every field
 * is checked, since the file is the guest's to rewrite.
 */
export function parseXwdHeader(header: Buffer, fileSize: number): XwdLayout {
  if (header.length < XWD_HEADER_BYTES) throw invalid('the header is truncated');
  const field = (i: number) => header.readUInt32BE(4 * i);
  const headerSize = field(0);
  if (field(1) !== XWD_FILE_VERSION) throw invalid(`XWD version ${field(1)}`);
  if (field(2) !== Z_PIXMAP) throw invalid(`pixmap format ${field(2)}`);
  const [width, height] = [field(4), field(5)];
  const [byteOrder, bitsPerPixel, stride, visualClass] = [field(7), field(11), field(12), field(13)];
  const ncolors = field(19);
  if (headerSize < XWD_HEADER_BYTES || headerSize > MAX_HEADER_BYTES) throw invalid(`header size ${headerSize}`);
  if (bitsPerPixel !== 32 || visualClass !== TRUE_COLOR) {
    throw invalid(`${bitsPerPixel} bits per pixel, visual class ${visualClass}`);
  }
  if (byteOrder > 1) throw invalid(`byte order ${byteOrder}`);
  if (width < 1 || height < 1 || width > MAX_SIDE || height > MAX_SIDE) throw invalid(`size ${width}x${height}`);
  if (stride % 4 !== 0 || stride < width * 4 || stride > MAX_SIDE * 4 || stride * height > MAX_PIXEL_BYTES) {
    throw invalid(`${stride} bytes per line for a width of ${width}`);
  }
  if (ncolors > MAX_COLORS) throw invalid(`${ncolors} colormap entries`);
  const pixelOffset = headerSize + ncolors * XWD_COLOR_BYTES;
  if (pixelOffset + stride * height > fileSize) throw invalid(`${fileSize} bytes, too short for its header`);

  const bytes = [field(14), field(15), field(16)].map(maskByte);
  const [red, green, blue] = bytes;
  if (red == null || green == null || blue == null || new Set(bytes).size !== 3) throw invalid('unsupported color masks');
  // A mask names bits of the pixel value; the file stores that value in `byteOrder` (0: least
  // significant byte first). Read as a host-order word, the byte moves if the two orders differ.
  const swapped = (byteOrder === 0) !== (endianness() === 'LE');
  const shift = (byte: number) => 8 * (swapped ? 3 - byte : byte);
  return { width, height, stride, pixelOffset, shifts: { red: shift(red), green: shift(green), blue: shift(blue) } };
}

/** The framebuffer file, opened and its header checked. */
interface Framebuffer {
  readonly handle: FileHandle;
  readonly layout: XwdLayout;
}

async function openFramebuffer(file: string): Promise<Framebuffer> {
  let handle: FileHandle;
  try {
    // No symlink, and no blocking open of a FIFO the guest may have put there.
    handle = await open(file, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ELOOP') throw invalid('it is a symbolic link');
    if (code === 'ENOENT') throw new AgentFailure('runtime_error', 'X session down: no framebuffer', false);
    throw invalid(`cannot open it: ${code ?? String(err)}`);
  }
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) throw invalid('not a regular file');
    const header = Buffer.alloc(XWD_HEADER_BYTES);
    const { bytesRead } = await handle.read(header, 0, XWD_HEADER_BYTES, 0);
    return { handle, layout: parseXwdHeader(header.subarray(0, bytesRead), stat.size) };
  } catch (err) {
    await handle.close();
    throw err;
  }
}

/**
 * The rows of `area`, from its first pixel to its last, in one positioned read: row r starts at
 * `r * stride`. The buffer is unpooled so that it starts on a word boundary (read as 32-bit words).
 */
async function readRows(fb: Framebuffer, area: ScreenRegion): Promise<Buffer> {
  const { stride, pixelOffset } = fb.layout;
  const length = (area.height - 1) * stride + area.width * 4;
  const rows = Buffer.allocUnsafeSlow(length);
  const { bytesRead } = await fb.handle.read(rows, 0, length, pixelOffset + area.y * stride + area.x * 4);
  // The guest may truncate the file between the size check and the read.
  if (bytesRead !== length) throw invalid('it shrank while being read');
  return rows;
}

/** Words store their bytes least significant first: the four-pixel path of toRgb relies on it. */
const LITTLE_ENDIAN = endianness() === 'LE';

/**
 * 32-bit pixels (row stride `stride`) to packed RGB, in plain JS: measured at 1024x768, ≈1.2 ms
 * writing three output words per four pixels, ≈1.7 ms writing three bytes per pixel, ≈2.5 ms
 * reading bytes too, against ≈10 ms for sharp's extractChannel and joinChannel and ≈12 ms for
 * its recomb (a float matrix). Byte-swapping the words natively (Buffer.swap32 leaves RGBX one
 * byte in) was as fast, but sharp takes a fourth channel as alpha, which is zero here, and a
 * resize premultiplies by it.
 */
export function toRgb(rows: Buffer, width: number, height: number, stride: number, s: ChannelShifts): Buffer {
  const px = new Uint32Array(rows.buffer, rows.byteOffset, rows.length >>> 2);
  const size = width * height * 3;
  // Unpooled (starts on a word boundary), rounded up to whole words for the word view.
  const out = Buffer.allocUnsafeSlow(size + 3);
  const ow = new Uint32Array(out.buffer, out.byteOffset, (size + 3) >>> 2);
  const step = stride >>> 2;
  const { red: r, green: g, blue: b } = s;
  let o = 0;
  for (let y = 0; y < height; y++) {
    let i = y * step;
    const end = i + width;
    // Byte stores (a Uint8Array store keeps the low 8 bits: no mask) until the output is at a
    // word boundary, then four pixels to three words while they last, then bytes again.
    for (; (o & 3) !== 0 && i < end; i++, o += 3) {
      const v = px[i]!;
      out[o] = v >>> r;
      out[o + 1] = v >>> g;
      out[o + 2] = v >>> b;
    }
    if (LITTLE_ENDIAN && (o & 3) === 0) {
      let w = o >>> 2;
      for (; i + 4 <= end; i += 4, w += 3) {
        const p0 = px[i]!, p1 = px[i + 1]!, p2 = px[i + 2]!, p3 = px[i + 3]!;
        ow[w] = ((p0 >>> r) & 255) | (((p0 >>> g) & 255) << 8) | (((p0 >>> b) & 255) << 16) | ((p1 >>> r) << 24);
        ow[w + 1] = ((p1 >>> g) & 255) | (((p1 >>> b) & 255) << 8) | (((p2 >>> r) & 255) << 16) | ((p2 >>> g) << 24);
        ow[w + 2] = ((p2 >>> b) & 255) | (((p3 >>> r) & 255) << 8) | (((p3 >>> g) & 255) << 16) | ((p3 >>> b) << 24);
      }
      o = w << 2;
    }
    for (; i < end; i++, o += 3) {
      const v = px[i]!;
      out[o] = v >>> r;
      out[o + 1] = v >>> g;
      out[o + 2] = v >>> b;
    }
  }
  return out.subarray(0, size);
}

async function encode(rgb: Buffer, area: DisplaySize, spec: ScreenshotSpec): Promise<Screenshot> {
  const { width, height } = scaledSize(area, spec.scalePercent);
  // A pipeline per encode: sharp's clone() would structuredClone the input buffer.
  const png = (options: typeof PNG_FAST | typeof PNG_SMALL) => {
    const image = sharp(rgb, { raw: { width: area.width, height: area.height, channels: 3 } });
    // sharp's default kernel (lanczos3) keeps small text the most legible; the cheapest usable
    // one (linear) saved only ≈3 of 15 ms halving a 2560x1600 screen.
    const sized = width === area.width && height === area.height ? image : image.resize(width, height, { fit: 'fill' });
    return sized.png(options).toBuffer();
  };
  let data = await png(PNG_FAST);
  if (data.length > spec.maxBytes) data = await png(PNG_SMALL);
  if (data.length > spec.maxBytes) {
    throw new AgentFailure('too_large', `the image is ${data.length} bytes, over the limit of ${spec.maxBytes}`, false);
  }
  return { png: data, width, height };
}

/**
 * A PNG of the screen from the framebuffer in `fbDir`, cropped to `spec.region` (clamped to the
 * screen) and scaled; `currentSize` asks the X server for the screen's size now.
 */
export async function captureScreenshot(
  fbDir: string,
  spec: ScreenshotSpec,
  currentSize: () => Promise<DisplaySize>,
): Promise<Screenshot> {
  const opening = openFramebuffer(join(fbDir, FRAMEBUFFER_FILE));
  // Handled now (it may fail while the X server is being asked); awaited, and so rethrown, below.
  opening.catch(() => undefined);
  let screen: DisplaySize;
  try {
    screen = await currentSize();
  } catch (err) {
    // The X server's answer decides ("X session down"); the file is not needed any more.
    void opening.then((fb) => fb.handle.close(), () => undefined);
    throw err;
  }
  const fb = await opening;
  try {
    const { layout } = fb;
    if (screen.width > layout.width || screen.height > layout.height) {
      throw invalid(`the screen is ${screen.width}x${screen.height}, the framebuffer ${layout.width}x${layout.height}`);
    }
    const area = spec.region === null ? { x: 0, y: 0, ...screen } : clampRegion(spec.region, screen);
    const rows = await readRows(fb, area);
    return await encode(toRgb(rows, area.width, area.height, layout.stride, layout.shifts), area, spec);
  } finally {
    await fb.handle.close();
  }
}

/** The X screen's current size, asked by the guest helper (`xsize`) inside the desktop. */
export async function guestScreenSize(target: GuestTarget): Promise<DisplaySize> {
  const call = await GuestCall.start(target, 'xsize', [], { timeoutMs: XSIZE_MS });
  const fields = await call.status();
  const [width, height] = fields.map(Number);
  if (fields.length !== 2 || !fields.every((f) => /^[1-9][0-9]{0,4}$/.test(f)) || width === undefined || height === undefined) {
    throw new AgentFailure('runtime_error', 'guest helper sent a malformed reply', true);
  }
  return { width, height };
}

/**
 * The guest helper's `xinput` operation (agent/guest/helper/op-xinput.pl), run by the real Perl
 * against a stand-in X server on a unix socket that speaks enough of the protocol (setup,
 * QueryExtension, GetKeyboardMapping, WarpPointer, QueryPointer, XTEST FakeInput) and records
 * each request: the requests are checked one by one, in order. What real applications see of
 * the same operation is tested against Xvfb and xev (test/integration/sandbox-input.test.ts).
 */
import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { guestHelperProgram, warmHelperProgram } from '../../agent/src/runtime/sandbox/guest/guest-helper.js';

const XTEST = 140;
const MIN_KEYCODE = 8;
/** Two keysyms per keycode from keycode 8: 37 holds Control_L, 38 `a` (and `A`), 39 `A` alone on level 1. */
const KEYMAP: Readonly<Record<number, [number, number]>> = { 37: [0xffe3, 0], 38: [0x61, 0x41], 39: [0, 0x62] };
const ROOT = 0x2a0;

let dir: string;
let socketPath: string;
let server: Server;
let requests: string[];
/** An event the server sends before its next reply, as MappingNotify reaches every client. */
let eventFirst = false;
/** The server's pointer, across connections. */
let pointer = { x: 3, y: 4 };

function reply(seq: number, data: Buffer, first = 0): Buffer {
  const head = Buffer.alloc(32);
  head.writeUInt8(1, 0);
  head.writeUInt8(first, 1);
  head.writeUInt16LE(seq, 2);
  const extra = Math.max(0, data.length - 24);
  head.writeUInt32LE(extra / 4, 4);
  data.copy(head, 8, 0, Math.min(24, data.length));
  return Buffer.concat([head, data.subarray(24)]);
}

function serve(client: Socket): void {
  let got = Buffer.alloc(0);
  let setUp = false;
  let seq = 0;
  const answer = (buf: Buffer) => {
    if (eventFirst) {
      eventFirst = false;
      const event = Buffer.alloc(32);
      event.writeUInt8(34, 0); // MappingNotify
      client.write(event);
    }
    client.write(buf);
  };
  client.on('data', (chunk: Buffer) => {
    got = Buffer.concat([got, chunk]);
    if (!setUp) {
      if (got.length < 12) return;
      got = got.subarray(12);
      setUp = true;
      // Setup reply: 32 fixed bytes (vendor length 4, one screen, no pixmap formats, keycodes
      // 8-15), the vendor, then screen 0 (root window, 1024x768 at bytes 20 and 22).
      const body = Buffer.alloc(32 + 4 + 40);
      body.writeUInt16LE(4, 16);
      body.writeUInt8(1, 20);
      body.writeUInt8(MIN_KEYCODE, 26);
      body.writeUInt8(39, 27);
      body.write('fake', 32);
      body.writeUInt32LE(ROOT, 36);
      body.writeUInt16LE(1024, 36 + 20);
      body.writeUInt16LE(768, 36 + 22);
      const head = Buffer.alloc(8);
      head.writeUInt8(1, 0);
      head.writeUInt16LE(11, 2);
      head.writeUInt16LE(body.length / 4, 6);
      client.write(Buffer.concat([head, body]));
    }
    while (got.length >= 4 && got.length >= 4 * got.readUInt16LE(2)) {
      const req = got.subarray(0, 4 * got.readUInt16LE(2));
      got = got.subarray(req.length);
      seq++;
      const op = req.readUInt8(0);
      if (op === 98) {
        requests.push(`QueryExtension ${req.subarray(8, 8 + req.readUInt16LE(4)).toString()}`);
        answer(reply(seq, Buffer.from([1, XTEST, 0, 0])));
      } else if (op === 101) {
        const [first, count] = [req.readUInt8(4), req.readUInt8(5)];
        requests.push(`GetKeyboardMapping ${first} ${count}`);
        const syms = Buffer.alloc(24 + count * 8);
        for (let k = 0; k < count; k++) {
          const [a, b] = KEYMAP[first + k] ?? [0, 0];
          syms.writeUInt32LE(a, 24 + 8 * k);
          syms.writeUInt32LE(b, 24 + 8 * k + 4);
        }
        answer(reply(seq, syms, 2));
      } else if (op === 119) {
        requests.push('GetModifierMapping');
        const data = Buffer.alloc(24 + 8);
        data[24] = 50; // Shift: keycode 50; the other seven modifiers none
        answer(reply(seq, data, 1));
      } else if (op === 41) {
        expect(req.readUInt32LE(8)).toBe(ROOT);
        pointer = { x: req.readInt16LE(20), y: req.readInt16LE(22) };
        requests.push(`WarpPointer ${pointer.x} ${pointer.y}`);
      } else if (op === 38) {
        requests.push('QueryPointer');
        const data = Buffer.alloc(24);
        data.writeUInt32LE(ROOT, 0);
        data.writeInt16LE(pointer.x, 8);
        data.writeInt16LE(pointer.y, 10);
        answer(reply(seq, data, 1));
      } else if (op === XTEST && req.readUInt8(1) === 2) {
        const kind = ({ 2: 'KeyPress', 3: 'KeyRelease', 4: 'ButtonPress', 5: 'ButtonRelease' } as Record<number, string>)[req.readUInt8(4)];
        requests.push(`${kind} ${req.readUInt8(5)}`);
      } else {
        requests.push(`unexpected ${op}`);
      }
    }
  });
  client.on('error', () => undefined);
}

async function xinput(...steps: (string | number)[]): Promise<string> {
  const program = guestHelperProgram('xinput').replaceAll('/tmp/.X11-unix/X0', socketPath);
  const child = spawn('perl', ['-e', program, '--', 'xinput', ...steps.map(String)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => (out += c.toString()));
  await once(child, 'close');
  return out;
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'canto-xinput-'));
  socketPath = join(dir, 'X0');
  server = createServer(serve);
  await new Promise<void>((resolve) => server.listen(socketPath, resolve));
});

afterAll(async () => {
  await new Promise<void>((resolve) => server.close(() => resolve()));
  rmSync(dir, { recursive: true, force: true });
});

beforeEach(() => {
  requests = [];
});

describe('the xinput helper operation', () => {
  it('warps, presses and releases buttons and keys in order, and answers the cursor the server reads', async () => {
    expect(await xinput('m', 10, 20, 'p', 1, 'r', 1, 'k', 0xffe3, 'k', 0x61, 'u', 0xffe3, 'u', 0x61)).toBe('OK 10 20\n');
    expect(requests).toEqual([
      // The keyboard mapping comes first: a key it cannot press sends the batch back unplayed.
      `GetKeyboardMapping ${MIN_KEYCODE} 32`,
      'WarpPointer 10 20',
      'QueryExtension XTEST',
      'ButtonPress 1',
      'ButtonRelease 1',
      'KeyPress 37',
      'KeyPress 38',
      'KeyRelease 37',
      'KeyRelease 38',
      'QueryPointer',
    ]);
  });

  it('types a character on its key, with Shift around it when it is on the second level, and pauses', async () => {
    const t0 = performance.now();
    expect(await xinput('c', 0x61, 20_000, 'c', 0x41, 20_000)).toBe(`OK ${pointer.x} ${pointer.y}\n`);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(80);
    // As xdotool: Shift goes up before the key.
    const typing = 'KeyPress 38, KeyRelease 38, KeyPress 50, KeyPress 38, KeyRelease 50, KeyRelease 38';
    expect(requests.join(', ')).toBe(`GetKeyboardMapping ${MIN_KEYCODE} 32, GetModifierMapping, QueryExtension XTEST, ${typing}, QueryPointer`);
    // A key on a third level, or none, is left to the script.
    expect(await xinput('c', 0xffff, 0)).toBe('OK script\n');
  });

  it('moves halfway from where the cursor is, and skips an event that comes before a reply', async () => {
    await xinput('m', 100, 50);
    requests = [];
    eventFirst = true;
    expect(await xinput('h', 0, 10)).toBe('OK 50 30\n');
    expect(requests).toEqual(['QueryPointer', 'WarpPointer 50 30', 'QueryPointer']);
  });

  it('sends nothing and answers `script` for a key not on a key\'s first level', async () => {
    expect(await xinput('m', 1, 1, 'k', 0x41, 'u', 0x41)).toBe('OK script\n');
    expect(await xinput('k', 0x62, 'u', 0x62)).toBe('OK script\n');
    expect(await xinput('k', 0xffff, 'u', 0xffff)).toBe('OK script\n');
    expect(requests.every((r) => r.startsWith('GetKeyboardMapping'))).toBe(true);
  });

  it('compiles under strict and warnings, cold and in the warm server', () => {
    for (const program of [guestHelperProgram('xinput'), warmHelperProgram()]) {
      const out = spawnSync('perl', ['-Mstrict', '-w', '-c', '-e', program], { encoding: 'utf8' });
      expect(out.stderr.trim()).toBe('-e syntax OK');
    }
  });

  it('refuses steps it does not know before it connects', async () => {
    expect(await xinput('z', 1)).toBe('ERR bad_request - unknown input step\n');
    expect(await xinput('m', 1)).toBe('ERR bad_request - malformed number\n');
    expect(requests).toEqual([]);
  });
});

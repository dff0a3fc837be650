/**
 * The frames of a warm exec server (agent/src/runtime/sandbox/guest/guest-exec.ts `frameReader`):
 * whole frames however the socket splits them, and a frame larger than the server ever sends
 * refused at its head, before any of it is buffered (a guest can reach that socket).
 */
import { expect, it } from 'vitest';
import { frameReader, MAX_FRAME_BYTES } from '../../agent/src/runtime/sandbox/guest/guest-exec.js';

const frame = (tag: string, data: string) => Buffer.concat([Buffer.from(tag + data.length.toString(16).padStart(8, '0'), 'latin1'), Buffer.from(data)]);

it('hands over whole frames, however the chunks split them', () => {
  const seen: string[] = [];
  let bad = 0;
  const read = frameReader((tag, data) => seen.push(`${tag}:${data.toString()}`), () => (bad += 1));
  const stream = Buffer.concat([frame('s', ''), frame('o', 'hello '), frame('e', 'oops'), frame('o', 'world'), frame('x', '0')]);
  for (let i = 0; i < stream.length; i += 3) read(stream.subarray(i, i + 3));
  expect(seen).toEqual(['s:', 'o:hello ', 'e:oops', 'o:world', 'x:0']);
  expect(bad).toBe(0);
});

it('refuses a frame larger than the server sends at its head, and a malformed head, once', () => {
  for (const head of [`o${(64 << 20).toString(16).padStart(8, '0')}`, `o${(MAX_FRAME_BYTES + 1).toString(16).padStart(8, '0')}`, 'oZZZZZZZZ']) {
    const seen: string[] = [];
    let bad = 0;
    const read = frameReader((tag) => seen.push(tag), () => (bad += 1));
    read(Buffer.concat([frame('o', 'before'), Buffer.from(head, 'latin1')]));
    read(Buffer.alloc(1 << 20));
    expect(seen, head).toEqual(['o']);
    expect(bad, head).toBe(1);
  }
});

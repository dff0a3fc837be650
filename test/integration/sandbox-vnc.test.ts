/**
 * The live stream end to end on the real machine: a sandbox desktop, the stream gateway on
 * 127.0.0.1, and rfb2 as the VNC client (after it sends the ticket line on the socket it then
 * hands to rfb2). Checks the framebuffer against the display, full-frame updates, that view
 * sessions cannot move the pointer or press keys while control sessions can, refused tickets,
 * and that a hibernate with a client connected keeps its memory snapshot, also when a server
 * does not exit and has to be killed. Needs root. The desktop is destroyed in afterAll;
 * handshake timings are printed for the docs.
 */
import { connect, type Socket } from 'node:net';
import { createConnection, type Rect, type RfbClient } from 'rfb2';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { StreamGateway } from '../../agent/src/stream/gateway.js';
import { startStreamDesktop, type StreamDesktop } from '../helpers/stream-desktop.js';
import { hostProcesses, isRoot, median } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';

if (!isRoot) console.warn('sandbox VNC tests skipped: they need root (namespaces, cgroups, CRIU)');

const RAW = 0;
const DESKTOP_SIZE = -223;
const CAPS_LOCK = 0xffe5;

interface Viewer {
  readonly socket: Socket;
  readonly rfb: RfbClient;
  readonly closed: Promise<void>;
  /** From dialing the gateway to the end of the RFB handshake (ServerInit read). */
  readonly handshakeMs: number;
}

async function dial(port: number, line: string): Promise<Socket> {
  const socket = connect({ host: '127.0.0.1', port, noDelay: true });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  socket.write(line);
  return socket;
}

/** Presents the ticket, then speaks RFB with rfb2 on the same socket. */
async function view(port: number, ticket: string): Promise<Viewer> {
  const t0 = performance.now();
  const socket = await dial(port, `${ticket}\n`);
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  const rfb = createConnection({ stream: socket, encodings: [RAW, DESKTOP_SIZE] });
  await new Promise<void>((resolve, reject) => {
    rfb.once('connect', resolve);
    rfb.once('error', reject);
    void closed.then(() => reject(new Error('connection closed during the RFB handshake')));
  });
  return { socket, rfb, closed, handshakeMs: performance.now() - t0 };
}

/** Requests a full (non-incremental) update and resolves once rectangles covering the screen arrived. */
async function fullFrame(viewer: Viewer): Promise<Rect[]> {
  const { rfb } = viewer;
  const rects: Rect[] = [];
  let area = 0;
  const done = new Promise<void>((resolve) => {
    const onRect = (rect: Rect) => {
      rects.push(rect);
      area += rect.width * rect.height;
      if (area >= rfb.width * rfb.height) {
        rfb.off('rect', onRect);
        resolve();
      }
    };
    rfb.on('rect', onRect);
  });
  rfb.requestUpdate(false, 0, 0, rfb.width, rfb.height);
  await done;
  return rects;
}

/** Everything the gateway sends to a connection before closing it. */
async function refusal(port: number, line: string): Promise<string> {
  const socket = await dial(port, line);
  let text = '';
  socket.on('data', (chunk: Buffer) => (text += chunk.toString('latin1')));
  socket.on('error', () => undefined);
  await new Promise((resolve) => socket.once('close', resolve));
  return text;
}

describe.skipIf(!isRoot)('sandbox VNC stream', () => {
  let world: StreamDesktop | undefined;
  let driver: SandboxDriver;
  let gateway: StreamGateway;
  let id: string;
  const viewers: Viewer[] = [];
  const handshakes: number[] = [];
  const frames: number[] = [];

  async function session(claim: 'view' | 'control'): Promise<Viewer> {
    const viewer = await view(gateway.port, gateway.grant(id, claim).ticket);
    viewers.push(viewer);
    handshakes.push(viewer.handshakeMs);
    return viewer;
  }

  async function pointer(): Promise<{ x: number; y: number }> {
    const out = await driver.exec(id, { command: 'xdotool getmouselocation --shell', timeoutMs: 10_000, maxOutputBytes: 4096 });
    expect(out.exitCode, out.stderr).toBe(0);
    const x = /^X=(\d+)$/m.exec(out.stdout)?.[1];
    const y = /^Y=(\d+)$/m.exec(out.stdout)?.[1];
    return { x: Number(x), y: Number(y) };
  }

  async function capsLock(): Promise<string> {
    const out = await driver.exec(id, { command: 'xset q', timeoutMs: 10_000, maxOutputBytes: 64 * 1024 });
    expect(out.exitCode, out.stderr).toBe(0);
    return /Caps Lock:\s+(on|off)/.exec(out.stdout)?.[1] ?? 'unknown';
  }

  /** Host pids and command lines of this desktop's VNC servers. */
  const servers = () => hostProcesses((args) => args[0] === '/usr/bin/x11vnc' && args.includes(id));

  beforeAll(async () => {
    world = await startStreamDesktop('canto-vnc-test-');
    ({ driver, gateway, id } = world);
  });

  // Every session ends with its test, and its server with it.
  afterEach(async () => {
    for (const v of viewers.splice(0)) v.socket.destroy();
    await until(async () => (await servers()).length === 0, 10_000, 'the VNC servers to exit');
  });

  afterAll(async () => {
    await world?.close();
    console.log(
      'sandbox VNC timings (ms):',
      JSON.stringify({
        handshakeMedian: Math.round(median(handshakes)),
        handshakes: handshakes.map(Math.round),
        fullFrameMedian: Math.round(median(frames)),
      }),
    );
  });

  it('serves the display at its size, with full-frame updates', async () => {
    for (let i = 0; i < 5; i++) {
      const viewer = await session('view');
      expect([viewer.rfb.width, viewer.rfb.height]).toEqual([1024, 768]);
      expect(viewer.rfb.title).toBe(id);
      expect(viewer.rfb.bpp).toBe(32);
      const t0 = performance.now();
      const rects = await fullFrame(viewer);
      frames.push(performance.now() - t0);
      const area = rects.reduce((sum, r) => sum + r.width * r.height, 0);
      expect(area).toBe(1024 * 768);
      for (const r of rects) expect(r.data?.length).toBe(r.width * r.height * 4);
      viewer.socket.end();
      await viewer.closed;
    }
  });

  it('applies a control session\u2019s pointer and keys and ignores a view session\u2019s', async () => {
    const control = await session('control');
    const watcher = await session('view');
    const args = await servers();
    expect(args.filter((s) => s.args.includes('-viewonly'))).toHaveLength(1);
    expect(args).toHaveLength(2);

    control.rfb.pointerEvent(123, 234, 0);
    await until(async () => {
      const p = await pointer();
      return p.x === 123 && p.y === 234;
    }, 10_000, 'the pointer to move');

    watcher.rfb.pointerEvent(400, 300, 0);
    // The server reads a client's messages in order: once the update requested after the pointer
    // event is answered, the event has been handled (and dropped).
    await fullFrame(watcher);
    expect(await pointer()).toEqual({ x: 123, y: 234 });

    control.rfb.pointerEvent(321, 123, 0);
    await until(async () => {
      const p = await pointer();
      return p.x === 321 && p.y === 123;
    }, 10_000, 'the pointer to move again');

    // Keys: Caps Lock toggles a keyboard LED, which needs no focused window to observe.
    expect(await capsLock()).toBe('off');
    watcher.rfb.keyEvent(CAPS_LOCK, true);
    watcher.rfb.keyEvent(CAPS_LOCK, false);
    await fullFrame(watcher);
    expect(await capsLock()).toBe('off');
    for (const expected of ['on', 'off']) {
      control.rfb.keyEvent(CAPS_LOCK, true);
      control.rfb.keyEvent(CAPS_LOCK, false);
      await until(async () => (await capsLock()) === expected, 10_000, `Caps Lock to be ${expected}`);
    }

    control.socket.destroy();
    await until(() => !gateway.controlHeld(id), 10_000, 'the control claim to be released');
  });

  it('serves the new size after a resize', async () => {
    const open = await session('view');
    const resized = new Promise<Rect>((resolve) => open.rfb.once('resize', resolve));
    // A server would send a new size in answer to an update request.
    open.rfb.requestUpdate(true, 0, 0, open.rfb.width, open.rfb.height);
    expect(await driver.setDisplay(id, { width: 800, height: 600 })).toEqual({ width: 800, height: 600 });
    // x11vnc 0.9.16 misses this X server's RandR change and exits on its next poll past the new
    // edge, which closes the client's connection; a server that followed the change would tell
    // the client instead. Either way the client is not left with a wrong picture.
    const outcome = await Promise.race([resized.then((r) => `resized ${r.width}x${r.height}`), open.closed.then(() => 'closed')]);
    expect(['resized 800x600', 'closed']).toContain(outcome);
    const fresh = await session('view');
    expect([fresh.rfb.width, fresh.rfb.height]).toEqual([800, 600]);
    const rects = await fullFrame(fresh);
    expect(rects.reduce((sum, r) => sum + r.width * r.height, 0)).toBe(800 * 600);
  });

  it('refuses reused and expired tickets', async () => {
    const { ticket } = gateway.grant(id, 'view');
    const first = await view(gateway.port, ticket);
    viewers.push(first);
    expect(await refusal(gateway.port, `${ticket}\n`)).toBe('ERR invalid_ticket\n');

    const shortLived = await StreamGateway.start({
      listenHost: '127.0.0.1',
      port: 0,
      advertiseHost: '127.0.0.1',
      open: (desktopId, viewOnly) => driver.openVnc(desktopId, viewOnly),
      ticketTtlMs: 50,
      log: () => undefined,
    });
    try {
      const grant = shortLived.grant(id, 'control');
      await until(() => !shortLived.controlHeld(id), 10_000, 'the ticket to expire');
      expect(await refusal(shortLived.port, `${grant.ticket}\n`)).toBe('ERR expired_ticket\n');
    } finally {
      await shortLived.close();
    }
  });

  it('hibernates with a client connected and keeps the memory snapshot', async (ctx) => {
    if (!driver.capabilities().memorySnapshots) ctx.skip();
    const size = await driver.getDisplay(id);
    const live = await session('control');
    await fullFrame(live);
    expect(await servers()).toHaveLength(1);
    const unused = gateway.grant(id, 'view').ticket;

    // The driver closes every VNC server (closeAll) before CRIU dumps the guest.
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    await live.closed;
    expect(await servers()).toHaveLength(0);
    await until(() => !gateway.controlHeld(id), 10_000, 'the control claim to be released');
    expect(await refusal(gateway.port, `${unused}\n`)).toBe('ERR not_running\n');

    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    const after = await session('control');
    // The display size survived the snapshot.
    expect({ width: after.rfb.width, height: after.rfb.height }).toEqual(size);
    await fullFrame(after);
    after.rfb.pointerEvent(10, 20, 0);
    await until(async () => {
      const p = await pointer();
      return p.x === 10 && p.y === 20;
    }, 10_000, 'the pointer to move after the restore');
  });

  it('kills a server that does not exit, and still keeps the memory snapshot', async (ctx) => {
    if (!driver.capabilities().memorySnapshots) ctx.skip();
    const stuck = await session('view');
    await fullFrame(stuck);
    const [server] = await servers();
    expect(server).toBeDefined();
    // A stopped server cannot see its client hang up: closeAll must kill it before the dump.
    process.kill(server?.pid ?? 0, 'SIGSTOP');
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    await stuck.closed;
    expect(await servers()).toHaveLength(0);
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    const after = await session('view');
    await fullFrame(after);
  });
});

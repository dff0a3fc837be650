/**
 * Terminals and the WebSocket screen stream on the real machine: a sandbox desktop, the stream
 * gateway on 127.0.0.1, and `ws` clients. A terminal runs a real shell inside the desktop (output,
 * resize seen by `stty size`, exit status), its ticket works once, closing the socket leaves no
 * process behind (background jobs included, even one that left the session), the per-desktop cap
 * holds, and a hibernate with a terminal open (this agent's, or an earlier agent's) closes it and
 * still takes a memory snapshot. RFB
 * over a WebSocket gives the handshake and a framebuffer for view and control claims, and only
 * control moves the pointer. Needs root.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { WS_CLOSE } from '../../shared/src/terminal-protocol.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import type { StreamGateway } from '../../agent/src/stream/gateway.js';
import { startStreamDesktop, type StreamDesktop } from '../helpers/stream-desktop.js';
import { MAX_TERMINALS } from '../../agent/src/stream/terminal-tickets.js';
import { hostProcesses, isRoot, memorySnapshotsHere } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';
import { openTerminal, rfbOverWebSocket } from '../helpers/terminal.js';

if (!isRoot) console.warn('sandbox terminal tests skipped: they need root (namespaces, cgroups, CRIU)');

describe.skipIf(!isRoot)('sandbox terminals and the WebSocket stream', () => {
  let world: StreamDesktop | undefined;
  let driver: SandboxDriver;
  let gateway: StreamGateway;
  let id: string;
  const generation = 1;

  const terminalUrl = (spec: { cols?: number; rows?: number; command?: string | null } = {}) => {
    const grant = gateway.grantTerminal(id, generation, { cols: spec.cols ?? 80, rows: spec.rows ?? 24, command: spec.command ?? null });
    return `ws://127.0.0.1:${grant.port}/terminal?ticket=${encodeURIComponent(grant.ticket)}`;
  };
  const vncUrl = (claim: 'view' | 'control') => {
    const grant = gateway.grant(id, claim);
    return `ws://127.0.0.1:${grant.port}/vnc?ticket=${encodeURIComponent(grant.ticket)}`;
  };
  const marked = (mark: string) => hostProcesses((args) => args.join(' ').includes(mark));

  async function pointer(): Promise<{ x: number; y: number }> {
    const out = await driver.exec(id, { command: 'xdotool getmouselocation --shell', timeoutMs: 10_000, maxOutputBytes: 4096 });
    expect(out.exitCode, out.stderr).toBe(0);
    return { x: Number(/^X=(\d+)$/m.exec(out.stdout)?.[1]), y: Number(/^Y=(\d+)$/m.exec(out.stdout)?.[1]) };
  }

  beforeAll(async () => {
    world = await startStreamDesktop('canto-terminal-test-', (d) => ({
      openTerminal: (desktopId, spec) => d.openTerminal(desktopId, spec),
      generationOf: () => generation,
    }));
    ({ driver, gateway, id } = world);
  }, 60_000);

  // Every test's terminals and tickets end with it.
  afterEach(() => gateway.release(id));

  afterAll(async () => {
    await world?.close();
  });

  it('runs a shell in the desktop: output, resize, and the exit status', async () => {
    const term = await openTerminal(terminalUrl({ cols: 90, rows: 20 }));
    const n = Math.floor(Math.random() * 1e9);
    term.type(`echo hello-$((${n} + 1)); hostname\n`);
    await term.waitFor(new RegExp(`hello-${n + 1}\\r\\n${id.replace(/_/g, '-')}\\r\\n`));
    term.type('stty size\n');
    await term.waitFor(/\b20 90\r\n/);
    const mark = term.output().length;
    term.resize(132, 43);
    term.type('stty size; echo "$TERM"\n');
    await term.waitFor(/\b43 132\r\nxterm-256color\r\n/, 10_000, mark);
    term.type('exit 3\n');
    expect(await term.closed).toEqual({ exitCode: 3, code: WS_CLOSE.done, reason: 'done' });
  }, 30_000);

  it('runs a given command instead of a shell, and reports a signal as 128 + n', async () => {
    const done = await openTerminal(terminalUrl({ command: 'echo from-command; exit 7' }));
    expect((await done.closed).exitCode).toBe(7);
    expect(done.output()).toContain('from-command');
    const killed = await openTerminal(terminalUrl({ command: 'kill -TERM $$' }));
    expect((await killed.closed).exitCode).toBe(128 + 15);
  }, 30_000);

  it('keeps the end of the output of a program that ends while its terminal is paused for a slow client', async () => {
    const session = await driver.openTerminal(id, { cols: 80, rows: 24, command: "printf 'x%.0s' $(seq 1 3000); echo; echo END-OF-OUTPUT" });
    session.pause();
    let out = '';
    session.onData((data) => (out += data.toString('utf8')));
    // Long after the program ended, and after the 200 ms node-pty waits before it drops what is unread.
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    session.resume();
    expect(await session.exited).toBe(0);
    expect(out).toContain('END-OF-OUTPUT');
    expect(out.split('x').length - 1).toBe(3000);
  });

  it('takes a ticket once', async () => {
    const url = terminalUrl({ command: 'sleep 30' });
    const first = await openTerminal(url);
    const second = await openTerminal(url);
    expect(await second.closed).toEqual({ exitCode: null, code: WS_CLOSE.invalid_ticket, reason: 'invalid_ticket' });
    first.ws.close();
    const bogus = await openTerminal(`ws://127.0.0.1:${gateway.port}/terminal?ticket=ttk_${'A'.repeat(43)}`);
    expect((await bogus.closed).code).toBe(WS_CLOSE.invalid_ticket);
  }, 30_000);

  it('leaves no process behind when the socket closes, background jobs included', async () => {
    const term = await openTerminal(terminalUrl());
    term.type('sleep 4242 & (setsid sleep 4243 &) ; echo started-$((40 + 2))\n');
    await term.waitFor(/started-42/);
    await until(async () => (await marked('4242')).length > 0 && (await marked('4243')).length > 0, 10_000, 'the background jobs');
    term.ws.close();
    expect((await term.closed).code).toBe(1005);
    await until(async () => (await marked('4242')).length === 0 && (await marked('4243')).length === 0, 10_000, 'no process left');
  }, 30_000);

  it('stops reading a client whose program leaves its input unread, and loses nothing', async () => {
    const size = 8 * 1024 * 1024;
    const term = await openTerminal(terminalUrl({ command: `stty raw -echo; echo go; sleep 2; head -c ${size} | wc -c` }));
    await term.waitFor(/go\r?\n/);
    const chunk = Buffer.alloc(64 * 1024, 'a');
    for (let sent = 0; sent < size; sent += chunk.length) term.ws.send(chunk, { binary: true });
    // While the program sleeps the agent holds at most a little of it (and its event loop, which
    // this test shares, runs on): the rest waits at the client.
    await new Promise((r) => setTimeout(r, 1000));
    expect(term.ws.bufferedAmount).toBeGreaterThan(size / 4);
    await term.waitFor(new RegExp(`\\b${size}\\b`), 20_000);
    expect((await term.closed).exitCode).toBe(0);
  }, 40_000);

  it('caps the terminals of a desktop, counting unused tickets', async () => {
    const urls = Array.from({ length: MAX_TERMINALS }, () => terminalUrl({ command: 'sleep 30' }));
    expect(() => terminalUrl()).toThrow(/at most 8 terminals/);
    // Open terminals count too; a closed one frees its place.
    const open = await openTerminal(urls[0] as string);
    await until(async () => (await marked('sleep 30')).length > 0, 10_000, 'the terminal to start');
    expect(() => terminalUrl()).toThrow(/at most/);
    open.ws.close();
    await open.closed;
    await until(() => {
      try {
        terminalUrl();
        return true;
      } catch {
        return false;
      }
    }, 5_000, 'a free terminal place');
  }, 30_000);

  it('streams RFB over a WebSocket for view and control claims; only control moves the pointer', async () => {
    const viewer = await rfbOverWebSocket(vncUrl('view'));
    expect(viewer.protocol).toBe('binary');
    expect([viewer.rfb.width, viewer.rfb.height]).toEqual([1024, 768]);
    const start = await pointer();
    // The server handles a client's messages in order: once the full frame asked for after the
    // pointer event has arrived, the (view-only) server has seen the event, and dropped it.
    viewer.rfb.pointerEvent(start.x === 11 ? 12 : 11, 22, 0);
    let area = 0;
    const full = new Promise<void>((resolve) => {
      viewer.rfb.on('rect', (rect) => {
        area += rect.width * rect.height;
        if (area >= 1024 * 768) resolve();
      });
    });
    viewer.rfb.requestUpdate(false, 0, 0, 1024, 768);
    await full;
    expect(await pointer()).toEqual(start);

    const controller = await rfbOverWebSocket(vncUrl('control'));
    const to = { x: start.x === 333 ? 334 : 333, y: start.y === 444 ? 445 : 444 };
    controller.rfb.pointerEvent(to.x, to.y, 0);
    await until(async () => JSON.stringify(await pointer()) === JSON.stringify(to), 10_000, 'the control client to move the pointer');

    const reused = vncUrl('view');
    const once = await rfbOverWebSocket(reused);
    await expect(rfbOverWebSocket(reused)).rejects.toThrow(/4401 invalid_ticket/);
    for (const c of [viewer, controller, once]) c.ws.close();
  }, 30_000);

  it("kills, at a hibernate, terminals of an earlier agent that this one does not know", async () => {
    const snapshots = await memorySnapshotsHere();
    // A second driver on the same state stands for the agent after a restart; the first still
    // holds the pty's master, so its shell lives on unknown to the second.
    const earlier = await driver.openTerminal(id, { cols: 80, rows: 24, command: 'sleep 4245' });
    await until(async () => (await marked('4245')).length > 0, 10_000, 'the earlier terminal');
    const restarted = await createSandboxDriver({ stateDir: world!.stateDir });
    try {
      const { snapshot } = await restarted.hibernate(id);
      expect(await marked('4245')).toEqual([]);
      if (snapshots) expect(snapshot).toBe(true);
      expect(await earlier.exited).toBe(128 + 9);
      await restarted.start({ desktopId: id, tier: 'small', firstBoot: null });
    } finally {
      await restarted.close();
    }
  }, 60_000);

  it('closes terminals when the desktop hibernates, and the memory snapshot is still taken', async () => {
    const snapshots = await memorySnapshotsHere();
    const term = await openTerminal(terminalUrl());
    term.type('sleep 4244 & echo ready-$((1 + 1))\n');
    await term.waitFor(/ready-2/);
    // What the agent's handlers do before they hibernate: the gateway lets go, then the driver stops.
    gateway.release(id);
    const { snapshot } = await driver.hibernate(id);
    expect((await term.closed).code).toBe(WS_CLOSE.going_away);
    expect(await marked('4244')).toEqual([]);
    if (snapshots) expect(snapshot).toBe(true);
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
  }, 60_000);
});

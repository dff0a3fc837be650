/**
 * Port links handed to relays (agent/native/port-relay.c, ports/port-relays.ts) on the real
 * machine: the port gateway verifies a link's line, the sandbox driver hands the client's
 * connection to a `canto-spawn --relay` child, and from then on the bytes go between the client
 * and the guest's port without this process. Checks the answer (`OK`, `ERR refused`), the relay's
 * confinement (the guest's network namespace and cgroups, not its pid namespace, nobody without
 * capabilities), half-close and a 50 MiB download, that a download completes while this process's
 * event loop is blocked (the agent is out of the path), that a client's reset ends its relay, that
 * relays die with the process spawner, and that a hibernate resets open links and leaves no relay.
 * Needs root and the built spawner.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { portLinkLine } from '../../shared/src/port-link.js';
import { PortGateway } from '../../agent/src/ports/gateway.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { helperPath, runningSpawner } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { expectNetworkOnlyConfinement, hostProcesses, isAlive, isRoot, memoryKiB } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';

const ready = isRoot && helperPath() !== null;
if (!ready) console.warn('port relay tests skipped: they need root and dist/canto-spawn (npm run build)');

const MiB = 1024 * 1024;
const HTTP_PORT = 8000;
/** A guest server that greets each connection and keeps it open. */
const HOLD_PORT = 8001;
const SECRET = 'test-join-token-0123456789abcdef';

/** Reads `socket` up to and including `text`; what came behind it is left in the socket. */
function readUntil(socket: Socket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = '';
    const onClose = () => reject(new Error(`closed before "${text}": ${JSON.stringify(got)}`));
    const onData = (c: Buffer) => {
      got += c.toString('latin1');
      const at = got.indexOf(text);
      if (at === -1) return;
      socket.off('data', onData);
      socket.off('close', onClose);
      socket.pause();
      const rest = got.slice(at + text.length);
      if (rest.length > 0) socket.unshift(Buffer.from(rest, 'latin1'));
      resolve(got.slice(0, at + text.length));
    };
    socket.on('data', onData);
    socket.once('close', onClose);
    socket.resume();
  });
}

/** Everything until the socket ends or closes, and whether it was reset. */
function readToEnd(socket: Socket): Promise<{ body: Buffer; reset: boolean }> {
  return new Promise((resolve) => {
    const parts: Buffer[] = [];
    let reset = false;
    socket.on('data', (c: Buffer) => parts.push(c));
    socket.on('error', (err: NodeJS.ErrnoException) => (reset ||= err.code === 'ECONNRESET'));
    socket.once('close', () => resolve({ body: Buffer.concat(parts), reset }));
    socket.resume();
  });
}

describe.skipIf(!ready)('port links handed to relays', () => {
  let base: string;
  let driver: SandboxDriver;
  let gateway: PortGateway;
  let id: string;
  const logs: Array<{ msg: string; fields?: Record<string, unknown> }> = [];

  const initPid = async () => (JSON.parse(await readFile(join(base, 'state', 'desktops', id, 'run', 'init.json'), 'utf8')) as { pid: number }).pid;
  const relayPids = async () =>
    (await hostProcesses((args) => args[1] === '--relay' && args[2] === `/proc/${initPidNow}/ns/net`)).map((p) => p.pid);
  let initPidNow = 0;

  /** A link through the gateway: its line sent, `OK` read; the rest of the socket is the guest port's. */
  async function link(port: number): Promise<Socket> {
    const socket = connect({ host: '127.0.0.1', port: gateway.port });
    socket.on('error', () => undefined);
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write(portLinkLine(SECRET, { desktopId: id, generation: 1, port }));
    expect(await readUntil(socket, '\n')).toBe('OK\n');
    return socket;
  }

  async function sh(command: string): Promise<void> {
    const out = await driver.exec(id, { command, timeoutMs: 20_000, maxOutputBytes: MiB });
    expect(out.exitCode, `${command}: ${out.stderr}`).toBe(0);
  }

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-relays-test-'));
    driver = await createSandboxDriver({ stateDir: join(base, 'state'), log: () => undefined });
    id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    await sh(
      "cat > /root/hold.py <<'EOF'\nimport socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n" +
        `s.bind(("127.0.0.1", ${HOLD_PORT})); s.listen(16)\nkept = []\nwhile True:\n    c, _ = s.accept(); c.sendall(b"hello\\n"); kept.append(c)\nEOF\n` +
        'mkdir -p /root/www && cd /root/www && printf index > index.txt && head -c 52428800 /dev/zero > big.bin && ' +
        `(setsid nohup python3 -m http.server ${HTTP_PORT} --bind 127.0.0.1 </dev/null >/tmp/http.log 2>&1 &) && ` +
        '(setsid nohup python3 /root/hold.py </dev/null >/tmp/hold.log 2>&1 &)',
    );
    const answers = (port: number) => driver.openGuestPort(id, port).then((c) => (c.destroy(), true), () => false);
    await until(async () => (await answers(HTTP_PORT)) && (await answers(HOLD_PORT)), 10_000, 'the guest servers to listen');
    initPidNow = await initPid();
    gateway = await PortGateway.start({
      listenHost: '127.0.0.1',
      port: 0,
      open: (target) => driver.openGuestPort(target.desktopId, target.port),
      handOff: (target, client) => driver.handOffGuestPort(target.desktopId, target.port, client),
      log: (msg, fields) => logs.push({ msg, fields: fields as Record<string, unknown> }),
    });
    gateway.setKey(SECRET);
  });

  afterAll(async () => {
    await gateway?.close();
    if (id) await driver?.destroy(id);
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
  });

  it('answers OK from the relay and carries an HTTP exchange; the gateway keeps no relay of its own', async () => {
    logs.length = 0;
    const socket = await link(HTTP_PORT);
    const answer = readToEnd(socket);
    socket.write('GET /index.txt HTTP/1.0\r\nHost: guest\r\n\r\n');
    const { body, reset } = await answer;
    expect(reset).toBe(false);
    expect(body.toString('latin1')).toMatch(/^HTTP\/1\.0 200 [^]*\r\n\r\nindex$/);
    expect(logs.map((l) => l.msg)).toContain('port connection handed off');
    expect((gateway as unknown as { relays: Set<unknown> }).relays.size).toBe(0);
    await until(() => logs.some((l) => l.msg === 'port connection closed'), 5_000, 'the relay to report its end');
    await until(async () => (await relayPids()).length === 0, 5_000, 'the relay to exit');
    expect(gateway.stats()).toMatchObject({ relayed: 1, relayedOpen: 0, agent: 0 });
  });

  it('answers ERR refused for a port nothing listens on', async () => {
    logs.length = 0;
    const socket = connect({ host: '127.0.0.1', port: gateway.port });
    const all = readToEnd(socket);
    socket.write(portLinkLine(SECRET, { desktopId: id, generation: 1, port: 8999 }));
    expect((await all).body.toString()).toBe('ERR refused\n');
    await until(() => logs.some((l) => l.msg === 'port connection refused' && l.fields?.code === 'refused'), 5_000, 'the refusal in the log');
  });

  it('runs each relay outside the guest pid namespace, in its network and cgroups, as nobody without capabilities', async () => {
    const socket = await link(HOLD_PORT);
    expect(await readUntil(socket, 'hello\n')).toBe('hello\n');
    const [relay] = await until(async () => ((await relayPids()).length === 1 ? relayPids() : null), 5_000, 'the relay');
    await expectNetworkOnlyConfinement(relay!, initPidNow, id);
    console.log(`port relay memory: ${await memoryKiB(relay!, 'Rss')} kB RSS, ${await memoryKiB(relay!, 'Pss')} kB PSS`);
    // A reset from the client ends the relay.
    socket.resetAndDestroy();
    await until(async () => !(await isAlive(relay!)), 5_000, 'the relay to exit after the reset');
  });

  it('passes a half-close on and streams 50 MiB, while this process does nothing', async () => {
    // The hold server greets after the client has ended its side.
    const hold = await link(HOLD_PORT);
    hold.end();
    expect(await readUntil(hold, 'hello\n')).toBe('hello\n');
    hold.destroy();

    // A client of its own, so that this event loop can be blocked while it downloads: the link
    // is made (line, OK) before, and the GET goes when it reads `go`.
    const line = portLinkLine(SECRET, { desktopId: id, generation: 1, port: HTTP_PORT });
    const client = spawn('python3', ['-c', [
      'import socket, sys, time',
      `s = socket.create_connection(("127.0.0.1", ${gateway.port}))`,
      `s.sendall(${JSON.stringify(line)}.encode())`,
      'assert s.recv(3) == b"OK\\n"',
      'print("linked", flush=True)',
      'sys.stdin.readline()',
      's.sendall(b"GET /big.bin HTTP/1.0\\r\\nHost: guest\\r\\n\\r\\n")',
      'n = 0',
      'while True:',
      '    b = s.recv(1 << 20)',
      '    if not b: break',
      '    n += len(b)',
      'print(n, time.time(), flush=True)',
    ].join('\n')], { stdio: ['pipe', 'pipe', 'inherit'] });
    let out = '';
    client.stdout.on('data', (c: Buffer) => (out += c.toString()));
    await until(() => out.includes('linked'), 10_000, 'the client to be linked');
    client.stdin.write('go\n');
    // Blocked: a relay through this process would move no byte until the loop runs again.
    const until2 = Date.now() + 3_000;
    while (Date.now() < until2) {
      // busy
    }
    const blockedUntil = Date.now() / 1000;
    await new Promise((resolve) => client.once('close', resolve));
    const [bytes, finishedAt] = out.trim().split('\n')[1]!.split(' ').map(Number);
    expect(bytes).toBeGreaterThan(50 * MiB);
    expect(finishedAt).toBeLessThan(blockedUntil);
  });

  it('relays die with the process spawner (and so with the agent); the next link gets a new one', async () => {
    const held = await link(HOLD_PORT);
    await readUntil(held, 'hello\n');
    const ended = readToEnd(held);
    const spawner = await runningSpawner();
    expect(spawner).not.toBeNull();
    const before = await relayPids();
    expect(before.length).toBeGreaterThan(0);
    process.kill(spawner!.pid, 'SIGKILL');
    await ended;
    await until(async () => (await Promise.all(before.map((pid) => isAlive(pid)))).every((alive) => !alive), 5_000, 'the relays to die');
    const again = await link(HTTP_PORT);
    const answer = readToEnd(again);
    again.write('GET /index.txt HTTP/1.0\r\n\r\n');
    expect((await answer).body.toString('latin1')).toMatch(/\r\n\r\nindex$/);
    expect((await runningSpawner())!.pid).not.toBe(spawner!.pid);
  });

  it('a hibernate resets the links open through relays and leaves no relay', async (ctx) => {
    const held = await link(HOLD_PORT);
    await readUntil(held, 'hello\n');
    const ended = readToEnd(held);
    // This link's relay, and the one of the half-closed link before (its guest server never ends).
    expect((await relayPids()).length).toBeGreaterThan(0);
    const result = await driver.hibernate(id);
    expect((await ended).reset).toBe(true);
    expect(await relayPids()).toEqual([]);
    if (!result.snapshot) ctx.skip(); // a CRIU that cannot dump TCP sockets here: the rest needs a restore
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    initPidNow = await initPid();
    const again = await link(HTTP_PORT);
    const answer = readToEnd(again);
    again.write('GET /index.txt HTTP/1.0\r\n\r\n');
    expect((await answer).body.toString('latin1')).toMatch(/\r\n\r\nindex$/);
  });
});

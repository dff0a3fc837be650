/**
 * Guest ports on the real machine: a sandbox desktop running `python3 -m http.server` on
 * 127.0.0.1:8000 inside its own network namespace, reached through the driver's per-desktop
 * forwarder (guest-ports.ts) and through the port gateway with a signed line. Checks the
 * forwarder's confinement (not in the guest's pid namespace, in its network namespace and
 * cgroups, as nobody without capabilities), its replacement after a death, that a hibernate with
 * connections open still takes a memory snapshot (CRIU's --tcp-close) and that the guest servers
 * answer again after the wake through a new forwarder, and that destroy kills it. Needs root. The
 * desktop is destroyed in afterAll; latency and throughput are printed for the docs.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, readlink, rm } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { portLinkLine } from '../../shared/src/port-link.js';
import { PortGateway } from '../../agent/src/ports/gateway.js';
import { forwarderProgram } from '../../agent/src/runtime/sandbox/ports/guest-ports-perl.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { failure } from '../helpers/agent-failure.js';
import { expectNetworkOnlyConfinement, hostProcesses, isAlive, isRoot, median, memoryKiB, parentPid } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';

const execFileAsync = promisify(execFile);

if (!isRoot) console.warn('sandbox port tests skipped: they need root (namespaces, cgroups, CRIU)');

const MiB = 1024 * 1024;
const HTTP_PORT = 8000;
/** A guest server that accepts connections and never closes them. */
const HOLD_PORT = 8001;
const SECRET = 'test-join-token-0123456789abcdef';

/**
 * Everything a stream yields until it ends (or closes); then it is closed. A guest connection is
 * half-open capable, so the server's end alone does not close it.
 */
function readAll(stream: Duplex): Promise<Buffer> {
  return new Promise((resolve) => {
    const parts: Buffer[] = [];
    const done = () => {
      stream.destroy();
      resolve(Buffer.concat(parts));
    };
    stream.on('data', (c: Buffer) => parts.push(c));
    stream.on('error', () => undefined);
    stream.once('end', done);
    stream.once('close', done);
    stream.resume();
  });
}

/** One HTTP/1.0 GET over a connection; the server closes it after the answer. */
async function get(conn: Duplex, path: string): Promise<{ status: number; body: Buffer }> {
  const all = readAll(conn);
  conn.write(`GET ${path} HTTP/1.0\r\nHost: guest\r\n\r\n`);
  const raw = await all;
  const split = raw.indexOf('\r\n\r\n');
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(raw.subarray(0, split).toString('latin1'))?.[1] ?? 0);
  return { status, body: raw.subarray(split + 4) };
}

/** Host pids whose title is `canto-ports <desktop id>`: the forwarder and its connections' children. */
async function forwarderPids(desktopId: string): Promise<number[]> {
  const found = await hostProcesses((args) => args[0]?.trim() === `canto-ports ${desktopId}`);
  const live = await Promise.all(found.map(async (p) => ((await isAlive(p.pid)) ? [p.pid] : [])));
  return live.flat();
}

/** The forwarder itself: the one of them whose parent is not another of them. */
async function forwarderPid(desktopId: string): Promise<number | null> {
  const pids = await forwarderPids(desktopId);
  for (const pid of pids) {
    if (!pids.includes(await parentPid(pid))) return pid;
  }
  return null;
}

const nsOf = (pid: number | 'self', ns: string) => readlink(`/proc/${pid}/ns/${ns}`);

describe.skipIf(!isRoot)('sandbox guest ports', () => {
  let base: string;
  let driver: SandboxDriver;
  let id: string;
  let stopped: string;
  const held: Socket[] = [];
  const logs: Array<{ msg: string; fields?: object }> = [];

  async function sh(command: string): Promise<string> {
    const out = await driver.exec(id, { command, timeoutMs: 20_000, maxOutputBytes: MiB });
    expect(out.exitCode, `exit code of ${command}: ${out.stderr}`).toBe(0);
    return out.stdout.trim();
  }

  async function initPid(): Promise<number> {
    const text = await readFile(join(base, 'state', 'desktops', id, 'run', 'init.json'), 'utf8');
    return (JSON.parse(text) as { pid: number }).pid;
  }

  const answers = async (port: number) => {
    try {
      (await driver.openGuestPort(id, port)).destroy();
      return true;
    } catch {
      return false;
    }
  };

  /**
   * Starts the guest servers unless they answer, with a plain exec `&`: they are guest processes,
   * kept by a memory snapshot (detached processes are killed before one).
   */
  async function ensureGuestServers(): Promise<void> {
    if ((await answers(HTTP_PORT)) && (await answers(HOLD_PORT))) return;
    await sh(
      "cat > /root/hold.py <<'EOF'\n" +
        'import socket\n' +
        's = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n' +
        `s.bind(("127.0.0.1", ${HOLD_PORT})); s.listen(16)\n` +
        'kept = []\n' +
        'while True:\n' +
        '    c, _ = s.accept(); c.sendall(b"hello\\n"); kept.append(c)\n' +
        'EOF\n' +
        'mkdir -p /root/www && cd /root/www && printf index > index.txt && head -c 52428800 /dev/zero > big.bin && ' +
        `(setsid nohup python3 -m http.server ${HTTP_PORT} --bind 127.0.0.1 </dev/null >/tmp/http.log 2>&1 &) && ` +
        '(setsid nohup python3 /root/hold.py </dev/null >/tmp/hold.log 2>&1 &)',
    );
    // Listening once a connect is not refused.
    await until(async () => (await answers(HTTP_PORT)) && (await answers(HOLD_PORT)), 10_000, 'the guest servers to listen');
  }

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-ports-test-'));
    // CANTO_TEST_CRIU: another CRIU binary (see the hibernate case).
    driver = await createSandboxDriver({
      stateDir: join(base, 'state'),
      ...(process.env.CANTO_TEST_CRIU ? { criuPath: process.env.CANTO_TEST_CRIU } : {}),
      log: (msg, fields) => logs.push({ msg, fields }),
    });
    id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    stopped = newId('desktop');
    await driver.prepare(stopped, 'small');
    await ensureGuestServers();
  });

  afterAll(async () => {
    for (const s of held) s.destroy();
    for (const desktop of [id, stopped]) if (desktop) await driver?.destroy(desktop);
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
  });

  it('the forwarder program compiles under strict and warnings', async () => {
    const { stderr } = await execFileAsync('perl', ['-Mstrict', '-w', '-c', '-e', forwarderProgram()]);
    expect(stderr.trim()).toBe('-e syntax OK');
  });

  it('relays an HTTP GET to a server bound to the guest loopback', async () => {
    const res = await get(await driver.openGuestPort(id, HTTP_PORT), '/index.txt');
    expect(res.status).toBe(200);
    expect(res.body.toString()).toBe('index');
    // The host's own loopback is another network: nothing of the guest's is there.
    const direct = connect({ host: '127.0.0.1', port: HOLD_PORT });
    const refused = await new Promise<string>((resolve) => {
      direct.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? ''));
      direct.once('connect', () => resolve('connected'));
    });
    direct.destroy();
    if (refused === 'connected') console.warn(`something on the host listens on ${HOLD_PORT}; skipped the isolation check`);
    else expect(refused).toBe('ECONNREFUSED');
  });

  it('refuses a port nothing listens on, a stopped or unknown desktop and a bad port', async () => {
    const err = (await driver.openGuestPort(id, 8999).catch((e: unknown) => e)) as NodeJS.ErrnoException;
    expect(err.code).toBe('ECONNREFUSED');
    expect((await failure(driver.openGuestPort(stopped, HTTP_PORT))).code).toBe('not_running');
    expect((await failure(driver.openGuestPort(newId('desktop'), HTTP_PORT))).code).toBe('not_found');
    expect((await failure(driver.openGuestPort(id, 0))).code).toBe('bad_request');
    expect((await failure(driver.openGuestPort(id, 65536))).code).toBe('bad_request');
  });

  it('refuses connections and streams only while a stop holds the fence, and serves again after it', async () => {
    // The fence a hibernate or destroy raises; one that fails leaves the desktop running.
    const release = (driver as unknown as { guest: { inFlight: { fence(id: string): () => void } } }).guest.inFlight.fence(id);
    try {
      expect((await failure(driver.openGuestPort(id, HTTP_PORT))).code).toBe('not_running');
      expect((await failure(driver.openVnc(id, true))).code).toBe('not_running');
    } finally {
      release();
    }
    const res = await get(await driver.openGuestPort(id, HTTP_PORT), '/index.txt');
    expect(res.status).toBe(200);
  });

  it('runs one forwarder per desktop, outside the guest pid namespace, in its network and cgroups, as nobody', async () => {
    const conns = await Promise.all([1, 2, 3].map(() => driver.openGuestPort(id, HOLD_PORT)));
    const fwd = await until(() => forwarderPid(id), 10_000, 'the forwarder');
    // The forwarder and one child per open connection.
    expect((await forwarderPids(id)).length).toBeGreaterThanOrEqual(4);
    await expectNetworkOnlyConfinement(fwd, await initPid(), id);
    // The guest cannot see it.
    expect(await sh('ps -eo args | grep -c "[c]anto-ports" || true')).toBe('0');
    const children = (await forwarderPids(id)).filter((p) => p !== fwd);
    const childPss = await Promise.all(children.map((p) => memoryKiB(p, 'Pss')));
    console.log(
      `port forwarder memory: ${await memoryKiB(fwd, 'Rss')} kB RSS, ${await memoryKiB(fwd, 'Pss')} kB PSS; ` +
        `per open connection ${median(childPss)} kB PSS (${children.length} children)`,
    );
    for (const c of conns) c.destroy();
    // A connection's child exits with its connection.
    await until(async () => (await forwarderPids(id)).length === 1, 10_000, 'the connection children to exit');
  });

  it('starts a new forwarder when the old one died', async () => {
    const before = await until(() => forwarderPid(id), 10_000, 'the forwarder');
    process.kill(before, 'SIGKILL');
    await until(async () => (await forwarderPid(id)) === null, 10_000, 'the forwarder to be gone');
    const res = await get(await driver.openGuestPort(id, HTTP_PORT), '/index.txt');
    expect(res.body.toString()).toBe('index');
    const after = await forwarderPid(id);
    expect(after).not.toBeNull();
    expect(after).not.toBe(before);
  });

  it('relays with backpressure and half-close: an upload after the client ended, a 50 MB download', async () => {
    // The hold server greets and keeps reading; the client ends its side and still gets the greeting.
    const hold = await driver.openGuestPort(id, HOLD_PORT);
    hold.end();
    const greeting = await new Promise<string>((resolve) => hold.once('data', (c: Buffer) => resolve(c.toString())));
    expect(greeting).toBe('hello\n');
    hold.destroy();

    const latencies: number[] = [];
    for (let i = 0; i < 20; i++) {
      const t0 = performance.now();
      const res = await get(await driver.openGuestPort(id, HTTP_PORT), '/index.txt');
      latencies.push(performance.now() - t0);
      expect(res.status).toBe(200);
    }
    const t0 = performance.now();
    const big = await get(await driver.openGuestPort(id, HTTP_PORT), '/big.bin');
    const seconds = (performance.now() - t0) / 1000;
    expect(big.body.length).toBe(50 * MiB);
    console.log(
      `guest port: median open + GET + close ${median(latencies).toFixed(1)} ms over 20; ` +
        `50 MiB download ${(50 / seconds).toFixed(0)} MiB/s (python http.server through the forwarder)`,
    );
  });

  it('serves the port gateway with a signed line on the real driver', async () => {
    const gateway = await PortGateway.start({
      listenHost: '127.0.0.1',
      port: 0,
      open: (target) => driver.openGuestPort(target.desktopId, target.port),
      log: () => undefined,
    });
    gateway.setKey(SECRET);
    try {
      const ask = async (port: number) => {
        const socket = connect({ host: '127.0.0.1', port: gateway.port });
        const all = readAll(socket);
        socket.write(`${portLinkLine(SECRET, { desktopId: id, generation: 1, port })}GET /index.txt HTTP/1.0\r\n\r\n`);
        return (await all).toString('latin1');
      };
      const times: number[] = [];
      for (let i = 0; i < 20; i++) {
        const t0 = performance.now();
        const answer = await ask(HTTP_PORT);
        times.push(performance.now() - t0);
        expect(answer).toMatch(/^OK\nHTTP\/1\.0 200 [^]*\r\n\r\nindex$/);
      }
      expect(await ask(8999)).toBe('ERR refused\n');
      console.log(`port gateway: median line + OK + GET + close ${median(times).toFixed(1)} ms over 20`);
    } finally {
      await gateway.close();
    }
  });

  it('hibernates with a memory snapshot while connections are open, and serves again after the wake', async (ctx) => {
    if (!driver.capabilities().memorySnapshots) ctx.skip();
    // Open at the dump: one the guest server holds, and a half-sent request http.server waits on.
    const holding = await driver.openGuestPort(id, HOLD_PORT);
    const partial = await driver.openGuestPort(id, HTTP_PORT);
    partial.write('GET /index.txt HTTP/1.0\r\n');
    held.push(holding as Socket, partial as Socket);
    await new Promise<void>((resolve) => holding.once('data', () => resolve()));
    const closed = Promise.all([holding, partial].map((c) => new Promise<void>((resolve) => c.once('close', () => resolve()))));
    const oldForwarder = await until(() => forwarderPid(id), 10_000, 'the forwarder');

    logs.length = 0;
    const first = await driver.hibernate(id);
    await closed;
    expect(await forwarderPids(id)).toEqual([]);
    // CRIU 4.1.1 cannot dump any TCP socket, listening ones included, on Linux 6.16 and later: the
    // kernel refuses SO_PASSCRED/SO_PASSSEC on them now (checkpoint-restore/criu#2718, fixed after
    // 4.1.1). The driver then cold-stops, which is right, but there is no snapshot to test.
    const failed = JSON.stringify(logs.find((l) => l.msg.startsWith('memory snapshot failed'))?.fields ?? '');
    if (!first.snapshot && failed.includes("Can't get 1:16 opt")) {
      console.warn(`this CRIU cannot dump TCP sockets on this kernel (criu#2718); set CANTO_TEST_CRIU to a fixed one. ${failed}`);
      ctx.skip();
    }
    expect(first).toEqual({ snapshot: true });
    expect((await failure(driver.openGuestPort(id, HTTP_PORT))).code).toBe('not_running');

    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    const res = await get(await driver.openGuestPort(id, HTTP_PORT), '/index.txt');
    expect(res.body.toString()).toBe('index');
    const again = await driver.openGuestPort(id, HOLD_PORT);
    expect(await new Promise<string>((resolve) => again.once('data', (c: Buffer) => resolve(c.toString())))).toBe('hello\n');
    again.destroy();
    const newForwarder = await forwarderPid(id);
    expect(newForwarder).not.toBeNull();
    expect(newForwarder).not.toBe(oldForwarder);
    const init = await initPid();
    expect(await nsOf(newForwarder as number, 'net')).toBe(await nsOf(init, 'net'));
    // Hibernating again right after works too (the restored guest held the restored-closed sockets).
    const conn = await driver.openGuestPort(id, HOLD_PORT);
    held.push(conn as Socket);
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    expect((await get(await driver.openGuestPort(id, HTTP_PORT), '/index.txt')).body.toString()).toBe('index');
  });

  it('destroy kills the forwarder', async () => {
    // Running, whatever the case before left (a cold stop, with a CRIU that cannot dump sockets).
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    await ensureGuestServers();
    await driver.openGuestPort(id, HOLD_PORT).then((c) => held.push(c as Socket));
    expect(await forwarderPid(id)).not.toBeNull();
    await driver.destroy(id);
    expect(await forwarderPids(id)).toEqual([]);
  });
});

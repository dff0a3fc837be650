/**
 * The agent's link against a real websocket server that speaks the protocol through `RpcPeer`,
 * as the scheduler's gateway does, with the in-memory FakeDriver behind the agent.
 */
import { spawn } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { connect } from 'node:net';
import { mkdtemp, rm } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { WebSocketServer, type WebSocket } from 'ws';
import { startAgent, type AgentHandle } from '../../agent/src/channel.js';
import { loadAgentConfig, type AgentConfig } from '../../agent/src/config.js';
import { GenerationStore } from '../../agent/src/generations.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { isId } from '../../shared/src/ids.js';
import { silentLogger } from '../../shared/src/log.js';
import {
  AgentFailure,
  HeartbeatPayload,
  HelloPayload,
  PROTOCOL_VERSION,
  parseMessage,
} from '../../shared/src/protocol.js';
import { RpcPeer } from '../../shared/src/rpc.js';
import { portLinkLine } from '../../shared/src/port-link.js';
import { failure } from '../helpers/agent-failure.js';

const TOKEN = 'join-token-for-tests';
/** A host's port-link key, as a scheduler of 1.6 or later derives it. */
const HOST_LINK_KEY = 'ab'.repeat(32);
const D = 'dsk_aaaaaaaaaaaaaaaaaaaaaaaa';

interface Link {
  readonly ws: WebSocket;
  readonly peer: RpcPeer;
  readonly hello: HelloPayload;
  readonly helloAt: number;
  closedAt?: number;
}

/** A stand-in for the scheduler's agent gateway. */
class FakeScheduler {
  readonly links: Link[] = [];
  readonly heartbeats: HeartbeatPayload[] = [];
  /** Times of upgrades refused with 401. */
  readonly refusals: number[] = [];
  heartbeatMs = 30;
  /** When set, hellos are refused with this failure (counted in `rejectedHellos`). */
  rejectHello?: AgentFailure;
  /** The port-link key hello replies carry; none, as a scheduler before 1.6 sent, when unset. */
  portLinkKey?: string;
  readonly rejectedHellos: number[] = [];
  private readonly wss = new WebSocketServer({ noServer: true });
  private readonly http: Server = createServer((_req, res) => res.writeHead(404).end());
  url = '';

  async listen(): Promise<void> {
    this.http.on('upgrade', (req, socket, head) => {
      if (req.url !== '/internal/agents/ws' || req.headers.authorization !== `Bearer ${TOKEN}`) {
        this.refusals.push(Date.now());
        socket.end('HTTP/1.1 401 Unauthorized\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
        return;
      }
      this.wss.handleUpgrade(req, socket, head, (ws) => this.accept(ws));
    });
    await new Promise<void>((resolve) => this.http.listen(0, '127.0.0.1', resolve));
    const address = this.http.address();
    if (address === null || typeof address === 'string') throw new Error('no address');
    this.url = `http://127.0.0.1:${address.port}`;
  }

  private accept(ws: WebSocket): void {
    const peer = new RpcPeer(ws);
    peer.handle('hello', async (payload) => {
      const hello = parseMessage(HelloPayload, payload, 'hello');
      if (this.rejectHello) {
        this.rejectedHellos.push(Date.now());
        throw this.rejectHello;
      }
      const link: Link = { ws, peer, hello, helloAt: Date.now() };
      peer.onClose(() => (link.closedAt = Date.now()));
      this.links.push(link);
      return { protocol: PROTOCOL_VERSION, heartbeat_ms: this.heartbeatMs, ...(this.portLinkKey === undefined ? {} : { port_link_key: this.portLinkKey }) };
    });
    peer.handle('heartbeat', async (payload) => {
      this.heartbeats.push(parseMessage(HeartbeatPayload, payload, 'heartbeat'));
    });
  }

  get hellos(): HelloPayload[] {
    return this.links.map((l) => l.hello);
  }

  latest(): Link {
    const link = this.links.at(-1);
    if (!link) throw new Error('no agent has said hello');
    return link;
  }

  async close(): Promise<void> {
    for (const client of this.wss.clients) client.terminate();
    this.wss.close();
    await new Promise<void>((resolve) => this.http.close(() => resolve()));
  }
}

/** Waits for a condition with a deadline, instead of sleeping for a guessed time. */
async function waitFor(condition: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}


const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** Runs the daemon as `canto agent` would, with the fake runtime, in a child process. */
const CHILD_AGENT = `
const { loadAgentConfig } = await import(${JSON.stringify(`${ROOT}agent/src/config.ts`)});
const { runAgent } = await import(${JSON.stringify(`${ROOT}agent/src/main.ts`)});
await runAgent(loadAgentConfig(process.env));
`;

let server: FakeScheduler;
let dir: string;
let driver: FakeDriver;
let agent: AgentHandle | undefined;

function config(overrides: Record<string, string> = {}): AgentConfig {
  return loadAgentConfig({
    CANTO_SCHEDULER_URL: server.url,
    CANTO_AGENT_TOKEN: TOKEN,
    CANTO_AGENT_STATE_DIR: dir,
    CANTO_AGENT_RUNTIME: 'fake',
    CANTO_AGENT_RECONNECT_MIN_MS: '200',
    CANTO_AGENT_RECONNECT_MAX_MS: '400',
    CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
    ...overrides,
  });
}

async function start(overrides: Record<string, string> = {}): Promise<AgentHandle> {
  agent = await startAgent({ config: config(overrides), driver, logger: silentLogger() });
  return agent;
}

beforeEach(async () => {
  server = new FakeScheduler();
  await server.listen();
  dir = await mkdtemp(join(tmpdir(), 'canto-agent-'));
  driver = new FakeDriver();
});

afterEach(async () => {
  await agent?.stop();
  agent = undefined;
  await server.close();
  await rm(dir, { recursive: true, force: true });
});

describe('agent channel', () => {
  it('says hello with its identity, capabilities, capacity and fenced desktops', async () => {
    await driver.prepare(D, 'small');
    await (await GenerationStore.open(dir)).check(D, 7);
    const handle = await start();
    await handle.waitConnected(5000);
    expect(handle.connected()).toBe(true);
    const hello = server.latest().hello;
    expect(hello).toMatchObject({
      protocol: PROTOCOL_VERSION,
      host_id: handle.hostId,
      hostname: hostname(),
      capabilities: { runtime: 'fake', memory_snapshots: true },
      desktops: [{ desktop_id: D, generation: 7, running: false, has_snapshot: false }],
    });
    expect(isId('host', hello.host_id)).toBe(true);
    expect(hello.agent_instance_id).not.toBe('');
    expect(hello.capacity.vcpus).toBeGreaterThan(0);
    expect(hello.capacity.memory_mb).toBeGreaterThan(0);
    // 1.8: where other agents fetch desktops moved off this host.
    expect(hello.transfer).toEqual({ host: hostname(), port: expect.any(Number) });
    expect(hello.transfer?.port).toBeGreaterThan(0);
  });

  it('with a bad token never gets a hello through and keeps retrying at the maximum delay', async () => {
    const handle = await start({ CANTO_AGENT_TOKEN: 'wrong', CANTO_AGENT_RECONNECT_MIN_MS: '10', CANTO_AGENT_RECONNECT_MAX_MS: '100' });
    await waitFor(() => server.refusals.length >= 4, 'four refused upgrades');
    expect(server.links).toHaveLength(0);
    expect(handle.connected()).toBe(false);
    await expect(handle.waitConnected(20)).rejects.toThrow(/did not connect/);
    // Refusals are retried at 80–100% of the maximum, not at the doubling minimum.
    const gaps = server.refusals.slice(1).map((t, i) => t - (server.refusals[i] ?? 0));
    for (const gap of gaps) expect(gap).toBeGreaterThanOrEqual(70);
  });

  it('retries slowly after a rejected hello and connects once the scheduler accepts it', async () => {
    server.rejectHello = new AgentFailure('unsupported', 'agent protocol 1.0 is newer than 0.9', false);
    const handle = await start({ CANTO_AGENT_RECONNECT_MIN_MS: '10', CANTO_AGENT_RECONNECT_MAX_MS: '100' });
    await waitFor(() => server.rejectedHellos.length >= 3, 'three rejected hellos');
    expect(handle.connected()).toBe(false);
    const gaps = server.rejectedHellos.slice(1).map((t, i) => t - (server.rejectedHellos[i] ?? 0));
    for (const gap of gaps) expect(gap).toBeGreaterThanOrEqual(70);
    server.rejectHello = undefined; // the operator upgraded the scheduler
    await handle.waitConnected(5000);
    expect(server.links).toHaveLength(1);
  });

  it('round-trips commands to the driver and refuses stale generations', async () => {
    const handle = await start();
    await handle.waitConnected(5000);
    const { peer } = server.latest();
    expect(await peer.request('desktop.prepare', { desktop_id: D, generation: 1, tier: 'small' }, 5000)).toEqual({});
    const startPayload = {
      desktop_id: D, generation: 2, operation_id: 'op_1', tier: 'small',
      first_boot: { env: { A: '1' }, setup_script: null },
    };
    expect(await peer.request('desktop.start', startPayload, 5000)).toEqual({ restored: false });
    expect(driver.desktops.get(D)?.firstBoot).toEqual({ env: { A: '1' }, setupScript: null });
    expect(await peer.request('guest.exec', { desktop_id: D, generation: 2, command: 'echo hi', timeout_ms: 1000 }, 5000))
      .toMatchObject({ exit_code: 0, stdout: 'hi\n', stderr: '' });
    await waitFor(() => server.heartbeats.at(-1)?.running_desktops === 1, 'a heartbeat counting the running desktop');

    const stale = await failure(peer.request('desktop.hibernate', { desktop_id: D, generation: 1, operation_id: 'op_0' }, 5000));
    expect(stale).toMatchObject({ code: 'stale_generation', retryable: false });
    expect(driver.desktops.get(D)?.running).toBe(true);

    const bad = await failure(peer.request('desktop.start', { desktop_id: D }, 5000));
    expect(bad.code).toBe('bad_request');
    const unknown = await failure(peer.request('desktop.teleport', {}, 5000));
    expect(unknown.code).toBe('unsupported');
  });

  it('sends heartbeats at the interval the scheduler chose', async () => {
    server.heartbeatMs = 20;
    const handle = await start();
    await handle.waitConnected(5000);
    await waitFor(() => server.heartbeats.length >= 5, 'five heartbeats');
    // The first beat leaves before the host was first measured; later ones carry the measure.
    expect(server.heartbeats[0]).toEqual({ running_desktops: 0 });
    expect(server.heartbeats.at(-1)).toEqual({
      running_desktops: 0,
      measured: { memory_available_mb: expect.any(Number), desktops_memory_mb: 0, cpu_busy: expect.any(Number) },
    });
    expect(server.heartbeats.at(-1)!.measured!.memory_available_mb).toBeGreaterThan(0);
  });

  it('reconnects with backoff after the scheduler drops the socket, as the same instance', async () => {
    const handle = await start();
    await handle.waitConnected(5000);
    const first = server.latest();
    first.ws.terminate();
    await waitFor(() => !handle.connected(), 'the agent noticing the drop');
    await waitFor(() => server.links.length === 2, 'a second hello');
    await handle.waitConnected(5000);
    const second = server.latest();
    expect(second.hello.host_id).toBe(first.hello.host_id);
    expect(second.hello.agent_instance_id).toBe(first.hello.agent_instance_id);
    // The first retry after a good hello waits 50–100% of the 200 ms minimum.
    expect(second.helloAt - (first.closedAt ?? 0)).toBeGreaterThanOrEqual(90);
    expect(await second.peer.request('desktop.prepare', { desktop_id: D, generation: 1, tier: 'small' }, 5000)).toEqual({});
  });

  it('rejects the scheduler’s pending calls when the agent goes away, and does not come back after stop()', async () => {
    const handle = await start();
    await handle.waitConnected(5000);
    const { peer } = server.latest();
    await peer.request('desktop.prepare', { desktop_id: D, generation: 1, tier: 'small' }, 5000);
    await peer.request('desktop.start', { desktop_id: D, generation: 1, operation_id: 'op_1', tier: 'small', first_boot: null }, 5000);
    const pending = peer.request('guest.exec', { desktop_id: D, generation: 1, command: 'sleep 30', timeout_ms: 60_000 }, 60_000);
    await waitFor(() => driver.desktops.get(D)?.running === true && server.heartbeats.length > 0, 'a running desktop');

    await handle.stop();
    expect(await failure(pending)).toMatchObject({ code: 'disconnected', retryable: true });
    expect(handle.connected()).toBe(false);
    expect(driver.closed).toBe(true);
    await expect(handle.waitConnected(1000)).rejects.toThrow(/stopped/);
    await handle.stop(); // idempotent
    expect(server.links).toHaveLength(1);
  });

  it('stops on SIGTERM and the process exits by itself: no timer or socket is left behind', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', CHILD_AGENT], {
      cwd: ROOT,
      env: {
        ...process.env,
        CANTO_SCHEDULER_URL: server.url,
        CANTO_AGENT_TOKEN: TOKEN,
        CANTO_AGENT_STATE_DIR: dir,
        CANTO_AGENT_RUNTIME: 'fake',
        CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    try {
      await waitFor(() => server.links.length === 1, 'the child agent’s hello', 15_000);
      const { peer } = server.latest();
      await peer.request('desktop.prepare', { desktop_id: D, generation: 1, tier: 'small' }, 5000);
      await peer.request('desktop.start', { desktop_id: D, generation: 1, operation_id: 'op_1', tier: 'small', first_boot: null }, 5000);
      // A command still running when the signal comes must not keep the process alive.
      const pending = peer.request('guest.exec', { desktop_id: D, generation: 1, command: 'sleep 30', timeout_ms: 60_000 }, 60_000);
      await waitFor(() => server.heartbeats.length > 0, 'a heartbeat from the child');
      child.kill('SIGTERM');
      expect(await failure(pending)).toMatchObject({ code: 'disconnected' });
      // main.ts force-exits with 1 after 10 s if something keeps the loop alive; 0 means it drained.
      const code = await Promise.race([exited, new Promise<string>((resolve) => setTimeout(resolve, 8000, 'still running'))]);
      expect(code, output).toBe(0);
      expect(output).toContain('agent stopped');
      expect(output).not.toContain(TOKEN);
    } finally {
      child.kill('SIGKILL');
    }
  });

  it('takes port links signed with the key its hello brought, and none signed with the join token', async () => {
    const ask = async (line: string) => {
      const { host, port } = server.latest().hello.ingress!;
      const socket = connect({ host: host === '0.0.0.0' ? '127.0.0.1' : host, port });
      socket.on('error', () => undefined);
      socket.write(line);
      let said = '';
      socket.on('data', (d: Buffer) => (said += d.toString('latin1')));
      await new Promise((resolve) => socket.once('close', resolve));
      return said;
    };
    const target = { desktopId: D, generation: 1, port: 8080 };
    // A scheduler that sends no key (before 1.6): no line is taken, the join token's included, as
    // every agent holds that token.
    await start();
    await waitFor(() => server.links.length === 1, 'hello');
    expect(await ask(portLinkLine(TOKEN, target))).toBe('ERR unauthorized\n');
    await agent!.stop();
    agent = undefined;
    // One that sends the host's key: its lines are taken (this desktop is not running here).
    server.portLinkKey = HOST_LINK_KEY;
    await start();
    await waitFor(() => server.links.length === 2, 'the second hello');
    expect(await ask(portLinkLine(TOKEN, target))).toBe('ERR unauthorized\n');
    expect(await ask(portLinkLine(HOST_LINK_KEY, target))).toBe('ERR not_running\n');
  });
});

/**
 * How long a move's transfer ticket works (agent/src/transfer/tickets.ts), and what a refused one
 * does to the move:
 * - on the source, a ticket ends when the desktop it grants is started there again (a rolled-back
 *   move) or destroyed there (the move's finish), not an hour later; the stop for a move (a
 *   hibernate that keeps detached processes) leaves it working, as the copy after a pre-copy
 *   fetches with the pre-copy's ticket;
 * - on the target, a refused ticket fails the import retryably and at once: the source is asked
 *   nothing more with it, and the scheduler's next try of the copy asks the source for a new
 *   export. A source agent that restarted (its tickets were in memory) then costs the move a
 *   retry, not a rollback.
 * The agents' handlers and transfer servers are real (fake runtime); the last case runs a real
 * scheduler and database with fake agents over websockets.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { startAgent, type AgentHandle } from '../../agent/src/channel.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { TransferTickets } from '../../agent/src/transfer/tickets.js';
import { silentLogger } from '../../shared/src/log.js';
import { failure } from '../helpers/agent-failure.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { closeFakeMoveHosts, D, exportFrom, fakeMoveHost as host, importInto, stoppedDesktop, type FakeMoveHost } from '../helpers/fake-move-hosts.js';
import { adminApi, api, JOIN_TOKEN, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startTransferProxy, type TransferProxy } from '../helpers/transfer-proxy.js';

const proxies: TransferProxy[] = [];

afterEach(async () => {
  vi.restoreAllMocks();
  for (const p of proxies.splice(0)) await p.close();
  await closeFakeMoveHosts();
});

/** What the source's transfer server answers a listing request with `ticket`. */
async function listingStatus(h: FakeMoveHost, ticket: string): Promise<{ status: number; detail: string }> {
  const res = await fetch(`${h.server.url}/v1/transfer/${D}/units`, { headers: { authorization: `Bearer ${ticket}` } });
  const body = (await res.json()) as { detail?: string };
  return { status: res.status, detail: body.detail ?? '' };
}

describe('a transfer ticket on the source', () => {
  it('stops working when the desktop starts there again, also once it is stopped again at the same generation', async () => {
    const a = await host();
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    expect((await listingStatus(a, exp.ticket)).status).toBe(200);
    // The move rolls back: the desktop runs again on its source, at the generation it was
    // exported at, and is stopped there again later (a command of the same generation).
    await a.handlers.handle('desktop.start', { desktop_id: D, generation: 4, operation_id: 'op_move', tier: 'small', first_boot: null });
    expect(await listingStatus(a, exp.ticket)).toMatchObject({ status: 401, detail: expect.stringMatching(/unknown or expired/) });
    await a.handlers.handle('desktop.hibernate', { desktop_id: D, generation: 4, operation_id: 'op_move' });
    expect(await listingStatus(a, exp.ticket)).toMatchObject({ status: 401, detail: expect.stringMatching(/unknown or expired/) });
    // The desktop's next move exports again, with a ticket that works.
    const next = await exportFrom(a, 5);
    expect((await listingStatus(a, next.ticket)).status).toBe(200);
  });

  it('stops working when the desktop is destroyed there, the move having finished', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    await importInto(b, exp);
    await a.handlers.handle('desktop.destroy', { desktop_id: D, generation: 5, operation_id: 'op_move' });
    // Refused as a ticket this source no longer knows, before anything is said of the desktop.
    expect(await listingStatus(a, exp.ticket)).toMatchObject({ status: 401, detail: expect.stringMatching(/unknown or expired/) });
  });

  it("keeps working across the stop for a move, as the copy after a pre-copy fetches with the pre-copy's ticket", async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    await a.handlers.handle('desktop.start', { desktop_id: D, generation: 4, operation_id: 'op_move', tier: 'small', first_boot: null });
    // Granted while the desktop runs, as `desktop.precopy.export` grants it (sized listings).
    const { ticket } = a.tickets.issue(D, 4, 60_000, 'sized');
    await a.handlers.handle('desktop.hibernate', { desktop_id: D, generation: 4, operation_id: 'op_move', keep_detached: true });
    expect((await listingStatus(a, ticket)).status).toBe(200);
    const imported = await importInto(b, { url: a.server.url, ticket }, undefined, 5);
    expect(imported.fetched_bytes).toBeGreaterThan(0);
  });

  it("answers only for its own desktop: another desktop's start or destroy leaves it working", async () => {
    const a = await host();
    const other = 'dsk_bbbbbbbbbbbbbbbbbbbbbbbb';
    await stoppedDesktop(a);
    await stoppedDesktop(a, other);
    const exp = await exportFrom(a);
    await a.handlers.handle('desktop.start', { desktop_id: other, generation: 4, operation_id: 'op_other', tier: 'small', first_boot: null });
    await a.handlers.handle('desktop.destroy', { desktop_id: other, generation: 5, operation_id: 'op_other' });
    expect((await listingStatus(a, exp.ticket)).status).toBe(200);
  });
});

describe('a refused ticket on the target', () => {
  it('fails the import retryably, saying the source no longer knows the ticket', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    // What a restart of the source's agent does to the tickets it granted.
    a.tickets.clear();
    const err = await failure(importInto(b, exp));
    expect(err).toMatchObject({ code: 'unauthorized', retryable: true });
    expect(err.message).toMatch(/no longer/);
    expect(err.message).toMatch(/new export/);
  });

  it('asks the source nothing more with a ticket it refused: no retry of the unit with the same ticket', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    const proxy = await startTransferProxy(a.server.url, {});
    proxies.push(proxy);
    // The listing goes out; then the source forgets the ticket, before the unit is asked for.
    const source = a.server.source;
    const listing = source.listing.bind(source);
    source.listing = async (...args) => {
      const listed = await listing(...args);
      a.tickets.clear();
      return listed;
    };
    const err = await failure(importInto(b, { url: proxy.url, ticket: exp.ticket }));
    expect(err).toMatchObject({ code: 'unauthorized', retryable: true });
    const units = proxy.exchanges().filter((e) => e.request.includes('/units/'));
    expect(units).toHaveLength(1);
    expect(units[0]!.response).toMatch(/ 401 /);
  });
});

describe('a move whose source agent restarted before the target fetched', () => {
  let s: TestScheduler;
  let call: ReturnType<typeof api>;
  let admin: ReturnType<typeof api>;
  const stops: Array<() => Promise<void>> = [];

  beforeAll(async () => {
    s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
    call = api(s.url, await mintKey(s.databaseUrl, 'transfer-tickets'));
    admin = adminApi(s.url);
  });

  afterAll(async () => {
    for (const stop of stops.splice(0).reverse()) await stop();
    await s?.close();
  });

  /** A free port on loopback, for a transfer listener that keeps its port across restarts. */
  async function freePort(): Promise<number> {
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    const { port } = probe.address() as AddressInfo;
    await new Promise((resolve) => probe.close(resolve));
    return port;
  }

  /**
   * A host's agent on the fake runtime whose transfer listener has a fixed port, as a real host's
   * does (7013): restarted, it answers at the same URL the export named, without the tickets.
   */
  async function restartableAgent(): Promise<{ hostId: string; restart(): Promise<void> }> {
    const stateDir = mkdtempSync(join(tmpdir(), 'canto-agent-'));
    const port = await freePort();
    const config = loadAgentConfig({
      CANTO_SCHEDULER_URL: s.url,
      CANTO_AGENT_TOKEN: JOIN_TOKEN,
      CANTO_AGENT_STATE_DIR: stateDir,
      CANTO_AGENT_RECONNECT_MAX_MS: '500',
      CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
      CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
      CANTO_AGENT_TRANSFER_LISTEN: `127.0.0.1:${port}`,
      CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
      CANTO_AGENT_ADDRESS: '127.0.0.1',
      CANTO_LOG_LEVEL: 'silent',
    });
    let driver = new FakeDriver();
    const start = async () => {
      const handle = await startAgent({ config, driver, logger: silentLogger() });
      await handle.waitConnected(10_000);
      return handle;
    };
    let handle: AgentHandle = await start();
    stops.push(async () => {
      await handle.stop();
      rmSync(stateDir, { recursive: true, force: true });
    });
    return {
      hostId: handle.hostId,
      async restart() {
        await handle.stop();
        // The desktops outlive the agent, as a host's disks do; a stopped driver stays closed.
        const desktops = driver.desktops;
        driver = new FakeDriver();
        for (const [id, desktop] of desktops) driver.desktops.set(id, desktop);
        handle = await start();
      },
    };
  }

  it('copies with a new export instead of rolling back, and asks the restarted source once with the lost ticket', async () => {
    const source = await restartableAgent();
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(source.hostId);
    const target: TestAgent = await startFakeAgent(s.url, { delayMs: 0 });
    stops.push(() => target.stop());
    const hosts = async () => (await admin('GET', '/admin/v1/hosts')).json.hosts as Array<{ id: string; state: string; linked: boolean }>;
    await until(async () => (await hosts()).some((h) => h.id === target.hostId && h.state === 'ready' && h.linked), 10_000, 'the target ready');

    const issued = vi.spyOn(TransferTickets.prototype, 'issue');
    const checked = vi.spyOn(TransferTickets.prototype, 'check');
    // The source's agent restarts once the export is out and before the target fetches anything.
    const transfer = target.driver!.transfer;
    const inspect = transfer.inspect.bind(transfer);
    let restarted = false;
    transfer.inspect = async (desktopId) => {
      if (desktopId === id && !restarted) {
        restarted = true;
        await source.restart();
      }
      return inspect(desktopId);
    };

    const requested = await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: target.hostId });
    expect(requested.status, requested.text).toBe(202);
    const op = await until(async () => {
      const got = (await admin('GET', `/admin/v1/operations/${requested.json.id as string}`)).json;
      return got.state === 'succeeded' || got.state === 'failed' ? got : null;
    }, 30_000, 'the move to settle');
    expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
    expect(restarted).toBe(true);
    expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: target.hostId });
    expect(target.driver!.desktops.get(id)?.running).toBe(true);

    // Two exports (the second by the copy's retry); the first ticket was presented once, refused.
    const tickets = issued.mock.calls.flatMap((args, i) => (args[0] === id ? [issued.mock.results[i]!.value as { ticket: string }] : []));
    expect(tickets).toHaveLength(2);
    const lost = checked.mock.calls.flatMap((args, i) => (args[0] === tickets[0]!.ticket ? [checked.mock.results[i]!.value as { ok: boolean; status?: number }] : []));
    expect(lost).toEqual([expect.objectContaining({ ok: false, status: 401 })]);
  }, 60_000);
});

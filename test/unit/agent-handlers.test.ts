import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { GenerationStore } from '../../agent/src/generations.js';
import { CommandHandlers } from '../../agent/src/handlers.js';
import { LifecycleSlots } from '../../agent/src/lifecycle-slots.js';
import { AgentMetrics } from '../../agent/src/observability.js';
import type { RuntimeDriver } from '../../agent/src/runtime/driver.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { DesktopMoves } from '../../agent/src/transfer/moves.js';
import { silentLogger } from '../../shared/src/log.js';
import { AGENT_COMMANDS, AgentFailure, type AgentErrorCode } from '../../shared/src/protocol.js';
import { failure } from '../helpers/agent-failure.js';

let dir: string;
let driver: FakeDriver;
let handlers: CommandHandlers;

async function setup(driverOverride?: RuntimeDriver, slots?: LifecycleSlots): Promise<void> {
  const generations = await GenerationStore.open(dir);
  handlers = new CommandHandlers({ driver: driverOverride ?? driver, generations, logger: silentLogger(), ...(slots ? { slots } : {}) });
}

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'canto-handlers-'));
  driver = new FakeDriver();
  await setup();
});

afterEach(async () => {
  await driver.close();
  await rm(dir, { recursive: true, force: true });
});

const D = 'dsk_aaaaaaaaaaaaaaaaaaaaaaaa';
const prepare = (generation = 1, desktop_id = D) => ({ desktop_id, generation, tier: 'small' });
const start = (generation = 1, first_boot: unknown = null, desktop_id = D) => ({
  desktop_id, generation, operation_id: 'op_1', tier: 'small', first_boot,
});
const op = (generation = 1, desktop_id = D) => ({ desktop_id, generation, operation_id: 'op_2' });
const exec = (command: string, generation = 1) => ({ desktop_id: D, generation, command, timeout_ms: 5000 });


async function expectCode(promise: Promise<unknown>, code: AgentErrorCode): Promise<AgentFailure> {
  const err = await failure(promise);
  expect(err.code).toBe(code);
  return err;
}

describe('command handlers', () => {
  it('drives the lifecycle and answers in the protocol shapes', async () => {
    expect(await handlers.handle('desktop.prepare', prepare())).toEqual({});
    const firstBoot = { env: { FOO: 'bar' }, setup_script: 'echo hi' };
    expect(await handlers.handle('desktop.start', start(1, firstBoot))).toEqual({ restored: false });
    expect(driver.desktops.get(D)?.firstBoot).toEqual({ env: { FOO: 'bar' }, setupScript: 'echo hi' });
    expect(await handlers.handle('guest.exec', exec('echo hello world'))).toEqual({
      exit_code: 0, stdout: 'hello world\n', stderr: '', stdout_truncated: false, stderr_truncated: false,
    });
    expect(await handlers.handle('guest.exec', exec('false'))).toMatchObject({ exit_code: 1 });
    expect(await handlers.handle('desktop.hibernate', op(2))).toEqual({ snapshot: true });
    expect(await handlers.handle('desktop.hibernate', op(2))).toEqual({ snapshot: true }); // idempotent
    expect(await handlers.handle('desktop.start', start(3, firstBoot))).toEqual({ restored: true });
    expect(await handlers.handle('desktop.start', start(3, firstBoot))).toEqual({ restored: false }); // already running
    expect(driver.desktops.get(D)?.firstBootRuns).toBe(1);
    expect(await handlers.handle('desktop.destroy', op(4))).toEqual({});
    expect(await handlers.handle('desktop.destroy', op(4))).toEqual({}); // idempotent
    expect(driver.desktops.has(D)).toBe(false);
  });

  it("tells the move side of a move's stop (a hibernate keeping detached processes), and of no other", async () => {
    const stopped: Array<[string, number]> = [];
    const moves = new DesktopMoves({ driver, source: null, url: null, log: () => undefined });
    moves.stoppedForMove = (desktopId, generation) => void stopped.push([desktopId, generation]);
    handlers = new CommandHandlers({ driver, generations: await GenerationStore.open(dir), logger: silentLogger(), moves });
    await handlers.handle('desktop.prepare', prepare());
    await handlers.handle('desktop.start', start(1));
    await handlers.handle('desktop.hibernate', op(2));
    expect(stopped).toEqual([]);
    await handlers.handle('desktop.start', start(3));
    await handlers.handle('desktop.hibernate', { ...op(3), keep_detached: true });
    expect(stopped).toEqual([[D, 3]]);
  });

  it('applies first boot once even when every wake is cold', async () => {
    driver = new FakeDriver({ memorySnapshots: false });
    await setup();
    const firstBoot = { env: {}, setup_script: null };
    await handlers.handle('desktop.prepare', prepare());
    await handlers.handle('desktop.start', start(1, firstBoot));
    expect(await handlers.handle('desktop.hibernate', op(2))).toEqual({ snapshot: false });
    expect(await handlers.handle('desktop.start', start(3, firstBoot))).toEqual({ restored: false });
    expect(driver.desktops.get(D)).toMatchObject({ coldBoots: 2, firstBootRuns: 1, firstBoot: { env: {}, setupScript: null } });
  });

  it('refuses malformed payloads with bad_request before touching the driver', async () => {
    await expectCode(handlers.handle('desktop.prepare', { desktop_id: D, generation: 1, tier: 'huge' }), 'bad_request');
    await expectCode(handlers.handle('desktop.start', { desktop_id: D, generation: -1 }), 'bad_request');
    await expectCode(handlers.handle('guest.exec', { ...exec('true'), timeout_ms: 0 }), 'bad_request');
    // A NUL never reaches a process spawner, which separates its strings with NULs.
    await expectCode(handlers.handle('guest.exec', exec('true\0LD_PRELOAD=/tmp/x.so')), 'bad_request');
    expect(driver.events).toEqual([]);
  });

  it('fences by generation, including after destroy', async () => {
    await handlers.handle('desktop.prepare', prepare(5));
    const err = await expectCode(handlers.handle('desktop.start', start(4)), 'stale_generation');
    expect(err.retryable).toBe(false);
    await expectCode(handlers.handle('guest.exec', exec('true', 3)), 'stale_generation');
    expect(driver.events.filter((e) => e.startsWith('start'))).toEqual([]);

    await handlers.handle('desktop.destroy', op(6));
    await expectCode(handlers.handle('desktop.prepare', prepare(6)), 'stale_generation');
    await expectCode(handlers.handle('desktop.start', start(5)), 'stale_generation');
    expect(driver.desktops.has(D)).toBe(false);
    await handlers.handle('desktop.destroy', op(6));
  });

  it("fences lifecycle commands by leader epoch: a deposed leader's late command does nothing", async () => {
    await handlers.handle('desktop.prepare', { ...prepare(1), leader_epoch: 3 });
    await handlers.handle('desktop.start', { ...start(2), leader_epoch: 4 });
    // The old leader (epoch 3) still thinks it leads and sends a hibernate.
    const err = await expectCode(handlers.handle('desktop.hibernate', { ...op(3), leader_epoch: 3 }), 'stale_epoch');
    expect(err.retryable).toBe(false);
    expect(driver.desktops.get(D)!.running).toBe(true);
    // Guest operations are served by any replica and carry no epoch.
    expect(await handlers.handle('guest.exec', exec('true', 2))).toMatchObject({ exit_code: 0 });
    // The current leader's command, and a scheduler too old to send an epoch, still act.
    expect(await handlers.handle('desktop.hibernate', { ...op(3), leader_epoch: 4 })).toEqual({ snapshot: true });
    expect(await handlers.handle('desktop.start', start(4))).toEqual({ restored: true });
  });

  it('stops what a hello fence names, unless a newer command reached it first', async () => {
    const OTHER = 'dsk_bbbbbbbbbbbbbbbbbbbbbbbb';
    for (const id of [D, OTHER]) {
      await handlers.handle('desktop.prepare', prepare(1, id));
      await handlers.handle('desktop.start', start(2, null, id));
    }
    // OTHER was woken again meanwhile at generation 7: the fence's generation 5 is older.
    await handlers.handle('desktop.start', start(7, null, OTHER));
    // Neither the fence nor inspect lists every desktop: after an outage a host may be fenced on
    // a thousand of them at once, and a listing per desktop kept it busy for many minutes.
    driver.list = () => Promise.reject(new Error('listed every desktop'));
    expect(await handlers.fence([{ desktop_id: D, generation: 5 }, { desktop_id: OTHER, generation: 5 }])).toBe(1);
    expect(driver.desktops.get(D)).toMatchObject({ running: false, hasSnapshot: true });
    expect(driver.desktops.get(OTHER)!.running).toBe(true);
    // The fenced generation holds: a command of the old one is refused.
    await expectCode(handlers.handle('desktop.start', start(4)), 'stale_generation');
    expect(await handlers.handle('desktop.inspect', { desktop_id: D })).toEqual({ running: false, has_snapshot: true });
    expect(await handlers.handle('desktop.inspect', { desktop_id: OTHER })).toEqual({ running: true, has_snapshot: false });
  });

  it('reports missing and stopped desktops instead of faking success', async () => {
    await expectCode(handlers.handle('desktop.start', start()), 'not_found');
    await expectCode(handlers.handle('guest.exec', exec('true')), 'not_found');
    await handlers.handle('desktop.prepare', prepare());
    await expectCode(handlers.handle('guest.exec', exec('true')), 'not_running');
  });

  it('turns unexpected driver errors into short, non-retryable runtime_error', async () => {
    const broken: RuntimeDriver = Object.assign(Object.create(driver) as FakeDriver, {
      prepare: () => Promise.reject(new Error(`disk full\n${'x'.repeat(5000)}`)),
      hibernate: () => Promise.resolve({ snapshot: 'yes' } as unknown as { snapshot: boolean }),
    });
    await setup(broken);
    const err = await expectCode(handlers.handle('desktop.prepare', prepare()), 'runtime_error');
    expect(err.retryable).toBe(false);
    expect(err.message).toBe('desktop.prepare failed: disk full');
    // A result that does not match the protocol is caught on the agent, not on the scheduler.
    await expectCode(handlers.handle('desktop.hibernate', op()), 'runtime_error');
  });

  it('says a full disk is one, and lets the command be tried again once there may be room', async () => {
    const full: RuntimeDriver = Object.assign(Object.create(driver) as FakeDriver, {
      prepare: () => Promise.reject(Object.assign(new Error("ENOSPC: no space left on device, mkdir '/var/lib/x'"), { code: 'ENOSPC' })),
    });
    await setup(full);
    const err = await expectCode(handlers.handle('desktop.prepare', prepare()), 'runtime_error');
    expect(err.retryable).toBe(true);
    expect(err.message).toBe("desktop.prepare failed: no space left on this host's disk (ENOSPC)");
  });

  it('runs lifecycle commands for one desktop one at a time, in arrival order', async () => {
    driver = new FakeDriver({ delayMs: 30 });
    await setup();
    const E = 'dsk_eeeeeeeeeeeeeeeeeeeeeeee';
    await Promise.all([handlers.handle('desktop.prepare', prepare(1)), handlers.handle('desktop.prepare', prepare(1, E))]);
    driver.events.length = 0;
    // D's first start holds in the driver until E's start is there too, which only happens if E
    // does not wait behind D's queue (no timing involved: a machine under load delays both alike).
    let otherIn!: () => void;
    const other = new Promise<void>((resolve) => (otherIn = resolve));
    let held = false;
    const startDesktop = driver.start.bind(driver);
    driver.start = async (spec) => {
      if (spec.desktopId === E) otherIn();
      else if (!held) {
        held = true;
        let timer: NodeJS.Timeout | undefined;
        const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${E} waited behind ${D}`)), 10_000)));
        await Promise.race([other, late]).finally(() => clearTimeout(timer));
      }
      return startDesktop(spec);
    };
    const results = await Promise.all([
      handlers.handle('desktop.start', start(2)),
      handlers.handle('desktop.hibernate', op(3)),
      handlers.handle('desktop.start', start(4)),
      handlers.handle('desktop.start', start(2, null, E)),
    ]);
    expect(results).toEqual([{ restored: false }, { snapshot: true }, { restored: true }, { restored: false }]);
    const forD = driver.events.filter((e) => e.endsWith(D));
    expect(forD).toEqual([`start:begin ${D}`, `start:end ${D}`, `hibernate:begin ${D}`, `hibernate:end ${D}`, `start:begin ${D}`, `start:end ${D}`]);
  });

  it("runs starts, hibernates and forks of different desktops at most the host's slots at once, in arrival order", async () => {
    driver = new FakeDriver({ delayMs: 40 });
    const slots = new LifecycleSlots(2);
    await setup(undefined, slots);
    const metrics = new AgentMetrics();
    metrics.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver, slots });
    const ids = Array.from({ length: 6 }, (_, i) => `dsk_${String(i).repeat(24)}`);
    await Promise.all(ids.map((id) => handlers.handle('desktop.prepare', prepare(1, id))));
    driver.events.length = 0;
    const starts = ids.map((id) => handlers.handle('desktop.start', start(2, null, id)));
    // While four wait, the cheap and freeing commands pass: a prepare and a destroy of others.
    await new Promise((resolve) => setTimeout(resolve, 10));
    expect(await metrics.registry.getSingleMetricAsString('canto_agent_lifecycle_commands')).toMatch(/state="running"} 2\n[^]*state="waiting"} 4/);
    const other = 'dsk_ffffffffffffffffffffffff';
    await handlers.handle('desktop.prepare', prepare(1, other));
    await handlers.handle('desktop.destroy', op(2, other));
    expect(await Promise.all(starts)).toEqual(ids.map(() => ({ restored: false })));
    expect(driver.events.indexOf(`destroy:end ${other}`)).toBeLessThan(driver.events.indexOf(`start:end ${ids[5]}`));
    let running = 0;
    let most = 0;
    for (const e of driver.events.filter((e) => e.startsWith('start:'))) {
      running += e.startsWith('start:begin') ? 1 : -1;
      most = Math.max(most, running);
    }
    expect(most).toBe(2);
    expect(driver.events.filter((e) => e.startsWith('start:begin')).map((e) => e.split(' ')[1])).toEqual(ids);
    expect([slots.running, slots.queued]).toEqual([0, 0]);

    // A hibernate waits for a slot like a start; with no bound (0) all run at once: each holds
    // here until all six are in the driver, which only happens if none waits for a slot (no
    // timing involved: a machine under load delays them all alike).
    await setup(undefined, new LifecycleSlots(0));
    let inDriver = 0;
    let allIn!: () => void;
    const together = new Promise<void>((resolve) => (allIn = resolve));
    const hibernate = driver.hibernate.bind(driver);
    driver.hibernate = async (desktopId, options) => {
      if (++inDriver === ids.length) allIn();
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('the hibernates did not all run at once')), 10_000)));
      await Promise.race([together, late]).finally(() => clearTimeout(timer));
      return hibernate(desktopId, options);
    };
    await Promise.all(ids.map((id) => handlers.handle('desktop.hibernate', op(3, id))));
    expect(inDriver).toBe(ids.length);
  });

  it('a failed command does not block the queue behind it', async () => {
    await handlers.handle('desktop.prepare', prepare(2));
    const [stale, ok] = await Promise.allSettled([
      handlers.handle('desktop.start', start(1)),
      handlers.handle('desktop.start', start(2)),
    ]);
    expect(stale.status).toBe('rejected');
    expect(ok).toEqual({ status: 'fulfilled', value: { restored: false } });
  });

  it('lets a stopping agent wait for the commands it runs, up to a bound', async () => {
    driver = new FakeDriver({ delayMs: 150 });
    await setup();
    await handlers.handle('desktop.prepare', prepare());
    let started = false;
    void handlers.handle('desktop.start', start()).then(() => (started = true));
    await handlers.settle(5_000);
    expect(started).toBe(true);
    // A command outlasting the bound does not hold the stop.
    let hibernated = false;
    void handlers.handle('desktop.hibernate', op()).then(() => (hibernated = true));
    await handlers.settle(20);
    expect(hibernated).toBe(false);
    await handlers.settle(5_000);
    expect(hibernated).toBe(true);
  });

  it('registers a handler for every scheduler command', () => {
    const types: string[] = [];
    handlers.register({ handle: (type) => void types.push(type) });
    expect(types.sort()).toEqual(Object.keys(AGENT_COMMANDS).sort());
  });
});

describe('computer use and the control claim', () => {
  /** A gateway stand-in: grants tickets and holds a control claim when told to. */
  function streamStub() {
    const released: string[] = [];
    const held = new Set<string>();
    return {
      released,
      held,
      grant: (desktopId: string, claim: 'view' | 'control') => {
        if (claim === 'control') held.add(desktopId);
        return { ticket: 'stk_test', expiresAt: new Date('2030-01-01T00:00:00Z'), host: '127.0.0.1', port: 7010 };
      },
      grantTerminal: () => ({ ticket: 'ttk_test', expiresAt: new Date('2030-01-01T00:00:00Z'), host: '127.0.0.1', port: 7010 }),
      controlHeld: (desktopId: string) => held.has(desktopId),
      release: (desktopId: string) => {
        released.push(desktopId);
        held.delete(desktopId);
      },
    };
  }

  async function awake(): Promise<void> {
    await handlers.handle('desktop.prepare', prepare());
    await handlers.handle('desktop.start', start());
  }

  it('refuses exec and file operations while the control claim is held, but never input', async () => {
    const stream = streamStub();
    handlers = new CommandHandlers({ driver, generations: await GenerationStore.open(dir), logger: silentLogger(), stream });
    await awake();
    const grant = await handlers.handle('stream.grant', { desktop_id: D, generation: 1, claim: 'control' });
    expect(grant).toEqual({ ticket: 'stk_test', expires_at: '2030-01-01T00:00:00.000Z', host: '127.0.0.1', port: 7010, websocket: true });
    const ref = { desktop_id: D, generation: 1 };
    for (const [type, payload] of [
      ['guest.exec', exec('true')],
      ['guest.spawn', { ...ref, process_id: 'prc_aaaaaaaaaaaaaaaaaaaaaaaa', command: 'true' }],
      ['guest.file.stat', { ...ref, path: '/root' }],
      ['guest.file.delete', { ...ref, path: '/root/x', recursive: false }],
      ['guest.dir.list', { ...ref, path: '/root', limit: 10 }],
      ['guest.file.read', { ...ref, path: '/root/x', offset: null, length: 10, max_whole_bytes: 10 }],
    ] as const) {
      expect((await failure(handlers.handle(type, payload))).code, type).toBe('control_claimed');
    }
    expect(await handlers.handle('guest.input', { ...ref, actions: [{ type: 'mouse_move', x: 3, y: 4 }] })).toEqual({ x: 3, y: 4 });
    // A terminal is a person at the desktop too: the claim does not refuse it.
    const terminal = { ...ref, cols: 80, rows: 24, command: null };
    expect(await handlers.handle('terminal.grant', terminal)).toEqual({ ticket: 'ttk_test', expires_at: '2030-01-01T00:00:00.000Z', host: '127.0.0.1', port: 7010 });
    expect((await failure(handlers.handle('terminal.grant', { ...terminal, generation: 0 }))).code).toBe('stale_generation');
    expect((await failure(handlers.handle('terminal.grant', { ...terminal, cols: 0 }))).code).toBe('bad_request');
    // Hibernate releases the claim (its stream clients are disconnected first).
    await handlers.handle('desktop.hibernate', op());
    expect(stream.released).toContain(D);
    expect(stream.held.size).toBe(0);
  });

  it('releases a claim granted while the hibernate ran, so it does not hold over the next wake', async () => {
    driver = new FakeDriver({ delayMs: 100 });
    const stream = streamStub();
    handlers = new CommandHandlers({ driver, generations: await GenerationStore.open(dir), logger: silentLogger(), stream });
    await awake();
    const hibernating = handlers.handle('desktop.hibernate', op());
    await new Promise((resolve) => setTimeout(resolve, 20));
    await handlers.handle('stream.grant', { desktop_id: D, generation: 1, claim: 'control' });
    expect(stream.held.has(D)).toBe(true);
    await hibernating;
    expect(stream.held.size).toBe(0);
  });

  it('answers unsupported for every computer-use command on a driver without it, and without a gateway', async () => {
    const bare = new FakeDriver({ computerUse: false });
    await setup(bare);
    await handlers.handle('desktop.prepare', prepare());
    await handlers.handle('desktop.start', start());
    const ref = { desktop_id: D, generation: 1 };
    for (const [type, payload] of [
      ['guest.display.get', ref],
      ['guest.display.set', { ...ref, width: 800, height: 600 }],
      ['guest.screenshot', { ...ref, region: null, scale_percent: null, max_bytes: 1000 }],
      ['guest.input', { ...ref, actions: [] }],
      ['stream.grant', { ...ref, claim: 'view' }],
    ] as const) {
      expect((await failure(handlers.handle(type, payload))).code, type).toBe('unsupported');
    }
    await setup();
    await awake();
    expect((await failure(handlers.handle('stream.grant', { ...ref, claim: 'view' }))).code).toBe('unsupported');
    expect((await failure(handlers.handle('terminal.grant', { ...ref, cols: 80, rows: 24, command: null }))).code).toBe('unsupported');
  });

  it('re-checks the batch caps the scheduler already checked', async () => {
    await awake();
    const waits = [{ type: 'wait', ms: 5000 }, { type: 'wait', ms: 5000 }, { type: 'wait', ms: 1 }];
    expect((await failure(handlers.handle('guest.input', { desktop_id: D, generation: 1, actions: waits }))).code).toBe('bad_request');
  });
});

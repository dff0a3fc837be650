/**
 * Starts a real agent in-process on the in-memory FakeDriver, dialing a test scheduler over a
 * real websocket with the join token. Fast enough for API tests; the end-to-end suite uses the
 * real runtime instead.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startAgent, type AgentHandle } from '../../agent/src/channel.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { runAgent } from '../../agent/src/main.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import type { HostMeter } from '../../agent/src/host-meter.js';
import { silentLogger } from '../../shared/src/log.js';
import { awakeDesktop, JOIN_TOKEN, type api } from './scheduler.js';
import { destroyLeftDesktops } from './sandbox.js';

export interface TestAgent extends AgentHandle {
  /** Present when the agent was started with a driver of our own (`delayMs`, `again`). */
  readonly driver: FakeDriver | null;
  readonly stateDir: string;
  /** Stops the agent; its state directory goes unless `keepState` (to start the same host again). */
  stop(keepState?: boolean): Promise<void>;
}

export interface FakeAgentOptions {
  /**
   * Added to every lifecycle call of the FakeDriver, in ms. `runAgent` builds its FakeDriver
   * without a delay, so a slow agent is assembled from `startAgent` and a FakeDriver of our own.
   */
  delayMs?: number;
  /** Wait for the hello before returning. Default true. */
  waitConnected?: boolean;
  /** false: a host without computer-use support (the API answers 501). Default true. */
  computerUse?: boolean;
  /**
   * The same host again after a stop: its state directory (host id, generations; kept on stop)
   * and the desktops its driver held.
   */
  again?: { stateDir: string; driver: FakeDriver };
  /** Say this protocol version in hello: an agent of an older release (gives a driver of our own). */
  protocol?: string;
  /** What heartbeats report of the host's use, instead of this machine's (gives a driver of our own). */
  meter?: (driver: FakeDriver) => HostMeter;
}

/**
 * An agent over `driver` in `stateDir` (its host identity there), linked to the scheduler: what a
 * host's agent is across its restarts, with a driver that outlives them (the desktops it runs).
 */
export async function startAgentOver(schedulerUrl: string, stateDir: string, driver: FakeDriver): Promise<AgentHandle> {
  const config = loadAgentConfig({
    CANTO_SCHEDULER_URL: schedulerUrl,
    CANTO_AGENT_TOKEN: JOIN_TOKEN,
    CANTO_AGENT_STATE_DIR: stateDir,
    CANTO_AGENT_RECONNECT_MAX_MS: '100',
    CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
  });
  const handle = await startAgent({ config, driver, logger: silentLogger() });
  await handle.waitConnected(5_000);
  return handle;
}

export async function startFakeAgent(schedulerUrl: string, options: FakeAgentOptions = {}): Promise<TestAgent> {
  const stateDir = options.again?.stateDir ?? mkdtempSync(join(tmpdir(), 'canto-agent-'));
  const config = loadAgentConfig({
    CANTO_SCHEDULER_URL: schedulerUrl,
    CANTO_AGENT_TOKEN: JOIN_TOKEN,
    CANTO_AGENT_STATE_DIR: stateDir,
    CANTO_AGENT_RUNTIME: 'fake',
    CANTO_AGENT_RECONNECT_MAX_MS: '500',
    CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_ADDRESS: '127.0.0.1',
    CANTO_LOG_LEVEL: 'silent',
  });
  const logger = silentLogger();
  let driver: FakeDriver | null = null;
  let handle: AgentHandle;
  if (options.again) {
    // A closed driver stays closed: a new one over the same desktops, as a host's disk outlives its agent.
    driver = new FakeDriver({ delayMs: options.delayMs ?? 0 });
    for (const [id, desktop] of options.again.driver.desktops) driver.desktops.set(id, desktop);
    handle = await startAgent({ config, driver, logger, announceProtocol: options.protocol, meter: options.meter?.(driver) });
  } else if (options.delayMs !== undefined || options.computerUse === false || options.protocol !== undefined || options.meter !== undefined) {
    driver = new FakeDriver({ delayMs: options.delayMs ?? 0, computerUse: options.computerUse ?? true });
    handle = await startAgent({ config, driver, logger, announceProtocol: options.protocol, meter: options.meter?.(driver) });
  } else {
    handle = await runAgent(config, { handleSignals: false, logger });
  }
  if (options.waitConnected ?? true) await handle.waitConnected(10_000);
  return {
    ...handle,
    driver,
    stateDir,
    async stop(keepState = false) {
      await handle.stop();
      if (!keepState) rmSync(stateDir, { recursive: true, force: true, maxRetries: 3 });
    },
  };
}

/**
 * Makes the fake agent's removal of a desktop take `ms` longer: a move's last step (removing the
 * source's copy) then lasts long enough for a test to act while it runs. Answers the agent's driver.
 */
export function slowDestroy(agent: TestAgent, ms: number): FakeDriver {
  const driver = agent.driver!;
  const destroy = driver.destroy.bind(driver);
  driver.destroy = async (desktopId) => {
    await new Promise((resolve) => setTimeout(resolve, ms));
    return destroy(desktopId);
  };
  return driver;
}

export interface SandboxAgent extends AgentHandle {
  /** The agent's state directory; the runtime's disks are under `runtime/`. */
  readonly stateDir: string;
  /** Stops the agent only: its desktops keep running and its state directory stays. */
  halt(): Promise<void>;
}

/**
 * Starts a real agent in-process on the sandbox runtime (namespaces, Xvfb, CRIU). Needs root.
 * Given the `stateDir` of a halted agent, it comes back as the same host with the same desktops.
 * `stop` also destroys every desktop the runtime still holds and removes the state directory:
 * desktops outlive their agent by design, so a test that failed midway would otherwise leave
 * them running.
 */
export async function startSandboxAgent(
  schedulerUrl: string, existingStateDir?: string, options: { goldenTemplates?: boolean } = {},
): Promise<SandboxAgent> {
  const stateDir = existingStateDir ?? mkdtempSync(join(tmpdir(), 'canto-sandbox-agent-'));
  const config = loadAgentConfig({
    // Off unless asked: most tests pin what a first boot does (golden-templates tests turn it on).
    CANTO_AGENT_GOLDEN_TEMPLATES: options.goldenTemplates === true ? 'true' : 'false',
    CANTO_SCHEDULER_URL: schedulerUrl,
    CANTO_AGENT_TOKEN: JOIN_TOKEN,
    CANTO_AGENT_STATE_DIR: stateDir,
    CANTO_AGENT_RUNTIME: 'sandbox',
    CANTO_AGENT_RECONNECT_MAX_MS: '500',
    CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
    CANTO_AGENT_ADDRESS: '127.0.0.1',
    CANTO_LOG_LEVEL: 'silent',
  });
  const handle = await runAgent(config, { handleSignals: false, logger: silentLogger() });
  await handle.waitConnected(10_000);
  return {
    ...handle,
    stateDir,
    halt: () => handle.stop(),
    async stop() {
      await handle.stop();
      await destroyLeftDesktops(join(stateDir, 'runtime'));
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

/** A desktop of `call`'s org, created and woken, the agent of `agents` it runs on, and another one. */
export async function awakeOnOneOf(call: ReturnType<typeof api>, agents: readonly TestAgent[]): Promise<{ id: string; source: TestAgent; target: TestAgent }> {
  const id = await awakeDesktop(call);
  const host = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
  const source = agents.find((a) => a.hostId === host)!;
  return { id, source, target: agents.find((a) => a !== source)! };
}

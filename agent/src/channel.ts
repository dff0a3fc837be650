/**
 * The agent's start-up: its identity and fencing store, the stream and port gateways, the transfer
 * server other agents fetch moved desktops from, the command handlers, and the links to the
 * scheduler replicas (scheduler-links.ts), which the agent always dials (hosts sit behind NAT and
 * firewalls; the schedulers never need to reach them).
 */
import type { Logger } from '../../shared/src/log.js';
import type { AgentConfig } from './config.js';
import { GenerationStore } from './generations.js';
import { CommandHandlers } from './handlers.js';
import { STAGING_SWEEP_MS, sweepStaging } from './transfer/staging-sweep.js';
import { StreamGateway } from './stream/gateway.js';
import { fencePortLine } from './ports/fence.js';
import { PortGateway } from './ports/gateway.js';
import { loadHostIdentity } from './host-identity.js';
import { ProcHostMeter, type HostMeter } from './host-meter.js';
import type { RuntimeDriver } from './runtime/driver.js';
import { LeaderEpochs } from './leader-epochs.js';
import { SchedulerLinks } from './scheduler-links.js';
import { AgentMetrics, startProbeServer, type ProbeServer } from './observability.js';
import { spawnerStats } from './runtime/sandbox/host/spawner.js';
import { LifecycleSlots } from './lifecycle-slots.js';
import { DesktopMoves } from './transfer/moves.js';
import { TransferServer } from './transfer/server.js';
import { TransferSource } from './transfer/source.js';
import { TransferTickets } from './transfer/tickets.js';

/**
 * How long a stopping agent waits for the commands it is running: inside the 5 s a signalled agent
 * has to stop (main.ts), after closing its links (up to 2 s) and leaving time to close its
 * listeners and the runtime.
 */
const COMMAND_GRACE_MS = 2_000;

export { agentSocketUrl, AGENT_SOCKET_PATH } from './scheduler-links.js';

export interface AgentHandle {
  readonly hostId: string;
  /** True while at least one scheduler replica is linked (hello done). */
  connected(): boolean;
  /** The replicas this agent has a working link to. */
  linkedReplicas(): string[];
  /** The newest leader epoch this agent has seen. */
  leaderEpoch(): number;
  /** Where `/healthz`, `/readyz` and `/metrics` are served; null when turned off. */
  readonly probePort: number | null;
  /** Resolves once connected (at once if already); rejects after `timeoutMs` or on stop. */
  waitConnected(timeoutMs: number): Promise<void>;
  /** Closes the link, clears every timer and closes the driver; desktops keep running. */
  stop(): Promise<void>;
}

export interface StartAgentOptions {
  readonly config: AgentConfig;
  readonly driver: RuntimeDriver;
  readonly logger: Logger;
  /**
   * The protocol version said in hello, when not this build's: how tests stand for an agent of an
   * older release next to current ones (the scheduler then uses only what that version knows).
   */
  readonly announceProtocol?: string;
  /** What heartbeats report of the host's use; the machine's own (/proc and the driver) unless given. */
  readonly meter?: HostMeter;
}

/** Starts dialing the scheduler and returns at once; use `waitConnected` to wait for the hello. */
export async function startAgent(options: StartAgentOptions): Promise<AgentHandle> {
  const identity = await loadHostIdentity(options.config.stateDir);
  const generations = await GenerationStore.open(options.config.stateDir);
  const stream = await startStreamGateway(options, generations);
  let ports: PortGateway | null;
  let transfer: TransferServer | null;
  try {
    ports = await startPortGateway(options, generations);
  } catch (err) {
    await stream?.close();
    throw err;
  }
  const movesLog = options.logger.child({ component: 'transfer' });
  const log = (msg: string, fields?: object) => movesLog.info(fields ?? {}, msg);
  try {
    transfer = await startTransferServer(options, generations, log);
  } catch (err) {
    await stream?.close();
    await ports?.close();
    throw err;
  }
  const epochs = new LeaderEpochs();
  const metrics = new AgentMetrics();
  const moves = new DesktopMoves({ driver: options.driver, source: transfer?.source ?? null, url: transfer?.url ?? null, log });
  const slots = new LifecycleSlots(options.config.lifecycleSlots);
  const handlers = new CommandHandlers({ driver: options.driver, generations, logger: options.logger, stream, leaderEpochs: epochs, metrics, moves, slots });
  const links = new SchedulerLinks({
    config: options.config, driver: options.driver, identity, generations, handlers, epochs, ports, transfer, logger: options.logger,
    announceProtocol: options.announceProtocol, meter: options.meter ?? new ProcHostMeter(options.driver),
  });
  let probes: ProbeServer | null = null;
  if (options.config.metricsListen !== null) {
    try {
      probes = await startProbeServer(options.config.metricsListen, metrics, {
        linkedReplicas: () => links.linkedReplicas(),
        leaderEpoch: () => epochs.current,
        driver: options.driver,
        slots,
        processes: spawnerStats,
        ...(ports === null ? {} : { portLinks: () => ports.stats() }),
      });
    } catch (err) {
      await stream?.close();
      await ports?.close();
      await transfer?.close();
      throw err;
    }
  }
  links.start();
  // Staging no move will come back for (transfer/staging-sweep.ts): at the start, then hourly.
  const transferDriver = options.driver.transfer;
  let sweeping = false;
  const sweep = () => {
    // One at a time: a sweep still waiting on a desktop's queue an hour later is not joined by another.
    if (transferDriver === undefined || sweeping) return;
    sweeping = true;
    sweepStaging({ transfer: transferDriver, queued: (id, work) => handlers.queued(id, work), log })
      .catch((err: unknown) => log('the staging sweep failed', { error: String(err) }))
      .finally(() => (sweeping = false));
  };
  sweep();
  const sweeps = setInterval(sweep, STAGING_SWEEP_MS);
  sweeps.unref();
  let stopping: Promise<void> | null = null;
  return {
    hostId: identity.hostId,
    connected: () => links.isConnected,
    linkedReplicas: () => links.linkedReplicas(),
    leaderEpoch: () => epochs.current,
    probePort: probes?.port ?? null,
    waitConnected: (timeoutMs) => links.waitConnected(timeoutMs),
    stop() {
      stopping ??= (async () => {
        clearInterval(sweeps);
        await links.stop();
        await handlers.settle(COMMAND_GRACE_MS);
        await probes?.close();
        await stream?.close();
        await ports?.close();
        await transfer?.close();
        await options.driver.close();
        options.logger.child({ component: 'agent-channel', host_id: identity.hostId }).info('agent stopped');
      })();
      return stopping;
    },
  };
}

/**
 * The stream gateway, where this host takes VNC clients and terminal clients holding a ticket;
 * none when streaming is turned off or the runtime has no computer-use support (stream and
 * terminal grants then answer 501).
 */
async function startStreamGateway(options: StartAgentOptions, generations: GenerationStore): Promise<StreamGateway | null> {
  const listen = options.config.streamListen;
  if (listen === null || !options.driver.capabilities().computerUse) return null;
  const log = options.logger.child({ component: 'stream-gateway' });
  return StreamGateway.start({
    listenHost: listen.host,
    port: listen.port,
    advertiseHost: options.config.address,
    open: (desktopId, viewOnly) => options.driver.openVnc(desktopId, viewOnly),
    openTerminal: (desktopId, spec) => options.driver.openTerminal(desktopId, spec),
    generationOf: (desktopId) => generations.get(desktopId),
    log: (msg, fields) => log.info(fields ?? {}, msg),
  });
}

/**
 * The port gateway, where the scheduler's ingress reaches ports inside this host's desktops with
 * lines signed by this host's port-link key (shared/src/port-link.ts), which the hello reply
 * brings; none when turned off. Each line is
 * fenced against the generations this host holds (ports/fence.ts) before the port is opened.
 */
async function startPortGateway(options: StartAgentOptions, generations: GenerationStore): Promise<PortGateway | null> {
  const listen = options.config.ingressListen;
  if (listen === null) return null;
  const log = options.logger.child({ component: 'port-gateway' });
  return PortGateway.start({
    listenHost: listen.host,
    port: listen.port,
    open: async (target) => {
      fencePortLine(generations.get(target.desktopId), target);
      return options.driver.openGuestPort(target.desktopId, target.port);
    },
    handOff: options.driver.handOffGuestPort === undefined ? undefined : async (target, client) => {
      fencePortLine(generations.get(target.desktopId), target);
      return options.driver.handOffGuestPort!(target.desktopId, target.port, client);
    },
    log: (msg, fields) => log.info(fields ?? {}, msg),
  });
}

/**
 * The transfer server, where other agents fetch desktops being moved off this host with tickets
 * `desktop.export` grants; none when turned off or when the runtime cannot move desktops.
 */
async function startTransferServer(
  options: StartAgentOptions,
  generations: GenerationStore,
  log: (msg: string, fields?: object) => void,
): Promise<TransferServer | null> {
  const listen = options.config.transferListen;
  const driverTransfer = options.driver.transfer;
  if (listen === null || driverTransfer === undefined) return null;
  const tickets = new TransferTickets();
  return TransferServer.start({
    listenHost: listen.host,
    port: listen.port,
    advertiseHost: options.config.address,
    source: new TransferSource({ transfer: driverTransfer, tickets, log }),
    tickets,
    generations,
    log,
  });
}

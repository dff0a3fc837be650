/**
 * The agent's probes and metrics, on a small HTTP listener of its own
 * (`CANTO_AGENT_METRICS_LISTEN`, loopback by default): `/healthz` says the process runs,
 * `/readyz` that it has a working link to at least one scheduler replica, `/metrics` is Prometheus
 * text. Nothing here names a desktop's contents or a credential.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { DesktopLifecycle, RuntimeDriver } from './runtime/driver.js';
import type { LifecycleSlots } from './lifecycle-slots.js';
import type { SpawnerStats } from './runtime/sandbox/host/spawner.js';
import type { PortLinkStats } from './ports/gateway.js';

export interface AgentProbeSources {
  linkedReplicas(): string[];
  leaderEpoch(): number;
  readonly driver: Pick<DesktopLifecycle, 'list'> & Pick<RuntimeDriver, 'templates' | 'restores' | 'hibernates'>;
  readonly slots?: Pick<LifecycleSlots, 'running' | 'queued' | 'limit'>;
  /** Processes the runtime started, by way (runtime/sandbox/host/spawner.ts). */
  readonly processes?: () => SpawnerStats;
  /** Port links by who carries them (ports/gateway.ts); absent without a port gateway. */
  readonly portLinks?: () => PortLinkStats;
}

/**
 * A counter that shows running totals kept elsewhere (the driver's, the spawner's): at each
 * scrape, reset and set to them, one series per value of `label`.
 */
function setTotals<L extends string>(counter: Counter<L>, label: L, totals: Readonly<Record<string, number>>): void {
  counter.reset();
  for (const [value, total] of Object.entries(totals)) counter.inc({ [label]: value } as Partial<Record<L, string>>, total);
}

export class AgentMetrics {
  readonly registry = new Registry();
  private readonly commands: Histogram<'command' | 'outcome'>;
  private readonly refused: Counter<'code'>;
  private sources: AgentProbeSources | null = null;

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    this.commands = new Histogram({
      name: 'canto_agent_command_duration_seconds',
      help: 'Commands from the schedulers, by command and outcome',
      labelNames: ['command', 'outcome'],
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
      registers,
    });
    this.refused = new Counter({
      name: 'canto_agent_commands_refused_total',
      help: 'Commands refused by a fence, by code (stale_generation, stale_epoch, not_running, ...)',
      labelNames: ['code'],
      registers,
    });
    const links: Gauge = new Gauge({
      name: 'canto_agent_scheduler_links',
      help: 'Scheduler replicas this agent has a working link to',
      registers,
      collect: () => {
        if (this.sources) links.set(this.sources.linkedReplicas().length);
      },
    });
    const epoch: Gauge = new Gauge({
      name: 'canto_agent_leader_epoch',
      help: 'The newest leader lease epoch this agent has seen',
      registers,
      collect: () => {
        if (this.sources) epoch.set(this.sources.leaderEpoch());
      },
    });
    const slotted: Gauge<'state'> = new Gauge({
      name: 'canto_agent_lifecycle_commands',
      help: 'Starts, hibernates and forks holding one of the host\'s slots (running) or waiting for one (waiting)',
      labelNames: ['state'],
      registers,
      collect: () => {
        const slots = this.sources?.slots;
        if (slots === undefined) return;
        slotted.set({ state: 'running' }, slots.running);
        slotted.set({ state: 'waiting' }, slots.queued);
      },
    });
    const slotLimit: Gauge = new Gauge({
      name: 'canto_agent_lifecycle_slots',
      help: 'Starts, hibernates and forks this host runs at once (CANTO_AGENT_LIFECYCLE_CONCURRENCY; 0 = no bound)',
      registers,
      collect: () => {
        const slots = this.sources?.slots;
        if (slots !== undefined) slotLimit.set(slots.limit);
      },
    });
    const started: Counter<'via'> = new Counter({
      name: 'canto_agent_processes_started_total',
      help: 'Processes the runtime started, by way: the process spawner (helper) or Node\'s own fork (node)',
      labelNames: ['via'],
      registers,
      collect: () => {
        const counts = this.sources?.processes?.();
        if (counts !== undefined) setTotals(started, 'via', { helper: counts.helper, node: counts.node });
      },
    });
    const spawners: Counter = new Counter({
      name: 'canto_agent_spawner_starts_total',
      help: 'Process spawners started (one at the first process; more mean one died and was replaced)',
      registers,
      collect: () => {
        const counts = this.sources?.processes?.();
        if (counts === undefined) return;
        spawners.reset();
        spawners.inc(counts.helperStarts);
      },
    });
    const template: Gauge<'state'> = new Gauge({
      name: 'canto_agent_desktop_template',
      help: 'The golden template new desktops are cloned from: 1 for its state now (ready, building, none), 0 for the others',
      labelNames: ['state'],
      registers,
      collect: () => {
        const stats = this.sources?.driver.templates?.() ?? null;
        if (stats === null) return;
        for (const state of ['ready', 'building', 'none'] as const) template.set({ state }, stats.state === state ? 1 : 0);
      },
    });
    const disks: Counter<'from'> = new Counter({
      name: 'canto_agent_new_desktop_disks_total',
      help: 'New desktops\' disks: cloned from the golden template (template) or empty, booting cold (empty)',
      labelNames: ['from'],
      registers,
      collect: () => {
        const stats = this.sources?.driver.templates?.() ?? null;
        if (stats !== null) setTotals(disks, 'from', { template: stats.cloned, empty: stats.empty });
      },
    });
    const restores: Counter<'outcome'> = new Counter({
      name: 'canto_agent_restores_total',
      help: 'Starts from a memory snapshot: restored, or failed (booted cold, the images set aside)',
      labelNames: ['outcome'],
      registers,
      collect: () => {
        const counts = this.sources?.driver.restores?.();
        if (counts !== undefined) setTotals(restores, 'outcome', { restored: counts.restored, failed: counts.failed });
      },
    });
    const hibernates: Counter<'outcome'> = new Counter({
      name: 'canto_agent_hibernates_total',
      help: 'Hibernates by outcome: memory (a snapshot taken), cold (stopped without one: its programs ended), refused (a move\'s stop that could not keep the memory: it runs on)',
      labelNames: ['outcome'],
      registers,
      collect: () => {
        const counts = this.sources?.driver.hibernates?.();
        if (counts !== undefined) setTotals(hibernates, 'outcome', { memory: counts.memory, cold: counts.cold, refused: counts.refused });
      },
    });
    const portLinks: Counter<'via'> = new Counter({
      name: 'canto_agent_port_links_total',
      help: 'Port links from the ingress, by who carries them: a relay of their own (relay) or the agent itself (agent)',
      labelNames: ['via'],
      registers,
      collect: () => {
        const stats = this.sources?.portLinks?.();
        if (stats !== undefined) setTotals(portLinks, 'via', { relay: stats.relayed, agent: stats.agent });
      },
    });
    const openLinks: Gauge<'via'> = new Gauge({
      name: 'canto_agent_port_links',
      help: 'Port links open now, by who carries them (relay, agent)',
      labelNames: ['via'],
      registers,
      collect: () => {
        const stats = this.sources?.portLinks?.();
        if (stats === undefined) return;
        openLinks.set({ via: 'relay' }, stats.relayedOpen);
        openLinks.set({ via: 'agent' }, stats.agentOpen);
      },
    });
    const desktops: Gauge<'running'> = new Gauge({
      name: 'canto_agent_desktops',
      help: 'Desktops this host holds, running or not',
      labelNames: ['running'],
      registers,
      collect: async () => {
        if (!this.sources) return;
        const held = await this.sources.driver.list().catch(() => null);
        if (held === null) return;
        desktops.set({ running: 'true' }, held.filter((d) => d.running).length);
        desktops.set({ running: 'false' }, held.filter((d) => !d.running).length);
      },
    });
  }

  attach(sources: AgentProbeSources): void {
    this.sources = sources;
  }

  observeCommand(command: string, outcome: string, seconds: number): void {
    this.commands.observe({ command, outcome }, seconds);
  }

  observeRefusal(code: string): void {
    this.refused.inc({ code });
  }
}

export interface ProbeServer {
  readonly port: number;
  close(): Promise<void>;
}

export async function startProbeServer(listen: { host: string; port: number }, metrics: AgentMetrics, sources: AgentProbeSources): Promise<ProbeServer> {
  metrics.attach(sources);
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '').split('?')[0];
    const send = (status: number, type: string, body: string) => {
      res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
      res.end(body);
    };
    if (req.method !== 'GET') return send(405, 'application/json', '{"status":"method not allowed"}');
    if (path === '/healthz') return send(200, 'application/json', '{"status":"ok"}');
    if (path === '/readyz') {
      const linked = sources.linkedReplicas();
      return linked.length > 0
        ? send(200, 'application/json', JSON.stringify({ status: 'ready', linked }))
        : send(503, 'application/json', '{"status":"no scheduler link"}');
    }
    if (path === '/metrics') {
      metrics.registry.metrics().then(
        (text) => send(200, metrics.registry.contentType, text),
        () => send(500, 'text/plain', 'metrics failed\n'),
      );
      return;
    }
    send(404, 'application/json', '{"status":"not found"}');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(listen.port, listen.host, () => resolve());
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

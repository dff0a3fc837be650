/**
 * The cluster primary of `canto scheduler` with `CANTO_WORKERS` > 1: it runs no scheduler code
 * itself, only `node:cluster` workers, each a full replica (worker.ts). The API and ingress
 * listeners are shared: the primary accepts their connections and hands each to one worker in
 * turn. Agent links are not shared: each worker listens for them on a port of its own
 * (worker-config.ts), because an agent must link to every replica.
 *
 * The primary keeps the workers running: one that dies is started again after a pause that
 * doubles from `RESTART_MIN_MS` to `RESTART_MAX_MS` while it keeps dying, and starts over once a
 * worker has lived `RESTART_RESET_MS`. Its replica id stays the same, so a replacement takes
 * back the leader lease its predecessor held at once. A worker that dies before it ever served
 * fails the start (a wrong database URL should stop `canto scheduler`, not loop).
 *
 * A stop is the primary's: it sends SIGTERM to every worker, each of which stops as a single
 * scheduler does, and kills the ones still running when `STOP_BUDGET_MS` is up. Workers ignore
 * SIGINT, which a terminal's Ctrl-C sends to the whole process group, so the primary decides
 * what happens first (`canto up` hibernates desktops while the scheduler still runs). Metrics scrapes, which reach
 * whichever worker the connection went to, are answered for all workers: that worker asks the
 * primary, which gathers and merges every worker's registry (prom-client's AggregatorRegistry).
 */
import cluster, { type Worker } from 'node:cluster';
import { AggregatorRegistry } from 'prom-client';
import type { Logger } from '../../../shared/src/log.js';
import { withMallocTunables } from '../../../shared/src/malloc-tunables.js';
import type { SchedulerConfig } from '../config.js';
import { STOP_BUDGET_MS } from '../main.js';
import { isClusterMessage, type ClusterMessage, type WorkerReady } from './messages.js';
import { WORKER_INDEX_ENV } from './worker-config.js';

const RESTART_MIN_MS = 100;
const RESTART_MAX_MS = 10_000;
const RESTART_RESET_MS = 30_000;

export interface ClusterOptions {
  /** The configuration every worker loads too (from `env`); the primary reads its worker count and replica id. */
  readonly config: SchedulerConfig;
  /** Settings the workers load their configuration from, on top of this process's environment. */
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly logger: Logger;
  /** Where workers write their logs: this process's stdout (default), or its stderr (`canto up` keeps stdout for its banner). */
  readonly workerStdout?: 'stdout' | 'stderr';
}

export interface RunningCluster {
  /** The API base URL (as a single scheduler's `url`). */
  readonly url: string;
  readonly ingressUrl: string | null;
  /** The workers serving now, by index. */
  workers(): ReadonlyArray<WorkerReady & { readonly index: number; readonly pid: number }>;
  close(): Promise<void>;
}

interface Slot {
  readonly index: number;
  worker: Worker | null;
  ready: WorkerReady | null;
  startedAt: number;
  everReady: boolean;
  delayMs: number;
  restart: NodeJS.Timeout | null;
}

export async function startSchedulerCluster(options: ClusterOptions): Promise<RunningCluster> {
  const { config } = options;
  const log = options.logger.child({ component: 'cluster' });
  const aggregator = new AggregatorRegistry();
  cluster.setupPrimary({ stdio: ['ignore', options.workerStdout === 'stderr' ? 2 : 1, 2, 'ipc'] });
  const slots: Slot[] = Array.from({ length: config.workers }, (_, i) => ({
    index: i + 1, worker: null, ready: null, startedAt: 0, everReady: false, delayMs: RESTART_MIN_MS, restart: null,
  }));
  let stopping = false;
  let failStart: ((err: Error) => void) | null = null;
  let allReady: (() => void) | null = null;

  const fork = (slot: Slot) => {
    slot.restart = null;
    slot.startedAt = Date.now();
    const worker = cluster.fork({
      ...options.env,
      // The base id, which each worker extends with its index: the same for every worker, and
      // for a worker started again.
      CANTO_REPLICA_ID: config.replicaId,
      [WORKER_INDEX_ENV]: String(slot.index),
      // Workers are the processes that relay file bytes; glibc reads this only at their start.
      GLIBC_TUNABLES: withMallocTunables(options.env.GLIBC_TUNABLES ?? process.env.GLIBC_TUNABLES),
    });
    slot.worker = worker;
    worker.on('message', (message: unknown) => {
      if (!isClusterMessage(message)) return;
      onMessage(slot, worker, message);
    });
    worker.once('exit', (code, signal) => onExit(slot, worker, code, signal));
  };

  const onMessage = (slot: Slot, worker: Worker, message: ClusterMessage) => {
    if (message.type === 'canto:ready') {
      slot.ready = message;
      slot.everReady = true;
      log.info({ worker: slot.index, pid: worker.process.pid, replica: message.replicaId, agent_url: message.advertisedUrl }, 'worker serving');
      if (slots.every((s) => s.ready)) allReady?.();
    } else if (message.type === 'canto:metrics-request') {
      const reply = (body: { text?: string; error?: string }) => {
        if (worker.isConnected()) worker.send({ type: 'canto:metrics-reply', id: message.id, ...body } satisfies ClusterMessage);
      };
      aggregator.clusterMetrics().then((text) => reply({ text }), (err: Error) => reply({ error: err.message }));
    }
  };

  const onExit = (slot: Slot, worker: Worker, code: number | null, signal: string | null) => {
    if (slot.worker !== worker) return;
    slot.worker = null;
    slot.ready = null;
    if (stopping) return;
    if (!slot.everReady && failStart) {
      failStart(new Error(`scheduler worker ${slot.index} exited before it served (code ${code}, signal ${signal}); its log says why`));
      return;
    }
    if (Date.now() - slot.startedAt >= RESTART_RESET_MS) slot.delayMs = RESTART_MIN_MS;
    log.error({ worker: slot.index, pid: worker.process.pid, code, signal, restart_in_ms: slot.delayMs }, 'worker died; starting it again');
    slot.restart = setTimeout(() => fork(slot), slot.delayMs);
    slot.delayMs = Math.min(RESTART_MAX_MS, slot.delayMs * 2);
  };

  let closing: Promise<void> | null = null;
  const close = () => {
    closing ??= (async () => {
      stopping = true;
      const live: Worker[] = [];
      for (const slot of slots) {
        if (slot.restart) clearTimeout(slot.restart);
        slot.restart = null;
        if (slot.worker && !slot.worker.isDead()) live.push(slot.worker);
      }
      const exited = live.map((w) => new Promise<void>((resolve) => (w.isDead() ? resolve() : w.once('exit', () => resolve()))));
      for (const w of live) w.process.kill('SIGTERM');
      // Each worker keeps to the budget itself; one that does not (stuck) is killed at its end.
      const force = setTimeout(() => {
        for (const w of live) {
          if (!w.isDead()) {
            log.error({ pid: w.process.pid }, 'worker did not stop within the budget; killing it');
            w.process.kill('SIGKILL');
          }
        }
      }, STOP_BUDGET_MS - 250);
      await Promise.all(exited);
      clearTimeout(force);
    })();
    return closing;
  };

  try {
    await new Promise<void>((resolve, reject) => {
      allReady = resolve;
      failStart = reject;
      for (const slot of slots) fork(slot);
    });
  } catch (err) {
    await close();
    throw err;
  } finally {
    allReady = null;
    failStart = null;
  }
  const first = slots[0]!.ready!;
  log.info({ url: first.url, workers: slots.length, replica: config.replicaId }, 'scheduler listening');
  return {
    url: first.url,
    ingressUrl: first.ingressUrl,
    workers: () => slots.filter((s) => s.ready && s.worker).map((s) => ({ ...s.ready!, index: s.index, pid: s.worker!.process.pid! })),
    close,
  };
}

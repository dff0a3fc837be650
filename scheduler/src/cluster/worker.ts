/**
 * One worker of a clustered scheduler (primary.ts): a whole replica in a process of its own, with
 * the configuration every worker loads and what worker-config.ts makes of it for this index. It
 * tells the primary once it serves, answers metrics scrapes with every worker's metrics (asking
 * the primary, which merges them), and stops on SIGTERM as a single scheduler does.
 *
 * A worker whose primary is gone exits at once: `node:cluster` ends a worker whose IPC channel
 * closes unexpectedly. Its lease and registry row then age out, as after any crash.
 */
import { AggregatorRegistry } from 'prom-client';
import { createRootLogger } from '../../../shared/src/log.js';
import { loadSchedulerConfig } from '../config.js';
import { startScheduler, STOP_BUDGET_MS } from '../main.js';
import { SchedulerMetrics } from '../observability/metrics.js';
import { isClusterMessage, type ClusterMessage } from './messages.js';
import { workerConfig } from './worker-config.js';

/** A scrape waits this long for the primary's merged metrics (prom-client's own limit is 5 s). */
const METRICS_WAIT_MS = 6_000;

export async function runSchedulerWorker(env: Readonly<Record<string, string | undefined>>, index: number): Promise<void> {
  const send = (message: ClusterMessage) => process.send?.(message);
  // A terminal's Ctrl-C (SIGINT) reaches every process of the group, and is the primary's to act
  // on: `canto up` hibernates desktops first, through the workers.
  process.on('SIGINT', () => {});
  // First, before anything can fail slowly: the primary's metric requests are answered from the
  // start, and a worker still starting reads as one with no agent linked yet (not as absent,
  // which would let the other workers' figures stand for the process).
  new AggregatorRegistry();
  const metrics = new SchedulerMetrics();
  AggregatorRegistry.setRegistries([metrics.registry]);
  const config = workerConfig(loadSchedulerConfig(env), index);
  const logger = createRootLogger({ level: config.logLevel, name: 'canto-scheduler' }).child({ worker: index });
  const scheduler = await startScheduler(config, logger, metrics);

  let nextId = 0;
  const pending = new Map<number, { resolve: (text: string) => void; reject: (err: Error) => void }>();
  process.on('message', (message: unknown) => {
    if (!isClusterMessage(message) || message.type !== 'canto:metrics-reply') return;
    const call = pending.get(message.id);
    pending.delete(message.id);
    if (message.text !== undefined) call?.resolve(message.text);
    else call?.reject(new Error(`the cluster primary could not gather metrics: ${message.error ?? 'no answer'}`));
  });
  scheduler.metrics.aggregateWith(() => new Promise<string>((resolve, reject) => {
    const id = nextId++;
    const timer = setTimeout(() => {
      pending.delete(id);
      reject(new Error('the cluster primary did not answer a metrics request'));
    }, METRICS_WAIT_MS);
    pending.set(id, {
      resolve: (text) => (clearTimeout(timer), resolve(text)),
      reject: (err) => (clearTimeout(timer), reject(err)),
    });
    send({ type: 'canto:metrics-request', id });
  }));

  // The primary stops workers with SIGTERM; a second one changes nothing (the primary keeps the budget).
  let stopping = false;
  const onSignal = () => {
    if (stopping) return;
    stopping = true;
    setTimeout(() => process.exit(1), STOP_BUDGET_MS - 500).unref();
    void scheduler.close().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.on('SIGTERM', onSignal);
  send({ type: 'canto:ready', replicaId: config.replicaId, url: scheduler.url, advertisedUrl: scheduler.advertisedUrl, ingressUrl: scheduler.ingressUrl });
}

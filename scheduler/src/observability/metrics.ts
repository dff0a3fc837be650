/**
 * The scheduler's Prometheus metrics (`GET /metrics`, text format 0.0.4). Three kinds:
 *
 * - measured in this process as things happen: HTTP latency by route template, operations this
 *   replica's engine settled and how long they took from request to settlement, hosts found down;
 * - read from this process when scraped: agent links held here, whether this replica leads, the
 *   lease epoch;
 * - read from PostgreSQL when scraped (the same numbers on every replica): desktops by state, open
 *   operations, hosts by status, the webhook backlog. A scrape that cannot reach the database
 *   leaves those out rather than failing.
 *
 * With several workers (scheduler/src/cluster/), a scrape of any worker answers for the whole
 * process: the cluster primary gathers every worker's registry and merges them, each metric by its
 * aggregator — counters and histograms add up, figures read from the database are taken once, and
 * the per-replica gauges say what an operator asks of the process (see each one's `aggregator`).
 *
 * docs/operators.md lists every metric.
 */
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry, type Aggregator } from 'prom-client';
import type { Sql } from '../store/db.js';
import { REPLICA_LIVE_MS } from '../fleet/registry.js';

export interface MetricsSources {
  sql: Sql;
  agentLinks(): number;
  isLeader(): boolean;
  leaseEpoch(): number;
}

export class SchedulerMetrics {
  readonly registry = new Registry();
  readonly httpDuration: Histogram<'method' | 'route' | 'status_code'>;
  readonly operationsSettled: Counter<'kind' | 'outcome'>;
  readonly operationDuration: Histogram<'kind' | 'outcome'>;
  readonly hostsDown: Counter;
  private sources: MetricsSources | null = null;
  private aggregate: (() => Promise<string>) | null = null;

  constructor() {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    this.httpDuration = new Histogram({
      name: 'canto_http_request_duration_seconds',
      help: 'HTTP API requests by method, route template and status',
      labelNames: ['method', 'route', 'status_code'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120],
      registers,
    });
    this.operationsSettled = new Counter({
      name: 'canto_operations_settled_total',
      help: 'Operations this replica\'s engine settled, by kind and outcome',
      labelNames: ['kind', 'outcome'],
      registers,
    });
    this.operationDuration = new Histogram({
      name: 'canto_operation_duration_seconds',
      help: 'Time from an operation\'s request to its settlement, for operations this replica settled',
      labelNames: ['kind', 'outcome'],
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300],
      registers,
    });
    this.hostsDown = new Counter({
      name: 'canto_hosts_down_total',
      help: 'Hosts this replica found silent and marked down (as leader)',
      registers,
    });
    // Across workers: the agents linked to every worker (what guest operations through any of
    // them need), whether any worker leads, and the latest epoch one led in.
    this.processGauge('canto_agent_links', 'Agents linked to this replica and not silent (with several workers: to every worker)', 'min', (src) => src.agentLinks());
    this.processGauge('canto_leader', '1 while this replica (one of its workers) holds the leader lease', 'max', (src) => (src.isLeader() ? 1 : 0));
    this.processGauge('canto_lease_epoch', 'The leader lease epoch this replica last led in (grows with every new leader term)', 'max', (src) => src.leaseEpoch());
    this.databaseGauge('canto_desktops', 'Desktops by state (destroyed ones excluded)', ['state'], (sql) =>
      sql`SELECT state, count(*)::int AS n FROM desktops WHERE state <> 'destroyed' GROUP BY state`);
    this.databaseGauge('canto_operations_open', 'Pending and running operations by kind and state', ['kind', 'state'], (sql) =>
      sql`SELECT kind, state, count(*)::int AS n FROM operations WHERE state IN ('pending', 'running') GROUP BY kind, state`);
    this.databaseGauge('canto_hosts', 'Hosts by status', ['status'], (sql) =>
      sql`SELECT status, count(*)::int AS n FROM hosts GROUP BY status`);
    // A stopped drain waits for an operator; alert on `canto_host_drains{state="stopped"} > 0`.
    // The states as store/moves.ts `drainState` derives them, in SQL so one query counts them all.
    this.databaseGauge('canto_host_drains', 'Hosts with a drain, by its state: draining, stopped (a move failed) or drained', ['state'], (sql) =>
      sql`SELECT CASE WHEN drain_finished_at IS NOT NULL THEN 'drained' WHEN drain_error IS NOT NULL THEN 'stopped' ELSE 'draining' END AS state,
                 count(*)::int AS n
          FROM hosts WHERE drain_requested_at IS NOT NULL GROUP BY 1`);
    this.databaseGauge('canto_webhook_deliveries_pending', 'Webhook deliveries not yet delivered or failed', [], (sql) =>
      sql`SELECT count(*)::int AS n FROM webhook_deliveries WHERE state = 'pending'`);
    this.databaseGauge('canto_outbox_undispatched', 'Lifecycle events not yet turned into webhook deliveries', [], (sql) =>
      sql`SELECT count(*)::int AS n FROM outbox WHERE dispatched_at IS NULL`);
    this.databaseGauge('canto_replicas_live', 'Live scheduler replicas (refreshed their registry row lately)', [], (sql) =>
      sql`SELECT count(*)::int AS n FROM replicas WHERE last_seen_at > now() - make_interval(secs => ${REPLICA_LIVE_MS / 1000})`);
  }

  /** Connects the gauges read at scrape time to what they read. */
  attach(sources: MetricsSources): void {
    this.sources = sources;
  }

  observeSettled(kind: string, outcome: 'succeeded' | 'failed', createdAt: Date): void {
    this.operationsSettled.inc({ kind, outcome });
    this.operationDuration.observe({ kind, outcome }, Math.max(0, (Date.now() - createdAt.getTime()) / 1000));
  }

  /** Scrapes answer with `read()` from now on: the whole cluster's metrics, merged by the primary. */
  aggregateWith(read: () => Promise<string>): void {
    this.aggregate = read;
  }

  async text(): Promise<string> {
    return this.aggregate ? this.aggregate() : this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  private processGauge(name: string, help: string, aggregator: Aggregator, read: (sources: MetricsSources) => number): void {
    const gauge: Gauge = new Gauge({
      name,
      help,
      aggregator,
      registers: [this.registry],
      collect: () => {
        if (this.sources) gauge.set(read(this.sources));
      },
    });
  }

  private databaseGauge(
    name: string,
    help: string,
    labelNames: string[],
    query: (sql: Sql) => Promise<ReadonlyArray<Record<string, unknown>>>,
  ): void {
    const gauge: Gauge = new Gauge({
      name,
      help,
      labelNames,
      // The same rows on every worker: one worker's reading stands for the process.
      aggregator: 'first',
      registers: [this.registry],
      collect: async () => {
        if (!this.sources) return;
        let rows: ReadonlyArray<Record<string, unknown>>;
        try {
          rows = await query(this.sources.sql);
        } catch {
          // No reading rather than the last one: a database out of reach showed "no host down,
          // no drain stopped" for as long as it lasted (alert on /readyz for the outage itself).
          // A gauge without labels reads 0 once reset: NaN says "unknown" instead.
          gauge.reset();
          if (labelNames.length === 0) gauge.set(Number.NaN);
          return;
        }
        gauge.reset();
        for (const row of rows) {
          const labels = Object.fromEntries(labelNames.map((l) => [l, String(row[l])]));
          gauge.set(labels, Number(row.n));
        }
      },
    });
  }
}

/**
 * What makes each worker of a clustered scheduler a replica of its own: a replica id derived from
 * the configured one and the worker's index (stable across a worker's restarts, so a replacement
 * takes back a lease its crashed predecessor held without waiting out the TTL), a share of the
 * database pool, and an agent-link listener of its own. Agents must reach every replica over its
 * own link, and the API port is shared by all workers (the cluster primary hands each connection
 * to one of them), so each worker advertises the port only it listens on.
 *
 * Pure: the worker calls it on the configuration it loaded, with its index from the environment.
 */
import type { SchedulerConfig } from '../config.js';

/** The environment variable a worker finds its index (1..N) in; set by the primary only. */
export const WORKER_INDEX_ENV = 'CANTO_WORKER_INDEX';

/** The fewest query connections a worker keeps, whatever `CANTO_DB_POOL_MAX` shares out. */
const MIN_WORKER_POOL = 2;

export function workerReplicaId(base: string, index: number): string {
  return `${base}-w${index}`;
}

/** Worker `index`'s configuration (from 1) out of the one all workers share. */
export function workerConfig(config: SchedulerConfig, index: number): SchedulerConfig {
  if (!Number.isInteger(index) || index < 1 || index > config.workers) throw new Error(`worker index must be 1..${config.workers}, got ${index}`);
  const agents = config.agentListen;
  return Object.freeze({
    ...config,
    replicaId: workerReplicaId(config.replicaId, index),
    databasePoolMax: Math.max(MIN_WORKER_POOL, Math.floor(config.databasePoolMax / config.workers)),
    // Without CANTO_AGENT_LISTEN, a port of its own on the API's host: free, and always reachable
    // wherever the API listener is (firewalls aside: docs/operators.md).
    agentListen: Object.freeze(agents
      ? { host: agents.host, port: agents.port === 0 ? 0 : agents.port + index - 1 }
      : { host: config.listenHost, port: 0 }),
  });
}

/** `CANTO_WORKER_INDEX` of this process, or null in a process the primary did not start. */
export function workerIndexFrom(env: Readonly<Record<string, string | undefined>>): number | null {
  const raw = env[WORKER_INDEX_ENV];
  if (raw === undefined || raw === '') return null;
  if (!/^\d+$/.test(raw)) throw new Error(`${WORKER_INDEX_ENV} must be a worker number, got "${raw}"`);
  return Number(raw);
}

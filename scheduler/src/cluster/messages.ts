/**
 * What the cluster primary and its workers say to each other over the IPC channel `node:cluster`
 * gives them. prom-client's own metric requests travel on the same channel under its own types;
 * ours are prefixed `canto:` and everything else is ignored.
 */

/** A worker is serving: where, and as which replica. */
export interface WorkerReady {
  readonly type: 'canto:ready';
  readonly replicaId: string;
  /** The API base URL (shared by all workers). */
  readonly url: string;
  /** Where agents link to this worker alone. */
  readonly advertisedUrl: string;
  readonly ingressUrl: string | null;
}

export type ClusterMessage =
  | WorkerReady
  /** A worker was scraped: it asks the primary for every worker's metrics, merged. */
  | { readonly type: 'canto:metrics-request'; readonly id: number }
  | { readonly type: 'canto:metrics-reply'; readonly id: number; readonly text?: string; readonly error?: string };

const TYPES = new Set(['canto:ready', 'canto:metrics-request', 'canto:metrics-reply']);

export function isClusterMessage(value: unknown): value is ClusterMessage {
  return typeof value === 'object' && value !== null && TYPES.has((value as { type?: unknown }).type as string);
}

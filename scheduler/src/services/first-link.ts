/**
 * A replica's first link to a host, waited for by a guest call (services/guest.ts) instead of
 * answering 503. Agents link to a replica within moments of its start (fleet/registry.ts
 * notifies the others, which tell their agents), and to every replica within moments of their
 * own start, so a call served in between is a moment's wait. Only then: a link this replica had
 * and lost (the agent stopped, froze, or its host went away), one that never came since (an agent
 * too old to link to every replica, a partial partition), and a host that reads `down` are
 * answered 503 at once.
 */
import type { Sql } from '../store/db.js';
import { LINK_SETTLE_MS } from '../fleet/link-view.js';

/** How long a call waits for the first link. */
export const LINK_WAIT_MS = 2_000;

export interface FirstLinks {
  /** Whether the host's agent has been linked to this replica since it started. */
  hasLinked(hostId: string): boolean;
  /** How long this replica has been taking agent links, in ms. */
  upForMs(): number;
  /** Resolves true once the host's agent is linked to this replica, false after `timeoutMs`. */
  waitConnected(hostId: string, timeoutMs: number): Promise<boolean>;
}

/**
 * Whether this replica's first link to the host came up within LINK_WAIT_MS: waited for only while
 * the host reads `ready` (another replica hears its heartbeats), this replica never had a link to
 * it, and the replica or the agent instance started within LINK_SETTLE_MS.
 */
export async function firstLinkCame(sql: Sql, links: FirstLinks, hostId: string): Promise<boolean> {
  if (links.hasLinked(hostId)) return false;
  const [host] = await sql<Array<{ status: string; agent_new: boolean }>>`
    SELECT status, COALESCE(instance_since > now() - make_interval(secs => ${LINK_SETTLE_MS / 1000}), false) AS agent_new FROM hosts WHERE id = ${hostId}`;
  if (host?.status !== 'ready' || !(host.agent_new || links.upForMs() < LINK_SETTLE_MS)) return false;
  return links.waitConnected(hostId, LINK_WAIT_MS);
}

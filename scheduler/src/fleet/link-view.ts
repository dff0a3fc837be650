/**
 * Which scheduler replicas a host's agent is linked to, as the replicas last recorded it in their
 * registry rows (every second). An agent keeps a link to every live replica, and each replica
 * serves guest calls and the leader runs lifecycle operations over its own links only, so a host
 * linked to some replicas and not others is partly unreachable while every heartbeat that does
 * arrive keeps it `ready`: a partial partition. The worst case is the leader cut off from a host
 * its followers reach, where wakes and hibernates there wait and fail `host_unavailable` while the
 * host reads healthy. This view is what the admin API, `canto hosts show` and `canto status` say.
 *
 * Links take a moment to form: a replica that has just started, or an agent that has just
 * (re)started, is "settling" for LINK_SETTLE_MS and is not counted as unlinked meanwhile. A
 * replica of an older version, whose row does not say (`linked_hosts` null), is left out.
 *
 * Pure: callers read the rows (and the leader lease) and pass the database's own clock.
 */
import type { ReplicaRow } from '../store/replicas.js';

/** How long a new replica or a new agent instance may go without its links before they count as missing. */
export const LINK_SETTLE_MS = 5_000;

export interface HostLinkView {
  /** Replicas the agent is linked to. */
  readonly linked: string[];
  /** Replicas it is not linked to, past the settling time: calls served there answer 503, and on the leader, lifecycle operations fail. */
  readonly unlinked: string[];
  /** Replicas it is not linked to yet, within the settling time of the replica or of the agent. */
  readonly settling: string[];
  /** The replica that leads; null when none holds a live lease. */
  readonly leader: string | null;
  /** Whether it is linked to the leader; null when no live replica leads or the leader does not say (yet). */
  readonly leader_linked: boolean | null;
}

export interface LinkViewHost {
  readonly id: string;
  /** When the agent instance now running first said hello; null on a host registered before that was recorded. */
  readonly instance_since: Date | null;
}

/** `rows`: the live replicas; `leaderId`: the live lease's holder, or null; `now`: the database's clock. */
export function hostLinkView(host: LinkViewHost, rows: readonly ReplicaRow[], leaderId: string | null, now: Date): HostLinkView {
  const fresh = (since: Date | null) => since !== null && now.getTime() - since.getTime() < LINK_SETTLE_MS;
  const agentSettling = fresh(host.instance_since);
  const view = { linked: [] as string[], unlinked: [] as string[], settling: [] as string[] };
  let leaderLinked: boolean | null = null;
  for (const r of rows) {
    if (r.linked_hosts === null) continue;
    const bucket = r.linked_hosts.includes(host.id) ? view.linked : agentSettling || fresh(r.started_at) ? view.settling : view.unlinked;
    bucket.push(r.id);
    if (r.id === leaderId && bucket !== view.settling) leaderLinked = bucket === view.linked;
  }
  return { ...view, leader: leaderId, leader_linked: leaderLinked };
}

/** One sentence for an operator when the host is missing links that have had time to form; null when nothing is. */
export function linkWarning(view: HostLinkView): string | null {
  if (view.unlinked.length === 0) return null;
  const reach = view.linked.length === 0 ? 'no replica' : `only ${view.linked.join(', ')}`;
  if (view.leader_linked === false) {
    return `its agent is not linked to the leader ${String(view.leader)} (it reaches ${reach}): wakes, hibernates and moves there wait and fail host_unavailable; ` +
      'check the network from the host to the leader\'s agent address (its URL in canto status)';
  }
  return `its agent is not linked to ${view.unlinked.join(', ')} (it reaches ${reach}): guest calls served by ${view.unlinked.length === 1 ? 'that replica' : 'those replicas'} answer 503`;
}

/** `2/3`, `1/2 not leader`, `1/2 linking`: replicas linked of those that say, for tables. */
export function linksLabel(view: HostLinkView): string {
  const all = view.linked.length + view.unlinked.length + view.settling.length;
  if (all === 0) return '-';
  const note = view.leader_linked === false ? ' not leader' : view.settling.length > 0 ? ' linking' : '';
  return `${view.linked.length}/${all}${note}`;
}

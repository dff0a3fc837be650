/**
 * Which replicas a host's agent is linked to (scheduler/src/fleet/link-view.ts): a missing link
 * counts only once both the replica and the agent instance have run for the settling time; a
 * replica that does not record its links (an older version) is left out; the leader's link is
 * named on its own, and the sentence for an operator says what a missing one breaks.
 */
import { describe, expect, it } from 'vitest';
import { hostLinkView, LINK_SETTLE_MS, linksLabel, linkWarning } from '../../scheduler/src/fleet/link-view.js';
import type { ReplicaRow } from '../../scheduler/src/store/replicas.js';

const now = new Date('2026-11-28T12:00:00Z');
const ago = (ms: number) => new Date(now.getTime() - ms);
const OLD = ago(60_000);

function replica(id: string, linked: string[] | null, startedAt = OLD): ReplicaRow {
  return { id, url: `http://${id}`, version: '1', settings: {}, started_at: startedAt, last_seen_at: now, linked_hosts: linked };
}

const host = { id: 'host_a', instance_since: OLD };

describe('host link view', () => {
  it('counts a replica the agent is not linked to as unlinked, and the leader among them as cut off', () => {
    const view = hostLinkView(host, [replica('r1', ['host_a']), replica('r2', ['host_b'])], 'r2', now);
    expect(view).toEqual({ linked: ['r1'], unlinked: ['r2'], settling: [], leader: 'r2', leader_linked: false });
    expect(linksLabel(view)).toBe('1/2 not leader');
    expect(linkWarning(view)).toBe(
      'its agent is not linked to the leader r2 (it reaches only r1): wakes, hibernates and moves there wait and fail host_unavailable; ' +
        "check the network from the host to the leader's agent address (its URL in canto status)",
    );
  });

  it('names the followers it is missing when the leader is linked: their guest calls answer 503', () => {
    const view = hostLinkView(host, [replica('r1', ['host_a']), replica('r2', []), replica('r3', [])], 'r1', now);
    expect(view.leader_linked).toBe(true);
    expect(linksLabel(view)).toBe('1/3');
    expect(linkWarning(view)).toBe('its agent is not linked to r2, r3 (it reaches only r1): guest calls served by those replicas answer 503');
    expect(linkWarning(hostLinkView(host, [replica('r1', []), replica('r2', [])], null, now))).toBe(
      'its agent is not linked to r1, r2 (it reaches no replica): guest calls served by those replicas answer 503',
    );
  });

  it('lets links form: a new replica, or a new agent instance, is settling rather than unlinked', () => {
    const newReplica = hostLinkView(host, [replica('r1', ['host_a']), replica('r2', [], ago(LINK_SETTLE_MS - 1))], 'r2', now);
    expect(newReplica).toMatchObject({ unlinked: [], settling: ['r2'], leader_linked: null });
    expect(linksLabel(newReplica)).toBe('1/2 linking');
    expect(linkWarning(newReplica)).toBeNull();
    const newAgent = hostLinkView({ id: 'host_a', instance_since: ago(1_000) }, [replica('r1', []), replica('r2', [])], 'r1', now);
    expect(newAgent).toMatchObject({ unlinked: [], settling: ['r1', 'r2'], leader_linked: null });
    // Past the settling time, the same rows count as missing links.
    expect(hostLinkView({ id: 'host_a', instance_since: ago(LINK_SETTLE_MS) }, [replica('r1', [])], 'r1', now).unlinked).toEqual(['r1']);
  });

  it('leaves out replicas that do not record links; all linked is no warning', () => {
    const view = hostLinkView(host, [replica('r1', ['host_a']), replica('old', null)], 'old', now);
    expect(view).toEqual({ linked: ['r1'], unlinked: [], settling: [], leader: 'old', leader_linked: null });
    expect(linkWarning(view)).toBeNull();
    expect(linksLabel(view)).toBe('1/1');
    expect(linksLabel(hostLinkView(host, [replica('old', null)], null, now))).toBe('-');
  });
});

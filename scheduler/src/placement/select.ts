/** Placement, step 3 of 3 — selection: the best-ranked host, or none when nothing is feasible. */
import { feasibleHosts, type HostCandidate, type PlacementPolicy } from './feasible.js';
import { rankHosts } from './rank.js';
import type { Tier } from '../../../shared/src/tiers.js';

export function selectHost(hosts: readonly HostCandidate[], tier: Tier, policy: PlacementPolicy): string | null {
  return rankHosts(feasibleHosts(hosts, tier, policy), policy)[0]?.id ?? null;
}

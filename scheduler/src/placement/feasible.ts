/**
 * Placement, step 1 of 3 — feasibility: hosts that are connected, ready, not cordoned, and have
 * room for the tier once overcommit is applied to their reported capacity.
 */
import { TIER_SPECS, type Tier } from '../../../shared/src/tiers.js';

export interface HostCandidate {
  readonly id: string;
  readonly connected: boolean;
  readonly ready: boolean;
  readonly cordoned: boolean;
  readonly vcpus: number;
  readonly memoryMb: number;
  readonly committedVcpus: number;
  readonly committedMemoryMb: number;
}

export interface Overcommit {
  readonly cpu: number;
  readonly memory: number;
}

export function feasibleHosts(hosts: readonly HostCandidate[], tier: Tier, overcommit: Overcommit): HostCandidate[] {
  const need = TIER_SPECS[tier];
  return hosts.filter(
    (h) =>
      h.connected &&
      h.ready &&
      !h.cordoned &&
      h.committedVcpus + need.vcpus <= h.vcpus * overcommit.cpu &&
      h.committedMemoryMb + need.memoryMb <= h.memoryMb * overcommit.memory,
  );
}

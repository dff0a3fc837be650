/**
 * Placement, step 1 of 3 — feasibility: hosts that are connected, ready, not cordoned, and have
 * room for the tier: CPU and memory for the running desktops once overcommit is applied to their
 * reported capacity, and a storage slot for the desktop's disk and snapshot (every placed desktop
 * holds its slots, awake or hibernated; see TIER_SPECS).
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
  /** Storage slots the host offers, and the slots its placed desktops hold. */
  readonly slots: number;
  readonly slotsUsed: number;
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
      h.committedMemoryMb + need.memoryMb <= h.memoryMb * overcommit.memory &&
      hasSlots(h, tier, 1),
  );
}

/** Whether `count` more desktops of `tier` fit in the host's storage slots. */
export function hasSlots(h: Pick<HostCandidate, 'slots' | 'slotsUsed'>, tier: Tier, count: number): boolean {
  return h.slotsUsed + TIER_SPECS[tier].slots * count <= h.slots;
}

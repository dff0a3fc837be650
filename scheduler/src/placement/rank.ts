/**
 * Placement, step 2 of 3 — ranking: spread desktops by preferring the host with the most free
 * capacity. Each host's nominal use of CPU and memory (the running desktops' tier sizes, as a
 * fraction of its reported capacity times the overcommit, or of its capacity when no cap is set)
 * and of storage slots (a fraction of its slots) is compared; the busiest of the three decides, so a
 * host full of hibernated desktops is as busy as one full of awake ones. Slots matter most in
 * practice: a placed desktop holds them awake or not, while CPU and memory count only awake ones,
 * so ranking by awake load alone saw a fleet of freshly created desktops as empty everywhere and
 * piled them onto one host. Ties go to the host with less use over all three, then by id, so the
 * order is stable and equal hosts fill round-robin.
 *
 * Measured use decides whether a host can take a desktop (feasible.ts), not which one does: free
 * memory moves by megabytes from one heartbeat to the next with whatever else runs on a machine,
 * and ranking by it let that noise, not the desktops placed, decide where the next one went.
 */
import type { HostCandidate, PlacementPolicy } from './feasible.js';

/** The host's use of each resource placement counts, as fractions of what it may commit. */
export function hostUse(h: HostCandidate, policy: PlacementPolicy): { cpu: number; memory: number; slots: number } {
  return {
    cpu: h.committedVcpus / (h.vcpus * (policy.cpuOvercommit > 0 ? policy.cpuOvercommit : 1) || 1),
    memory: h.committedMemoryMb / (h.memoryMb * (policy.memoryOvercommit > 0 ? policy.memoryOvercommit : 1) || 1),
    slots: h.slotsUsed / (h.slots || 1),
  };
}

export function rankHosts(hosts: readonly HostCandidate[], policy: PlacementPolicy): HostCandidate[] {
  const scored = hosts.map((h) => {
    const use = hostUse(h, policy);
    return { h, busiest: Math.max(use.cpu, use.memory, use.slots), total: use.cpu + use.memory + use.slots };
  });
  scored.sort((a, b) => a.busiest - b.busiest || a.total - b.total || a.h.id.localeCompare(b.h.id));
  return scored.map((s) => s.h);
}

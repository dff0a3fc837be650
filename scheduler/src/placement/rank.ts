/**
 * Placement, step 2 of 3 — ranking: spread desktops by preferring the host with the most free
 * capacity. Each host's use of CPU and memory (as a fraction of overcommitted capacity) and of
 * storage slots (a fraction of its slots) is compared; the busiest of the three decides, so a
 * host full of hibernated desktops is as busy as one full of awake ones. Slots matter most in
 * practice: a placed desktop holds them awake or not, while CPU and memory count only awake ones,
 * so ranking by awake load alone saw a fleet of freshly created desktops as empty everywhere and
 * piled them onto one host. Ties go to the host with less use over all three, then by id, so the
 * order is stable and equal hosts fill round-robin.
 */
import type { HostCandidate, Overcommit } from './feasible.js';

/** The host's use of each resource placement counts, as fractions of what it may commit. */
export function hostUse(h: HostCandidate, overcommit: Overcommit): { cpu: number; memory: number; slots: number } {
  return {
    cpu: h.committedVcpus / (h.vcpus * overcommit.cpu || 1),
    memory: h.committedMemoryMb / (h.memoryMb * overcommit.memory || 1),
    slots: h.slotsUsed / (h.slots || 1),
  };
}

export function rankHosts(hosts: readonly HostCandidate[], overcommit: Overcommit): HostCandidate[] {
  const scored = hosts.map((h) => {
    const use = hostUse(h, overcommit);
    return { h, busiest: Math.max(use.cpu, use.memory, use.slots), total: use.cpu + use.memory + use.slots };
  });
  scored.sort((a, b) => a.busiest - b.busiest || a.total - b.total || a.h.id.localeCompare(b.h.id));
  return scored.map((s) => s.h);
}

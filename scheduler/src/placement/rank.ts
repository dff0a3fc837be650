/**
 * Placement, step 2 of 3 — ranking: spread load by preferring the host whose busier resource
 * (CPU or memory, as a fraction of overcommitted capacity) is least used; ties by id so the
 * order is stable.
 */
import type { HostCandidate, Overcommit } from './feasible.js';

export function rankHosts(hosts: readonly HostCandidate[], overcommit: Overcommit): HostCandidate[] {
  const load = (h: HostCandidate) =>
    Math.max(h.committedVcpus / (h.vcpus * overcommit.cpu || 1), h.committedMemoryMb / (h.memoryMb * overcommit.memory || 1));
  return [...hosts].sort((a, b) => load(a) - load(b) || a.id.localeCompare(b.id));
}

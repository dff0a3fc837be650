/**
 * What placement knows of each host, built from the database's record of it: the capacity its
 * agent reported and the use it last measured, the CPU and memory its running desktops commit,
 * and the storage slots its placed desktops hold. The engine places with these numbers and the admin API shows the same ones, so
 * what an operator reads is what placement decides by.
 */
import { TIER_SPECS, type Tier } from '../../../shared/src/tiers.js';
import type { HostRow } from '../store/rows.js';
import type { HostCandidate } from './feasible.js';

/** Desktops of one tier that are running or about to run on a host (store/hosts.ts `committedLoad`). */
export interface CommittedLoadRow {
  host_id: string;
  tier: string;
  count: number;
  /** Of those, the awake and hibernating ones (a waking one is counted by its admission). */
  started: number;
}

export interface CandidateContext {
  /** Whether this replica's agent link to the host is up. */
  isConnected(hostId: string): boolean;
  /** Storage slots every host offers (CANTO_HOST_SLOTS). */
  hostSlots: number;
}

export function hostCandidates(
  hosts: readonly HostRow[],
  load: readonly CommittedLoadRow[],
  slotsUsed: ReadonlyMap<string, number>,
  context: CandidateContext,
): HostCandidate[] {
  const committed = new Map<string, { vcpus: number; memoryMb: number; desktops: number }>();
  for (const l of load) {
    const spec = TIER_SPECS[l.tier as Tier];
    const sum = committed.get(l.host_id) ?? { vcpus: 0, memoryMb: 0, desktops: 0 };
    sum.vcpus += spec.vcpus * l.count;
    sum.memoryMb += spec.memoryMb * l.count;
    sum.desktops += l.started;
    committed.set(l.host_id, sum);
  }
  return hosts.map((h) => ({
    id: h.id,
    connected: context.isConnected(h.id),
    ready: h.status === 'ready',
    cordoned: h.cordoned,
    vcpus: h.vcpus,
    memoryMb: h.memory_mb,
    committedVcpus: committed.get(h.id)?.vcpus ?? 0,
    committedMemoryMb: committed.get(h.id)?.memoryMb ?? 0,
    committedDesktops: committed.get(h.id)?.desktops ?? 0,
    measured: h.memory_available_mb === null || h.running_desktops === null ? null : { memoryAvailableMb: h.memory_available_mb, runningDesktops: h.running_desktops },
    slots: context.hostSlots,
    slotsUsed: slotsUsed.get(h.id) ?? 0,
  }));
}

/**
 * Placement, step 1 of 3 — feasibility: hosts that are connected, ready, not cordoned, and have
 * room for the tier. Room is three things:
 *
 * - memory, as measured: the host's available memory (its agent's last heartbeat), less an
 *   expected size for each desktop started since that measure and for the new one, must stay above
 *   a reserve. A host that reports no measure (an agent older than protocol 1.11, or one that just
 *   said hello) counts every running desktop at the expected size against its memory instead. This
 *   is what refuses before the host runs out of memory; tier sizes stay cgroup limits;
 * - nominal sizes, when an operator caps them: the tiers' CPU and memory of the running desktops
 *   within reported capacity times the overcommit. Off (0) by default: an idle desktop uses a few
 *   MiB of its 4 GiB limit, and a nominal cap held a 2-core, 24 GiB host to 8 idle desktops;
 * - a storage slot for the desktop's disk and snapshot (every placed desktop holds its slots,
 *   awake or hibernated; see TIER_SPECS).
 */
import { TIER_SPECS, type Tier } from '../../../shared/src/tiers.js';

/** The host's use as its agent last measured it (protocol 1.11 heartbeats). */
export interface MeasuredHostUse {
  readonly memoryAvailableMb: number;
  /** Desktops running when it was measured. */
  readonly runningDesktops: number;
}

export interface HostCandidate {
  readonly id: string;
  readonly connected: boolean;
  readonly ready: boolean;
  readonly cordoned: boolean;
  readonly vcpus: number;
  readonly memoryMb: number;
  readonly committedVcpus: number;
  readonly committedMemoryMb: number;
  /**
   * Desktops that run or were admitted to (awake or hibernating, and wakes admitted but not yet
   * awake): what the host's memory must hold beside what its measure shows.
   */
  readonly committedDesktops: number;
  /** Null when the agent has not reported one. */
  readonly measured: MeasuredHostUse | null;
  /** Storage slots the host offers, and the slots its placed desktops hold. */
  readonly slots: number;
  readonly slotsUsed: number;
}

export interface PlacementPolicy {
  /** Nominal caps: running desktops' tier vCPUs and memory within reported capacity times these; 0 is no cap. */
  readonly cpuOvercommit: number;
  readonly memoryOvercommit: number;
  /** Share of a host's memory placement keeps free, in percent. */
  readonly memoryReservePercent: number;
  /** What a desktop the host's measure does not show yet is expected to use, in MiB. */
  readonly desktopExpectedMb: number;
}

export function feasibleHosts(hosts: readonly HostCandidate[], tier: Tier, policy: PlacementPolicy): HostCandidate[] {
  return hosts.filter((h) => h.connected && h.ready && !h.cordoned && nominalRoom(h, tier, policy) && memoryRoomMb(h, policy) >= policy.desktopExpectedMb && hasSlots(h, tier, 1));
}

/** Whether the tier's nominal CPU and memory fit under the caps that are on. */
export function nominalRoom(h: HostCandidate, tier: Tier, policy: PlacementPolicy): boolean {
  const need = TIER_SPECS[tier];
  return (
    (policy.cpuOvercommit <= 0 || h.committedVcpus + need.vcpus <= h.vcpus * policy.cpuOvercommit) &&
    (policy.memoryOvercommit <= 0 || h.committedMemoryMb + need.memoryMb <= h.memoryMb * policy.memoryOvercommit)
  );
}

/** The memory the host keeps free: `memoryReservePercent` of what it has. */
export function memoryReserveMb(h: Pick<HostCandidate, 'memoryMb'>, policy: PlacementPolicy): number {
  return Math.ceil((h.memoryMb * policy.memoryReservePercent) / 100);
}

/**
 * Memory a new desktop may still take before the host reaches its reserve, in MiB (negative when
 * past it). Desktops committed since the measure (more than it saw running) count at the expected
 * size; without a measure, every committed desktop does.
 */
export function memoryRoomMb(h: HostCandidate, policy: PlacementPolicy): number {
  const free = h.measured === null
    ? h.memoryMb - h.committedDesktops * policy.desktopExpectedMb
    : h.measured.memoryAvailableMb - Math.max(0, h.committedDesktops - h.measured.runningDesktops) * policy.desktopExpectedMb;
  return free - memoryReserveMb(h, policy);
}

/** Why a schedulable host cannot take a desktop of the tier (the first limit it is at); null when it can. */
export function limitReached(h: HostCandidate, tier: Tier, policy: PlacementPolicy): 'memory' | 'nominal' | 'slots' | null {
  if (memoryRoomMb(h, policy) < policy.desktopExpectedMb) return 'memory';
  if (!nominalRoom(h, tier, policy)) return 'nominal';
  if (!hasSlots(h, tier, 1)) return 'slots';
  return null;
}

/** Whether `count` more desktops of `tier` fit in the host's storage slots. */
export function hasSlots(h: Pick<HostCandidate, 'slots' | 'slotsUsed'>, tier: Tier, count: number): boolean {
  return h.slotsUsed + TIER_SPECS[tier].slots * count <= h.slots;
}

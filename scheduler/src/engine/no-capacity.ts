/**
 * Placement's refusal: no schedulable host has room, and why, in words an API client can act on.
 */
import type { Tier } from '../../../shared/src/tiers.js';
import { limitReached, type HostCandidate, type PlacementPolicy } from '../placement/feasible.js';

/**
 * No schedulable host has room for the desktop. Retried while room may still appear (a desktop
 * hibernating, a host joining or being uncordoned) for the engine's `capacityWaitMs`, then the
 * operation fails with code `no_capacity` and this message, which says what placement saw.
 */
export class NoCapacity extends Error {
  readonly code = 'no_capacity';
}

/** Why nothing has room, in a sentence an API client can act on (no host ids). */
export function noCapacityMessage(tier: Tier, hosts: readonly HostCandidate[], policy: PlacementPolicy, what = 'host'): string {
  const ready = hosts.filter((h) => h.connected && h.ready);
  const schedulable = ready.filter((h) => !h.cordoned);
  if (schedulable.length === 0) {
    return ready.length === 0 ? `no ${what} is up to take a ${tier} desktop` : `every ${what} that is up is cordoned or draining`;
  }
  const at = { memory: 0, nominal: 0, slots: 0 };
  for (const h of schedulable) {
    const limit = limitReached(h, tier, policy);
    if (limit !== null) at[limit] += 1;
  }
  const reasons = [
    at.memory > 0 ? `${at.memory} short of memory (its measured use and one more desktop would leave less than its ${policy.memoryReservePercent}% reserve free)` : null,
    at.nominal > 0 ? `${at.nominal} at the nominal CPU or memory cap for running desktops` : null,
    at.slots > 0 ? `${at.slots} out of storage slots` : null,
  ].filter((r) => r !== null);
  return `no ${what} has room for a ${tier} desktop: ${schedulable.length} schedulable, ${reasons.join(', ') || 'each at a limit'}`;
}

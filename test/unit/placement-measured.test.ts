/**
 * Placement by measured use: a host takes desktops while its available memory, less an expected
 * size for each desktop its measure does not show yet, stays above a reserve. Nominal tier sizes
 * cap only when an overcommit is set; by default a 2-core, 24 GiB host takes a thousand idle
 * small desktops, and a host whose measure says it is full takes none whatever the nominal caps.
 */
import { describe, expect, it } from 'vitest';
import { feasibleHosts, limitReached, memoryReserveMb, memoryRoomMb, type HostCandidate, type PlacementPolicy } from '../../scheduler/src/placement/feasible.js';
import { PlacementReservations } from '../../scheduler/src/placement/reservations.js';
import { selectHost } from '../../scheduler/src/placement/select.js';
import { noCapacityMessage } from '../../scheduler/src/engine/steps.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';

const config = loadSchedulerConfig({ DATABASE_URL: 'postgres://x', CANTO_SECRET_KEY: 'x' });
const defaults: PlacementPolicy = config.placement;

/** This machine: 2 cores, 24 GiB. */
const host = (id: string, over: Partial<HostCandidate> = {}): HostCandidate => ({
  id,
  connected: true,
  ready: true,
  cordoned: false,
  vcpus: 2,
  memoryMb: 24_000,
  committedVcpus: 0,
  committedMemoryMb: 0,
  committedDesktops: 0,
  measured: { memoryAvailableMb: 22_000, runningDesktops: 0 },
  slots: 2048,
  slotsUsed: 0,
  ...over,
});

/** `n` awake small desktops, as the database counts them, all seen running by the measure. */
const awakeSmall = (n: number, memoryAvailableMb: number): Partial<HostCandidate> => ({
  committedVcpus: 2 * n, committedMemoryMb: 4096 * n, committedDesktops: n, slotsUsed: n,
  measured: { memoryAvailableMb, runningDesktops: n },
});

describe('placement by measured memory', () => {
  it('has no nominal cap by default: 10 % of memory reserved, 256 MiB expected per unseen desktop, 2048 slots', () => {
    expect(defaults).toEqual({ cpuOvercommit: 0, memoryOvercommit: 0, memoryReservePercent: 10, desktopExpectedMb: 256 });
    expect(config.hostSlots).toBe(2048);
  });

  it('takes the thousandth idle small desktop on a 2-core, 24 GiB host with default settings', () => {
    // 999 idle desktops at ≈11 MiB each left 11 GiB available.
    const busy = host('a', awakeSmall(999, 11_000));
    expect(selectHost([busy], 'small', defaults)).toBe('a');
    // The old nominal caps (8× CPU, 2× memory) stopped this host at 8.
    expect(selectHost([host('a', awakeSmall(8, 21_900))], 'small', { ...defaults, cpuOvercommit: 8, memoryOvercommit: 2 })).toBeNull();
  });

  it('refuses once the measure says the next desktop would eat into the reserve, whatever the nominal caps admit', () => {
    const reserve = memoryReserveMb(host('a'), defaults);
    expect(reserve).toBe(2400);
    const generous = { ...defaults, cpuOvercommit: 1000, memoryOvercommit: 1000 };
    expect(feasibleHosts([host('a', awakeSmall(10, reserve + 256))], 'small', generous)).toHaveLength(1);
    expect(feasibleHosts([host('a', awakeSmall(10, reserve + 255))], 'small', generous)).toHaveLength(0);
    expect(limitReached(host('a', awakeSmall(10, reserve + 255)), 'small', generous)).toBe('memory');
  });

  it('counts desktops the measure has not seen yet at the expected size', () => {
    // 20 committed, the last measure saw 12 running: 8 unseen count 256 MiB each.
    const h = host('a', { committedDesktops: 20, measured: { memoryAvailableMb: 10_000, runningDesktops: 12 } });
    expect(memoryRoomMb(h, defaults)).toBe(10_000 - 8 * 256 - 2400);
    // More running than committed (desktops hibernated since) never adds room.
    const after = host('a', { committedDesktops: 5, measured: { memoryAvailableMb: 10_000, runningDesktops: 12 } });
    expect(memoryRoomMb(after, defaults)).toBe(10_000 - 2400);
  });

  it('counts every running desktop at the expected size on a host that reports no measure', () => {
    const old = host('a', { measured: null, committedDesktops: 10 });
    expect(memoryRoomMb(old, defaults)).toBe(24_000 - 10 * 256 - 2400);
    // (24000 − 2400) / 256 = 84.4: the 85th desktop does not fit.
    expect(selectHost([host('a', { measured: null, committedDesktops: 83 })], 'small', defaults)).toBe('a');
    expect(selectHost([host('a', { measured: null, committedDesktops: 84 })], 'small', defaults)).toBeNull();
  });

  it('still applies nominal caps an operator sets, and storage slots', () => {
    const capped = { ...defaults, cpuOvercommit: 8, memoryOvercommit: 2 };
    expect(limitReached(host('a', awakeSmall(8, 20_000)), 'small', capped)).toBe('nominal');
    expect(limitReached(host('a', { slots: 4, slotsUsed: 4 }), 'small', defaults)).toBe('slots');
    expect(limitReached(host('a'), 'small', defaults)).toBeNull();
  });

  it('says in the no_capacity message which limit each schedulable host is at', () => {
    const fleet = [host('a', awakeSmall(900, 2_500)), host('b', { slots: 1, slotsUsed: 1 }), host('c', { cordoned: true })];
    expect(noCapacityMessage('small', fleet, defaults)).toBe(
      'no host has room for a small desktop: 2 schedulable, 1 short of memory (its measured use and one more desktop would leave less than its 10% reserve free), 1 out of storage slots',
    );
  });

  it('admits a burst of wakes up to the room there is, each counted from its admission', async () => {
    // Room for 3 unseen desktops: 2400 reserve + 3 × 256 = 3168 available.
    const fleet = [host('a', { measured: { memoryAvailableMb: 3200, runningDesktops: 0 } })];
    const ledger = new PlacementReservations();
    const admit = (id: string) => ledger.choose(
      { desktopId: id, tier: 'small', running: true },
      async () => ({ hosts: fleet, placed: new Map([[id, 'a']]) }),
      (hosts) => (memoryRoomMb(hosts[0]!, defaults) >= defaults.desktopExpectedMb ? 'a' : null),
    );
    const admitted = await Promise.all(['w1', 'w2', 'w3', 'w4', 'w5'].map(admit));
    expect(admitted).toEqual(['a', 'a', 'a', null, null]);
    // One is awake and released: the next measure will show it; until then its room is back.
    ledger.release('w1');
    expect(await admit('w4')).toBe('a');
  });
});

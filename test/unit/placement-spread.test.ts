/**
 * Placement that spreads: ranking by free capacity counts storage slots (a placed desktop holds
 * them awake or not), so desktops that were only created still make a host busier; choices made
 * while earlier ones are still in flight count those too.
 */
import { describe, expect, it } from 'vitest';
import type { HostCandidate, PlacementPolicy } from '../../scheduler/src/placement/feasible.js';
import { hostUse, rankHosts } from '../../scheduler/src/placement/rank.js';
import { selectHost } from '../../scheduler/src/placement/select.js';
import { PlacementReservations } from '../../scheduler/src/placement/reservations.js';
import { TIER_SPECS, type Tier } from '../../shared/src/tiers.js';

/** Nominal caps at these overcommits; measured memory at its defaults (10 % reserve, 256 MiB expected). */
const nominal = (cpu: number, memory: number): PlacementPolicy => ({ cpuOvercommit: cpu, memoryOvercommit: memory, memoryReservePercent: 10, desktopExpectedMb: 256 });

const overcommit = nominal(8, 2);
const host = (id: string, over: Partial<HostCandidate> = {}): HostCandidate => ({
  id,
  connected: true,
  ready: true,
  cordoned: false,
  vcpus: 4,
  memoryMb: 16384,
  committedVcpus: 0,
  committedMemoryMb: 0,
  committedDesktops: 0,
  measured: null,
  slots: 128,
  slotsUsed: 0,
  ...over,
});

/** Places `count` desktops of `tier` one after another, committing each, as the engine does. */
function placeAll(hosts: HostCandidate[], count: number, tier: Tier = 'small'): Record<string, number> {
  const landed: Record<string, number> = Object.fromEntries(hosts.map((h) => [h.id, 0]));
  let fleet = hosts;
  for (let i = 0; i < count; i++) {
    const id = selectHost(fleet, tier, overcommit);
    if (id === null) break;
    landed[id]!++;
    fleet = fleet.map((h) => (h.id === id ? { ...h, slotsUsed: h.slotsUsed + TIER_SPECS[tier].slots } : h));
  }
  return landed;
}

describe('ranking by free capacity', () => {
  it('counts slots held by desktops that are not awake', () => {
    // a holds 10 hibernated desktops and no awake load: it is busier than an empty b.
    expect(rankHosts([host('a', { slotsUsed: 10 }), host('b')], overcommit).map((h) => h.id)).toEqual(['b', 'a']);
  });

  it('lets the busiest resource decide, then use over all, then the id', () => {
    const hosts = [
      host('a', { slotsUsed: 64 }), // slots 50 %
      host('b', { committedVcpus: 16 }), // cpu 50 %
      host('c', { committedVcpus: 16, slotsUsed: 32 }), // cpu 50 %, slots 25 %: more used over all than b
      host('d', { committedMemoryMb: 8192 }), // memory 25 %
    ];
    expect(rankHosts(hosts, overcommit).map((h) => h.id)).toEqual(['d', 'a', 'b', 'c']);
    expect(hostUse(hosts[2]!, overcommit)).toEqual({ cpu: 0.5, memory: 0, slots: 0.25 });
  });

  it('spreads 12 desktops over 3 equal hosts 4/4/4, and over unequal ones by size', () => {
    expect(placeAll([host('a'), host('b'), host('c')], 12)).toEqual({ a: 4, b: 4, c: 4 });
    expect(placeAll([host('a', { slots: 64 }), host('b', { slots: 128 })], 12)).toEqual({ a: 4, b: 8 });
  });

  it('gives cordoned, down and unlinked hosts nothing', () => {
    const hosts = [host('a', { cordoned: true }), host('b', { ready: false }), host('c', { connected: false }), host('d', { slotsUsed: 100 })];
    expect(placeAll(hosts, 5)).toEqual({ a: 0, b: 0, c: 0, d: 5 });
  });
});

describe('placements in flight', () => {
  it('counts a chosen desktop against its host until it is released', async () => {
    const ledger = new PlacementReservations();
    const fleet = [host('a'), host('b'), host('c')];
    const read = async () => ({ hosts: fleet, placed: new Map<string, string>() });
    const pick = (hosts: HostCandidate[]) => selectHost(hosts, 'small', overcommit);
    // Six choices at once, none committed yet: two per host.
    const chosen = await Promise.all(Array.from({ length: 6 }, (_, i) => ledger.choose({ desktopId: `d${i}`, tier: 'small', running: false }, read, pick)));
    expect(chosen.sort()).toEqual(['a', 'a', 'b', 'b', 'c', 'c']);
    expect(ledger.size).toBe(6);
    for (let i = 0; i < 6; i++) ledger.release(`d${i}`);
    expect(ledger.size).toBe(0);
  });

  it('counts a desktop the database already shows placed once, and a waking one on CPU and memory too', async () => {
    const ledger = new PlacementReservations();
    let seen: HostCandidate[] = [];
    const pick = (hosts: HostCandidate[]) => ((seen = hosts), 'a');
    await ledger.choose({ desktopId: 'd1', tier: 'default', running: true }, async () => ({ hosts: [host('a')], placed: new Map() }), pick);
    await ledger.choose({ desktopId: 'd2', tier: 'small', running: false }, async () => ({ hosts: [host('a')], placed: new Map() }), pick);
    expect(seen[0]).toMatchObject({ slotsUsed: 2, committedVcpus: 4, committedMemoryMb: 8192, committedDesktops: 1 });
    // d1 committed: the database's numbers include it, the ledger adds only d2.
    await ledger.choose({ desktopId: 'd3', tier: 'small', running: false }, async (inFlight) => {
      expect(inFlight.sort()).toEqual(['d1', 'd2']);
      return { hosts: [host('a', { slotsUsed: 2 })], placed: new Map([['d1', 'a']]) };
    }, pick);
    // …but d1 is waking, not yet awake: it still weighs on measured memory from its reservation.
    expect(seen[0]).toMatchObject({ slotsUsed: 3, committedVcpus: 0, committedDesktops: 1 });
  });

  it('counts a desktop being moved on its target, though the database shows it on its source', async () => {
    const ledger = new PlacementReservations();
    let seen: HostCandidate[] = [];
    const pick = (hosts: HostCandidate[]) => ((seen = hosts), 'b');
    const moving = async () => ({ hosts: [host('a', { slotsUsed: 1 }), host('b')], placed: new Map([['m1', 'a']]) });
    await ledger.choose({ desktopId: 'm1', tier: 'small', running: true }, moving, pick);
    await ledger.choose({ desktopId: 'm2', tier: 'small', running: false }, moving, pick);
    expect(seen.find((h) => h.id === 'b')).toMatchObject({ slotsUsed: 1, committedVcpus: 2, committedDesktops: 1 });
    expect(seen.find((h) => h.id === 'a')).toMatchObject({ slotsUsed: 1, committedVcpus: 0, committedDesktops: 0 });
  });

  it('counts a placement that commits after the read began and is released before it ended', async () => {
    // The read's snapshot is taken before d1 commits, so the database does not show d1; d1 is
    // released while the read is still running. It must still count, from the reservation.
    const ledger = new PlacementReservations();
    let seen: HostCandidate[] = [];
    await ledger.choose({ desktopId: 'd1', tier: 'small', running: false }, async () => ({ hosts: [host('a')], placed: new Map() }), () => 'a');
    await ledger.choose({ desktopId: 'd2', tier: 'small', running: false }, async () => {
      ledger.release('d1');
      return { hosts: [host('a')], placed: new Map() };
    }, (hosts) => ((seen = hosts), 'a'));
    expect(seen[0]).toMatchObject({ slotsUsed: 1 });
  });

  it('keeps choosing after a read fails', async () => {
    const ledger = new PlacementReservations();
    const pick = () => 'a';
    await expect(ledger.choose({ desktopId: 'd1', tier: 'small', running: false }, async () => Promise.reject(new Error('db down')), pick)).rejects.toThrow('db down');
    await expect(ledger.choose({ desktopId: 'd2', tier: 'small', running: false }, async () => ({ hosts: [host('a')], placed: new Map() }), pick)).resolves.toBe('a');
  });
});

/** Placement pipeline: feasibility (status, link, cordon, capacity with overcommit), ranking, selection. */
import { describe, expect, it } from 'vitest';
import { feasibleHosts, hasSlots, type HostCandidate, type PlacementPolicy } from '../../scheduler/src/placement/feasible.js';
import { rankHosts } from '../../scheduler/src/placement/rank.js';
import { selectHost } from '../../scheduler/src/placement/select.js';

/** Nominal caps at these overcommits; measured memory at its defaults (10 % reserve, 256 MiB expected). */
const nominal = (cpu: number, memory: number): PlacementPolicy => ({ cpuOvercommit: cpu, memoryOvercommit: memory, memoryReservePercent: 10, desktopExpectedMb: 256 });

const host = (id: string, over: Partial<HostCandidate> = {}): HostCandidate => ({
  id,
  connected: true,
  ready: true,
  cordoned: false,
  vcpus: 2,
  memoryMb: 8192,
  committedVcpus: 0,
  committedMemoryMb: 0,
  committedDesktops: 0,
  measured: null,
  slots: 64,
  slotsUsed: 0,
  ...over,
});
const none = nominal(1, 1);

describe('placement', () => {
  it('drops hosts that are disconnected, down or cordoned', () => {
    const hosts = [host('a', { connected: false }), host('b', { ready: false }), host('c', { cordoned: true }), host('d')];
    expect(feasibleHosts(hosts, 'small', none).map((h) => h.id)).toEqual(['d']);
  });

  it('needs free storage slots for the tier, hibernated desktops included', () => {
    // small holds 1 slot, large 4.
    expect(feasibleHosts([host('a', { slots: 4, slotsUsed: 3 })], 'small', none)).toHaveLength(1);
    expect(feasibleHosts([host('a', { slots: 4, slotsUsed: 4 })], 'small', none)).toHaveLength(0);
    expect(feasibleHosts([host('a', { slots: 4, slotsUsed: 1 })], 'large', none)).toHaveLength(0);
    expect(hasSlots({ slots: 8, slotsUsed: 4 }, 'large', 1)).toBe(true);
    expect(hasSlots({ slots: 8, slotsUsed: 4 }, 'large', 2)).toBe(false);
    expect(hasSlots({ slots: 20, slotsUsed: 0 }, 'small', 20)).toBe(true);
  });

  it('checks CPU and memory capacity after overcommit', () => {
    // small = 2 vCPU / 4096 MiB. A 2-vCPU host fits one small desktop without overcommit…
    expect(feasibleHosts([host('a')], 'small', none)).toHaveLength(1);
    expect(feasibleHosts([host('a', { committedVcpus: 2 })], 'small', none)).toHaveLength(0);
    // …and four with 4× CPU overcommit, as long as memory (8 GiB × 2 = 16 GiB) holds.
    expect(feasibleHosts([host('a', { committedVcpus: 6, committedMemoryMb: 12288 })], 'small', nominal(4, 2))).toHaveLength(1);
    expect(feasibleHosts([host('a', { committedVcpus: 6, committedMemoryMb: 12289 })], 'small', nominal(4, 2))).toHaveLength(0);
    // large = 8 vCPU never fits a 2-vCPU host at 2× CPU overcommit.
    expect(feasibleHosts([host('a')], 'large', nominal(2, 8))).toHaveLength(0);
  });

  it('ranks by the busier resource, least loaded first, ties by id', () => {
    const hosts = [
      host('c', { committedVcpus: 1 }), // cpu 50 %
      host('b', { committedMemoryMb: 6144 }), // memory 75 %
      host('a', { committedVcpus: 1 }), // cpu 50 %, ties with c
      host('d'),
    ];
    expect(rankHosts(hosts, none).map((h) => h.id)).toEqual(['d', 'a', 'c', 'b']);
  });

  it('selects the best feasible host, or none', () => {
    const overcommit = nominal(8, 2);
    expect(selectHost([host('x', { committedVcpus: 8 }), host('y')], 'default', overcommit)).toBe('y');
    expect(selectHost([host('x', { connected: false })], 'default', overcommit)).toBeNull();
  });
});

/**
 * Heartbeats never wait for the host's measure: a meter whose reads are slow (its file-system
 * calls queued behind a move's copy) must not make a healthy host read silent to the schedulers.
 * They carry the last measure, and the meter's figures come from /proc and the driver's usage.
 */
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Heartbeats, type BeatingLink } from '../../agent/src/heartbeats.js';
import { cpuTimes, memAvailableMb, ProcHostMeter, type HostMeasure, type HostMeter } from '../../agent/src/host-meter.js';
import type { MeasuredUse } from '../../shared/src/protocol.js';
import { silentLogger } from '../../shared/src/log.js';
import { until } from '../helpers/wait.js';

interface Beat { at: number; running: number; measured?: MeasuredUse }

function fakeLink(): BeatingLink & { beats: Beat[] } {
  const beats: Beat[] = [];
  return {
    beats,
    ws: { ping: () => undefined, terminate: () => undefined } as unknown as BeatingLink['ws'],
    peer: { isOpen: true, notify: (_type: string, payload: { running_desktops: number; measured?: MeasuredUse }) =>
      beats.push({ at: Date.now(), running: payload.running_desktops, measured: payload.measured }) } as unknown as BeatingLink['peer'],
    lastSeenAt: performance.now(),
    label: {},
  };
}

let heartbeats: Heartbeats | null = null;
afterEach(() => heartbeats?.stop());

describe('Heartbeats', () => {
  it('beats on time while measuring the host takes longer than several intervals', async () => {
    let reads = 0;
    let release: () => void = () => undefined;
    const measure: HostMeasure = { running: 1, measured: { memory_available_mb: 1000, desktops_memory_mb: 12, cpu_busy: 0.25 } };
    const meter: HostMeter = {
      // The first read answers at once; later ones hang until released.
      read: async () => {
        if (reads++ > 0) await new Promise<void>((r) => (release = r));
        return measure;
      },
    };
    const link = fakeLink();
    heartbeats = new Heartbeats(meter, () => [link], silentLogger());
    const started = Date.now();
    await heartbeats.start(20, link);
    await new Promise((r) => setTimeout(r, 300));
    // About fifteen intervals passed with the listing stuck: every one of them beat.
    expect(link.beats.length).toBeGreaterThanOrEqual(10);
    const gaps = link.beats.slice(1).map((b, i) => b.at - link.beats[i]!.at);
    expect(Math.max(...gaps), `gaps ${gaps.join(',')} since ${started}`).toBeLessThan(150);
    // They carry the last count read.
    expect(link.beats.at(-1)).toMatchObject({ running: 1, measured: measure.measured });
    release();
  });

  it('keeps a link that answers although the wall clock jumps an hour ahead (link liveness runs on a monotonic clock)', async () => {
    const meter: HostMeter = { read: async () => ({ running: 1, measured: { memory_available_mb: 1, desktops_memory_mb: 1, cpu_busy: 0 } }) };
    let terminated = false;
    const link = { ...fakeLink(), ws: { ping: () => undefined, terminate: () => (terminated = true) } as unknown as BeatingLink['ws'] };
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      vi.setSystemTime(Date.now() + 3_600_000);
      heartbeats = new Heartbeats(meter, () => [link], silentLogger());
      await heartbeats.start(20, link);
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      vi.useRealTimers();
    }
    expect(terminated).toBe(false);
  });

  it('leaves the measured use out when standing for an agent older than protocol 1.11', async () => {
    const meter: HostMeter = { read: async () => ({ running: 2, measured: { memory_available_mb: 1, desktops_memory_mb: 1, cpu_busy: 0 } }) };
    const link = fakeLink();
    heartbeats = new Heartbeats(meter, () => [link], silentLogger(), false);
    await heartbeats.start(20, link);
    await until(() => link.beats.some((b) => b.running === 2), 5_000, 'a beat with the count');
    expect(link.beats.every((b) => b.measured === undefined)).toBe(true);
  });
});

describe('ProcHostMeter', () => {
  it('reads MemAvailable and the CPU busy fraction between two reads of /proc/stat', () => {
    expect(memAvailableMb('MemTotal:       24683520 kB\nMemFree:  100 kB\nMemAvailable:   23714816 kB\n')).toBe(23159);
    expect(memAvailableMb('MemTotal: 1 kB\n')).toBeNull();
    // user nice system idle iowait irq softirq steal
    const before = cpuTimes('cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n');
    const after = cpuTimes('cpu  400 0 100 1300 100 0 0 0 0 0\n');
    expect(before).toEqual({ total: 1000, idle: 800 });
    expect(1 - (after.idle - before.idle) / (after.total - before.total)).toBeCloseTo(1 / 3);
  });

  it("reports the driver's running desktops and their memory, and this machine's available memory", async () => {
    const meter = new ProcHostMeter({ usage: async () => ({ running: 3, memoryBytes: 30 * 1024 * 1024 }) });
    const first = await meter.read();
    expect(first.running).toBe(3);
    expect(first.measured.desktops_memory_mb).toBe(30);
    expect(first.measured.memory_available_mb).toBeGreaterThan(0);
    const second = await meter.read();
    expect(second.measured.cpu_busy).toBeGreaterThanOrEqual(0);
    expect(second.measured.cpu_busy).toBeLessThanOrEqual(1);
  });
});

/**
 * What the host uses now, for the heartbeat (protocol 1.11 `measured`): the memory the kernel says
 * is available, the memory charged to the desktops, how many of them run, and the fraction of the
 * CPU that was busy since the previous read. Every figure comes from a fixed handful of reads
 * (/proc/meminfo, /proc/stat, the driver's `usage()`), so a host with a thousand idle desktops
 * costs the same to measure as one with none: nothing here visits desktops one by one.
 */
import { readFile } from 'node:fs/promises';
import type { MeasuredUse } from '../../shared/src/protocol.js';
import type { DesktopLifecycle } from './runtime/driver.js';

export interface HostMeasure {
  readonly running: number;
  readonly measured: MeasuredUse;
}

export interface HostMeter {
  read(): Promise<HostMeasure>;
}

const MIB = 1024 * 1024;

/** CPU jiffies from the first line of /proc/stat: all of them, and the idle ones (idle + iowait). */
export function cpuTimes(procStat: string): { total: number; idle: number } {
  const fields = (procStat.split('\n', 1)[0] ?? '').trim().split(/\s+/).slice(1).map(Number);
  const total = fields.reduce((a, b) => a + (Number.isFinite(b) ? b : 0), 0);
  return { total, idle: (fields[3] ?? 0) + (fields[4] ?? 0) };
}

/** MemAvailable from /proc/meminfo, in MiB; null when the kernel does not say it. */
export function memAvailableMb(meminfo: string): number | null {
  const match = /^MemAvailable:\s+(\d+) kB/m.exec(meminfo);
  return match ? Math.floor(Number(match[1]) / 1024) : null;
}

/** The meter of the machine the agent runs on. */
export class ProcHostMeter implements HostMeter {
  private last: { total: number; idle: number } | null = null;

  constructor(private readonly driver: Pick<DesktopLifecycle, 'usage'>) {}

  async read(): Promise<HostMeasure> {
    const [usage, meminfo, stat] = await Promise.all([
      this.driver.usage(),
      readFile('/proc/meminfo', 'utf8'),
      readFile('/proc/stat', 'utf8'),
    ]);
    const now = cpuTimes(stat);
    const previous = this.last;
    this.last = now;
    const spent = previous === null ? 0 : now.total - previous.total;
    const busy = spent > 0 ? 1 - (now.idle - previous!.idle) / spent : 0;
    return {
      running: usage.running,
      measured: {
        memory_available_mb: memAvailableMb(meminfo) ?? 0,
        desktops_memory_mb: Math.round(usage.memoryBytes / MIB),
        cpu_busy: Math.min(1, Math.max(0, Math.round(busy * 1000) / 1000)),
      },
    };
  }
}

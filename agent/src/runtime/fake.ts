/**
 * An in-memory runtime driver for fast unit and link tests. It never replaces the real runtime in
 * the end-to-end suite; its job is to let the channel and handlers be tested without root, CRIU or
 * seconds per boot.
 *
 * It keeps the contract the real drivers keep, because tests of the layers above rely on it:
 * every method is idempotent (start on a running desktop succeeds, hibernate on a stopped one
 * succeeds, destroy of an unknown one succeeds), first-boot settings apply once per disk, and it
 * refuses work on desktops it does not hold (`not_found`) or that are not running (`not_running`)
 * instead of pretending. `events` records the begin and end of each call so tests can check that
 * commands for one desktop never interleave; `delayMs` makes those windows wide.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { Tier } from '../../../shared/src/tiers.js';
import type {
  DesktopStatus,
  ExecOutcome,
  ExecSpec,
  FirstBootSpec,
  RuntimeCapabilities,
  RuntimeDriver,
  StartSpec,
} from './driver.js';

export interface FakeDesktop {
  tier: Tier;
  running: boolean;
  hasSnapshot: boolean;
  /** The first-boot settings applied to this disk, once; null until then. */
  firstBoot: FirstBootSpec | null;
  /** How many times first boot was applied; anything above 1 is a bug. */
  firstBootRuns: number;
  coldBoots: number;
  restores: number;
}

export interface FakeDriverOptions {
  /** Added to every lifecycle call, in ms. Default 0. */
  readonly delayMs?: number;
  /** Whether hibernate keeps memory. Default true. */
  readonly memorySnapshots?: boolean;
}

export class FakeDriver implements RuntimeDriver {
  readonly desktops = new Map<string, FakeDesktop>();
  /** `"<method>:begin <id>"` and `"<method>:end <id>"`, in order. */
  readonly events: string[] = [];
  closed = false;
  private readonly delayMs: number;
  private readonly memorySnapshots: boolean;
  /** Aborts sleeps in progress on close, so a closed driver leaves no timers behind. */
  private readonly closing = new AbortController();

  constructor(options: FakeDriverOptions = {}) {
    this.delayMs = options.delayMs ?? 0;
    this.memorySnapshots = options.memorySnapshots ?? true;
  }

  capabilities(): RuntimeCapabilities {
    return { runtime: 'fake', memorySnapshots: this.memorySnapshots };
  }

  prepare(desktopId: string, tier: Tier): Promise<void> {
    return this.step('prepare', desktopId, () => {
      if (this.desktops.has(desktopId)) return;
      this.desktops.set(desktopId, {
        tier, running: false, hasSnapshot: false, firstBoot: null, firstBootRuns: 0, coldBoots: 0, restores: 0,
      });
    });
  }

  start(spec: StartSpec): Promise<{ restored: boolean }> {
    return this.step('start', spec.desktopId, () => {
      const desktop = this.require(spec.desktopId);
      if (desktop.running) return { restored: false };
      desktop.running = true;
      if (desktop.hasSnapshot) {
        desktop.hasSnapshot = false;
        desktop.restores++;
        return { restored: true };
      }
      desktop.coldBoots++;
      if (spec.firstBoot && desktop.firstBootRuns === 0) {
        desktop.firstBoot = spec.firstBoot;
        desktop.firstBootRuns++;
      }
      return { restored: false };
    });
  }

  hibernate(desktopId: string): Promise<{ snapshot: boolean }> {
    return this.step('hibernate', desktopId, () => {
      const desktop = this.require(desktopId);
      if (desktop.running) {
        desktop.running = false;
        desktop.hasSnapshot = this.memorySnapshots;
      }
      return { snapshot: desktop.hasSnapshot };
    });
  }

  destroy(desktopId: string): Promise<void> {
    return this.step('destroy', desktopId, () => {
      this.desktops.delete(desktopId);
    });
  }

  /**
   * Understands `true`, `false`, `exit N`, `echo WORDS` and `sleep SECONDS`; anything else exits
   * 127 like a shell would for an unknown command.
   */
  async exec(desktopId: string, spec: ExecSpec): Promise<ExecOutcome> {
    const desktop = this.require(desktopId);
    if (!desktop.running) throw new AgentFailure('not_running', `${desktopId} is not running`, false);
    const [name = '', ...args] = spec.command.trim().split(/\s+/);
    switch (name) {
      case 'true':
        return { exitCode: 0, stdout: '', stderr: '' };
      case 'false':
        return { exitCode: 1, stdout: '', stderr: '' };
      case 'exit':
        return { exitCode: Number.parseInt(args[0] ?? '0', 10) || 0, stdout: '', stderr: '' };
      case 'echo':
        return { exitCode: 0, stdout: `${args.join(' ')}\n`, stderr: '' };
      case 'sleep': {
        const ms = Number(args[0] ?? '0') * 1000;
        if (ms > spec.timeoutMs) {
          await this.pause(spec.timeoutMs);
          throw new AgentFailure('timeout', `command timed out after ${spec.timeoutMs} ms`, false);
        }
        await this.pause(ms);
        return { exitCode: 0, stdout: '', stderr: '' };
      }
      default:
        return { exitCode: 127, stdout: '', stderr: `sh: ${name}: not found\n` };
    }
  }

  async list(): Promise<DesktopStatus[]> {
    return [...this.desktops].map(([desktopId, d]) => ({ desktopId, running: d.running, hasSnapshot: d.hasSnapshot }));
  }

  async close(): Promise<void> {
    this.closed = true;
    this.closing.abort();
  }

  private require(desktopId: string): FakeDesktop {
    const desktop = this.desktops.get(desktopId);
    if (!desktop) throw new AgentFailure('not_found', `no disk for ${desktopId} on this host`, false);
    return desktop;
  }

  private async step<T>(method: string, desktopId: string, body: () => T): Promise<T> {
    this.events.push(`${method}:begin ${desktopId}`);
    try {
      if (this.delayMs > 0) await this.pause(this.delayMs);
      return body();
    } finally {
      this.events.push(`${method}:end ${desktopId}`);
    }
  }

  private async pause(ms: number): Promise<void> {
    try {
      await sleep(ms, undefined, { signal: this.closing.signal });
    } catch {
      throw new AgentFailure('runtime_error', 'driver closed', true);
    }
  }
}

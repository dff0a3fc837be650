/**
 * The runtime driver interface: everything the agent needs from whatever actually runs desktops
 * (Linux namespaces with CRIU today, VMs later). One file per implementation.
 *
 * All methods are idempotent, because the scheduler re-sends a command after a crash or a lost
 * reply: `start` on a running desktop succeeds without restarting it, `hibernate` on a stopped
 * one succeeds, `destroy` of an unknown desktop succeeds.
 */
import type { Tier } from '../../../shared/src/tiers.js';

export interface RuntimeCapabilities {
  /** Short driver name, e.g. `sandbox`. */
  readonly runtime: string;
  /** True when hibernate keeps memory (a CRIU or VM snapshot); false means a cold stop. */
  readonly memorySnapshots: boolean;
}

export interface FirstBootSpec {
  /** Written as `KEY=value` lines (shell-quoted) to `/root/.canto/env` in the guest. */
  readonly env: Readonly<Record<string, string>>;
  /** Run once, detached, under process id `setup`; null when the desktop has none. */
  readonly setupScript: string | null;
}

export interface StartSpec {
  readonly desktopId: string;
  readonly tier: Tier;
  /**
   * Given until the desktop's first successful wake. The driver applies it at most once per
   * desktop disk (it keeps its own marker on the disk), even if the command is repeated.
   */
  readonly firstBoot: FirstBootSpec | null;
}

export interface ExecSpec {
  readonly command: string;
  readonly timeoutMs: number;
}

export interface ExecOutcome {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
}

export interface DesktopStatus {
  readonly desktopId: string;
  readonly running: boolean;
  readonly hasSnapshot: boolean;
}

export interface RuntimeDriver {
  capabilities(): RuntimeCapabilities;
  /** Creates the desktop's disk (its writable layer) if it does not exist yet. */
  prepare(desktopId: string, tier: Tier): Promise<void>;
  /** Restores from the memory snapshot when there is one, else boots cold. */
  start(spec: StartSpec): Promise<{ restored: boolean }>;
  /** Snapshots memory (when supported) and stops every process; the disk stays. */
  hibernate(desktopId: string): Promise<{ snapshot: boolean }>;
  /** Stops the desktop and removes its disk and snapshot. */
  destroy(desktopId: string): Promise<void>;
  /** Runs `/bin/sh -c command` inside the desktop as root, in its namespaces and root. */
  exec(desktopId: string, spec: ExecSpec): Promise<ExecOutcome>;
  /** Desktops this host holds a disk for. */
  list(): Promise<DesktopStatus[]>;
  /** Releases driver resources; running desktops keep running. */
  close(): Promise<void>;
}

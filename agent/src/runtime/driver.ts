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
  /** Bytes kept of each of stdout and stderr; the rest is read and dropped. */
  readonly maxOutputBytes: number;
}

export interface ExecOutcome {
  readonly exitCode: number;
  readonly stdout: string;
  readonly stderr: string;
  /** True when the stream had more than `maxOutputBytes` bytes. */
  readonly stdoutTruncated: boolean;
  readonly stderrTruncated: boolean;
}

export interface DetachedSpec {
  /** `prc_…` for client processes; `setup` is the driver's own. */
  readonly processId: string;
  readonly command: string;
}

export interface ProcessStatus {
  readonly status: 'running' | 'exited' | 'lost';
  /** Set only when `status` is `exited`. */
  readonly exitCode: number | null;
  readonly stdoutTail: string;
  readonly stderrTail: string;
}

/** A guest path: absolute, normalized (no `.`/`..`/empty segments, no NUL), `/` for the root. */
export type GuestPath = string;

export interface FileReadSpec {
  readonly path: GuestPath;
  /** null: the whole file, refused with `too_large` above `maxWholeBytes`. */
  readonly offset: number | null;
  /** Window length; only with an offset. */
  readonly length: number;
  readonly maxWholeBytes: number;
}

export interface FileRead {
  /** Total size of the file. */
  readonly size: number;
  /** Bytes `body` will yield. */
  readonly length: number;
  /** True when the window reaches the end of the file. */
  readonly eof: boolean;
  readonly body: AsyncIterable<Buffer>;
}

export interface FileWriteSpec {
  readonly path: GuestPath;
  /** null replaces the file; a number appends, accepted only when the file's size equals it. */
  readonly appendAt: number | null;
}

export type FileType = 'file' | 'directory' | 'symlink' | 'other';

export interface FileStat {
  readonly fileType: FileType;
  readonly sizeBytes: number;
  /** ISO 8601. */
  readonly modifiedAt: string;
  /** Permission bits as octal text, e.g. `644`. */
  readonly mode: string;
}

export interface DirEntry {
  readonly name: string;
  readonly fileType: FileType;
  readonly sizeBytes: number;
  readonly modifiedAt: string;
}

export interface DirListing {
  /** Direct children sorted by name in byte order, at most `limit`. */
  readonly entries: DirEntry[];
  readonly truncated: boolean;
}

export interface DisplaySize {
  readonly width: number;
  readonly height: number;
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
  /**
   * Copies a stopped desktop into new desktops on this host: disk, memory snapshot (when there is
   * one) and first-boot marker, so each fork wakes into the source's state and never re-runs
   * setup. The source is left as it was. Forks that already exist are kept (idempotent).
   * Returns whether the forks carry a memory snapshot.
   */
  fork(sourceId: string, forkIds: readonly string[]): Promise<{ snapshot: boolean }>;
  /** Runs `/bin/sh -c command` inside the desktop as root, in its namespaces and root. */
  exec(desktopId: string, spec: ExecSpec): Promise<ExecOutcome>;
  /**
   * Guest operations. Every path is resolved inside the desktop's own mount namespace and root,
   * never from the host side. Failures are `AgentFailure`s: `path_missing`, `path_conflict`
   * (with `currentSize` for a failed append guard), `too_large`, `not_running`, `timeout`.
   */
  /** Starts a command detached under `processId`; killed (and then `lost`) on hibernate. */
  spawnDetached(desktopId: string, spec: DetachedSpec): Promise<void>;
  /** `null` when the desktop never had a process of that id. */
  processStatus(desktopId: string, processId: string, tailBytes: number): Promise<ProcessStatus | null>;
  readFile(desktopId: string, spec: FileReadSpec): Promise<FileRead>;
  /** Atomic: the file has its old content or the new one, never a torn mix, whatever fails. */
  writeFile(desktopId: string, spec: FileWriteSpec, body: AsyncIterable<Buffer>): Promise<void>;
  deletePath(desktopId: string, path: GuestPath, recursive: boolean): Promise<void>;
  /** Does not follow a final symlink (reports `symlink`). */
  statPath(desktopId: string, path: GuestPath): Promise<FileStat>;
  /** Follows a symlinked directory; entries are not followed. */
  listDir(desktopId: string, path: GuestPath, limit: number): Promise<DirListing>;
  /** The display's current geometry, read live from the guest's X server. */
  getDisplay(desktopId: string): Promise<DisplaySize>;
  /**
   * Resizes the display (RandR) and returns the geometry read back. It survives a memory
   * snapshot; a cold boot starts at 1024x768.
   */
  setDisplay(desktopId: string, size: DisplaySize): Promise<DisplaySize>;
  /** Desktops this host holds a disk for. */
  list(): Promise<DesktopStatus[]>;
  /** Releases driver resources; running desktops keep running. */
  close(): Promise<void>;
}

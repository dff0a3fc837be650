/**
 * The driver side of moving a stopped desktop between hosts (shared/src/transfer.ts): an optional
 * capability a runtime driver offers as `driver.transfer`, kept apart from `RuntimeDriver` so a
 * driver that cannot move desktops simply has none (the agent then answers `unsupported`).
 *
 * A desktop travels as *units*: `desktop` (its own files) and `layer-<id>` for each frozen layer
 * its disk stands on. The driver only knows how to turn a unit into bytes and bytes back into a
 * unit; tickets, hashing, HTTP, resume and staging files belong to agent/src/transfer/.
 *
 * Source: `units` then `read`, whose bytes must be the same on every call while the desktop stays
 * stopped (the importer resumes a broken copy at a byte offset of a new read).
 * Target: `unpack` each fetched unit into the staging directory, then `install` them all at once.
 * An installed copy carries an import record until it first starts (`started`); only such a copy
 * is removed by `discard`, so a rollback can never delete a desktop that ran here.
 *
 * Pre-copy (1.12), optional as `precopy`: while the desktop still runs, the source picks cold
 * files of its writable layer and streams them; the target unpacks them into staging. At the
 * stop the `desktop` unit is read without those still unchanged (`read`'s `leaveOut`), and the
 * target's `unpack` puts the pre-copied ones in place first (`reuse`).
 */
import { once } from 'node:events';
import type { Readable, Writable } from 'node:stream';
import type { Tier } from '../../../shared/src/tiers.js';
import type { SlabReader } from './slabs.js';

/** The unit holding a desktop's own files. */
export const DESKTOP_UNIT = 'desktop';

/** The unit id of a frozen layer. */
export function layerUnit(layerId: string): string {
  return `layer-${layerId}`;
}

/** What an installed copy remembers of the import that brought it, until it first starts here. */
export interface ImportRecord {
  /** The generation the import command carried: a repeat of it finds the work done. */
  readonly generation: number;
  /** The move the import command named (1.15), with the generation: a repeat names both. */
  readonly operationId?: string;
  readonly units: number;
  readonly totalBytes: number;
}

export interface HeldDesktop {
  /** This host holds the desktop's files (installed, not merely staged). */
  readonly held: boolean;
  readonly running: boolean;
  /** Present while the copy came by import and has not started here since. */
  readonly imported: ImportRecord | null;
}

/** A unit's bytes being produced. */
export interface UnitStream {
  readonly body: Readable;
  /**
   * Settles once the producer is done: rejects when it failed, even if `body` ended normally (a
   * cut-off stream must not pass for a whole one). Destroying `body` stops the producer.
   */
  readonly done: Promise<void>;
  /**
   * Present when the stream was asked for in slabs and the platform gave them: the bytes then
   * come through `slabs.read(body, take)`, never as `body`'s 'data' events. `body` still ends,
   * closes and is destroyed as usual.
   */
  readonly slabs?: SlabReader;
}

/** How a stream is to be read: `slabs` asks for reused buffers (runtime/slabs.ts) where the platform can. */
export interface ReadOptions {
  readonly slabs?: boolean;
}

/** An unpacking of one unit under way: its input, and how it ends. */
export interface UnitSink {
  /** Takes the unit's bytes in order; ending it says they are all there. Errors on it are `done`'s. */
  readonly input: Writable;
  /** Settles once the unit is unpacked (after `input` ended); rejects when unpacking failed. */
  readonly done: Promise<void>;
  /** Gives up: the unpacking stops and `done` rejects. */
  abort(): void;
}

/** Once a full unpacking takes more: null, or why it stopped first (it ended or failed). */
export function sinkDrained(sink: UnitSink): Promise<Error | null> {
  const stopped = sink.done.then(
    () => new Error('the unpacking ended before its input'),
    (err: unknown) => (err instanceof Error ? err : new Error(String(err))),
  );
  return Promise.race([once(sink.input, 'drain').then(() => null), stopped]);
}

export interface InstallSpec {
  readonly tier: Tier;
  /** Units fetched into staging and unpacked; the others are layers this host already holds. */
  readonly unpacked: readonly string[];
  readonly record: ImportRecord;
}

export interface DesktopTransfer {
  /** What this host holds of the desktop. */
  inspect(desktopId: string): Promise<HeldDesktop>;
  /**
   * The units of a stopped desktop, `desktop` first, then its layers topmost first. `not_found`
   * when it is not here, `conflict` when it runs.
   */
  units(desktopId: string): Promise<string[]>;
  /**
   * A fresh stream of the unit from its first byte; of the `desktop` unit, less the files named
   * in `leaveOut` (member names from `precopy.scan`).
   */
  read(desktopId: string, unitId: string, leaveOut?: readonly string[], how?: ReadOptions): Promise<UnitStream>;
  /**
   * The exact length of `read`'s stream, found without reading the unit's data; absent when the
   * driver cannot (the source then lists by hashing, one full pass).
   */
  size?(desktopId: string, unitId: string, leaveOut?: readonly string[]): Promise<number>;
  /** True when this host already holds the unit (a layer; never `desktop`). */
  holds(unitId: string): Promise<boolean>;
  /** Where an import of the desktop keeps its files, on the same filesystem as the installed ones. */
  stagingDir(desktopId: string): string;
  /** Layers a unpacked `desktop` unit in staging stands on, topmost first (none for a plain disk). */
  stagedChain(desktopId: string): Promise<string[]>;
  /**
   * Starts unpacking a unit into staging, replacing an earlier unpack of it. `reuse`: files of
   * the unpacked pre-copy that the unit leaves out, put in place first (`runtime_error`,
   * retryable, when one is missing).
   */
  unpack(desktopId: string, unitId: string, reuse?: readonly string[]): Promise<UnitSink>;
  /**
   * Moves the unpacked units into place, layers before the desktop, each with one rename, and
   * removes staging. What it installs is on disk when it resolves (and was before the renames, so
   * a power loss leaves the copy whole or absent). Fails (retryable) when a layer it counted on is
   * gone meanwhile.
   */
  install(desktopId: string, spec: InstallSpec): Promise<void>;
  /** The desktops that have a staging directory here (transfer/staging-sweep.ts). */
  stagedDesktops(): Promise<string[]>;
  /** Removes the desktop's staging, never an installed copy, and the layers only it stood on. */
  dropStaging(desktopId: string): Promise<void>;
  /**
   * Writes what this host holds of the desktop to disk: an import that found its copy already
   * installed answers only once that copy would survive a power loss here.
   */
  flush(desktopId: string): Promise<void>;
  /**
   * The desktop is about to start here: it is no longer a copy an abort may remove. Answers
   * whether it was such a copy (the first start of a desktop moved here).
   */
  started(desktopId: string): Promise<boolean>;
  /**
   * Removes the desktop's staging and, when its copy came by import and never started here, the
   * copy (layers nothing else stands on go with it). `conflict` when it runs.
   */
  discard(desktopId: string): Promise<void>;
  /** Copying cold files of a running desktop ahead of its stop; absent when the driver cannot. */
  readonly precopy?: PrecopyFiles;
}

/** What must not change between a pre-copy's first look at a file and the desktop's stop. */
export interface FileIdentity {
  readonly ino: string;
  readonly size: number;
  readonly ctimeNs: string;
  readonly mtimeNs: string;
}

export interface PrecopyEntry {
  /** A member name of the `desktop` unit (relative to the desktop's directory). */
  readonly path: string;
  readonly identity: FileIdentity;
}

export interface PrecopyFiles {
  /** The desktop's files worth sending ahead now, with their identities; it may be running. */
  scan(desktopId: string): Promise<PrecopyEntry[]>;
  /** A stream of exactly these files, in the unit format; files that vanish are skipped. */
  read(desktopId: string, paths: readonly string[], how?: ReadOptions): Promise<UnitStream>;
  /** Each file's identity now; null when it is gone or no longer a lone regular file. */
  identify(desktopId: string, paths: readonly string[]): Promise<Array<FileIdentity | null>>;
  /**
   * Starts unpacking a pre-copy stream into staging, replacing an earlier one; `done` once the
   * files are unpacked and on disk (the copy after the stop then has only its own bytes to write).
   */
  unpack(desktopId: string): Promise<UnitSink>;
  /** Whether the unpacked pre-copy in staging holds every one of these files. */
  holds(desktopId: string, paths: readonly string[]): Promise<boolean>;
  /** Removes what staging holds of a pre-copy. */
  drop(desktopId: string): Promise<void>;
}

/** Whether a file is still what a pre-copy read: same inode, size, ctime and mtime. */
export function sameIdentity(now: FileIdentity | null, then: FileIdentity): boolean {
  return now !== null && now.ino === then.ino && now.size === then.size && now.ctimeNs === then.ctimeNs && now.mtimeNs === then.mtimeNs;
}

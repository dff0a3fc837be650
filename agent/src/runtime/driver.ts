/**
 * The runtime driver interface: everything the agent needs from whatever actually runs desktops
 * (Linux namespaces with CRIU today, VMs later). One file per implementation.
 *
 * All methods are idempotent, because the scheduler re-sends a command after a crash or a lost
 * reply: `start` on a running desktop succeeds without restarting it, `hibernate` on a stopped
 * one succeeds, `destroy` of an unknown desktop succeeds.
 */
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Tier } from '../../../shared/src/tiers.js';
import type { InputAction } from '../../../shared/src/computer-use.js';
import type { Static } from '@sinclair/typebox';
import type { CamelKeys } from '../../../shared/src/camel-case.js';
import type { DesktopRef } from '../../../shared/src/desktop-ref.js';
import type {
  DirListResult, DisplayResult, ExecOutput, ExecPayload, FileReadPayload, FileReadResult, FileStatResult, FileType,
  FileWritePayload, InputResult, ProcessResult, ScreenRegion, ScreenshotPayload, ScreenshotResult, SpawnPayload,
  TerminalGrantPayload,
} from '../../../shared/src/guest-commands.js';
import type { FirstBoot, StartPayload } from '../../../shared/src/protocol.js';
import type { DesktopTransfer } from './transfer.js';

export type { ScreenRegion };

export interface RuntimeCapabilities {
  /** Short driver name, e.g. `sandbox`. */
  readonly runtime: string;
  /** True when hibernate keeps memory (a CRIU or VM snapshot); false means a cold stop. */
  readonly memorySnapshots: boolean;
  /** True when the driver runs screenshots, input and the VNC stream (docs/api.md §4.5, 4.6). */
  readonly computerUse: boolean;
}

/**
 * The protocol's first-boot settings (shared/src/protocol.ts `FirstBoot`) in camelCase: `env` is
 * written as `KEY=value` lines (shell-quoted) to `/root/.canto/env` in the guest; `setupScript`
 * runs once, detached, under process id `setup` (null when the desktop has none).
 */
export type FirstBootSpec = CamelKeys<FirstBoot>;

/**
 * `desktop.start` as the driver sees it: the protocol's payload in camelCase, without the fencing
 * fields the agent checks before the driver runs. `firstBoot` is given until the desktop's first
 * successful wake; the driver applies it at most once per desktop disk (it keeps its own marker
 * on the disk), even if the command is repeated.
 */
export type StartSpec = Omit<CamelKeys<Omit<Static<typeof StartPayload>, 'generation' | 'leader_epoch' | 'operation_id'>>, 'firstBoot'> & {
  readonly firstBoot: FirstBootSpec | null;
  /**
   * The desktop is about to be used: a driver may make its first guest calls fast ahead of them
   * (the sandbox runtime starts its warm servers). Set for the first start of a desktop moved here.
   */
  readonly inUse?: boolean;
};

/*
 * Request and response shapes of guest operations and computer use: the agent protocol's
 * (shared/src/guest-commands.ts) in camelCase, without the desktop reference the driver gets as
 * an argument. The fields are documented there.
 */
type Ref = keyof typeof DesktopRef;
/** A protocol payload as the driver takes it. */
type SpecOf<P> = CamelKeys<Omit<P, Ref>>;

/** `maxOutputBytes` is always set: the command table supplies the default cap. */
export type ExecSpec = SpecOf<Required<Static<typeof ExecPayload>>>;
/** The truncation flags are always set by a driver (optional only on the link, for old agents). */
export type ExecOutcome = CamelKeys<Static<typeof ExecOutput>>;
/** `processId`: `prc_…` for client processes; `setup` is the driver's own. */
export type DetachedSpec = SpecOf<Static<typeof SpawnPayload>>;
/** `exitCode` is set only when `status` is `exited`. */
export type ProcessStatus = CamelKeys<Omit<Static<typeof ProcessResult>, 'found'>>;

/** A guest path: absolute, normalized (no `.`/`..`/empty segments, no NUL), `/` for the root. */
export type GuestPath = string;

/**
 * `offset` null reads the whole file, refused with `too_large` above `maxWholeBytes`; `length`
 * is the window's length, only with an offset.
 */
export type FileReadSpec = SpecOf<Static<typeof FileReadPayload>>;

/** `size` is the whole file's, `length` the bytes `body` will yield; `eof` when the window reaches the end. */
export type FileRead = CamelKeys<Static<typeof FileReadResult>> & { readonly body: AsyncIterable<Buffer> };

/** `appendAt` null replaces the file; a number appends, accepted only when the file's size equals it. */
export type FileWriteSpec = SpecOf<Static<typeof FileWritePayload>>;

export type { FileType };

/** `modifiedAt` is ISO 8601; `mode` the permission bits as octal text, e.g. `644`. */
export type FileStat = CamelKeys<Static<typeof FileStatResult>>;

/** Direct children sorted by name in byte order, at most the limit asked. */
export type DirListing = CamelKeys<Static<typeof DirListResult>>;
export type DirEntry = DirListing['entries'][number];

export type DisplaySize = Readonly<Static<typeof DisplayResult>>;

/**
 * `region` in screen pixels, clamped to the current screen (null: the whole screen);
 * `scalePercent` 1-100 of the cropped size (null keeps it); a PNG over `maxBytes` fails with
 * `too_large`.
 */
export type ScreenshotSpec = SpecOf<Static<typeof ScreenshotPayload>>;

/** The image's size is after the crop and the scale. */
export type Screenshot = Omit<CamelKeys<Static<typeof ScreenshotResult>>, 'png'> & { readonly png: Buffer };

export type CursorPosition = Readonly<Static<typeof InputResult>>;

/**
 * A VNC (RFB) server speaking to one client through a pair of pipes: what the client sends goes
 * to `input`, what the server answers comes from `output`. It ends when the server exits, when
 * `close()` is called, or when the desktop hibernates or is destroyed.
 */
export interface VncSession {
  readonly input: NodeJS.WritableStream;
  readonly output: NodeJS.ReadableStream;
  /** Settles once the server has exited. */
  readonly closed: Promise<void>;
  close(): void;
}

/** A terminal's size and program; `command` is run by `/bin/sh -c` instead of a login shell, and the session ends when it exits. */
export type TerminalSpec = SpecOf<Static<typeof TerminalGrantPayload>>;

/**
 * A program on a pseudo-terminal inside a desktop, for one terminal client. It ends when the
 * program exits, when `close()` is called, or when the desktop hibernates or is destroyed; nothing
 * started in the terminal outlives it.
 */
export interface TerminalSession {
  /** Bytes the program wrote to the terminal. */
  onData(listener: (data: Buffer) => void): void;
  /**
   * Bytes typed at the terminal. False when too much waits for the program to read it: send no
   * more until `onDrain` says so (a program that does not read must not fill the agent's memory).
   */
  write(data: Buffer): boolean;
  onDrain(listener: () => void): void;
  resize(cols: number, rows: number): void;
  /** Stops and restarts reading the program's output (backpressure). */
  pause(): void;
  resume(): void;
  /** The program's exit status (128 + n for a signal), once the session is gone. */
  readonly exited: Promise<number>;
  /** Ends the session: kills the program and everything that still holds its terminal. */
  close(): void;
}

/**
 * A connection to a TCP port inside a desktop, for one client of the port gateway (docs/api.md §4.7): the
 * bytes written go to the guest app, the bytes read come from it. Half-close works both ways:
 * `end()` reaches the app as an end of its input while its answer still arrives, and the app
 * ending its output ends this stream's readable side only. It must be created with
 * `allowHalfOpen` (a net.Socket is fine). `destroy()` closes both directions at once. It also
 * ends when the desktop hibernates or is destroyed.
 */
export type GuestConnection = Duplex;

export interface DesktopUsage {
  readonly running: number;
  /** Memory charged to the desktops (their cgroups), in bytes. */
  readonly memoryBytes: number;
}

export interface DesktopStatus {
  readonly desktopId: string;
  readonly running: boolean;
  readonly hasSnapshot: boolean;
}

export interface HibernateOptions {
  /** A move's stop: detached processes are part of the memory and go on after the restore. */
  readonly keepDetached?: boolean;
  /**
   * A move's stop (protocol 1.17): on a host that makes memory snapshots, a desktop whose snapshot
   * fails is not stopped cold but left running, and the hibernate fails (`snapshot_failed`).
   */
  readonly requireSnapshot?: boolean;
}

/** The desktop's life on this host: disks, starts and stops, forks. Every driver has it. */
export interface DesktopLifecycle {
  capabilities(): RuntimeCapabilities;
  /** Creates the desktop's disk (its writable layer) if it does not exist yet. */
  prepare(desktopId: string, tier: Tier): Promise<void>;
  /** Restores from the memory snapshot when there is one, else boots cold. */
  start(spec: StartSpec): Promise<{ restored: boolean }>;
  /**
   * Snapshots memory (when supported) and stops every process; the disk stays. Detached
   * processes are killed first (docs/api.md §3.2), unless `keepDetached` (a move) and the snapshot keeps them.
   */
  hibernate(desktopId: string, options?: HibernateOptions): Promise<{ snapshot: boolean }>;
  /** Stops the desktop and removes its disk and snapshot. */
  destroy(desktopId: string): Promise<void>;
  /**
   * Copies a stopped desktop into new desktops on this host: disk, memory snapshot (when there is
   * one) and first-boot marker, so each fork wakes into the source's state and never re-runs
   * setup. The source is left as it was. Forks that already exist are kept (idempotent).
   * Returns whether the forks carry a memory snapshot.
   */
  fork(sourceId: string, forkIds: readonly string[]): Promise<{ snapshot: boolean }>;
  /** Desktops this host holds a disk for. */
  list(): Promise<DesktopStatus[]>;
  /**
   * One desktop as `list` would show it, null when this host holds no disk for it, without
   * visiting the others: a command about one desktop must not cost more with every desktop held.
   */
  status(desktopId: string): Promise<DesktopStatus | null>;
  /**
   * How many desktops run and the memory they use, read in a few calls whatever their number
   * (the heartbeat reads it every interval, so it must not visit each desktop).
   */
  usage(): Promise<DesktopUsage>;
  /** Releases driver resources; running desktops keep running. */
  close(): Promise<void>;
}

/** Commands and files inside a running desktop (docs/api.md §4.3, 4.4). */
export interface GuestOperations {
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
}

/**
 * Seeing and driving the screen, and terminals: a driver without computer-use support says so in
 * `capabilities()`, and the agent answers `unsupported` before calling these.
 */
export interface ComputerUse {
  /** The display's current geometry, read live from the guest's X server. */
  getDisplay(desktopId: string): Promise<DisplaySize>;
  /**
   * Resizes the display (RandR) and returns the geometry read back. It survives a memory
   * snapshot; a cold boot starts at 1024x768.
   */
  setDisplay(desktopId: string, size: DisplaySize): Promise<DisplaySize>;
  /**
   * A PNG of the screen, read from the framebuffer without a process per shot. `runtime_error`
   * when the X session is down, `too_large` over `spec.maxBytes`.
   */
  screenshot(desktopId: string, spec: ScreenshotSpec): Promise<Screenshot>;
  /**
   * Runs a validated input batch in order, in one guest round trip, and returns the final cursor.
   * Not transactional: on a failure (`runtime_error`) earlier actions have run.
   */
  input(desktopId: string, actions: readonly InputAction[]): Promise<CursorPosition>;
  /** Starts a VNC server on the desktop's display for one client; `viewOnly` ignores its input. */
  openVnc(desktopId: string, viewOnly: boolean): Promise<VncSession>;
  /**
   * Starts a program on a pseudo-terminal inside the desktop, as the guest's root user with the
   * guest's capabilities and env file. `unsupported` when the host cannot make terminals.
   */
  openTerminal(desktopId: string, spec: TerminalSpec): Promise<TerminalSession>;
}

/** TCP ports of the desktop's apps, for the port gateway (docs/api.md §4.7). */
export interface PortAccess {
  /**
   * Connects to `127.0.0.1:<port>` in the desktop's own network namespace. Rejects with an
   * `AgentFailure` (`not_found`, `not_running`) when the desktop is not running here, and with an
   * error whose `code` is `ECONNREFUSED` when nothing accepts connections on the port.
   */
  openGuestPort(desktopId: string, port: number): Promise<GuestConnection>;
  /**
   * Hands `client`, a port link whose line verified, to a relay of its own into the port, which
   * answers the link itself (`OK`, or `ERR refused` when nothing listens): the agent leaves the
   * data path. Null when the driver has no such relays (the gateway then relays through
   * `openGuestPort`). Rejects as `openGuestPort` does, the client still the caller's.
   */
  handOffGuestPort?(desktopId: string, port: number, client: Socket): Promise<HandedOffLink | null>;
}

/** How a handed-off link's relay ended: it carried the link, or it answered `ERR <outcome>`. */
export type RelayOutcome = 'relayed' | 'not_running' | 'refused' | 'unavailable';

/** A port link a relay carries; the agent no longer holds the client's connection. */
export interface HandedOffLink {
  /** Settles when the relay has exited. */
  readonly outcome: Promise<RelayOutcome>;
}

/**
 * Where new desktops' disks come from on a host with golden templates: `ready`, they are clones
 * of the template; `building`, they boot cold until it is built; `none`, they boot cold (a failed
 * build waits out its retry period). Counts are since the driver started.
 */
export interface TemplateStats {
  readonly state: 'ready' | 'building' | 'none';
  readonly cloned: number;
  readonly empty: number;
}

/**
 * Starts from a memory snapshot since the driver started: `restored`, or `failed` (the images set
 * aside and the desktop booted cold, its memory lost; a template clone's first wake included).
 */
export interface RestoreStats {
  readonly restored: number;
  readonly failed: number;
}

/**
 * Hibernates since the driver started, by outcome: `memory` (a memory snapshot taken), `cold`
 * (stopped without one: its programs ended) or `refused` (a move's stop that could not keep the
 * memory: the desktop runs on).
 */
export interface HibernateStats {
  readonly memory: number;
  readonly cold: number;
  readonly refused: number;
}

/**
 * A runtime driver: each capability above, and moving desktops between hosts when it can. The
 * agent's command table (command-table.ts) is the only caller of most of it.
 */
export interface RuntimeDriver extends DesktopLifecycle, GuestOperations, ComputerUse, PortAccess {
  /** Moving stopped desktops to and from other hosts (transfer.ts); absent when the driver cannot. */
  readonly transfer?: DesktopTransfer;
  /** The golden templates' state; absent, or null, where new desktops always boot cold. */
  templates?(): TemplateStats | null;
  /** Absent where the driver never restores a snapshot (the fake driver). */
  restores?(): RestoreStats;
  /** Absent where the driver never takes one (the fake driver). */
  hibernates?(): HibernateStats;
}

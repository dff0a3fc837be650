/**
 * The guest operations on the agent link (protocol.ts has the envelope, the lifecycle commands
 * and the command table): exec and detached processes, files, display, screenshots, input and
 * stream grants. Each is fenced by the desktop's generation but not queued behind lifecycle
 * commands, and any scheduler replica may send it.
 */
import { TERMINAL_SIZE } from './terminal-protocol.js';
import { Type, type Static } from '@sinclair/typebox';
import { INPUT_LIMITS, InputAction, STREAM_CLAIMS } from './computer-use.js';
import { DesktopRef } from './desktop-ref.js';

/**
 * A command run in a guest: never a NUL (the agent's process spawner separates its strings with
 * NULs, host/spawner.ts), refused here too so that no sender, older or newer, gets one through.
 */
const GuestCommand = Type.String({ minLength: 1, pattern: '^[^\\u0000]*$' });

export const ExecPayload = Type.Object({
  ...DesktopRef,
  command: GuestCommand,
  timeout_ms: Type.Integer({ minimum: 1 }),
  /** 1.1: bytes kept of each output stream (default 1 MiB). */
  max_output_bytes: Type.Optional(Type.Integer({ minimum: 0 })),
});
/** Bytes of each output stream a synchronous exec keeps unless the scheduler names another cap. */
export const EXEC_MAX_OUTPUT_BYTES = 1024 * 1024;

/**
 * What a finished exec gives back: the one output shape of the API's answer (scheduler
 * guest-schemas.ts), the agent's reply and the runtime driver's outcome (camelCase there).
 */
export const ExecOutput = Type.Object({
  exit_code: Type.Integer(),
  stdout: Type.String(),
  stderr: Type.String(),
  stdout_truncated: Type.Boolean({ description: 'stdout was longer than 1 MiB; its first 1 MiB is returned' }),
  stderr_truncated: Type.Boolean({ description: 'stderr was longer than 1 MiB; its first 1 MiB is returned' }),
});
export type ExecOutput = Static<typeof ExecOutput>;
/** On the link the truncation flags are optional: agents before 1.1 do not send them. */
export const ExecResult = Type.Object({
  ...ExecOutput.properties,
  stdout_truncated: Type.Optional(ExecOutput.properties.stdout_truncated),
  stderr_truncated: Type.Optional(ExecOutput.properties.stderr_truncated),
});

/** Process ids: `setup` (the first-boot script) or `prc_` plus 24 base-32 characters. */
export const PROCESS_ID_SOURCE = '(setup|prc_[0-9a-v]{24})';
export const PROCESS_ID_PATTERN = `^${PROCESS_ID_SOURCE}$`;
export const PROCESS_ID = new RegExp(PROCESS_ID_PATTERN);
export const ProcessId = Type.String({ pattern: PROCESS_ID_PATTERN });
/** Guest paths on the link: absolute and normalized by the scheduler; the agent re-checks. */
const GuestPath = Type.String({ minLength: 1, maxLength: 4096, pattern: '^/' });

export const SpawnPayload = Type.Object({ ...DesktopRef, process_id: ProcessId, command: GuestCommand });
export const SpawnResult = Type.Object({});

export const ProcessPayload = Type.Object({ ...DesktopRef, process_id: ProcessId, tail_bytes: Type.Integer({ minimum: 0 }) });
export const ProcessResult = Type.Object({
  /** False when the desktop never had a process of this id. */
  found: Type.Boolean(),
  status: Type.Union([Type.Literal('running'), Type.Literal('exited'), Type.Literal('lost')]),
  exit_code: Type.Union([Type.Integer(), Type.Null()]),
  stdout_tail: Type.String(),
  stderr_tail: Type.String(),
});

/** The kinds of file a stat or a listing reports, on the link and in the API. */
export const FILE_TYPES = ['file', 'directory', 'symlink', 'other'] as const;
export const FileType = Type.Union(FILE_TYPES.map((type) => Type.Literal(type)));
export type FileType = Static<typeof FileType>;

/** Answered with a download of `length` bytes after the reply. */
export const FileReadPayload = Type.Object({
  ...DesktopRef,
  path: GuestPath,
  offset: Type.Union([Type.Integer({ minimum: 0 }), Type.Null()]),
  length: Type.Integer({ minimum: 0 }),
  max_whole_bytes: Type.Integer({ minimum: 0 }),
});
export const FileReadResult = Type.Object({
  size: Type.Integer({ minimum: 0 }),
  length: Type.Integer({ minimum: 0 }),
  eof: Type.Boolean(),
});

/** Carries the file's bytes as an upload; replied to once they are in place. */
export const FileWritePayload = Type.Object({
  ...DesktopRef,
  path: GuestPath,
  append_at: Type.Union([Type.Integer({ minimum: 0 }), Type.Null()]),
});
export const FileWriteResult = Type.Object({});

export const FileDeletePayload = Type.Object({ ...DesktopRef, path: GuestPath, recursive: Type.Boolean() });
export const FileDeleteResult = Type.Object({});

export const FileStatPayload = Type.Object({ ...DesktopRef, path: GuestPath });
export const FileStatResult = Type.Object({
  file_type: FileType,
  size_bytes: Type.Integer({ minimum: 0 }),
  modified_at: Type.String(),
  mode: Type.String(),
});

export const DirListPayload = Type.Object({ ...DesktopRef, path: GuestPath, limit: Type.Integer({ minimum: 1 }) });
export const DirListResult = Type.Object({
  entries: Type.Array(
    Type.Object({ name: Type.String(), file_type: FileType, size_bytes: Type.Integer({ minimum: 0 }), modified_at: Type.String() }),
  ),
  truncated: Type.Boolean(),
});

export const DisplayGetPayload = Type.Object({ ...DesktopRef });
export const DisplaySetPayload = Type.Object({
  ...DesktopRef,
  width: Type.Integer({ minimum: 1, maximum: 16384 }),
  height: Type.Integer({ minimum: 1, maximum: 16384 }),
});
/** The geometry read from the guest's X server (after a resize: read again). */
export const DisplayResult = Type.Object({ width: Type.Integer({ minimum: 1 }), height: Type.Integer({ minimum: 1 }) });

/** A rectangle of screen pixels. */
export const ScreenRegion = Type.Object({
  x: Type.Integer({ minimum: 0 }),
  y: Type.Integer({ minimum: 0 }),
  width: Type.Integer({ minimum: 1 }),
  height: Type.Integer({ minimum: 1 }),
});
export type ScreenRegion = Readonly<Static<typeof ScreenRegion>>;

export const ScreenshotPayload = Type.Object({
  ...DesktopRef,
  /** Screen pixels, clamped to the screen by the agent; null captures it all. */
  region: Type.Union([ScreenRegion, Type.Null()]),
  scale_percent: Type.Union([Type.Integer({ minimum: 1, maximum: 100 }), Type.Null()]),
  /** A PNG over this size fails with `too_large`. */
  max_bytes: Type.Integer({ minimum: 1 }),
});
export const ScreenshotResult = Type.Object({
  png: Type.Uint8Array(),
  width: Type.Integer({ minimum: 1 }),
  height: Type.Integer({ minimum: 1 }),
});

/** A batch the scheduler has validated (shared/src/computer-use.ts); the agent checks it again. */
export const InputPayload = Type.Object({ ...DesktopRef, actions: Type.Array(InputAction, { maxItems: INPUT_LIMITS.maxActions }) });
export const InputResult = Type.Object({ x: Type.Integer(), y: Type.Integer() });

/**
 * A single-use ticket for the agent's stream gateway: the client dials `host:port`, sends the
 * ticket and a newline, then speaks RFB. `control_claimed` when another client holds control.
 */
export const StreamGrantPayload = Type.Object({ ...DesktopRef, claim: Type.Union(STREAM_CLAIMS.map((c) => Type.Literal(c))) });
export const StreamGrantResult = Type.Object({
  ticket: Type.String(),
  expires_at: Type.String(),
  host: Type.String(),
  port: Type.Integer({ minimum: 1, maximum: 65535 }),
  /** 1.9: the gateway also takes the ticket as a WebSocket at `ws://host:port/vnc?ticket=…`. */
  websocket: Type.Optional(Type.Boolean()),
});

/**
 * 1.9: a single-use ticket for a terminal inside the desktop, presented as a WebSocket at
 * `ws://host:port/terminal?ticket=…` (shared/src/terminal-protocol.ts). `too_large` when the
 * desktop already has its share of terminals.
 */
export const TerminalGrantPayload = Type.Object({
  ...DesktopRef,
  cols: Type.Integer({ minimum: TERMINAL_SIZE.minCols, maximum: TERMINAL_SIZE.maxCols }),
  rows: Type.Integer({ minimum: TERMINAL_SIZE.minRows, maximum: TERMINAL_SIZE.maxRows }),
  command: Type.Union([GuestCommand, Type.Null()]),
});
export const TerminalGrantResult = Type.Object({
  ticket: Type.String(),
  expires_at: Type.String(),
  host: Type.String(),
  port: Type.Integer({ minimum: 1, maximum: 65535 }),
});

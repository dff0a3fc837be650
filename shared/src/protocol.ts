/**
 * The agent link: the messages a host agent and the scheduler exchange over one websocket, each
 * frame msgpack-encoded. Requests are `{v, id, type, payload}`; replies are `{v, id, ok, result}`
 * or `{v, id, ok: false, error}`; notifications are requests without an `id` and get no reply.
 *
 * Versioning: `PROTOCOL_VERSION` is `major.minor`. Only add message types and optional fields
 * within a major; the scheduler refuses an agent whose major is newer than its own.
 *
 * Changelog:
 *   1.0 — hello, heartbeat, desktop.prepare/start/hibernate/destroy, guest.exec.
 *   1.1 — guest.exec output cap and truncation flags; guest.spawn, guest.process, guest.file.read
 *         (download), guest.file.write (upload), guest.file.delete, guest.file.stat,
 *         guest.dir.list; error codes path_missing, path_conflict, too_large; frame members
 *         upload and download with stream.up/stream.down notifications.
 *   1.2 — desktop.fork.
 *   1.3 — guest.display.get, guest.display.set.
 *   1.4 — guest.screenshot, guest.input, stream.grant; error code control_claimed.
 *   1.5 — hello `ingress`: where the agent's port gateway listens (shared/src/port-link.ts).
 *   1.6 — raw stream chunks (rpc.ts): a peer sends them once the other side said 1.6 or later in
 *         hello; stream.up/stream.down notifications stay valid for older peers. Raw streams
 *         are flow-controlled with ack and cancel headers (rpc.ts). Hello reply
 *         `port_link_key`: the host's own key for port-link lines, instead of the join token.
 *   1.7 — agents link to every scheduler replica. Hello reply `replica_id`, `replicas` (the live
 *         replicas' advertised URLs), `leader_epoch` and `fence` (desktops the host runs that
 *         must stop: the agent hibernates them, then sends `host.ready`). Notification
 *         `cluster` (scheduler → agent): a new leader epoch or replica list. Lifecycle commands
 *         carry `leader_epoch`; the agent refuses an older one with `stale_epoch`.
 *         desktop.inspect: whether a desktop runs and has a memory snapshot.
 *   1.8 — moving desktops between hosts (shared/src/transfer.ts): hello `transfer` (where the
 *         agent's transfer server listens), desktop.export, desktop.import, desktop.import.abort,
 *         notification desktop.import.progress; error code `conflict` (the desktop is running);
 *         desktop.hibernate `keep_detached`.
 *   1.9 — terminal.grant (a pty inside the desktop over a WebSocket on the stream gateway,
 *         shared/src/terminal-protocol.ts); stream.grant result `websocket`: the gateway also
 *         takes stream tickets as WebSockets (RFB for browsers).
 *   1.10 — desktop.export `listing: 'sized'`: units listed by size (and `version`) without a
 *         hash, the hash coming as each fetch's trailer (shared/src/transfer.ts).
 *   1.11 — heartbeat `measured`: what the host uses now (available memory, memory of its desktops'
 *         cgroups, CPU busy), for placement by measured use (scheduler/src/placement/).
 *   1.12 — desktop.precopy.export, desktop.precopy.import: an awake desktop's cold files copied
 *         to the target before it stops (shared/src/precopy.ts); the transfer server's
 *         `precopy` route and `?reuse=`, and a listed unit's `reuse`.
 *   1.13 — memory snapshots are dumped without the network namespace's contents (restores
 *         make it empty and bring loopback up); an agent older than 1.13 might restore such a
 *         snapshot without loopback, so the scheduler moves none to it. desktop.export `reuse`:
 *         the pre-copy the target holds, so the listing counts the desktop unit as the target's
 *         own listing request will.
 *   1.14 — memory snapshots hold the guest's /run as a directory of /dev's tmpfs (the guest sees
 *         it through a symlink), not as a tmpfs of its own; an agent older than 1.14 cannot
 *         restore such a snapshot, so the scheduler moves none to it.
 *   1.15 — hello `host_key`: the host's own secret, without which a returning host id is refused
 *         once it said hello with one. desktop.import `operation_id`: the move it belongs to, so a
 *         copy an earlier move left on the target is not taken for this one's. Memory snapshots hold read-only covers of the host secrets
 *         in /etc (guest/etc-secrets.ts); an agent older than 1.15 cannot map them back at a
 *         restore, so the scheduler moves none to it.
 *   1.16 — the port gateway takes `CANTO-PORT/2` lines, each with a nonce it takes once
 *         (shared/src/port-link.ts); the ingress sends `/1` lines to older agents.
 *   1.17 — desktop.hibernate `require_snapshot` (a move's stop): a desktop whose memory snapshot
 *         fails is left running and the command fails with `snapshot_failed`, instead of a cold
 *         stop. An older agent ignores the field and stops such a desktop cold, as before.
 *
 * Every desktop command carries the desktop's `generation`. The agent remembers the highest
 * generation it has seen per desktop and refuses an older one with `stale_generation`: after a
 * host is declared failed and its desktops recovered elsewhere, a returning agent must not act on
 * commands from before the recovery. Commands are idempotent, so a new leader may re-send one.
 */
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { DesktopRef } from './desktop-ref.js';
import { ExportPayload, ExportResult, ImportAbortPayload, ImportAbortResult, ImportPayload, ImportResult } from './transfer.js';
import { PrecopyExportPayload, PrecopyExportResult, PrecopyImportPayload, PrecopyImportResult } from './precopy.js';
import { TierSchema } from './tiers.js';
import {
  DirListPayload, DirListResult, DisplayGetPayload, DisplayResult, DisplaySetPayload, ExecPayload, ExecResult,
  FileDeletePayload, FileDeleteResult, FileReadPayload, FileReadResult, FileStatPayload, FileStatResult,
  FileWritePayload, FileWriteResult, InputPayload, InputResult, ProcessPayload, ProcessResult, ScreenshotPayload,
  ScreenshotResult, SpawnPayload, SpawnResult, StreamGrantPayload, StreamGrantResult, TerminalGrantPayload, TerminalGrantResult,
} from './guest-commands.js';

export const PROTOCOL_VERSION = '1.17';
export const WIRE_VERSION = 1;

/** The protocol minors (of major 1) that changed what a memory snapshot holds: 1.13, 1.14 and 1.15 above. */
export const SNAPSHOT_FORMAT_MINORS: readonly number[] = [13, 14, 15];

/**
 * The newest snapshot format an agent dumps, as the minor of the protocol that brought it (0: one
 * from before any of them); `speaks(minor)` says whether the agent speaks 1.minor. An agent wakes
 * what another dumps when it speaks that minor too.
 */
export function snapshotFormat(speaks: (minor: number) => boolean): number {
  return SNAPSHOT_FORMAT_MINORS.filter((m) => speaks(m)).at(-1) ?? 0;
}

/** True when `version` is `major.minor` or later (a version that does not parse is not). */
export function protocolAtLeast(version: string, major: number, minor: number): boolean {
  const [maj, min] = version.split('.').map((part) => Number.parseInt(part, 10));
  if (maj === undefined || min === undefined || !Number.isFinite(maj) || !Number.isFinite(min)) return false;
  return maj > major || (maj === major && min >= minor);
}

export function protocolMajor(version: string): number {
  const major = Number.parseInt(version.split('.')[0] ?? '', 10);
  return Number.isFinite(major) ? major : Number.NaN;
}

export const AgentError = Type.Object({
  code: Type.Union([
    Type.Literal('stale_generation'),
    Type.Literal('not_found'),
    Type.Literal('not_running'),
    Type.Literal('timeout'),
    Type.Literal('runtime_error'),
    Type.Literal('bad_request'),
    Type.Literal('unsupported'),
    Type.Literal('unauthorized'),
    Type.Literal('disconnected'),
    // 1.1: guest file operations.
    Type.Literal('path_missing'),
    Type.Literal('path_conflict'),
    Type.Literal('too_large'),
    // 1.4: exec and file operations while a stream client holds the control claim.
    Type.Literal('control_claimed'),
    // 1.7: a lifecycle command from a leader term older than one the agent has seen.
    Type.Literal('stale_epoch'),
    // 1.8: an export or import of a desktop that runs on that host.
    Type.Literal('conflict'),
    // 1.17: a move's stop (`require_snapshot`) whose memory snapshot failed: the desktop runs on.
    Type.Literal('snapshot_failed'),
  ]),
  message: Type.String(),
  retryable: Type.Boolean(),
  /** 1.1: the file's size, on the `path_conflict` of a failed append guard. */
  current_size: Type.Optional(Type.Integer({ minimum: 0 })),
});
export type AgentError = Static<typeof AgentError>;
export type AgentErrorCode = AgentError['code'];

const TierName = TierSchema;


/** 1.7: the leader term a lifecycle command was sent in (store/leases.ts); absent from older schedulers. */
const LeaderEpoch = { leader_epoch: Type.Optional(Type.Integer({ minimum: 0 })) };

/* ------------------------------------------------------------------ agent → scheduler */

export const HelloPayload = Type.Object({
  protocol: Type.String(),
  host_id: Type.String(),
  /** 1.15: the host's key (agent/src/host-identity.ts); a host id is refused with any other once it said hello with one. */
  host_key: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9_-]{43}$' })),
  agent_instance_id: Type.String(),
  hostname: Type.String(),
  capabilities: Type.Object({
    runtime: Type.String(),
    memory_snapshots: Type.Boolean(),
  }),
  capacity: Type.Object({
    vcpus: Type.Integer({ minimum: 0 }),
    memory_mb: Type.Integer({ minimum: 0 }),
  }),
  desktops: Type.Array(
    Type.Object({ ...DesktopRef, running: Type.Boolean(), has_snapshot: Type.Boolean() }),
  ),
  /** 1.5: the port gateway the scheduler's ingress dials; absent when it is turned off. */
  ingress: Type.Optional(Type.Object({ host: Type.String({ minLength: 1 }), port: Type.Integer({ minimum: 1, maximum: 65535 }) })),
  /** 1.8: the transfer server other agents fetch moved desktops from; absent when it is off. */
  transfer: Type.Optional(Type.Object({ host: Type.String({ minLength: 1 }), port: Type.Integer({ minimum: 1, maximum: 65535 }) })),
});
export type HelloPayload = Static<typeof HelloPayload>;

/** 1.7: a scheduler replica, as agents dial it. */
export const ReplicaAddress = Type.Object({ id: Type.String({ minLength: 1 }), url: Type.String({ minLength: 1 }) });
export type ReplicaAddress = Static<typeof ReplicaAddress>;

/** 1.7: a desktop the host must stop before it reports ready: its record says it may not run. */
export const FenceEntry = Type.Object({ ...DesktopRef });
export type FenceEntry = Static<typeof FenceEntry>;

export const HelloResult = Type.Object({
  protocol: Type.String(),
  heartbeat_ms: Type.Integer(),
  /** 1.6: the key of this host's port-link lines (shared/src/port-link.ts), hex. */
  port_link_key: Type.Optional(Type.String({ pattern: '^[0-9a-f]{64}$' })),
  /** 1.7: the replica that answered. */
  replica_id: Type.Optional(Type.String({ minLength: 1 })),
  /** 1.7: every live replica; the agent keeps a link to each. */
  replicas: Type.Optional(Type.Array(ReplicaAddress)),
  /** 1.7: the current leader term, 0 when none has begun. */
  leader_epoch: Type.Optional(Type.Integer({ minimum: 0 })),
  /** 1.7: desktops to stop (hibernate, memory kept) before `host.ready`. */
  fence: Type.Optional(Type.Array(FenceEntry)),
});
export type HelloResult = Static<typeof HelloResult>;

/**
 * 1.11: the host's use as measured when the heartbeat left, read without visiting each desktop.
 * `desktops_memory_mb` is the memory charged to the machine's desktop cgroups (every agent on one
 * machine reports the same figure); `cpu_busy` is the fraction of all cores busy since the last read.
 */
export const MeasuredUse = Type.Object({
  memory_available_mb: Type.Integer({ minimum: 0 }),
  desktops_memory_mb: Type.Integer({ minimum: 0 }),
  cpu_busy: Type.Number({ minimum: 0, maximum: 1 }),
});
export type MeasuredUse = Static<typeof MeasuredUse>;

export const HeartbeatPayload = Type.Object({
  running_desktops: Type.Integer({ minimum: 0 }),
  /** 1.11; absent until the agent has read it once, and from older agents. */
  measured: Type.Optional(MeasuredUse),
});
export type HeartbeatPayload = Static<typeof HeartbeatPayload>;

/** 1.7 (agent → scheduler): the hello's fence is done; the host may take work. */
export const HostReadyPayload = Type.Object({ stopped: Type.Integer({ minimum: 0 }) });
export type HostReadyPayload = Static<typeof HostReadyPayload>;

/** 1.7 (scheduler → agent): what changed in the fleet; either member may be absent. */
export const ClusterPayload = Type.Object({
  leader_epoch: Type.Optional(Type.Integer({ minimum: 0 })),
  replicas: Type.Optional(Type.Array(ReplicaAddress)),
});
export type ClusterPayload = Static<typeof ClusterPayload>;

/** Upgrade response header naming the replica, so an agent drops a second link to it before hello. */
export const REPLICA_HEADER = 'x-canto-replica';
/** Upgrade response header saying why a scheduler refused an agent link. */
export const REFUSAL_HEADER = 'x-canto-refusal';

/* ------------------------------------------------------------------ scheduler → agent */

export const PreparePayload = Type.Object({ ...DesktopRef, ...LeaderEpoch, tier: TierName });
export const PrepareResult = Type.Object({});

export const FirstBoot = Type.Object({
  env: Type.Record(Type.String(), Type.String()),
  setup_script: Type.Union([Type.String(), Type.Null()]),
});
export type FirstBoot = Static<typeof FirstBoot>;

export const StartPayload = Type.Object({
  ...DesktopRef,
  ...LeaderEpoch,
  operation_id: Type.String(),
  tier: TierName,
  /** Present only until the desktop's first successful wake. */
  first_boot: Type.Union([FirstBoot, Type.Null()]),
});
export const StartResult = Type.Object({ restored: Type.Boolean() });

export const HibernatePayload = Type.Object({
  ...DesktopRef,
  ...LeaderEpoch,
  operation_id: Type.String(),
  /**
   * 1.8: a move's stop. Detached processes are part of the memory and go on after the restore,
   * where a user's hibernate kills them (docs/api.md §3.2); without a memory snapshot they end either way.
   */
  keep_detached: Type.Optional(Type.Boolean()),
  /**
   * 1.17: a move's stop. On a host that makes memory snapshots, a desktop whose snapshot fails is
   * not stopped cold: it runs on, and the command fails (`snapshot_failed`, not retryable).
   */
  require_snapshot: Type.Optional(Type.Boolean()),
});
export const HibernateResult = Type.Object({ snapshot: Type.Boolean() });

/**
 * Copies a hibernated desktop (disk, memory snapshot, display) into new desktops on the same
 * host. Each fork starts at its own generation; repeating the command skips forks that exist.
 */
export const ForkPayload = Type.Object({
  ...DesktopRef,
  ...LeaderEpoch,
  operation_id: Type.String(),
  forks: Type.Array(Type.Object({ desktop_id: Type.String(), generation: Type.Integer({ minimum: 0 }) }), { minItems: 1, maxItems: 20 }),
});
export const ForkResult = Type.Object({
  /** True when the forks carry a memory snapshot (they wake with the source's memory). */
  snapshot: Type.Boolean(),
});

export const DestroyPayload = Type.Object({ ...DesktopRef, ...LeaderEpoch, operation_id: Type.String() });
export const DestroyResult = Type.Object({});

/** 1.7: what the host holds of a desktop right now (after its queued lifecycle commands). */
export const InspectPayload = Type.Object({ desktop_id: Type.String() });
export const InspectResult = Type.Object({ running: Type.Boolean(), has_snapshot: Type.Boolean() });

/** Request types the scheduler sends, with their payload and result schemas. */
export const AGENT_COMMANDS = {
  'desktop.prepare': { payload: PreparePayload, result: PrepareResult },
  'desktop.start': { payload: StartPayload, result: StartResult },
  'desktop.hibernate': { payload: HibernatePayload, result: HibernateResult },
  'desktop.destroy': { payload: DestroyPayload, result: DestroyResult },
  'desktop.fork': { payload: ForkPayload, result: ForkResult },
  'desktop.inspect': { payload: InspectPayload, result: InspectResult },
  'guest.exec': { payload: ExecPayload, result: ExecResult },
  'guest.spawn': { payload: SpawnPayload, result: SpawnResult },
  'guest.process': { payload: ProcessPayload, result: ProcessResult },
  'guest.file.read': { payload: FileReadPayload, result: FileReadResult },
  'guest.file.write': { payload: FileWritePayload, result: FileWriteResult },
  'guest.file.delete': { payload: FileDeletePayload, result: FileDeleteResult },
  'guest.file.stat': { payload: FileStatPayload, result: FileStatResult },
  'guest.dir.list': { payload: DirListPayload, result: DirListResult },
  'guest.display.get': { payload: DisplayGetPayload, result: DisplayResult },
  'guest.display.set': { payload: DisplaySetPayload, result: DisplayResult },
  'guest.screenshot': { payload: ScreenshotPayload, result: ScreenshotResult },
  'guest.input': { payload: InputPayload, result: InputResult },
  'stream.grant': { payload: StreamGrantPayload, result: StreamGrantResult },
  'terminal.grant': { payload: TerminalGrantPayload, result: TerminalGrantResult },
  'desktop.export': { payload: ExportPayload, result: ExportResult },
  'desktop.import': { payload: ImportPayload, result: ImportResult },
  'desktop.import.abort': { payload: ImportAbortPayload, result: ImportAbortResult },
  'desktop.precopy.export': { payload: PrecopyExportPayload, result: PrecopyExportResult },
  'desktop.precopy.import': { payload: PrecopyImportPayload, result: PrecopyImportResult },
} as const;

export type AgentCommand = keyof typeof AGENT_COMMANDS;
export type CommandPayload<C extends AgentCommand> = Static<(typeof AGENT_COMMANDS)[C]['payload']>;
export type CommandResult<C extends AgentCommand> = Static<(typeof AGENT_COMMANDS)[C]['result']>;

/* ------------------------------------------------------------------ frames */

export const RequestFrame = Type.Object({
  v: Type.Literal(WIRE_VERSION),
  id: Type.Optional(Type.Integer({ minimum: 1 })),
  type: Type.String(),
  payload: Type.Unknown(),
  /** 1.1: `stream.up` frames with this request's id carry an upload to the handler. */
  upload: Type.Optional(Type.Literal(true)),
  /** 1.1: the handler sends a download as `stream.down` frames after its reply. */
  download: Type.Optional(Type.Literal(true)),
});
export type RequestFrame = Static<typeof RequestFrame>;

export const ReplyFrame = Type.Union([
  Type.Object({ v: Type.Literal(WIRE_VERSION), id: Type.Integer(), ok: Type.Literal(true), result: Type.Unknown() }),
  Type.Object({ v: Type.Literal(WIRE_VERSION), id: Type.Integer(), ok: Type.Literal(false), error: AgentError }),
]);
export type ReplyFrame = Static<typeof ReplyFrame>;

export type Frame = RequestFrame | ReplyFrame;

const requestCheck = TypeCompiler.Compile(RequestFrame);
const replyCheck = TypeCompiler.Compile(ReplyFrame);

export function isReplyFrame(value: unknown): value is ReplyFrame {
  return typeof value === 'object' && value !== null && 'ok' in value && replyCheck.Check(value);
}

export function isRequestFrame(value: unknown): value is RequestFrame {
  return requestCheck.Check(value);
}

const checkers = new Map<TSchema, ReturnType<typeof TypeCompiler.Compile>>();

/** Validates `value` against a message schema; throws a `bad_request` AgentFailure otherwise. */
export function parseMessage<S extends TSchema>(schema: S, value: unknown, what: string): Static<S> {
  let check = checkers.get(schema);
  if (!check) {
    check = TypeCompiler.Compile(schema);
    checkers.set(schema, check);
  }
  if (!check.Check(value)) {
    const first = check.Errors(value).First();
    throw new AgentFailure('bad_request', `invalid ${what}: ${first ? `${first.path} ${first.message}` : 'shape'}`, false);
  }
  return value as Static<S>;
}

/** An error that crosses the agent link as `{code, message, retryable}`. */
export class AgentFailure extends Error {
  constructor(
    readonly code: AgentErrorCode,
    message: string,
    readonly retryable: boolean,
    /** The file's size, on the `path_conflict` of a failed append guard. */
    readonly currentSize?: number,
  ) {
    super(message);
    this.name = 'AgentFailure';
  }

  toJSON(): AgentError {
    const error: AgentError = { code: this.code, message: this.message, retryable: this.retryable };
    if (this.currentSize !== undefined) error.current_size = this.currentSize;
    return error;
  }

  static from(error: AgentError): AgentFailure {
    return new AgentFailure(error.code, error.message, error.retryable, error.current_size);
  }
}

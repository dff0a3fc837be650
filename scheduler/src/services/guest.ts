/**
 * Guest operations (docs/api.md §4.3, 4.4, 4.6): exec, detached processes and files inside an
 * awake desktop, and the tickets for its screen stream and its terminals.
 * The scheduler holds no guest state; each call finds the desktop (404 across orgs), requires
 * `awake` (409), requires a live link to its host (503 at once, never after a timeout), and sends
 * the agent one fenced command carrying the desktop's generation. What the agent answers maps to
 * the API's statuses in one place, `toApiError`.
 *
 * Guest operations are not durable operations: they run while the caller waits, and a lost link
 * fails the call (503) rather than being retried here, because an exec is not idempotent.
 */
import type { AgentCommand, CommandPayload, CommandResult } from '../../../shared/src/protocol.js';
import type { ScreenRegion } from '../../../shared/src/guest-commands.js';
import { INPUT_LIMITS, inputBatchProblem, SCREENSHOT_MAX_BYTES, type InputAction, type StreamClaim } from '../../../shared/src/computer-use.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { newId } from '../../../shared/src/ids.js';
import type { Logger } from '../../../shared/src/log.js';
import { ApiError, errors } from '../errors.js';
import type { Sql } from '../store/db.js';
import { getDesktop, notifyGuestGone } from '../store/desktops.js';
import type { DesktopState } from '../store/rows.js';
import type { NotifiedCache } from '../store/notified-cache.js';
import { formatHostPort } from '../../../shared/src/host-port.js';
import { EXEC_MAX_OUTPUT_BYTES, type ExecOutput } from '../../../shared/src/guest-commands.js';
import type { Static } from '@sinclair/typebox';
import type { ProcessStatusResponse } from '../api/guest-schemas.js';
import { firstLinkCame, type FirstLinks } from './first-link.js';

/** Synchronous exec: the default and ceiling (docs/api.md §4.3) for `timeout_secs`. */
export const EXEC_DEFAULT_TIMEOUT_SECS = 60;
export const EXEC_MAX_TIMEOUT_SECS = 300;
/** Bytes of stdout and of stderr a synchronous exec returns; the rest is dropped (docs/decisions.md). */
export { EXEC_MAX_OUTPUT_BYTES };
/** docs/api.md §8: a chunk written, a window read, a whole file read. */
export const FILE_CHUNK_MAX_BYTES = 8 * 1024 * 1024;
export const DIR_LIST_MAX_ENTRIES = 2000;
export const TAIL_DEFAULT_BYTES = 64 * 1024;
export const TAIL_MAX_BYTES = 512 * 1024;
/** Slack on top of the guest deadline before the link itself gives up. */
const LINK_GRACE_MS = 10_000;

/** Deadline of every guest operation other than a synchronous exec. */
const GUEST_OP_TIMEOUT_MS = 120_000;

/** What the service needs from the agent gateway. */
export interface GuestLink extends FirstLinks {
  isConnected(hostId: string): boolean;
  call<C extends AgentCommand>(
    hostId: string,
    command: C,
    payload: CommandPayload<C>,
    timeoutMs: number,
    upload?: AsyncIterable<Uint8Array>,
  ): Promise<CommandResult<C>>;
  callDownload<C extends AgentCommand>(
    hostId: string,
    command: C,
    payload: CommandPayload<C>,
    timeoutMs: number,
  ): Promise<{ result: CommandResult<C>; body: AsyncIterable<Buffer> }>;
}

export interface ExecRequest {
  readonly command: string;
  readonly timeoutSecs: number | null | undefined;
}

/** `GET …/processes/{id}`'s answer, typed by its schema. */
export type ProcessStatusJson = Static<typeof ProcessStatusResponse>;

/** docs/api.md §4.3: default 60, clamped to 300, never rejected. Below one second counts as one. */
export function clampExecTimeoutSecs(value: number | null | undefined): number {
  if (value === null || value === undefined || Number.isNaN(value)) return EXEC_DEFAULT_TIMEOUT_SECS;
  return Math.min(EXEC_MAX_TIMEOUT_SECS, Math.max(1, Math.ceil(value)));
}

/** docs/api.md §4.3: omitted or 0 gives 64 KiB; anything above 512 KiB is capped. */
export function clampTailBytes(value: number | undefined): number {
  if (value === undefined || value === 0) return TAIL_DEFAULT_BYTES;
  return Math.min(TAIL_MAX_BYTES, value);
}

interface Target {
  readonly hostId: string;
  readonly ref: { desktop_id: string; generation: number };
}

/** What a guest operation needs of a desktop row, as cached. */
export interface DesktopRoute {
  readonly org_id: string;
  readonly state: DesktopState;
  readonly host_id: string | null;
  readonly generation: number;
  /** Between hosts (engine/move.ts): not reachable until the move commits or rolls back. */
  readonly moving: boolean;
}

export function isRoutable(route: DesktopRoute): route is DesktopRoute & { host_id: string } {
  return route.state === 'awake' && route.host_id !== null && !route.moving;
}

/**
 * A desktop row's change as its route notification tells it (migration `desktop route
 * notifications`): the route the change left, or null for a deleted row. Null for a payload that
 * is not one, which the cache takes as "anything may have changed".
 */
export function routeNotification(payload: string): { key: string; value: DesktopRoute | null } | null {
  let n: Record<string, unknown>;
  try {
    n = JSON.parse(payload) as Record<string, unknown>;
  } catch {
    return null;
  }
  if (typeof n.id !== 'string') return null;
  if (n.state === undefined) return { key: n.id, value: null };
  const { org_id, state, host_id, generation, moving } = n;
  if (typeof org_id !== 'string' || typeof state !== 'string' || typeof generation !== 'number' || typeof moving !== 'boolean') return null;
  if (host_id !== null && typeof host_id !== 'string') return null;
  return { key: n.id, value: { org_id, state: state as DesktopState, host_id, generation, moving } };
}

/** Agent answers meaning the host no longer runs the generation the route named. */
const NOT_RUNNING_THERE = new Set(['not_running', 'not_found', 'stale_generation']);
/** A replica reports a desktop gone at most this often (every call to it fails meanwhile). */
const REPORT_GONE_MS = 2_000;

export class GuestService {
  private readonly log: Logger;
  /** When this replica last reported each desktop gone. */
  private readonly reportedGone = new Map<string, number>();

  constructor(
    private readonly sql: Sql,
    private readonly link: GuestLink,
    logger: Logger,
    /** Awake desktops' routes by desktop id. */
    private readonly routes: NotifiedCache<DesktopRoute>,
  ) {
    this.log = logger.child({ component: 'guest' });
  }

  async exec(orgId: string, desktopId: string, req: ExecRequest): Promise<ExecOutput> {
    const target = await this.target(orgId, desktopId);
    const timeoutMs = clampExecTimeoutSecs(req.timeoutSecs) * 1000;
    const out = await this.run(target, 'guest.exec', {
      ...target.ref,
      command: req.command,
      timeout_ms: timeoutMs,
      max_output_bytes: EXEC_MAX_OUTPUT_BYTES,
    }, timeoutMs + LINK_GRACE_MS);
    return {
      exit_code: out.exit_code,
      stdout: out.stdout,
      stderr: out.stderr,
      stdout_truncated: out.stdout_truncated ?? false,
      stderr_truncated: out.stderr_truncated ?? false,
    };
  }

  async spawn(orgId: string, desktopId: string, command: string): Promise<{ process_id: string }> {
    const target = await this.target(orgId, desktopId);
    const processId = newId('process');
    await this.run(target, 'guest.spawn', { ...target.ref, process_id: processId, command }, GUEST_OP_TIMEOUT_MS);
    return { process_id: processId };
  }

  async processStatus(orgId: string, desktopId: string, processId: string, tailBytes: number): Promise<ProcessStatusJson> {
    const target = await this.target(orgId, desktopId);
    const st = await this.run(target, 'guest.process', { ...target.ref, process_id: processId, tail_bytes: tailBytes }, GUEST_OP_TIMEOUT_MS);
    if (!st.found) throw errors.processNotFound();
    return {
      process_id: processId,
      status: st.status,
      // docs/api.md §2.6 types exit_code as an integer that only means something once exited.
      exit_code: st.status === 'exited' && st.exit_code !== null ? st.exit_code : -1,
      stdout_tail: st.stdout_tail,
      stderr_tail: st.stderr_tail,
    };
  }

  /** `offset` null reads the whole file (413 above the cap); otherwise a window of `length`. */
  async readFile(orgId: string, desktopId: string, path: string, offset: number | null, length: number) {
    const target = await this.target(orgId, desktopId);
    const payload = { ...target.ref, path, offset, length, max_whole_bytes: FILE_CHUNK_MAX_BYTES };
    return this.mapped('guest.file.read', () => this.link.callDownload(target.hostId, 'guest.file.read', payload, GUEST_OP_TIMEOUT_MS), target);
  }

  async writeFile(orgId: string, desktopId: string, path: string, appendAt: number | null, body: AsyncIterable<Uint8Array>): Promise<void> {
    const target = await this.target(orgId, desktopId);
    const payload = { ...target.ref, path, append_at: appendAt };
    await this.mapped('guest.file.write', () => this.link.call(target.hostId, 'guest.file.write', payload, GUEST_OP_TIMEOUT_MS, body), target);
  }

  async deletePath(orgId: string, desktopId: string, path: string, recursive: boolean): Promise<void> {
    const target = await this.target(orgId, desktopId);
    await this.run(target, 'guest.file.delete', { ...target.ref, path, recursive }, GUEST_OP_TIMEOUT_MS);
  }

  async stat(orgId: string, desktopId: string, path: string) {
    const target = await this.target(orgId, desktopId);
    return this.run(target, 'guest.file.stat', { ...target.ref, path }, GUEST_OP_TIMEOUT_MS);
  }

  async listDir(orgId: string, desktopId: string, path: string) {
    const target = await this.target(orgId, desktopId);
    return this.run(target, 'guest.dir.list', { ...target.ref, path, limit: DIR_LIST_MAX_ENTRIES }, GUEST_OP_TIMEOUT_MS);
  }

  async getDisplay(orgId: string, desktopId: string) {
    const target = await this.target(orgId, desktopId);
    return this.run(target, 'guest.display.get', { ...target.ref }, GUEST_OP_TIMEOUT_MS);
  }

  /** Resizes, then answers the geometry read back from the guest. */
  async setDisplay(orgId: string, desktopId: string, width: number, height: number) {
    const target = await this.target(orgId, desktopId);
    return this.run(target, 'guest.display.set', { ...target.ref, width, height }, GUEST_OP_TIMEOUT_MS);
  }

  /** A PNG of the screen, cropped and scaled in the agent; 413 over the transfer cap. */
  async screenshot(orgId: string, desktopId: string, region: ScreenRegion | null, scalePercent: number | null) {
    const target = await this.target(orgId, desktopId);
    const payload = { ...target.ref, region, scale_percent: scalePercent, max_bytes: SCREENSHOT_MAX_BYTES };
    const shot = await this.run(target, 'guest.screenshot', payload, GUEST_OP_TIMEOUT_MS);
    return { png: Buffer.from(shot.png.buffer, shot.png.byteOffset, shot.png.byteLength), width: shot.width, height: shot.height };
  }

  /** Runs an input batch in one agent round trip; answers the final cursor. */
  async input(orgId: string, desktopId: string, actions: readonly InputAction[]): Promise<{ cursor: { x: number; y: number } }> {
    const problem = inputBatchProblem(actions);
    if (problem !== null) throw errors.badRequest(problem);
    const target = await this.target(orgId, desktopId);
    // The agent kills a batch at its deadline and answers `timeout` (504); the link waits longer.
    const cursor = await this.run(target, 'guest.input', { ...target.ref, actions: [...actions] }, INPUT_LIMITS.batchTimeoutMs + LINK_GRACE_MS);
    return { cursor: { x: cursor.x, y: cursor.y } };
  }

  /** A single-use stream ticket from the desktop's agent, as the URL the client dials. */
  async streamTicket(orgId: string, desktopId: string, claim: StreamClaim) {
    const target = await this.target(orgId, desktopId);
    const grant = await this.run(target, 'stream.grant', { ...target.ref, claim }, GUEST_OP_TIMEOUT_MS);
    const hostPort = formatHostPort(grant.host, grant.port);
    const ticket = encodeURIComponent(grant.ticket);
    return {
      url: `tcp://${hostPort}/?ticket=${ticket}`,
      ...(grant.websocket === true ? { ws_url: `ws://${hostPort}/vnc?ticket=${ticket}` } : {}),
      claim,
      expires_at: grant.expires_at,
    };
  }

  /** A single-use terminal ticket from the desktop's agent, as the WebSocket URL the client opens. */
  async terminalTicket(orgId: string, desktopId: string, spec: { cols: number; rows: number; command: string | null }) {
    const target = await this.target(orgId, desktopId);
    const grant = await this.run(target, 'terminal.grant', { ...target.ref, ...spec }, GUEST_OP_TIMEOUT_MS);
    return {
      url: `ws://${formatHostPort(grant.host, grant.port)}/terminal?ticket=${encodeURIComponent(grant.ticket)}`,
      cols: spec.cols,
      rows: spec.rows,
      expires_at: grant.expires_at,
    };
  }

  /**
   * The desktop, awake, on a connected host; otherwise the 404, 409 or 503 the API gives. Only an
   * awake desktop's route is cached: a stale one reaches an agent that no longer runs that
   * generation, which answers `not_running` and evicts it (`mapped`).
   */
  private async target(orgId: string, desktopId: string): Promise<Target> {
    const load = async (): Promise<DesktopRoute | null> => {
      const row = await getDesktop(this.sql, orgId, desktopId);
      return row && { org_id: row.org_id, state: row.state, host_id: row.host_id, generation: row.generation, moving: row.moving_operation_id !== null };
    };
    const route = await this.routes.get(desktopId, load, isRoutable);
    // The cache is keyed by desktop alone: another org's entry answers exactly like a missing row,
    // after the same query (answered from memory, it would tell by its speed that the id exists).
    if (!route || route.org_id !== orgId) {
      if (route) await load();
      throw errors.desktopNotFound();
    }
    if (route.moving && route.state === 'awake') throw errors.desktopMoving();
    if (!isRoutable(route)) throw errors.notAwake(route.state);
    if (!this.link.isConnected(route.host_id) && !(await firstLinkCame(this.sql, this.link, route.host_id))) throw errors.hostUnreachable();
    return { hostId: route.host_id, ref: { desktop_id: desktopId, generation: route.generation } };
  }

  private run<C extends AgentCommand>(target: Target, command: C, payload: CommandPayload<C>, timeoutMs: number): Promise<CommandResult<C>> {
    return this.mapped(command, () => this.link.call(target.hostId, command, payload, timeoutMs), target);
  }

  /** Runs one agent call, turning what the agent answered into the API's error. */
  private async mapped<T>(command: AgentCommand, work: () => Promise<T>, target: Target): Promise<T> {
    try {
      return await work();
    } catch (err) {
      if (err instanceof AgentFailure && NOT_RUNNING_THERE.has(err.code)) {
        this.routes.evict(target.ref.desktop_id);
        // A move stopped it (a call caught by the stop), or has it on its new host and not yet
        // started there: it is between hosts, which answers 503 with Retry-After, not 409.
        if (await this.moveOpen(target.ref.desktop_id)) throw errors.desktopMoving();
      }
      if (err instanceof AgentFailure && err.code === 'not_running') this.reportGone(target.ref.desktop_id);
      throw this.toApiError(err, command);
    }
  }

  /** Whether a move of the desktop is under way (asked only once its host said it does not run it). */
  private async moveOpen(desktopId: string): Promise<boolean> {
    const rows = await this.sql`SELECT 1 FROM operations WHERE desktop_id = ${desktopId} AND kind = 'move' AND state IN ('pending', 'running') LIMIT 1`;
    return rows.length > 0;
  }

  /**
   * The host has the desktop but does not run it, while its record (as this replica last read it)
   * says awake: its guest died, or it is stopping. The leader checks with the host and records a
   * dead one hibernated (engine.ts), so a desktop never stays "awake" with nothing running.
   */
  private reportGone(desktopId: string): void {
    const now = Date.now();
    const last = this.reportedGone.get(desktopId);
    if (last !== undefined && now - last < REPORT_GONE_MS) return;
    if (this.reportedGone.size >= 10_000) this.reportedGone.clear();
    this.reportedGone.set(desktopId, now);
    notifyGuestGone(this.sql, desktopId).catch((err: unknown) => this.log.warn({ err, desktopId }, 'could not report a desktop its host no longer runs'));
  }

  /** One mapping from what the agent answered to what the API answers. */
  private toApiError(err: unknown, command: AgentCommand): Error {
    if (err instanceof ApiError) return err;
    if (!(err instanceof AgentFailure)) return err instanceof Error ? err : new Error(String(err));
    switch (err.code) {
      case 'disconnected':
        return errors.hostUnreachable();
      case 'timeout':
        return errors.guestTimeout();
      case 'not_running':
      case 'not_found':
      case 'stale_generation':
        // The host no longer runs this generation of the desktop: it is stopping or has moved on.
        return errors.notAwake('not running on its host');
      case 'path_missing':
        return errors.pathNotFound();
      case 'path_conflict':
        return err.currentSize !== undefined ? errors.appendMismatch(err.currentSize) : errors.pathConflict(err.message);
      case 'too_large':
        // Limits of the desktop's sessions are its state, like a held control claim: 409.
        if (command === 'terminal.grant') return errors.terminalLimit();
        if (command === 'stream.grant') return errors.viewLimit(err.message);
        return command === 'guest.screenshot'
          ? errors.tooLarge('the image is over the 8 MiB cap; retry with region or scale_percent')
          : errors.tooLarge(err.message);
      case 'control_claimed':
        return command === 'stream.grant' ? errors.streamControlTaken() : errors.controlClaimed();
      case 'bad_request':
        return errors.badRequest(err.message);
      case 'unsupported':
        return errors.notImplemented("the desktop's host does not support this operation");
      case 'runtime_error': {
        const sentence = GUEST_FAILURES[command];
        if (sentence === undefined) break;
        this.log.warn({ command, message: err.message }, 'guest operation failed inside the desktop');
        return errors.guestFailed(sentence);
      }
      default:
        break;
    }
    this.log.error({ command, code: err.code, message: err.message }, 'guest operation failed in the agent');
    return new Error(`${command} failed`);
  }
}

/** docs/api.md §4.5's 500s: failures inside the guest, each with a fixed sentence (the agent's text is logged). */
const GUEST_FAILURES: Partial<Record<AgentCommand, string>> = {
  'guest.screenshot': "the desktop's X session did not answer",
  'guest.input': 'an input action failed inside the desktop; earlier actions of the batch have run',
  'guest.display.get': "the desktop's X session did not answer",
  'guest.display.set': 'the resize failed inside the desktop',
};

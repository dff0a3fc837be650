/**
 * Command handlers: the one place that turns a scheduler command into runtime driver calls. Each
 * command goes through the same steps:
 *
 * 1. validate the payload against its protocol schema (`bad_request` otherwise);
 * 2. wait its turn behind earlier lifecycle commands for the same desktop;
 * 3. fence: refuse a generation older than the one this host holds (`stale_generation`);
 * 4. call the driver, translating snake_case wire fields into the driver's camelCase specs;
 * 5. translate the result back and validate it against the result schema before it leaves, so a
 *    driver bug shows up here as a clear error instead of as a malformed reply on the scheduler.
 *
 * Lifecycle commands (prepare, start, hibernate, destroy) for one desktop run one at a time, in
 * arrival order, through a promise chain per desktop: a hibernate must not snapshot a desktop that
 * a start is still restoring. They come from the leader only, with its lease epoch, and one from
 * an older leader term is refused (leader-epochs.ts). A hello's fence (`fence`) and
 * `desktop.inspect` take the same queue, so they see the desktop as the commands before them left it. Commands for different desktops run in parallel. `guest.exec` is
 * fenced but not queued: it may run for minutes, and holding a hibernate behind it would stall the
 * scheduler's operation for that long; the driver answers `not_running` if the desktop stops under
 * it. The other guest operations (detached processes, files) are fenced and unqueued the same way.
 * A file write reads its bytes from the request's upload; a file read answers with a download.
 *
 * Moving a desktop (export, import, abort) is lifecycle work too, done by transfer/moves.ts.
 *
 * Driver errors that are not already an `AgentFailure` become a non-retryable `runtime_error`
 * with a short message; the full error goes to the log only.
 */
import type { Static, TSchema } from '@sinclair/typebox';
import { inputBatchProblem, type StreamClaim } from '../../shared/src/computer-use.js';
import type { Logger } from '../../shared/src/log.js';
import { AGENT_COMMANDS, AgentFailure, DestroyPayload, ForkPayload, HibernatePayload, PreparePayload, StartPayload, InspectPayload, parseMessage, type FenceEntry, type AgentCommand } from '../../shared/src/protocol.js';
import { DirListPayload, DisplayGetPayload, DisplaySetPayload, ExecPayload, FileDeletePayload, FileReadPayload, FileStatPayload, FileWritePayload, ProcessPayload, SpawnPayload, ScreenshotPayload, StreamGrantPayload, TerminalGrantPayload, InputPayload } from '../../shared/src/guest-commands.js';
import { WithDownload } from '../../shared/src/byte-stream.js';
import type { RequestContext, RpcPeer } from '../../shared/src/rpc.js';
import type { FenceKind, GenerationStore } from './generations.js';
import type { RuntimeDriver, TerminalSpec } from './runtime/driver.js';
import { LeaderEpochs } from './leader-epochs.js';
import { DesktopQueue } from './desktop-queue.js';
import { applyFence } from './hello-fence.js';
import { DesktopMoves } from './transfer/moves.js';

/** What the handlers need from the stream gateway (agent/src/stream/gateway.ts). */
export interface StreamAccess {
  grant(desktopId: string, claim: StreamClaim): { ticket: string; expiresAt: Date; host: string; port: number };
  /** A single-use terminal ticket for the desktop's generation (gateway.ts). */
  grantTerminal(desktopId: string, generation: number, spec: TerminalSpec): { ticket: string; expiresAt: Date; host: string; port: number };
  /** True while a stream client holds the desktop's control claim. */
  controlHeld(desktopId: string): boolean;
  /** Drops the desktop's tickets, closes its connections and releases its claim. */
  release(desktopId: string): void;
}

export interface HandlerDeps {
  readonly driver: RuntimeDriver;
  readonly generations: GenerationStore;
  readonly logger: Logger;
  /** The stream gateway; absent when streaming is turned off on this host. */
  readonly stream?: StreamAccess | null;
  /** Leader terms seen by this agent; a fresh tracker when absent. */
  readonly leaderEpochs?: LeaderEpochs;
  /** Told of every command's outcome (observability.ts). */
  readonly metrics?: { observeCommand(command: string, outcome: string, seconds: number): void; observeRefusal(code: string): void };
  /** Moves between hosts (transfer/moves.ts); without one, imports work and exports are `unsupported`. */
  readonly moves?: DesktopMoves;
}

/** A request's context, with a way to notify the scheduler link it came on. */
export type CommandContext = RequestContext & { readonly notify?: (type: string, payload: unknown) => void };

interface DesktopCommand {
  readonly desktop_id: string;
  readonly generation: number;
  readonly operation_id?: string;
  readonly leader_epoch?: number;
}

const MAX_ERROR_MESSAGE = 200;
/** Output kept per stream of a synchronous exec when the scheduler names no cap. */
export const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;
const NO_CONTEXT: RequestContext = { upload: null };

export class CommandHandlers {
  private readonly driver: RuntimeDriver;
  private readonly generations: GenerationStore;
  private readonly log: Logger;
  private readonly stream: StreamAccess | null;
  private readonly epochs: LeaderEpochs;
  private readonly metrics: HandlerDeps['metrics'] | null;
  private readonly queue = new DesktopQueue();
  private readonly moves: DesktopMoves;

  constructor(deps: HandlerDeps) {
    this.driver = deps.driver;
    this.generations = deps.generations;
    this.log = deps.logger.child({ component: 'agent-handlers' });
    this.stream = deps.stream ?? null;
    this.epochs = deps.leaderEpochs ?? new LeaderEpochs();
    this.metrics = deps.metrics ?? null;
    this.moves = deps.moves ?? new DesktopMoves({ driver: deps.driver, source: null, url: null, log: () => undefined });
  }

  /** Stops the desktops a hello reply names, before the host reports ready (hello-fence.ts). */
  fence(entries: readonly FenceEntry[]): Promise<number> {
    return applyFence(
      { queue: this.queue, generations: this.generations, driver: this.driver, releaseStreams: (id) => this.stream?.release(id), log: this.log },
      entries,
    );
  }

  /** Registers a handler on `peer` for every scheduler → agent command. */
  register(peer: Pick<RpcPeer, 'handle'> & Partial<Pick<RpcPeer, 'notify'>>): void {
    const notify = peer.notify && ((type: string, payload: unknown) => peer.notify!(type, payload));
    for (const type of Object.keys(AGENT_COMMANDS) as AgentCommand[]) {
      peer.handle(type, (payload, context) => this.handle(type, payload, notify ? { ...context, notify } : context));
    }
  }

  /** Runs one command and returns its validated, wire-shaped result. */
  async handle(type: AgentCommand, payload: unknown, context: CommandContext = NO_CONTEXT): Promise<unknown> {
    const result = await this.dispatch(type, payload, context);
    try {
      if (result instanceof WithDownload) {
        return new WithDownload(parseMessage(AGENT_COMMANDS[type].result, result.result, `${type} result`), result.body);
      }
      return parseMessage(AGENT_COMMANDS[type].result, result, `${type} result`);
    } catch (err) {
      // The scheduler sent nothing wrong: a result that fails its schema is our bug.
      this.log.error({ type, err }, 'driver result does not match the protocol');
      throw new AgentFailure('runtime_error', `agent produced an invalid ${type} result`, false);
    }
  }

  private dispatch(type: AgentCommand, raw: unknown, context: CommandContext): Promise<unknown> {
    switch (type) {
      case 'desktop.prepare': {
        const p = parse(PreparePayload, raw, type);
        return this.lifecycle(type, p, 'command', async () => {
          await this.driver.prepare(p.desktop_id, p.tier);
          return {};
        });
      }
      case 'desktop.start': {
        const p = parse(StartPayload, raw, type);
        const firstBoot = p.first_boot && { env: p.first_boot.env, setupScript: p.first_boot.setup_script };
        return this.lifecycle(type, p, 'command', async () => {
          await this.moves.starting(p.desktop_id);
          const { restored } = await this.driver.start({ desktopId: p.desktop_id, tier: p.tier, firstBoot });
          return { restored };
        });
      }
      case 'desktop.hibernate': {
        const p = parse(HibernatePayload, raw, type);
        return this.lifecycle(type, p, 'command', async () => {
          // Stream clients are disconnected (their VNC servers cannot be snapshotted) and lose their claims.
          this.stream?.release(p.desktop_id);
          const { snapshot } = await this.driver.hibernate(p.desktop_id, { keepDetached: p.keep_detached === true });
          return { snapshot };
        });
      }
      case 'desktop.fork': {
        const p = parse(ForkPayload, raw, type);
        // Queued on the source, so no wake can restore (and delete) the snapshot being copied.
        return this.lifecycle(type, p, 'command', async () => {
          for (const f of p.forks) await this.generations.check(f.desktop_id, f.generation);
          this.moves.forking(p.desktop_id);
          return this.driver.fork(p.desktop_id, p.forks.map((f) => f.desktop_id));
        });
      }
      case 'desktop.destroy': {
        const p = parse(DestroyPayload, raw, type);
        if (this.current(p)) this.moves.cancelImport(p.desktop_id);
        return this.lifecycle(type, p, 'destroy', async () => {
          this.stream?.release(p.desktop_id);
          await this.driver.destroy(p.desktop_id);
          await this.moves.destroyed(p.desktop_id);
          // Only after the disk is gone: if destroy fails, the scheduler retries a live desktop.
          await this.generations.forget(p.desktop_id);
          return {};
        });
      }
      case 'desktop.inspect': {
        const p = parse(InspectPayload, raw, type);
        return this.queue.run(p.desktop_id, async () => {
          const held = (await this.driver.list()).find((d) => d.desktopId === p.desktop_id);
          return { running: held?.running ?? false, has_snapshot: held?.hasSnapshot ?? false };
        });
      }
      case 'guest.exec': {
        const p = parse(ExecPayload, raw, type);
        return this.exclusive(type, p, async () => {
          const out = await this.driver.exec(p.desktop_id, {
            command: p.command,
            timeoutMs: p.timeout_ms,
            maxOutputBytes: p.max_output_bytes ?? DEFAULT_MAX_OUTPUT_BYTES,
          });
          return {
            exit_code: out.exitCode,
            stdout: out.stdout,
            stderr: out.stderr,
            stdout_truncated: out.stdoutTruncated,
            stderr_truncated: out.stderrTruncated,
          };
        });
      }
      case 'guest.spawn': {
        const p = parse(SpawnPayload, raw, type);
        return this.exclusive(type, p, async () => {
          await this.driver.spawnDetached(p.desktop_id, { processId: p.process_id, command: p.command });
          return {};
        });
      }
      case 'guest.process': {
        const p = parse(ProcessPayload, raw, type);
        return this.guest(type, p, async () => {
          const st = await this.driver.processStatus(p.desktop_id, p.process_id, p.tail_bytes);
          if (st === null) return { found: false, status: 'lost', exit_code: null, stdout_tail: '', stderr_tail: '' };
          return { found: true, status: st.status, exit_code: st.exitCode, stdout_tail: st.stdoutTail, stderr_tail: st.stderrTail };
        });
      }
      case 'guest.file.read': {
        const p = parse(FileReadPayload, raw, type);
        return this.exclusive(type, p, async () => {
          const read = await this.driver.readFile(p.desktop_id, {
            path: p.path,
            offset: p.offset,
            length: p.length,
            maxWholeBytes: p.max_whole_bytes,
          });
          return new WithDownload({ size: read.size, length: read.length, eof: read.eof }, read.body);
        });
      }
      case 'guest.file.write': {
        const p = parse(FileWritePayload, raw, type);
        const upload = context.upload;
        if (upload === null) return Promise.reject(new AgentFailure('bad_request', 'guest.file.write needs an upload', false));
        return this.exclusive(type, p, async () => {
          await this.driver.writeFile(p.desktop_id, { path: p.path, appendAt: p.append_at }, upload);
          return {};
        });
      }
      case 'guest.file.delete': {
        const p = parse(FileDeletePayload, raw, type);
        return this.exclusive(type, p, async () => {
          await this.driver.deletePath(p.desktop_id, p.path, p.recursive);
          return {};
        });
      }
      case 'guest.file.stat': {
        const p = parse(FileStatPayload, raw, type);
        return this.exclusive(type, p, async () => {
          const st = await this.driver.statPath(p.desktop_id, p.path);
          return { file_type: st.fileType, size_bytes: st.sizeBytes, modified_at: st.modifiedAt, mode: st.mode };
        });
      }
      case 'guest.dir.list': {
        const p = parse(DirListPayload, raw, type);
        return this.exclusive(type, p, async () => {
          const list = await this.driver.listDir(p.desktop_id, p.path, p.limit);
          return {
            entries: list.entries.map((e) => ({ name: e.name, file_type: e.fileType, size_bytes: e.sizeBytes, modified_at: e.modifiedAt })),
            truncated: list.truncated,
          };
        });
      }
      case 'guest.display.get': {
        const p = parse(DisplayGetPayload, raw, type);
        return this.computerUse(type, p, () => this.driver.getDisplay(p.desktop_id));
      }
      case 'guest.display.set': {
        const p = parse(DisplaySetPayload, raw, type);
        return this.computerUse(type, p, () => this.driver.setDisplay(p.desktop_id, { width: p.width, height: p.height }));
      }
      case 'guest.screenshot': {
        const p = parse(ScreenshotPayload, raw, type);
        return this.computerUse(type, p, async () => {
          const shot = await this.driver.screenshot(p.desktop_id, { region: p.region, scalePercent: p.scale_percent, maxBytes: p.max_bytes });
          return { png: shot.png, width: shot.width, height: shot.height };
        });
      }
      case 'guest.input': {
        const p = parse(InputPayload, raw, type);
        const problem = inputBatchProblem(p.actions);
        if (problem !== null) return Promise.reject(new AgentFailure('bad_request', problem, false));
        return this.computerUse(type, p, () => this.driver.input(p.desktop_id, p.actions));
      }
      case 'stream.grant': {
        const p = parse(StreamGrantPayload, raw, type);
        const stream = this.stream;
        if (stream === null) return Promise.reject(new AgentFailure('unsupported', 'streaming is turned off on this host', false));
        // The scheduler granted it for an awake desktop; the gateway checks again when the client dials.
        return this.computerUse(type, p, async () => {
          const grant = stream.grant(p.desktop_id, p.claim);
          return { ticket: grant.ticket, expires_at: grant.expiresAt.toISOString(), host: grant.host, port: grant.port, websocket: true };
        });
      }
      case 'terminal.grant': {
        const p = parse(TerminalGrantPayload, raw, type);
        const stream = this.stream;
        if (stream === null) return Promise.reject(new AgentFailure('unsupported', 'terminals need the stream gateway, which is off on this host', false));
        // Not gated by a stream control claim: a terminal is a person at the desktop, like a control stream.
        return this.guest(type, p, async () => {
          const grant = stream.grantTerminal(p.desktop_id, p.generation, { cols: p.cols, rows: p.rows, command: p.command });
          return { ticket: grant.ticket, expires_at: grant.expiresAt.toISOString(), host: grant.host, port: grant.port };
        });
      }
      case 'desktop.export':
      case 'desktop.import':
      case 'desktop.import.abort':
        return this.moves.command(type, raw, { lifecycle: (p, work) => this.lifecycle(type, p, 'command', work), current: (p) => this.current(p), notify: context.notify });
      default: {
        const unknown: never = type;
        return Promise.reject(new AgentFailure('unsupported', `unknown command ${String(unknown)}`, false));
      }
    }
  }

  /**
   * An exec or file operation: refused while a stream client holds the control claim, so the
   * person driving the desktop is not raced by an API client changing it underneath.
   */
  private exclusive(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<unknown>): Promise<unknown> {
    if (this.stream?.controlHeld(cmd.desktop_id) === true) {
      return Promise.reject(new AgentFailure('control_claimed', 'a stream client holds the control claim', false));
    }
    return this.guest(type, cmd, work);
  }

  /** Screenshots, input, display and streams: only on a driver with computer-use support. */
  private computerUse(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<unknown>): Promise<unknown> {
    if (!this.driver.capabilities().computerUse) {
      return Promise.reject(new AgentFailure('unsupported', 'this host has no computer-use support', false));
    }
    return this.guest(type, cmd, work);
  }

  /** A guest operation: fenced, but not queued behind lifecycle commands. */
  private guest(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<unknown>): Promise<unknown> {
    // Guest operations are frequent: they log at debug, lifecycle commands at info.
    return this.guarded(
      type,
      cmd,
      async () => {
        await this.generations.check(cmd.desktop_id, cmd.generation);
        return work();
      },
      'debug',
    );
  }

  /** Whether a command would pass the fences now (checked again, for real, in its turn). */
  private current(cmd: DesktopCommand): boolean {
    return (cmd.leader_epoch ?? Infinity) >= this.epochs.current && (this.generations.get(cmd.desktop_id) ?? 0) <= cmd.generation;
  }

  /** Queues a fenced lifecycle command behind earlier ones for the same desktop. */
  private lifecycle(
    type: AgentCommand,
    cmd: DesktopCommand,
    fence: FenceKind,
    work: () => Promise<unknown>,
  ): Promise<unknown> {
    return this.queue.run(cmd.desktop_id, () =>
      this.guarded(type, cmd, async () => {
        this.epochs.admit(cmd.leader_epoch);
        await this.generations.check(cmd.desktop_id, cmd.generation, fence);
        return work();
      }),
    );
  }

  /** Logs the outcome and turns unexpected errors into short, non-retryable `runtime_error`s. */
  private async guarded(
    type: AgentCommand,
    cmd: DesktopCommand,
    work: () => Promise<unknown>,
    level: 'info' | 'debug' = 'info',
  ): Promise<unknown> {
    // Only identifiers are logged: payloads can carry first-boot env values and exec commands.
    const fields = { type, desktop_id: cmd.desktop_id, generation: cmd.generation, operation_id: cmd.operation_id };
    const started = performance.now();
    const seconds = () => (performance.now() - started) / 1000;
    try {
      const result = await work();
      this.log[level]({ ...fields, ms: Math.round(performance.now() - started) }, 'command done');
      this.metrics?.observeCommand(type, 'ok', seconds());
      return result;
    } catch (err) {
      if (err instanceof AgentFailure) {
        // A missing file or a failed append guard is an answer, not an incident.
        const answer = err.code === 'path_missing' || err.code === 'path_conflict' || err.code === 'too_large';
        this.log[answer ? 'debug' : 'warn']({ ...fields, code: err.code, message: err.message }, 'command refused');
        this.metrics?.observeCommand(type, answer ? 'ok' : 'refused', seconds());
        if (!answer) this.metrics?.observeRefusal(err.code);
        throw err;
      }
      this.log.error({ ...fields, err }, 'command failed in the runtime driver');
      this.metrics?.observeCommand(type, 'failed', seconds());
      throw new AgentFailure('runtime_error', shortMessage(type, err), false);
    }
  }
}

function parse<S extends TSchema>(schema: S, value: unknown, type: AgentCommand): Static<S> {
  return parseMessage(schema, value, `${type} payload`);
}

function shortMessage(type: AgentCommand, err: unknown): string {
  const text = err instanceof Error ? err.message : String(err);
  const firstLine = text.split('\n', 1)[0] ?? '';
  const clipped = firstLine.length > MAX_ERROR_MESSAGE ? `${firstLine.slice(0, MAX_ERROR_MESSAGE)}…` : firstLine;
  return `${type} failed: ${clipped}`;
}

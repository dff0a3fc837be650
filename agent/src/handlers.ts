/**
 * Command handlers: the one place that turns a scheduler command into runtime driver calls. Each
 * command goes through the same steps:
 *
 * 1. validate the payload against its protocol schema (`bad_request` otherwise);
 * 2. wait its turn behind earlier lifecycle commands for the same desktop;
 * 3. fence: refuse a generation older than the one this host holds (`stale_generation`);
 * 4. run the command's entry of the typed table in command-table.ts, which calls the driver,
 *    translating snake_case wire fields into the driver's camelCase specs;
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
import type { Logger } from '../../shared/src/log.js';
import { AGENT_COMMANDS, AgentFailure, parseMessage, type AgentCommand, type CommandPayload, type FenceEntry } from '../../shared/src/protocol.js';
import { WithDownload } from '../../shared/src/byte-stream.js';
import type { RequestContext, RpcPeer } from '../../shared/src/rpc.js';
import type { FenceKind, GenerationStore } from './generations.js';
import type { RuntimeDriver } from './runtime/driver.js';
import { LeaderEpochs } from './leader-epochs.js';
import { DesktopQueue } from './desktop-queue.js';
import { defaultLifecycleSlots, LifecycleSlots } from './lifecycle-slots.js';
import { applyFence } from './hello-fence.js';
import { DesktopMoves } from './transfer/moves.js';
import { commandTable, type CommandContext, type CommandHandler, type CommandTable, type StreamAccess } from './command-table.js';

export { DEFAULT_MAX_OUTPUT_BYTES, type CommandContext, type StreamAccess } from './command-table.js';

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
  /** The host's bound on starts, hibernates and forks at once (lifecycle-slots.ts); four per core when absent. */
  readonly slots?: LifecycleSlots;
}

/** The lifecycle commands that take one of the host's slots: the ones that cost CPU. */
const SLOTTED: ReadonlySet<AgentCommand> = new Set(['desktop.start', 'desktop.hibernate', 'desktop.fork']);


interface DesktopCommand {
  readonly desktop_id: string;
  readonly generation: number;
  readonly operation_id?: string;
  readonly leader_epoch?: number;
}

const MAX_ERROR_MESSAGE = 200;
const NO_CONTEXT: RequestContext = { upload: null };

export class CommandHandlers {
  private readonly driver: RuntimeDriver;
  private readonly generations: GenerationStore;
  private readonly log: Logger;
  private readonly stream: StreamAccess | null;
  private readonly epochs: LeaderEpochs;
  private readonly metrics: HandlerDeps['metrics'] | null;
  private readonly queue = new DesktopQueue();
  private readonly slots: LifecycleSlots;
  private readonly moves: DesktopMoves;
  private readonly table: CommandTable;
  /** Commands running now, so a stopping agent lets them finish before it closes the runtime. */
  private readonly running = new Set<Promise<unknown>>();

  constructor(deps: HandlerDeps) {
    this.driver = deps.driver;
    this.generations = deps.generations;
    this.log = deps.logger.child({ component: 'agent-handlers' });
    this.stream = deps.stream ?? null;
    this.epochs = deps.leaderEpochs ?? new LeaderEpochs();
    this.metrics = deps.metrics ?? null;
    this.slots = deps.slots ?? new LifecycleSlots(defaultLifecycleSlots());
    this.moves = deps.moves ?? new DesktopMoves({ driver: deps.driver, source: null, url: null, log: () => undefined });
    this.table = commandTable({
      driver: this.driver,
      generations: this.generations,
      stream: this.stream,
      moves: this.moves,
      lifecycle: (type, cmd, fence, work) => this.lifecycle(type, cmd, fence, work),
      guest: (type, cmd, work) => this.guest(type, cmd, work),
      exclusive: (type, cmd, work) => this.exclusive(type, cmd, work),
      computerUse: (type, cmd, work) => this.computerUse(type, cmd, work),
      queued: (desktopId, work) => this.queue.run(desktopId, work),
      current: (cmd) => this.current(cmd),
    });
  }

  /** Stops the desktops a hello reply names, before the host reports ready (hello-fence.ts). */
  fence(entries: readonly FenceEntry[]): Promise<number> {
    return applyFence(
      { queue: this.queue, slots: this.slots, generations: this.generations, driver: this.driver, releaseStreams: (id) => this.stream?.release(id), log: this.log },
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

  /** Runs `work` in the desktop's command queue, after the commands before it (transfer/staging-sweep.ts). */
  queued<T>(desktopId: string, work: () => Promise<T>): Promise<T> {
    return this.queue.run(desktopId, work);
  }

  /**
   * Waits for the commands running now, at most `timeoutMs`: an agent stopping gracefully lets a
   * snapshot or an unpack finish rather than close the runtime (and its files) under it.
   */
  async settle(timeoutMs: number): Promise<void> {
    if (this.running.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)));
    await Promise.race([Promise.allSettled([...this.running]), expired]);
    clearTimeout(timer);
  }

  /** Runs one command and returns its validated, wire-shaped result. */
  handle(type: AgentCommand, payload: unknown, context: CommandContext = NO_CONTEXT): Promise<unknown> {
    const run = this.answer(type, payload, context);
    this.running.add(run);
    const done = () => this.running.delete(run);
    run.then(done, done);
    return run;
  }

  private async answer(type: AgentCommand, payload: unknown, context: CommandContext): Promise<unknown> {
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

  /** Validates the payload, then hands it to the command's entry of the table (command-table.ts). */
  private dispatch<C extends AgentCommand>(type: C, raw: unknown, context: CommandContext): Promise<unknown> {
    let p: CommandPayload<C>;
    try {
      p = parseMessage(AGENT_COMMANDS[type].payload, raw, `${type} payload`) as CommandPayload<C>;
    } catch (err) {
      return Promise.reject(err);
    }
    const handler = this.table[type] as CommandHandler<C> | undefined;
    if (handler === undefined) return Promise.reject(new AgentFailure('unsupported', `unknown command ${String(type)}`, false));
    return handler(p, context);
  }

  /**
   * An exec or file operation: refused while a stream client holds the control claim, so the
   * person driving the desktop is not raced by an API client changing it underneath.
   */
  private exclusive<T>(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<T>): Promise<T> {
    if (this.stream?.controlHeld(cmd.desktop_id) === true) {
      return Promise.reject(new AgentFailure('control_claimed', 'a stream client holds the control claim', false));
    }
    return this.guest(type, cmd, work);
  }

  /** Screenshots, input, display and streams: only on a driver with computer-use support. */
  private computerUse<T>(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<T>): Promise<T> {
    if (!this.driver.capabilities().computerUse) {
      return Promise.reject(new AgentFailure('unsupported', 'this host has no computer-use support', false));
    }
    return this.guest(type, cmd, work);
  }

  /** A guest operation: fenced, but not queued behind lifecycle commands. */
  private guest<T>(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<T>): Promise<T> {
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

  /**
   * Queues a fenced lifecycle command behind earlier ones for the same desktop; a CPU-heavy one
   * then waits for a host slot too, and is fenced once it has it.
   */
  private lifecycle<T>(type: AgentCommand, cmd: DesktopCommand, fence: FenceKind, work: () => Promise<T>): Promise<T> {
    const fenced = async () => {
      this.epochs.admit(cmd.leader_epoch);
      await this.generations.check(cmd.desktop_id, cmd.generation, fence);
      return work();
    };
    return this.queue.run(cmd.desktop_id, () => this.guarded(type, cmd, SLOTTED.has(type) ? () => this.slots.run(fenced) : fenced));
  }

  /** Logs the outcome and turns unexpected errors into short, non-retryable `runtime_error`s. */
  private async guarded<T>(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<T>, level: 'info' | 'debug' = 'info'): Promise<T> {
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
      // A full disk is said as one (its message names a path, which stays in the log) and may
      // pass (staging removed, destroyed desktops swept): the command may be tried again.
      const code = (err as NodeJS.ErrnoException | null)?.code;
      if (code === 'ENOSPC' || code === 'EDQUOT') throw new AgentFailure('runtime_error', `${type} failed: no space left on this host's disk (${code})`, true);
      throw new AgentFailure('runtime_error', shortMessage(type, err), false);
    }
  }
}

function shortMessage(type: AgentCommand, err: unknown): string {
  const text = err instanceof Error ? err.message : String(err);
  const firstLine = text.split('\n', 1)[0] ?? '';
  const clipped = firstLine.length > MAX_ERROR_MESSAGE ? `${firstLine.slice(0, MAX_ERROR_MESSAGE)}…` : firstLine;
  return `${type} failed: ${clipped}`;
}

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
 * a start is still restoring. Commands for different desktops run in parallel. `guest.exec` is
 * fenced but not queued: it may run for minutes, and holding a hibernate behind it would stall the
 * scheduler's operation for that long; the driver answers `not_running` if the desktop stops under
 * it.
 *
 * Driver errors that are not already an `AgentFailure` become a non-retryable `runtime_error`
 * with a short message; the full error goes to the log only.
 */
import type { Static, TSchema } from '@sinclair/typebox';
import type { Logger } from '../../shared/src/log.js';
import {
  AGENT_COMMANDS,
  AgentFailure,
  DestroyPayload,
  ExecPayload,
  HibernatePayload,
  PreparePayload,
  StartPayload,
  parseMessage,
  type AgentCommand,
} from '../../shared/src/protocol.js';
import type { RpcPeer } from '../../shared/src/rpc.js';
import type { FenceKind, GenerationStore } from './generations.js';
import type { RuntimeDriver } from './runtime/driver.js';

export interface HandlerDeps {
  readonly driver: RuntimeDriver;
  readonly generations: GenerationStore;
  readonly logger: Logger;
}

interface DesktopCommand {
  readonly desktop_id: string;
  readonly generation: number;
  readonly operation_id?: string;
}

const MAX_ERROR_MESSAGE = 200;

export class CommandHandlers {
  private readonly driver: RuntimeDriver;
  private readonly generations: GenerationStore;
  private readonly log: Logger;
  /** Tail of the lifecycle queue per desktop; removed once it drains so the map stays small. */
  private readonly queues = new Map<string, Promise<void>>();

  constructor(deps: HandlerDeps) {
    this.driver = deps.driver;
    this.generations = deps.generations;
    this.log = deps.logger.child({ component: 'agent-handlers' });
  }

  /** Registers a handler on `peer` for every scheduler → agent command. */
  register(peer: Pick<RpcPeer, 'handle'>): void {
    for (const type of Object.keys(AGENT_COMMANDS) as AgentCommand[]) {
      peer.handle(type, (payload) => this.handle(type, payload));
    }
  }

  /** Runs one command and returns its validated, wire-shaped result. */
  async handle(type: AgentCommand, payload: unknown): Promise<unknown> {
    const result = await this.dispatch(type, payload);
    try {
      return parseMessage(AGENT_COMMANDS[type].result, result, `${type} result`);
    } catch (err) {
      // The scheduler sent nothing wrong: a result that fails its schema is our bug.
      this.log.error({ type, err }, 'driver result does not match the protocol');
      throw new AgentFailure('runtime_error', `agent produced an invalid ${type} result`, false);
    }
  }

  private dispatch(type: AgentCommand, raw: unknown): Promise<unknown> {
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
          const { restored } = await this.driver.start({ desktopId: p.desktop_id, tier: p.tier, firstBoot });
          return { restored };
        });
      }
      case 'desktop.hibernate': {
        const p = parse(HibernatePayload, raw, type);
        return this.lifecycle(type, p, 'command', async () => {
          const { snapshot } = await this.driver.hibernate(p.desktop_id);
          return { snapshot };
        });
      }
      case 'desktop.destroy': {
        const p = parse(DestroyPayload, raw, type);
        return this.lifecycle(type, p, 'destroy', async () => {
          await this.driver.destroy(p.desktop_id);
          // Only after the disk is gone: if destroy fails, the scheduler retries a live desktop.
          await this.generations.forget(p.desktop_id);
          return {};
        });
      }
      case 'guest.exec': {
        const p = parse(ExecPayload, raw, type);
        return this.guarded(type, p, async () => {
          await this.generations.check(p.desktop_id, p.generation);
          const out = await this.driver.exec(p.desktop_id, { command: p.command, timeoutMs: p.timeout_ms });
          return { exit_code: out.exitCode, stdout: out.stdout, stderr: out.stderr };
        });
      }
      default: {
        const unknown: never = type;
        return Promise.reject(new AgentFailure('unsupported', `unknown command ${String(unknown)}`, false));
      }
    }
  }

  /** Queues a fenced lifecycle command behind earlier ones for the same desktop. */
  private lifecycle(
    type: AgentCommand,
    cmd: DesktopCommand,
    fence: FenceKind,
    work: () => Promise<unknown>,
  ): Promise<unknown> {
    const previous = this.queues.get(cmd.desktop_id) ?? Promise.resolve();
    const run = previous.then(() =>
      this.guarded(type, cmd, async () => {
        await this.generations.check(cmd.desktop_id, cmd.generation, fence);
        return work();
      }),
    );
    const tail = run.then(
      () => {},
      () => {},
    );
    this.queues.set(cmd.desktop_id, tail);
    void tail.then(() => {
      if (this.queues.get(cmd.desktop_id) === tail) this.queues.delete(cmd.desktop_id);
    });
    return run;
  }

  /** Logs the outcome and turns unexpected errors into short, non-retryable `runtime_error`s. */
  private async guarded(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<unknown>): Promise<unknown> {
    // Only identifiers are logged: payloads can carry first-boot env values and exec commands.
    const fields = { type, desktop_id: cmd.desktop_id, generation: cmd.generation, operation_id: cmd.operation_id };
    const started = performance.now();
    try {
      const result = await work();
      this.log.info({ ...fields, ms: Math.round(performance.now() - started) }, 'command done');
      return result;
    } catch (err) {
      if (err instanceof AgentFailure) {
        this.log.warn({ ...fields, code: err.code, message: err.message }, 'command refused');
        throw err;
      }
      this.log.error({ ...fields, err }, 'command failed in the runtime driver');
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

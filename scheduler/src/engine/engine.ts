/**
 * The operation engine: runs on the leader only. It claims pending operations (notified on
 * `canto_op_new`, with a poll behind it), re-drives operations a previous leader left running,
 * and drives each through its step. Work on one desktop is serialized in-process, so the
 * provisioner and an operation never place the same desktop twice.
 *
 * When an agent says hello, every desktop it still runs is reconciled with the database (a host
 * that was failed over must not keep running desktops the scheduler has moved on from).
 *
 * Retryable failures (the host is disconnected, a command timed out) are retried with capped
 * backoff until the operation is `operationDeadlineMs` old; anything else settles it `failed`.
 */
import type { Logger } from '../../../shared/src/log.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { provisioningDesktops } from '../store/desktops.js';
import { claimPending, OP_NEW_CHANNEL, runningOperations } from '../store/operations.js';
import type { OperationRow } from '../store/rows.js';
import * as steps from './steps.js';

export interface EngineDeps extends steps.StepDeps {
  pollMs: number;
  operationDeadlineMs: number;
}

export class OperationEngine {
  private running = false;
  private timer: NodeJS.Timeout | null = null;
  private unlisten: (() => Promise<void>) | null = null;
  private unsubscribeHello: (() => void) | null = null;
  private readonly driving = new Set<string>();
  private readonly provisioning = new Set<string>();
  private readonly desktopChains = new Map<string, Promise<unknown>>();
  private readonly inFlight = new Set<Promise<unknown>>();
  private ticking = false;
  private readonly log: Logger;

  constructor(private readonly deps: EngineDeps) {
    this.log = deps.logger.child({ component: 'engine' });
  }

  async start(): Promise<void> {
    if (this.running) return;
    this.running = true;
    const sub = await this.deps.sql.listen(OP_NEW_CHANNEL, () => this.kick());
    this.unlisten = () => sub.unlisten();
    this.unsubscribeHello = this.deps.agents.onHello((hostId, desktops) => {
      for (const reported of desktops) {
        if (!reported.running) continue;
        this.track(this.onDesktop(reported.desktop_id, () => steps.reconcile(this.deps, hostId, reported.desktop_id)));
      }
    });
    for (const op of await runningOperations(this.deps.sql)) this.launch(op);
    this.kick();
  }

  /** Stops claiming work. Steps in flight finish or fail their lease-fenced commit. */
  async stop(): Promise<void> {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.unsubscribeHello?.();
    this.unsubscribeHello = null;
    await this.unlisten?.().catch(() => {});
    this.unlisten = null;
    await Promise.allSettled([...this.inFlight]);
  }

  private kick(): void {
    if (!this.running) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => void this.tick(), 0);
  }

  private async tick(): Promise<void> {
    if (!this.running || this.ticking) return;
    this.ticking = true;
    try {
      for (const op of await claimPending(this.deps.sql, 20)) this.launch(op);
      for (const d of await provisioningDesktops(this.deps.sql, 20)) {
        if (this.provisioning.has(d.id)) continue;
        this.provisioning.add(d.id);
        const task = this.onDesktop(d.id, async () => {
          const fresh = await this.deps.sql`SELECT 1 FROM desktops WHERE id = ${d.id} AND state = 'provisioning' AND host_id IS NULL`;
          if (fresh.length === 1) await steps.provision(this.deps, d);
        }).catch((err: unknown) => {
          // No host with room yet is the normal wait; the next tick tries again.
          if (!(err instanceof AgentFailure && err.retryable)) this.log.warn({ err, desktopId: d.id }, 'provisioning failed');
        });
        this.track(task.finally(() => this.provisioning.delete(d.id)));
      }
    } catch (err) {
      this.log.error({ err }, 'engine tick failed');
    } finally {
      this.ticking = false;
      if (this.running) this.timer = setTimeout(() => void this.tick(), this.deps.pollMs);
    }
  }

  private launch(op: OperationRow): void {
    if (this.driving.has(op.id)) return;
    this.driving.add(op.id);
    this.track(this.onDesktop(op.desktop_id, () => this.drive(op)).finally(() => this.driving.delete(op.id)));
  }

  private track(p: Promise<unknown>): void {
    const guarded = p.catch((err: unknown) => this.log.error({ err }, 'engine task failed'));
    this.inFlight.add(guarded);
    void guarded.finally(() => this.inFlight.delete(guarded));
  }

  private onDesktop<T>(desktopId: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.desktopChains.get(desktopId) ?? Promise.resolve();
    const next = previous.catch(() => {}).then(fn);
    this.desktopChains.set(desktopId, next);
    void next.catch(() => {}).finally(() => {
      if (this.desktopChains.get(desktopId) === next) this.desktopChains.delete(desktopId);
    });
    return next;
  }

  private async drive(op: OperationRow): Promise<void> {
    const log = this.log.child({ operationId: op.id, kind: op.kind, desktopId: op.desktop_id });
    let backoffMs = 200;
    for (;;) {
      if (!this.running) return;
      try {
        await STEP[op.kind](this.deps, op);
        log.info('operation succeeded');
        return;
      } catch (err) {
        if (err instanceof steps.LeaseLost) return log.warn('lease lost; the next leader re-drives');
        const age = Date.now() - (op.started_at ?? op.created_at).getTime();
        const retryable = err instanceof AgentFailure && err.retryable;
        if (retryable && age < this.deps.operationDeadlineMs) {
          log.warn({ err: (err as Error).message, backoffMs }, 'retryable failure; retrying');
          await new Promise((r) => setTimeout(r, backoffMs));
          backoffMs = Math.min(backoffMs * 2, 5_000);
          continue;
        }
        const error = describe(err);
        log.warn({ error, err }, 'operation failed');
        try {
          await steps.fail(this.deps, op, error);
        } catch (settleErr) {
          log.error({ err: settleErr }, 'could not settle failed operation');
        }
        return;
      }
    }
  }
}

const STEP: Record<OperationRow['kind'], (deps: steps.StepDeps, op: OperationRow) => Promise<void>> = {
  wake: steps.wake,
  hibernate: steps.hibernate,
  destroy: steps.destroy,
  fork: steps.fork,
};

/**
 * The error an API client sees on a failed operation. Agent messages carry host details (paths,
 * tool output) that stay in the logs; the client gets a fixed sentence per code.
 */
const AGENT_ERRORS: Partial<Record<AgentFailure['code'], { code: string; message: string }>> = {
  disconnected: { code: 'host_unavailable', message: 'the desktop host is unreachable' },
  timeout: { code: 'timeout', message: 'the desktop host did not answer in time' },
  stale_generation: { code: 'stale_generation', message: 'the host refused a command from an older generation' },
};

function describe(err: unknown): { code: string; message: string } {
  if (err instanceof steps.StepFailure) return { code: err.code, message: err.message };
  if (err instanceof AgentFailure) return AGENT_ERRORS[err.code] ?? { code: 'runtime_error', message: 'the desktop runtime failed; the host agent log has the details' };
  return { code: 'internal', message: 'internal error' };
}

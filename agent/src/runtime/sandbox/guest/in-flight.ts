/**
 * Guest operations in flight, per desktop, and the fence that hibernate and destroy raise.
 *
 * Execs and file operations do not take the per-desktop lifecycle mutex (they run concurrently
 * with each other), so without a fence one could start while CRIU is dumping the guest and break
 * the dump, or keep a process inside cgroups that are being removed. While a desktop is fenced,
 * `begin` refuses new operations with `not_running`. Registration is synchronous: an operation is
 * known from the moment it passes the fence check, before its process exists, so `drain` can never
 * miss one that is about to spawn (an operation cancelled before it spawns kills its process as
 * soon as it is attached). The warm pool (warm-pool.ts) asks the same fence before starting a
 * server, so nothing new enters a desktop while it stops.
 */
import { AgentFailure } from '../../../../../shared/src/protocol.js';

export type GuestOpKind = 'exec' | 'file';

const KILLED_END_MS = 5_000;

async function withDeadline(promise: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)));
  await Promise.race([promise, deadline]);
  clearTimeout(timer);
}

export class GuestOp {
  private killFn: (() => Promise<void>) | null = null;
  private cancelledFlag = false;
  private resolveDone!: () => void;
  readonly done = new Promise<void>((resolve) => (this.resolveDone = resolve));

  constructor(
    readonly kind: GuestOpKind,
    private readonly onEnd: () => void,
  ) {}

  /** True once the desktop's stop has killed (or refused) this operation. */
  get cancelled(): boolean {
    return this.cancelledFlag;
  }

  /** Gives the operation's process to the tracker; killed at once if the stop came first. */
  attach(kill: () => Promise<void>): void {
    this.killFn = kill;
    if (this.cancelledFlag) void kill();
  }

  /** Kills the operation because the desktop stops: it then fails with `not_running`. */
  async kill(): Promise<void> {
    this.cancelledFlag = true;
    await this.killFn?.();
  }

  /** Kills the operation's process, if any, after the operation failed for its own reasons. */
  async killProcess(): Promise<void> {
    await this.killFn?.();
  }

  /** Idempotent: the operation and its process are finished. */
  end(): void {
    this.resolveDone();
    this.onEnd();
  }
}

export class InFlight {
  private readonly ops = new Map<string, Set<GuestOp>>();
  private readonly fences = new Map<string, number>();

  /** Registers a new operation, or refuses it while the desktop is stopping. */
  begin(desktopId: string, kind: GuestOpKind): GuestOp {
    if (this.fenced(desktopId)) {
      throw new AgentFailure('not_running', `desktop ${desktopId} is stopping`, false);
    }
    let set = this.ops.get(desktopId);
    if (set === undefined) this.ops.set(desktopId, (set = new Set()));
    const owner = set;
    const op: GuestOp = new GuestOp(kind, () => {
      owner.delete(op);
      if (owner.size === 0 && this.ops.get(desktopId) === owner) this.ops.delete(desktopId);
    });
    owner.add(op);
    return op;
  }

  /** True while a stop holds the desktop's fence. */
  fenced(desktopId: string): boolean {
    return (this.fences.get(desktopId) ?? 0) > 0;
  }

  /** Refuses new operations on the desktop until the returned function is called. */
  fence(desktopId: string): () => void {
    this.fences.set(desktopId, (this.fences.get(desktopId) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const n = (this.fences.get(desktopId) ?? 1) - 1;
      if (n > 0) this.fences.set(desktopId, n);
      else this.fences.delete(desktopId);
    };
  }

  /**
   * Lets file operations finish for up to `fileGraceMs` (an upload that is nearly done completes
   * instead of being thrown away), then kills every operation still running. Execs are killed at
   * once: a command can run for minutes and the stop must not wait for it.
   */
  async drain(desktopId: string, fileGraceMs: number): Promise<void> {
    const all = () => [...(this.ops.get(desktopId) ?? [])];
    await Promise.all(all().filter((op) => op.kind === 'exec').map((op) => op.kill()));
    const files = all().filter((op) => op.kind === 'file');
    if (files.length > 0 && fileGraceMs > 0) {
      await withDeadline(Promise.all(files.map((op) => op.done)), fileGraceMs);
    }
    const left = all();
    await Promise.all(left.map((op) => op.kill()));
    // A killed operation ends when its process is reaped; the bound only guards against a bug.
    await withDeadline(Promise.all(left.map((op) => op.done)), KILLED_END_MS);
  }
}

/**
 * `?wait=true`: wait for an operation to settle, answering as soon as it does. Settling sends a
 * `canto_op_settled` notification that every replica hears; a poll at the 2 s cadence of docs/api.md §4.1
 * backs it up in case a notification is lost while the listen connection reconnects.
 *
 * A replica that stops answers every wait at once with the operation as it stands, as docs/api.md §4.1's
 * wait cap does: a wait never holds a shutdown (the client polls the operation, or waits again
 * on another replica).
 */
import { EventEmitter } from 'node:events';
import type { Sql } from '../store/db.js';
import { getOperation, OP_SETTLED_CHANNEL } from '../store/operations.js';
import type { OperationRow } from '../store/rows.js';

export class OperationWaiter {
  private readonly settled = new EventEmitter();
  private unlisten: (() => Promise<void>) | null = null;
  private stopping = false;
  private readonly released = new Set<() => void>();

  constructor(
    private readonly sql: Sql,
    private readonly pollMs: number,
  ) {
    this.settled.setMaxListeners(0);
  }

  async start(): Promise<void> {
    const sub = await this.sql.listen(OP_SETTLED_CHANNEL, (id) => this.settled.emit(id));
    this.unlisten = () => sub.unlisten();
  }

  /** Answers every wait in flight now; later waits answer at once. */
  release(): void {
    this.stopping = true;
    for (const wake of [...this.released]) wake();
  }

  async stop(): Promise<void> {
    this.release();
    await this.unlisten?.();
    this.unlisten = null;
  }

  /**
   * The operation once settled, or as it stands when `capMs` runs out. `recorded`: the operation
   * as the request recorded it. A read that fails meanwhile (the database restarting) does not
   * end the wait: the operation is recorded and goes on, so the wait goes on with the last state
   * known, and at the cap answers that, as docs/api.md §4.1 promises ("never a timeout error").
   */
  async wait(orgId: string, id: string, capMs: number, recorded: OperationRow): Promise<OperationRow> {
    const deadline = Date.now() + capMs;
    let op = recorded;
    for (;;) {
      try {
        op = (await getOperation(this.sql, orgId, id)) ?? op;
      } catch {
        // Read again at the next poll.
      }
      const remaining = deadline - Date.now();
      if (op.state === 'succeeded' || op.state === 'failed' || remaining <= 0 || this.stopping) return op;
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          this.settled.off(id, done);
          this.released.delete(done);
          resolve();
        };
        const timer = setTimeout(done, Math.min(this.pollMs, remaining));
        this.settled.on(id, done);
        this.released.add(done);
      });
    }
  }
}

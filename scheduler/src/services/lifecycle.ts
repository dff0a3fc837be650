/**
 * Lifecycle requests: wake, hibernate and destroy become durable operations. The operation row,
 * the desktop's state change and the idempotency record are written in one transaction under a
 * row lock on the desktop, so two requests can never both start a transition.
 *
 * Which states accept what (docs/decisions.md):
 *   wake      ← provisioning, hibernated        (→ waking)
 *   hibernate ← awake                           (→ hibernating)
 *   destroy   ← provisioning, awake, hibernated (state kept until the host confirms)
 * and never while another operation on the desktop is open. Anything else is 409.
 */
import { inTransaction, type Sql } from '../store/db.js';
import { lockDesktop, transition } from '../store/desktops.js';
import { hasOpenOperation, insertOperation, operationByKey, getOperation } from '../store/operations.js';
import type { DesktopState, OperationRow } from '../store/rows.js';
import { errors } from '../errors.js';

export type LifecycleKind = 'wake' | 'hibernate' | 'destroy';

export const ACCEPTING_STATES: Readonly<Record<LifecycleKind, readonly DesktopState[]>> = {
  wake: ['provisioning', 'hibernated'],
  hibernate: ['awake'],
  destroy: ['provisioning', 'awake', 'hibernated'],
};

const IN_FLIGHT_STATE: Readonly<Record<LifecycleKind, DesktopState | null>> = {
  wake: 'waking',
  hibernate: 'hibernating',
  destroy: null,
};

export interface Leadership {
  isLeader(): boolean;
}

export interface TransitionRequest {
  expectedGeneration: number | null;
  idempotencyKey: string | null;
  reason?: string;
}

export class LifecycleService {
  constructor(
    private readonly sql: Sql,
    private readonly leadership: Leadership,
    private readonly retryAfterSecs: number,
  ) {}

  /** Records the operation; throws 404/409/503 `ApiError`s. A stale generation yields a failed op. */
  async request(orgId: string, desktopId: string, kind: LifecycleKind, req: TransitionRequest): Promise<{ op: OperationRow; repeated: boolean }> {
    if (!this.leadership.isLeader()) throw errors.notLeader(this.retryAfterSecs);
    return inTransaction(this.sql, async (tx) => {
      const desktop = await lockDesktop(tx, orgId, desktopId);
      if (!desktop) throw errors.desktopNotFound();
      if (req.idempotencyKey) {
        const existing = await operationByKey(tx, desktop.id, req.idempotencyKey);
        if (existing) return { op: existing, repeated: true };
      }
      if (req.expectedGeneration !== null && req.expectedGeneration !== desktop.generation) {
        const op = await insertOperation(tx, {
          orgId,
          desktopId,
          kind,
          idempotencyKey: req.idempotencyKey,
          fromState: desktop.state,
          failed: {
            code: 'generation_mismatch',
            message: `expected generation ${req.expectedGeneration}, desktop is at ${desktop.generation}`,
            current_generation: desktop.generation,
          },
        });
        return { op, repeated: false };
      }
      if (!ACCEPTING_STATES[kind].includes(desktop.state) || (await hasOpenOperation(tx, desktop.id))) {
        throw errors.wrongState(kind, desktop.state);
      }
      const next = IN_FLIGHT_STATE[kind];
      if (next) await transition(tx, desktop.id, [desktop.state], next);
      const op = await insertOperation(tx, {
        orgId,
        desktopId,
        kind,
        idempotencyKey: req.idempotencyKey,
        fromState: desktop.state,
        reason: req.reason ?? 'requested',
      });
      return { op, repeated: false };
    });
  }

  async get(orgId: string, id: string): Promise<OperationRow> {
    const op = await getOperation(this.sql, orgId, id);
    if (!op) throw errors.operationNotFound();
    return op;
  }
}

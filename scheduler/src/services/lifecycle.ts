/**
 * Lifecycle requests: wake, hibernate and destroy become durable operations. The operation row,
 * the desktop's state change and the idempotency record are written in one transaction under a
 * row lock on the desktop, so two requests can never both start a transition.
 *
 * Which states accept what (docs/decisions.md):
 *   wake      ← provisioning, hibernated        (→ waking)
 *   hibernate ← awake                           (→ hibernating)
 *   destroy   ← provisioning, awake, hibernated (state kept until the host confirms)
 * and never while another operation on the desktop is open. Anything else is 409, which names
 * the operation in the way when that is the cause.
 *
 * Fork (docs/api.md §4.1) copies a hibernated source on its own host. The ids of the forks are minted
 * here and kept on the operation, so a re-driven fork creates the same desktops. A host without
 * free storage slots for the forks gets the operation recorded already failed (`no_capacity`),
 * which `?wait=true` answers with 413.
 *
 * Every replica records operations, leader or not: the row and its notification reach the
 * leader's engine wherever it runs, so a follower never refuses a mutation while the database
 * answers.
 */
import { newId } from '../../../shared/src/ids.js';
import { TIER_SPECS } from '../../../shared/src/tiers.js';
import { inTransaction, type Sql } from '../store/db.js';
import { lockHostForForks, slotsUsed } from '../store/hosts.js';
import { heldByOrgLocked, lockDesktop, transition } from '../store/desktops.js';
import { openOperation, insertOperation, operationByKey, getOperation, type SettleFence } from '../store/operations.js';
import { assertTerm } from '../store/leases.js';
import type { DesktopRow, DesktopState, OperationRow } from '../store/rows.js';
import { hasSlots } from '../placement/feasible.js';
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

export interface TransitionRequest {
  expectedGeneration: number | null;
  idempotencyKey: string | null;
  reason?: string;
  /**
   * Asked of the desktop's row under its lock: false refuses the request (409). The idle sweeper
   * read the desktop before; a PATCH of its timeout, or a wake, may have come since.
   */
  stillDue?(desktop: DesktopRow): boolean;
  /** The idle sweeper's: its leader term, checked in the transaction (LeaseLost past it). */
  term?: SettleFence;
}

export interface ForkRequest {
  count: number;
  ephemeral: boolean;
  idempotencyKey: string | null;
}

export class LifecycleService {
  constructor(
    private readonly sql: Sql,
    /** Storage slots per host (CANTO_HOST_SLOTS); a fork needs its forks' slots free. */
    private readonly hostSlots = Number.POSITIVE_INFINITY,
    /** Desktops an org may hold (CANTO_ORG_DESKTOP_QUOTA); 0: no quota. */
    private readonly orgDesktopQuota = 0,
  ) {}

  /** Records a fork operation; throws 404/409 `ApiError`s. No capacity yields a failed op. */
  async requestFork(orgId: string, desktopId: string, req: ForkRequest): Promise<{ op: OperationRow; repeated: boolean }> {
    return this.locked(orgId, desktopId, req.idempotencyKey, async (tx, source, open) => {
      if (source.state !== 'hibernated' || source.host_id === null) throw errors.wrongState('fork', source.state);
      if (open) throw errors.operationInFlight('fork', open);
      if (this.orgDesktopQuota > 0 && (await heldByOrgLocked(tx, orgId)) + req.count > this.orgDesktopQuota) throw errors.desktopQuota(this.orgDesktopQuota);
      const base = { orgId, desktopId, kind: 'fork' as const, idempotencyKey: req.idempotencyKey, fromState: source.state };
      // The host's row locked: two forks of different sources on it are admitted one after the
      // other, each counting the slots the other's copies will hold once made.
      await lockHostForForks(tx, source.host_id);
      const used = (await slotsUsed(tx, source.host_id)).get(source.host_id) ?? 0;
      if (!hasSlots({ slots: this.hostSlots, slotsUsed: used }, source.tier, req.count)) {
        const needed = TIER_SPECS[source.tier].slots * req.count;
        const op = await insertOperation(tx, {
          ...base,
          failed: {
            code: 'no_capacity',
            message: `the source's host has ${Math.max(0, this.hostSlots - used)} free storage slots; ${req.count} ${source.tier} forks need ${needed}`,
          },
        });
        return { op, repeated: false };
      }
      const desktopIds = Array.from({ length: req.count }, () => newId('desktop'));
      const op = await insertOperation(tx, { ...base, params: { count: req.count, ephemeral: req.ephemeral, desktop_ids: desktopIds } });
      return { op, repeated: false };
    });
  }

  /** Records the operation; throws 404/409 `ApiError`s. A stale generation yields a failed op. */
  async request(orgId: string, desktopId: string, kind: LifecycleKind, req: TransitionRequest): Promise<{ op: OperationRow; repeated: boolean }> {
    return this.locked(orgId, desktopId, req.idempotencyKey, async (tx, desktop, open) => {
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
      if (!ACCEPTING_STATES[kind].includes(desktop.state)) throw errors.wrongState(kind, desktop.state);
      if (open) throw errors.operationInFlight(kind, open);
      if (req.stillDue && !req.stillDue(desktop)) throw errors.wrongState(kind, desktop.state);
      if (req.term) await assertTerm(tx, req.term);
      const next = IN_FLIGHT_STATE[kind];
      // Sent together (one round trip): under the row lock, with its state just checked, the
      // transition cannot miss.
      const [, op] = await Promise.all([
        next ? transition(tx, desktop.id, [desktop.state], next) : null,
        insertOperation(tx, {
          orgId,
          desktopId,
          kind,
          idempotencyKey: req.idempotencyKey,
          fromState: desktop.state,
          reason: req.reason ?? 'requested',
        }),
      ]);
      return { op, repeated: false };
    });
  }

  /**
   * What every mutation starts with: the desktop row locked (404 across orgs), a repeated
   * Idempotency-Key answered with the operation it created, and the desktop's open operation.
   * The three reads go in one round trip: the server runs them in order, so the two after the
   * lock see what was committed before it was granted. Those two are read before the desktop is
   * known to be the org's, and thrown away unread when it is not.
   */
  private locked(
    orgId: string,
    desktopId: string,
    idempotencyKey: string | null,
    fn: (tx: Sql, desktop: DesktopRow, open: { id: string; kind: string } | null) => Promise<{ op: OperationRow; repeated: boolean }>,
  ): Promise<{ op: OperationRow; repeated: boolean }> {
    return inTransaction(this.sql, async (tx) => {
      const [desktop, existing, open] = await Promise.all([
        lockDesktop(tx, orgId, desktopId),
        idempotencyKey ? operationByKey(tx, desktopId, idempotencyKey) : null,
        openOperation(tx, desktopId),
      ]);
      if (!desktop) throw errors.desktopNotFound();
      if (existing) return { op: existing, repeated: true };
      return fn(tx, desktop, open);
    });
  }

  async get(orgId: string, id: string): Promise<OperationRow> {
    const op = await getOperation(this.sql, orgId, id);
    if (!op) throw errors.operationNotFound();
    return op;
  }
}

/**
 * Moving a desktop to another host: a durable operation in phases, each recorded in the
 * operation's params before the next begins, so a leader that takes over resumes where the last
 * one stopped and every agent command it repeats is idempotent (shared/src/transfer.ts).
 *
 *   accepted → planned    the target is chosen (or the one asked for is checked) and the desktop
 *                         marked moving: guest calls answer 503 with Retry-After from here on
 *                         (with a pre-copy, only from the stop: it keeps working meanwhile)
 *   planned → precopied   (1.12, awake desktops) while the desktop runs, its cold files are
 *                         copied to the target (shared/src/precopy.ts); best effort: a pre-copy
 *                         that fails leaves everything to the copy after the stop
 *   planned/precopied → stopped
 *                         an awake desktop is hibernated on the source, memory kept where the
 *                         host can; its database state stays `awake` and its meter open, so the
 *                         move is billed and timed as if nothing happened
 *   stopped  → copied     the source exports (a ticket), the target imports agent to agent,
 *                         sha256-verified and resumable; pre-copied files still unchanged stay
 *                         out of the copy. Recorded only with the commit, one write less while
 *                         the desktop is down: a leader taking over before the commit asks for
 *                         the copy again, which the target answers from what it holds
 *   copied   → committed  one transaction: the desktop's host is the target, its generation
 *                         bumped, the moving mark cleared; the source copy still exists
 *   committed → started   an awake desktop is started on the target (restored from memory)
 *   started  → done       the source copy is destroyed; settled with bytes and downtime
 *
 * A move that fails is undone or recorded by move-failure.ts, in the settlement's fenced
 * transaction: nothing here writes the desktop's state outside a phase's own fenced write, so a
 * leader that lost its term mid-move leaves the record as it was for the next one.
 */
import { snapshotFormat, type CommandResult } from '../../../shared/src/protocol.js';
import { TIER_SPECS } from '../../../shared/src/tiers.js';
import { inTransaction, type Sql } from '../store/db.js';
import { termHolds } from '../store/leases.js';
import { getDesktopById, transition } from '../store/desktops.js';
import { operationParams, type SettleFence } from '../store/operations.js';
import type { DesktopRow, OperationRow } from '../store/rows.js';
import { selectHost } from '../placement/select.js';
import { command, LeaseLost, NoCapacity, noCapacityMessage, readFleet, settleFenced, StepFailure, type StepDeps } from './steps.js';

export type MovePhase = 'accepted' | 'planned' | 'precopied' | 'stopped' | 'copied' | 'committed' | 'started';

/** What a move operation keeps in `params`, growing as its phases pass. */
export interface MoveParams {
  phase: MovePhase;
  source_host_id: string;
  /** The host asked for; null lets placement choose. */
  requested_host_id: string | null;
  target_host_id?: string;
  was_awake?: boolean;
  /** Set by a drain: the drain it belongs to (the source host's drain start, ISO). */
  drain?: string | null;
  /** When the hibernate on the source began (downtime starts), and when the target answered again. */
  stopped_at?: string;
  /**
   * When the desktop became the target's (ISO). The start there gets its retries counted from
   * here (engine.ts), not from the move's start: however long the copy took, nothing is left to
   * roll back, and a retry is all that stands between the desktop and a failed start.
   */
  committed_at?: string;
  started_at?: string;
  memory_snapshot?: boolean;
  /** Whether the move pre-copies (decided at the plan: both agents speak 1.12, the desktop is awake). */
  precopy?: boolean;
  /** Bytes the pre-copy fetched while the desktop ran (0 when it failed or found nothing). */
  precopied_bytes?: number;
  /** The pre-copy the target holds, once it fetched one. */
  precopy_id?: string;
  total_bytes?: number;
  fetched_bytes?: number;
  resumed_bytes?: number;
  /** While copying: the target's progress (store/moves.ts `recordCopyProgress`). */
  copy_done_bytes?: number;
  copy_total_bytes?: number;
  /**
   * Milliseconds spent reaching each phase, by the phase reached (`finished` for the cleanup),
   * summed over attempts and leaders: where a slow move spent its time, for operators and the bench.
   */
  phase_ms?: Partial<Record<MovePhase | 'finished', number>>;
}

/**
 * Now, on the database's clock: a move's times are compared with those it records (a meter's
 * start, the operation's), and read by the next leader, whose own clock may differ from this one.
 */
function nowOf(deps: Pick<StepDeps, 'clock'>): Date {
  return new Date(deps.clock?.now() ?? Date.now());
}

/** When the phase being worked on began, per operation, in this process (see `advance`). */
const phaseStarts = new WeakMap<OperationRow, number>();

/**
 * The pre-copy's grant, per operation, kept in this process only (a ticket is a credential, never
 * stored): the copy after the stop fetches with it instead of asking the source for an export.
 * A ticket is valid for any number of requests until it expires, bound to the desktop and the
 * generation, which the stop does not change. A leader that did not run the pre-copy exports.
 */
const precopyGrants = new WeakMap<OperationRow, { url: string; ticket: string; bytes: number }>();

/** How long an export ticket lives: a copy interrupted for longer starts with a new one. */
const TICKET_TTL_MS = 3_600_000;
/** The slowest copy rate an import is given time for, on top of the usual command timeout. */
const MIN_COPY_BYTES_PER_SEC = 20 * 1024 * 1024;

/** How long an agent may take to fetch `bytes`: the command timeout plus the slowest copy allowed. */
function copyTimeoutMs(deps: StepDeps, bytes: number): number {
  return deps.agentCommandTimeoutMs + Math.ceil((bytes / MIN_COPY_BYTES_PER_SEC) * 1000);
}

export async function move(deps: StepDeps, op: OperationRow): Promise<void> {
  // The phase the database holds: a transaction whose COMMIT went through unheard (its link broke
  // on the answer) left this process a phase behind, and the copy it would redo is gone by now.
  op.params = (await operationParams(deps.sql, op.id)) ?? op.params;
  let p = op.params as unknown as MoveParams;
  phaseStarts.set(op, performance.now());
  const d = await loadDesktop(deps.sql, op.desktop_id);
  if (p.phase === 'accepted') p = await plan(deps, op, d, p);
  if (p.phase === 'planned' && p.precopy === true) p = await precopy(deps, op, d, p);
  if (p.phase === 'planned' || p.phase === 'precopied') p = await stop(deps, op, d, p);
  // The copy is recorded with the commit, in its transaction: a leader that takes over after the
  // copy copies again, which an import of the same generation answers at once. A move recorded
  // `copied` by a leader of an earlier version commits as before.
  let moved: DesktopRow | null = null;
  if (p.phase === 'stopped') p = await copy(deps, op, d, p);
  if (p.phase === 'copied') ({ p, moved } = await commit(deps, op, d, p));
  if (p.phase === 'committed') p = await startOnTarget(deps, op, p, moved);
  await finish(deps, op, p);
}

async function loadDesktop(sql: Sql, id: string): Promise<DesktopRow> {
  const d = await getDesktopById(sql, id);
  if (!d) throw new StepFailure('not_found', 'desktop vanished');
  return d;
}

/**
 * Writes the next phase into the operation, fenced on the leader term like a settlement. Inside
 * a transaction (`inTx`), the caller adopts the phase (`adopt`) once the transaction committed:
 * a COMMIT that failed must leave this process at the phase the database still holds.
 */
async function advance(sql: Sql, op: OperationRow, next: MoveParams, fence: SettleFence, inTx = false): Promise<MoveParams> {
  const p = { ...next, phase_ms: { ...next.phase_ms, [next.phase]: (next.phase_ms?.[next.phase] ?? 0) + phaseTook(op) } };
  const rows = await sql`
    UPDATE operations SET params = ${sql.json(p as never)}
    WHERE id = ${op.id} AND state = 'running'
      AND ${termHolds(sql, fence)}
    RETURNING id`;
  if (rows.length !== 1) throw new LeaseLost('leader lease lost during a move');
  return inTx ? p : adopt(op, p);
}

/** The phase written is this process's from now on. */
function adopt(op: OperationRow, p: MoveParams): MoveParams {
  op.params = p as unknown as Record<string, unknown>;
  phaseStarts.set(op, performance.now());
  return p;
}

/** Whole milliseconds since the operation's current phase began here. */
function phaseTook(op: OperationRow): number {
  return Math.round(performance.now() - (phaseStarts.get(op) ?? performance.now()));
}

async function plan(deps: StepDeps, op: OperationRow, d: DesktopRow, p: MoveParams): Promise<MoveParams> {
  if (d.state !== 'awake' && d.state !== 'hibernated') throw new StepFailure('conflict', `desktop is ${d.state}; only awake and hibernated desktops move`);
  if (d.host_id !== p.source_host_id) throw new StepFailure('conflict', 'the desktop is no longer on the host it was to move from');
  const target = p.requested_host_id ?? (await chooseTarget(deps, d));
  if (!target) {
    const others = (await readFleet(deps, [])).hosts.filter((h) => h.id !== d.host_id);
    const format = dumpFormat(deps, d.host_id!);
    const older = format > 0 ? others.filter((h) => h.connected && !deps.agents.speaks(h.id, 1, format)) : [];
    const usable = others.filter((h) => !older.includes(h));
    const left = older.length === 0 ? '' : `; ${older.length} more run an agent older than protocol 1.${format}, which cannot wake what the source's agent dumps`;
    throw new NoCapacity(noCapacityMessage(d.tier, usable, deps.placement, 'other host') + left);
  }
  if (target === p.source_host_id) throw new StepFailure('bad_target', 'the desktop is already on that host');
  if (!deps.agents.speaks(target, 1, 8) || !deps.agents.speaks(p.source_host_id, 1, 8)) {
    deps.placements.release(d.id);
    throw new StepFailure('unsupported', 'both hosts need an agent that speaks protocol 1.8 to move desktops');
  }
  // An agent wakes only the snapshot formats it knows (shared/src/protocol.ts): one older than
  // 1.13 would restore the source's snapshot without loopback, one older than 1.14 not at all.
  const format = dumpFormat(deps, p.source_host_id);
  if (format > 0 && !deps.agents.speaks(target, 1, format)) {
    deps.placements.release(d.id);
    throw new StepFailure('unsupported', `the target host's agent is older than protocol 1.${format} and cannot wake memory snapshots the source's agent makes; upgrade it first`);
  }
  // A pre-copy reads the desktop while it runs: it keeps answering until the stop marks it.
  const precopies = d.state === 'awake' && deps.agents.speaks(target, 1, 12) && deps.agents.speaks(p.source_host_id, 1, 12);
  const planned = await inTransaction(deps.sql, async (tx) => {
    if (!precopies) await tx`UPDATE desktops SET moving_operation_id = ${op.id} WHERE id = ${d.id}`;
    return advance(tx, op, { ...p, phase: 'planned', target_host_id: target, was_awake: d.state === 'awake', precopy: precopies }, deps.fence, true);
  });
  return adopt(op, planned);
}

/**
 * Copies the running desktop's cold files to the target. Any failure but a lost lease is only
 * logged: the copy after the stop then takes everything, as without a pre-copy.
 */
async function precopy(deps: StepDeps, op: OperationRow, d: DesktopRow, p: MoveParams): Promise<MoveParams> {
  let fetched = 0;
  let held: string | undefined;
  try {
    const exported = await command(deps, p.source_host_id, 'desktop.precopy.export', { desktop_id: d.id, generation: d.generation, ttl_ms: TICKET_TTL_MS });
    if (exported.files > 0) {
      const imported = await command(
        deps,
        p.target_host_id!,
        'desktop.precopy.import',
        { desktop_id: d.id, generation: targetGeneration(d), precopy_id: exported.precopy_id, source: { url: exported.url, ticket: exported.ticket } },
        copyTimeoutMs(deps, exported.bytes),
      );
      fetched = imported.fetched_bytes;
      held = exported.precopy_id;
      precopyGrants.set(op, { url: exported.url, ticket: exported.ticket, bytes: exported.bytes });
    }
  } catch (err) {
    if (err instanceof LeaseLost) throw err;
    deps.logger.warn({ err, desktopId: d.id }, 'move: the pre-copy failed; everything is copied after the stop');
  }
  return advance(deps.sql, op, { ...p, phase: 'precopied', precopied_bytes: fetched, ...(held === undefined ? {} : { precopy_id: held }) }, deps.fence);
}

/** The newest memory snapshot format the agent of `hostId` dumps (0: none of the versioned ones). */
function dumpFormat(deps: StepDeps, hostId: string): number {
  return snapshotFormat((minor) => deps.agents.speaks(hostId, 1, minor));
}

/**
 * Placement for a move: the usual pipeline, the source left out (and hosts whose agent could not
 * wake what the source's agent dumps), in-flight moves counted.
 */
async function chooseTarget(deps: StepDeps, d: DesktopRow): Promise<string | null> {
  const format = d.host_id === null ? 0 : dumpFormat(deps, d.host_id);
  return deps.placements.choose(
    { desktopId: d.id, tier: d.tier, running: d.state === 'awake' },
    async (inFlight) => {
      const fleet = await readFleet(deps, inFlight);
      const hosts = fleet.hosts.filter((h) => h.id !== d.host_id && (format === 0 || deps.agents.speaks(h.id, 1, format)));
      return { placed: fleet.placed, hosts };
    },
    (candidates) => selectHost(candidates, d.tier, deps.placement),
  );
}

async function stop(deps: StepDeps, op: OperationRow, d: DesktopRow, p: MoveParams): Promise<MoveParams> {
  let snapshot = false;
  // Downtime starts as the hibernate does: from here the desktop stops answering.
  const stopping = nowOf(deps);
  // Marked moving here when a pre-copy let the desktop run until now (the update is idempotent).
  if (p.precopy === true) await deps.sql`UPDATE desktops SET moving_operation_id = ${op.id} WHERE id = ${d.id}`;
  if (p.was_awake) {
    // Its detached processes are part of its memory: they go on after the restore on the target.
    // A desktop whose memory cannot be saved is not moved at all (1.17): it runs on at the source,
    // and the move fails and goes back, rather than end its programs.
    const stopped = await command(deps, p.source_host_id, 'desktop.hibernate', {
      desktop_id: d.id, generation: d.generation, operation_id: op.id, keep_detached: true, require_snapshot: true,
    });
    snapshot = stopped.snapshot;
  }
  return advance(deps.sql, op, { ...p, phase: 'stopped', stopped_at: stopping.toISOString(), memory_snapshot: snapshot }, deps.fence);
}

/**
 * The generation the target hears of the desktop: the one the commit will give it. A host the
 * desktop left earlier holds a tombstone at the generation it was destroyed there with, and
 * refuses anything not newer; the desktop's current generation may be exactly that one (nothing
 * bumped it since it last moved), so a move back would be refused as stale.
 */
export function targetGeneration(d: DesktopRow): number {
  return d.generation + 1;
}

async function copy(deps: StepDeps, op: OperationRow, d: DesktopRow, p: MoveParams): Promise<MoveParams> {
  const ref = { desktop_id: d.id, generation: d.generation };
  // A sized listing (1.10) reads the desktop once instead of twice; both ends must know it.
  const sized = deps.agents.speaks(p.source_host_id, 1, 10) && deps.agents.speaks(p.target_host_id!, 1, 10);
  // After a pre-copy the target holds, a source of 1.13 lists the desktop unit without the
  // unchanged pre-copied files, as the target's listing asks (counted once); the pre-copied
  // bytes then count beside the listing's.
  const reuse = sized && p.precopy_id !== undefined && deps.agents.speaks(p.source_host_id, 1, 13) ? p.precopy_id : undefined;
  // With the pre-copy's grant at hand, there is nothing to ask the source before the target
  // fetches: the target's listing request counts the units. Otherwise an export grants a ticket.
  const grant = reuse === undefined ? undefined : precopyGrants.get(op);
  let source: { url: string; ticket: string };
  let timeoutMs: number;
  if (grant !== undefined) {
    source = { url: grant.url, ticket: grant.ticket };
    // What follows the stop is at most the pre-copied files again, the rest of the disk, and memory.
    timeoutMs = copyTimeoutMs(deps, grant.bytes + TIER_SPECS[d.tier].memoryMb * 1024 * 1024);
  } else {
    const exported = await command(deps, p.source_host_id, 'desktop.export', {
      ...ref, ttl_ms: TICKET_TTL_MS, ...(sized ? { listing: 'sized' as const } : {}), ...(reuse === undefined ? {} : { reuse }),
    });
    source = { url: exported.url, ticket: exported.ticket };
    timeoutMs = copyTimeoutMs(deps, exported.total_bytes);
  }
  let imported: CommandResult<'desktop.import'>;
  try {
    // Named by the move (1.15), so a copy an earlier move left on the target is not taken for this one's.
    const move = deps.agents.speaks(p.target_host_id!, 1, 15) ? { operation_id: op.id } : {};
    imported = await command(deps, p.target_host_id!, 'desktop.import', { desktop_id: d.id, generation: targetGeneration(d), tier: d.tier, source, ...move }, timeoutMs);
  } catch (err) {
    // The grant names the source process that made it: its tickets live in that process's
    // memory and its transfer listener may be elsewhere once it is started again. A copy that
    // failed asks the source for an export on its next try, which a source still there answers
    // in a round trip, and one started again answers at all.
    if (grant !== undefined) precopyGrants.delete(op);
    throw err;
  }
  // Every listed byte is either fetched now or held already (an earlier attempt, a shared layer).
  const listed = imported.fetched_bytes + imported.resumed_bytes;
  const next: MoveParams = {
    ...p, phase: 'copied', total_bytes: listed + (reuse === undefined ? 0 : (p.precopied_bytes ?? 0)),
    fetched_bytes: (p.fetched_bytes ?? 0) + imported.fetched_bytes, resumed_bytes: imported.resumed_bytes,
    phase_ms: { ...p.phase_ms, copied: (p.phase_ms?.copied ?? 0) + phaseTook(op) },
  };
  // Written by the commit, in its transaction (see `move`).
  phaseStarts.set(op, performance.now());
  return next;
}

/** The desktop's host becomes the target, its generation bumped and its moving mark cleared. */
async function commit(deps: StepDeps, op: OperationRow, d: DesktopRow, p: MoveParams): Promise<{ p: MoveParams; moved: DesktopRow }> {
  const committed = await inTransaction(deps.sql, async (tx) => {
    const moved = await transition(tx, d.id, [d.state], d.state, { hostId: p.target_host_id!, expectGeneration: d.generation, clearMoving: true });
    if (!moved) throw new StepFailure('conflict', 'the desktop changed while it was being copied');
    return { p: await advance(tx, op, { ...p, phase: 'committed', committed_at: nowOf(deps).toISOString() }, deps.fence, true), moved };
  });
  deps.placements.release(d.id);
  return { p: adopt(op, committed.p), moved: committed.moved };
}

/**
 * `moved`: the row the commit wrote, when this leader committed (otherwise it is read). A start
 * that fails is retried, counted from the commit; one that cannot succeed is recorded by
 * move-failure.ts, fenced with the settlement. Nothing is written here: a leader that cannot tell
 * it leads sends nothing, and the next drive of the move (this term's or the next leader's)
 * finds the desktop as the commit left it.
 */
async function startOnTarget(deps: StepDeps, op: OperationRow, p: MoveParams, moved: DesktopRow | null): Promise<MoveParams> {
  let memory = p.memory_snapshot;
  if (p.was_awake) {
    const d = moved ?? (await loadDesktop(deps.sql, op.desktop_id));
    // Only a leader of an older release wrote anything else after the commit; that record stands.
    if (d.state !== 'awake' || d.host_id !== p.target_host_id) throw new StepFailure('conflict', `the moved desktop is recorded ${d.state} since its commit`);
    const started = await command(deps, p.target_host_id!, 'desktop.start', {
      desktop_id: d.id, generation: d.generation, operation_id: op.id, tier: d.tier, first_boot: null,
    });
    // The memory went with it only if the target restored it (it boots cold when it cannot).
    memory = p.memory_snapshot === true && started.restored;
  }
  const landed = await advance(deps.sql, op, { ...p, phase: 'started', started_at: nowOf(deps).toISOString(), memory_snapshot: memory }, deps.fence);
  deps.onMoveLanded?.(op);
  return landed;
}

/** Destroys the source copy (best effort: a source that is down keeps a stale copy) and settles. */
async function finish(deps: StepDeps, op: OperationRow, p: MoveParams): Promise<void> {
  const d = await loadDesktop(deps.sql, op.desktop_id);
  let sourceCleaned = true;
  try {
    await command(deps, p.source_host_id, 'desktop.destroy', { desktop_id: d.id, generation: d.generation, operation_id: op.id });
  } catch (err) {
    if (err instanceof LeaseLost) throw err;
    sourceCleaned = false;
    deps.logger.warn({ err, desktopId: d.id, hostId: p.source_host_id }, 'moved desktop: the source copy could not be removed now');
  }
  const downtimeMs = p.was_awake && p.stopped_at ? Date.parse(p.started_at ?? nowOf(deps).toISOString()) - Date.parse(p.stopped_at) : null;
  const result = {
    generation: d.generation, source_host_id: p.source_host_id, target_host_id: p.target_host_id, was_awake: p.was_awake ?? false,
    memory_snapshot: p.memory_snapshot ?? false, total_bytes: p.total_bytes ?? 0, fetched_bytes: p.fetched_bytes ?? 0,
    ...(p.precopy === true ? { precopied_bytes: p.precopied_bytes ?? 0 } : {}),
    downtime_ms: downtimeMs, source_cleaned: sourceCleaned,
    phase_ms: { ...p.phase_ms, finished: phaseTook(op) },
  };
  await inTransaction(deps.sql, (tx) => settleFenced(tx, deps.fence, op.id, { result }));
}

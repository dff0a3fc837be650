/**
 * The admin API's moves and drains: move one desktop (to a host named or one placement picks),
 * drain a host (cordon + move everything off), and read an admin operation with its progress.
 *
 * A drain is refused up front, touching nothing, when the other hosts could not take what the
 * host holds: every desktop is placed in turn on a copy of the fleet's numbers with the same
 * feasibility and ranking placement uses, awake ones (which need CPU and memory too) first. A
 * down host is refused too: its desktops' disks are only there, and nothing can be copied off a
 * host nobody can reach.
 */
import { Type, type Static } from '@sinclair/typebox';
import { TIER_SPECS, type Tier } from '../../../shared/src/tiers.js';
import { snapshotFormat } from '../../../shared/src/protocol.js';
import type { Sql } from '../store/db.js';
import { committedLoad, listHosts, slotsUsed } from '../store/hosts.js';
import { drainCounts, drainState, insertMove, operationById, startDrain } from '../store/moves.js';
import type { HostRow, OperationRow } from '../store/rows.js';
import { hostCandidates } from '../placement/candidates.js';
import { selectHost } from '../placement/select.js';
import type { HostCandidate, PlacementPolicy } from '../placement/feasible.js';
import { ApiError, errors } from '../errors.js';
import { hostById } from './store.js';

export const AdminOperationJson = Type.Object({
  id: Type.String({ description: '`op_…`' }),
  kind: Type.String({ description: '`move` for what this API starts; any operation can be read' }),
  state: Type.Union([Type.Literal('pending'), Type.Literal('running'), Type.Literal('succeeded'), Type.Literal('failed')]),
  desktop_id: Type.String(),
  org_id: Type.String(),
  reason: Type.String({ description: '`admin` (asked for by an operator) or `drain`' }),
  phase: Type.Union([Type.String(), Type.Null()], {
    description: 'Of a move: accepted, planned (target chosen), precopied (cold files copied while it runs), stopped, copied, committed (the desktop is on the target), started',
  }),
  source_host_id: Type.Union([Type.String(), Type.Null()]),
  target_host_id: Type.Union([Type.String(), Type.Null()]),
  total_bytes: Type.Union([Type.Integer(), Type.Null()], { description: 'What the copy carries, once known' }),
  copied_bytes: Type.Union([Type.Integer(), Type.Null()], {
    description: 'Of a move: bytes the target holds so far (fetched, or already there), a few times a second while it copies; all of them once copied',
  }),
  result: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
  error: Type.Union([Type.Object({ code: Type.String(), message: Type.String() }), Type.Null()]),
  created_at: Type.String({ format: 'date-time' }),
  settled_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
});
export type AdminOperationJson = Static<typeof AdminOperationJson>;

/** Moves at a time of a drain asked for without `parallel`. */
export const DEFAULT_DRAIN_PARALLEL = 2;

export const DrainJson = Type.Union(
  [
    Type.Object({
      state: Type.Union([Type.Literal('draining'), Type.Literal('drained'), Type.Literal('stopped')], {
        description: '`draining`: moves run; `drained`: the host holds no desktop; `stopped`: a move failed (see error)',
      }),
      requested_at: Type.String({ format: 'date-time' }),
      finished_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
        description: 'When the host was found holding no desktop (`drained`); null before',
      }),
      resumed_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
        description: 'When the drain, stopped by a failed move, was last asked for again; `failed` counts the moves that failed since',
      }),
      parallel: Type.Integer({ minimum: 1 }),
      remaining: Type.Integer({ minimum: 0, description: 'Desktops on the host that no move has taken yet (moved + running + remaining is the whole drain)' }),
      moved: Type.Integer({ minimum: 0 }),
      running: Type.Integer({ minimum: 0, description: 'Moves in progress' }),
      failed: Type.Integer({ minimum: 0, description: 'Moves that failed (since `resumed_at` when set); one stops the drain' }),
      moved_bytes: Type.Integer({ minimum: 0, description: 'Bytes of the moves settled, and copied so far of those running' }),
      total_bytes: Type.Integer({ minimum: 0, description: 'Bytes of the moves settled and running, as far as known' }),
      down_targets: Type.Array(Type.String(), {
        description: 'Hosts that running moves of this drain copy to and that are down: those moves wait for their agents (or fail at their deadline)',
      }),
      error: Type.Union([Type.String(), Type.Null()]),
    }),
    Type.Null(),
  ],
  { description: 'The host\'s drain, or null when none was asked for since it was last uncordoned' },
);
export type DrainJson = Static<typeof DrainJson>;

export interface MoveServiceDeps {
  sql: Sql;
  linked(hostId: string): boolean;
  /** Whether the host's agent speaks at least `major.minor` (a move goes to no agent older than the source's snapshot format). */
  speaks(hostId: string, major: number, minor: number): boolean;
  placement: PlacementPolicy;
  hostSlots: number;
}

export function operationJson(row: OperationRow): AdminOperationJson {
  const p = (row.params ?? {}) as Record<string, unknown>;
  const str = (v: unknown) => (typeof v === 'string' ? v : null);
  const num = (v: unknown) => (typeof v === 'number' ? v : null);
  return {
    id: row.id,
    kind: row.kind,
    state: row.state,
    desktop_id: row.desktop_id,
    org_id: row.org_id,
    reason: row.reason,
    phase: row.kind === 'move' ? (str(p.phase) ?? 'accepted') : null,
    source_host_id: str(p.source_host_id),
    target_host_id: str(p.target_host_id) ?? str(p.requested_host_id),
    total_bytes: num(p.total_bytes) ?? num(p.copy_total_bytes),
    copied_bytes: row.kind !== 'move' ? null : (num(p.total_bytes) ?? num(p.copy_done_bytes)),
    result: row.result,
    error: row.error ? { code: row.error.code, message: row.error.message } : null,
    created_at: row.created_at.toISOString(),
    settled_at: row.settled_at?.toISOString() ?? null,
  };
}

export async function drainJson(sql: Sql, host: HostRow): Promise<DrainJson> {
  const state = drainState(host);
  if (state === null || host.drain_requested_at === null) return null;
  // `copying` only paces the drainer; `running` tells an operator what is still under way. A
  // desktop in a move is counted there, not also as remaining (on the source until its commit),
  // so moved + running + remaining stays the drain's whole.
  const { copying: _copying, remaining: _onHost, waiting, ...counts } = await drainCounts(sql, host);
  return {
    state,
    requested_at: host.drain_requested_at.toISOString(),
    finished_at: host.drain_finished_at?.toISOString() ?? null,
    resumed_at: host.drain_resumed_at?.toISOString() ?? null,
    parallel: host.drain_parallel ?? 1,
    remaining: waiting,
    ...counts,
    error: host.drain_error,
  };
}

export class MoveService {
  constructor(private readonly deps: MoveServiceDeps) {}

  async move(desktopId: string, hostId: string | null): Promise<AdminOperationJson> {
    if (hostId !== null) {
      const target = await hostById(this.deps.sql, hostId);
      if (!target) throw errors.hostNotFound();
      if (target.status !== 'ready' || !this.deps.linked(hostId)) throw new ApiError(409, 'the target host is down or not linked to this replica');
      // A cordoned host takes a desktop an operator sends it by name; a draining one would only send it on.
      if (target.drain_requested_at && !target.drain_finished_at && !target.drain_error) {
        throw new ApiError(409, 'the target host is being drained; uncordon it first to move desktops onto it');
      }
    }
    const moved = await insertMove(this.deps.sql, desktopId, { requestedHostId: hostId, reason: 'admin', drain: null });
    if ('refused' in moved) throw moved.refused === 'not_found' ? errors.desktopNotFound() : new ApiError(409, moved.refused);
    return operationJson(moved.op);
  }

  async operation(id: string): Promise<AdminOperationJson> {
    const row = await operationById(this.deps.sql, id);
    if (!row) throw errors.operationNotFound();
    return operationJson(row);
  }

  /** Cordons the host and starts (or resumes) its drain; refused, changing nothing, when it cannot finish. */
  async drain(hostId: string, parallel: number | null): Promise<HostRow> {
    const host = await hostById(this.deps.sql, hostId);
    if (!host) throw errors.hostNotFound();
    if (host.status !== 'ready') {
      throw new ApiError(409, "the host is down: its desktops' disks are only on it, so nothing can be moved off until its agent is back");
    }
    const shortfall = await this.capacityShortfall(host);
    if (shortfall) throw new ApiError(409, shortfall);
    return (await startDrain(this.deps.sql, hostId, parallel, DEFAULT_DRAIN_PARALLEL))!;
  }

  /** Why the other hosts cannot take everything the host holds, or null when they can. */
  private async capacityShortfall(host: HostRow): Promise<string | null> {
    const { sql } = this.deps;
    const held = await sql<Array<{ tier: Tier; state: string }>>`
      SELECT tier, state FROM desktops WHERE host_id = ${host.id} AND state <> 'destroyed'
      ORDER BY (state IN ('awake', 'waking')) DESC, tier DESC`;
    if (held.length === 0) return null;
    const [hosts, load, slots] = await Promise.all([listHosts(sql), committedLoad(sql), slotsUsed(sql)]);
    const others = hostCandidates(hosts, load, slots, { isConnected: (id) => this.deps.linked(id), hostSlots: this.deps.hostSlots })
      .filter((h) => h.id !== host.id);
    // What an agent dumps goes to no agent older than its snapshot format (engine/move.ts).
    const format = snapshotFormat((minor) => this.deps.speaks(host.id, 1, minor));
    const tooOld = (h: HostCandidate) => format > 0 && !this.deps.speaks(h.id, 1, format);
    let fleet: HostCandidate[] = others.filter((h) => !tooOld(h));
    const older = others.filter((h) => h.connected && tooOld(h)).length;
    let placed = 0;
    for (const d of held) {
      const running = d.state === 'awake' || d.state === 'waking';
      // An awake desktop needs its tier's CPU and memory on its target; a hibernated one a slot (on
      // a host not short of measured memory, as every placement).
      const chosen = selectHost(
        fleet.map((h) => (running ? h : { ...h, committedVcpus: 0, committedMemoryMb: 0 })),
        d.tier,
        this.deps.placement,
      );
      if (chosen === null) break;
      const spec = TIER_SPECS[d.tier];
      fleet = fleet.map((h) =>
        h.id !== chosen ? h : {
          ...h,
          slotsUsed: h.slotsUsed + spec.slots,
          committedVcpus: h.committedVcpus + (running ? spec.vcpus : 0),
          committedMemoryMb: h.committedMemoryMb + (running ? spec.memoryMb : 0),
          committedDesktops: h.committedDesktops + (running ? 1 : 0),
        });
      placed++;
    }
    if (placed === held.length) return null;
    const passedBy = older === 0 ? '' : `; ${older} other hosts run an agent older than protocol 1.${format}, which cannot wake what this host's agent dumps: upgrade them first`;
    return `the other hosts lack capacity: ${held.length - placed} of the ${held.length} desktops on this host would not fit elsewhere (schedulable hosts: ${fleet.filter((h) => h.connected && h.ready && !h.cordoned).length}${passedBy}); nothing was changed`;
  }
}

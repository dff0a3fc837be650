/**
 * What each operation kind does: drive the host's agent, then commit the desktop's new state,
 * its generation bump, the meter change, the outbox event and the operation's settlement in
 * one transaction. If the agent call succeeded but the commit did not happen (a crash, a lost
 * lease), the next leader re-drives the step; agent commands are idempotent per desktop, so the
 * repeat finds the work done and nothing runs twice.
 */
import { AgentFailure, type CommandPayload, type CommandResult } from '../../../shared/src/protocol.js';
import type { Logger } from '../../../shared/src/log.js';
import { inSnapshot, inTransaction, together, type Sql } from '../store/db.js';
import { getDesktopById, insertForks, placedDesktops, setPlacement, transition } from '../store/desktops.js';
import { closeMeter, openMeter, recordEvent } from '../store/events.js';
import { committedLoad, listHosts, lostHostLastSeen, slotsUsed } from '../store/hosts.js';
import { assertTerm, LeaseLost } from '../store/leases.js';
import { settleOperation, type SettleFence } from '../store/operations.js';
import { deleteExposuresOf } from '../store/ports.js';
import type { DesktopRow, OperationRow } from '../store/rows.js';
import type { AgentGateway } from '../agents/gateway.js';
import type { SecretBox } from '../crypto/secret-box.js';
import { selectHost } from '../placement/select.js';
import { hostCandidates } from '../placement/candidates.js';
import type { FleetView, PlacementReservations } from '../placement/reservations.js';
import { memoryRoomMb, type PlacementPolicy } from '../placement/feasible.js';
import { NoCapacity, noCapacityMessage } from './no-capacity.js';
import type { Tier } from '../../../shared/src/tiers.js';
import { openDesktopSecret } from '../crypto/desktop-secrets.js';
import type { PreparedDisks } from './prepared-disks.js';
import { goneInRestart, type GoneInRestart } from './restart-stops.js';

/** The fence on the leader's term lives with the lease (store/leases.ts); steps and their callers name it here. */
export { assertTerm, LeaseLost };

export interface StepDeps {
  sql: Sql;
  /** The database's clock, for times compared with those it recorded (store/db-clock.ts); absent in tests of single steps. */
  clock?: { now(): number };
  agents: AgentGateway;
  secrets: SecretBox;
  logger: Logger;
  /** The leader term this engine runs in: settlement is fenced on it, and commands carry its epoch. */
  fence: SettleFence;
  /** Still leading in that term: no command is sent once this turns false. */
  leading(): boolean;
  agentCommandTimeoutMs: number;
  hostWaitMs: number;
  placement: PlacementPolicy;
  hostSlots: number;
  /** Placements chosen but not yet committed, which count against their hosts meanwhile. */
  placements: PlacementReservations;
  /**
   * Told when a move's desktop is on its target (committed, and started there if it was awake):
   * a drain's next move may start now rather than at the drainer's next pass (engine/drainer.ts).
   */
  onMoveLanded?(op: OperationRow): void;
  /** Disks provisions made whose placement was not recorded (prepared-disks.ts); absent in tests of single steps. */
  prepared?: PreparedDisks;
}

/** A failure that settles the operation at once, without retrying. */
export class StepFailure extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}


/**
 * Raised when an operation's settlement found it settled already: an earlier attempt's commit
 * went through although its answer was lost on the way (a link that broke at COMMIT). Nothing is
 * left to do, and nothing of this attempt is written.
 */
export class AlreadySettled extends Error {}


/**
 * Settles the operation in `tx`, fenced on the term: throws LeaseLost when the lease is gone,
 * AlreadySettled when the operation is (both roll the transaction back).
 */
export async function settleFenced(tx: Sql, fence: SettleFence, opId: string, outcome: Parameters<typeof settleOperation>[2]): Promise<void> {
  if (await settleOperation(tx, opId, outcome, fence)) return;
  const [row] = await tx<Array<{ state: string }>>`SELECT state FROM operations WHERE id = ${opId}`;
  if (row !== undefined && row.state !== 'running') throw new AlreadySettled(`operation ${opId} is ${row.state} already`);
  throw new LeaseLost('leader lease lost before settling');
}

export { NoCapacity, noCapacityMessage } from './no-capacity.js';

async function settle(tx: Sql, deps: StepDeps, op: OperationRow, result: Record<string, unknown>): Promise<void> {
  await settleFenced(tx, deps.fence, op.id, { result });
}

/** Lifecycle commands that carry the leader's epoch (the agent refuses an older term's). */
type FencedCommand =
  | 'desktop.prepare' | 'desktop.start' | 'desktop.hibernate' | 'desktop.destroy' | 'desktop.fork'
  | 'desktop.export' | 'desktop.import' | 'desktop.import.abort' | 'desktop.precopy.export' | 'desktop.precopy.import';

/**
 * Sends a lifecycle command in this engine's term. A replica that no longer leads sends nothing:
 * the next leader re-drives the operation.
 */
export async function command<C extends FencedCommand>(
  deps: StepDeps,
  hostId: string,
  name: C,
  payload: Omit<CommandPayload<C>, 'leader_epoch'>,
  timeoutMs = deps.agentCommandTimeoutMs,
): Promise<CommandResult<C>> {
  if (!deps.leading()) throw new LeaseLost('no longer the leader');
  try {
    return await deps.agents.call(hostId, name, { ...payload, leader_epoch: deps.fence.epoch } as CommandPayload<C>, timeoutMs);
  } catch (err) {
    // The host has heard from a newer leader: this term is over, whatever this replica thinks.
    if (err instanceof AgentFailure && err.code === 'stale_epoch') throw new LeaseLost('the host has heard from a newer leader');
    // A move to or from a host an operator declared lost ends now, not at its deadline.
    if (err instanceof AgentFailure && err.code === 'disconnected' && (await lostHostLastSeen(deps.sql, hostId)) !== null) throw hostLostFailure();
    throw err;
  }
}

function hostLostFailure(): StepFailure {
  return new StepFailure('host_lost', "the desktop's host was declared lost; its disk went with it");
}

export { inspect } from './restart-stops.js';

async function connectedHost(deps: StepDeps, hostId: string): Promise<string> {
  // Nothing to wait for on a host an operator declared lost: its agent is refused for good.
  if ((await unlinkedAndLost(deps, hostId)) !== null) throw hostLostFailure();
  return linkedHost(deps, hostId);
}

/** The host once this replica's link to it is up, waiting `hostWaitMs` for one (it is not lost). */
async function linkedHost(deps: StepDeps, hostId: string): Promise<string> {
  if (!(await deps.agents.waitConnected(hostId, deps.hostWaitMs))) {
    throw new AgentFailure('disconnected', 'the desktop host is unreachable', true);
  }
  return hostId;
}

/**
 * When a host this replica has no link to, and that was declared lost, was last heard from; null
 * for any other host (read only when unlinked: a linked host is not lost).
 */
export async function unlinkedAndLost(deps: StepDeps, hostId: string): Promise<Date | null> {
  return deps.agents.isConnected(hostId) ? null : lostHostLastSeen(deps.sql, hostId);
}

async function loadDesktop(deps: StepDeps, id: string): Promise<DesktopRow> {
  const d = await getDesktopById(deps.sql, id);
  if (!d) throw new StepFailure('not_found', 'desktop vanished');
  return d;
}

/**
 * Places a desktop that has no host yet and creates its disk there. A provisioning desktop
 * becomes `hibernated` (placed, never booted); a waking one stays waking. `desktop.created`
 * fires here, once.
 */
export async function provision(deps: StepDeps, desktop: DesktopRow, round?: PlacementRound): Promise<string> {
  if (desktop.host_id) return desktop.host_id;
  const hostId = await pickHost(deps, desktop, round);
  try {
    // Until the record names this host, its disk may be left there (prepared-disks.ts); counted
    // before the prepare is sent, since one that timed out may have made the disk all the same.
    deps.prepared?.add(desktop.id, hostId);
    await command(deps, hostId, 'desktop.prepare', { desktop_id: desktop.id, generation: desktop.generation, tier: desktop.tier });
    await inTransaction(deps.sql, async (tx) => {
      // A leader deposed meanwhile must not place a desktop its successor may have destroyed.
      await assertTerm(tx, deps.fence);
      if (!(await setPlacement(tx, desktop.id, hostId))) return;
      const moved = await transition(tx, desktop.id, ['provisioning'], 'hibernated', { markCreatedEvent: true });
      if (!moved) await tx`UPDATE desktops SET created_event_at = now() WHERE id = ${desktop.id} AND created_event_at IS NULL`;
      await recordEvent(tx, { orgId: desktop.org_id, desktopId: desktop.id, type: 'desktop.created', data: { tier: desktop.tier, host_id: hostId } });
    });
  } finally {
    deps.placements.release(desktop.id);
  }
  const placed = await loadDesktop(deps, desktop.id);
  await deps.prepared?.removeLeftovers(deps, placed);
  return placed.host_id!;
}

/**
 * Chooses the desktop's host from the fleet as the database has it plus the placements still in
 * flight (placement/reservations.ts), so concurrent provisions spread instead of piling up.
 */
async function pickHost(deps: StepDeps, desktop: DesktopRow, round?: PlacementRound): Promise<string> {
  const request = { desktopId: desktop.id, tier: desktop.tier, running: desktop.state === 'waking' };
  let refusal: string | undefined;
  const hostId = await deps.placements.choose(
    request,
    (inFlight) => readFleet(deps, inFlight),
    (candidates) => {
      const chosen = selectHost(candidates, desktop.tier, deps.placement);
      // Said of the fleet the choice was made on, in-flight placements counted.
      if (chosen === null) refusal = noCapacityMessage(desktop.tier, candidates, deps.placement);
      return chosen;
    },
    () => round?.noRoom.has(desktop.tier) ?? false,
  );
  if (hostId !== null) return hostId;
  refusal ??= round?.noRoom.get(desktop.tier) ?? `no host has room for a ${desktop.tier} desktop`;
  round?.noRoom.set(desktop.tier, refusal);
  throw new NoCapacity(refusal);
}

/**
 * One round of the engine's background placements (engine.ts `tick`). Once a tier found no room,
 * the round's other desktops of that tier wait for the next round instead of each reading the
 * fleet to find the same: a backlog of desktops no host can take (every host down, say) cost
 * each round one snapshot read of the fleet per desktop, and as many again for the message.
 */
export interface PlacementRound {
  /** Tiers that found no room this round, with why. */
  readonly noRoom: Map<Tier, string>;
}

/**
 * The fleet as placement sees it, and which of the desktops in flight the database shows placed.
 * One snapshot: a placement committing between separate reads would count twice (in the load and
 * as a reservation), and a slow database made bursts land unevenly.
 */
export function readFleet(deps: StepDeps, inFlight: string[]): Promise<FleetView> {
  return inSnapshot(deps.sql, async (tx) => {
    // One round trip for the four (a snapshot sees the same rows whatever their order).
    const [placed, hosts, load, slots] = await Promise.all([placedDesktops(tx, inFlight), listHosts(tx), committedLoad(tx), slotsUsed(tx)]);
    return { placed, hosts: hostCandidates(hosts, load, slots, { isConnected: (id) => deps.agents.isConnected(id), hostSlots: deps.hostSlots }) };
  });
}

export async function wake(deps: StepDeps, op: OperationRow): Promise<void> {
  const d = await loadDesktop(deps, op.desktop_id);
  if (d.state !== 'waking') throw new StepFailure('conflict', `desktop is ${d.state}, not waking`);
  const hostId = await connectedHost(deps, await provision(deps, d));
  await admitWake(deps, d, hostId);
  try {
    await start(deps, op, hostId);
  } finally {
    deps.placements.release(d.id);
  }
}

/**
 * Whether the desktop's host has the memory to wake it now, by its measured use (placement/
 * feasible.ts `memoryRoomMb`); the admission holds a reservation on the host until the desktop is
 * awake. Its CPU and memory tier sizes were weighed when it was placed (nominal caps), not here.
 */
async function admitWake(deps: StepDeps, d: DesktopRow, hostId: string): Promise<void> {
  const admitted = await deps.placements.choose(
    { desktopId: d.id, tier: d.tier, running: true },
    (inFlight) => readFleet(deps, inFlight),
    (candidates) => {
      const host = candidates.find((h) => h.id === hostId);
      return host !== undefined && memoryRoomMb(host, deps.placement) >= deps.placement.desktopExpectedMb ? hostId : null;
    },
  );
  if (admitted === null) {
    throw new NoCapacity(`the desktop's host has no memory to wake it now: its measured use and one more desktop would leave less than its ${deps.placement.memoryReservePercent}% reserve free`);
  }
}

/** The first boot's env and setup script, opened; a value that does not open fails the wake, and nothing is sent. */
function openFirstBoot(deps: StepDeps, d: DesktopRow): { env: Record<string, string>; setup_script: string | null } {
  try {
    return {
      env: d.env_sealed ? (JSON.parse(openDesktopSecret(deps.secrets, d.org_id, 'env', d.env_sealed, d.secrets_bound)) as Record<string, string>) : {},
      setup_script: d.setup_script_sealed ? openDesktopSecret(deps.secrets, d.org_id, 'setup_script', d.setup_script_sealed, d.secrets_bound) : null,
    };
  } catch {
    throw new StepFailure('secrets_unreadable', "the desktop's env or setup script does not open with this deployment's key (sealed with another key, or altered in the database); create the desktop again");
  }
}

async function start(deps: StepDeps, op: OperationRow, hostId: string): Promise<void> {
  const d = await loadDesktop(deps, op.desktop_id);
  const firstBoot = d.first_woken_at ? null : openFirstBoot(deps, d);
  const started = await command(deps, hostId, 'desktop.start', {
    desktop_id: d.id, generation: d.generation, operation_id: op.id, tier: d.tier, first_boot: firstBoot,
  });
  await inTransaction(deps.sql, async (tx) => {
    const awake = await transition(tx, d.id, ['waking'], 'awake', { markWoken: true });
    if (!awake) throw new StepFailure('conflict', 'desktop left the waking state');
    await together(
      openMeter(tx, d.org_id, d.id),
      recordEvent(tx, { orgId: d.org_id, desktopId: d.id, type: 'desktop.woken', data: { restored: started.restored } }),
      settle(tx, deps, op, { generation: awake.generation, restored: started.restored }),
    );
  });
}

export async function hibernate(deps: StepDeps, op: OperationRow): Promise<void> {
  const d = await loadDesktop(deps, op.desktop_id);
  if (d.state !== 'hibernating') throw new StepFailure('conflict', `desktop is ${d.state}, not hibernating`);
  const hostId = await connectedHost(deps, d.host_id!);
  // Sent all the same: the agent forgets the desktop's streams and learns its generation.
  const gone = await goneInRestart(deps, op, hostId, d.id);
  const stopped = await command(deps, hostId, 'desktop.hibernate', { desktop_id: d.id, generation: d.generation, operation_id: op.id });
  await inTransaction(deps.sql, (tx) => recordHibernated(tx, deps, op, d, gone?.snapshot ?? stopped.snapshot, gone));
}

/**
 * The hibernate's commit: state, meter, event and settlement (also step-failure.ts's, for a stop
 * that happened). `gone`: the guest died in a restart of its host before the hibernate came.
 */
export async function recordHibernated(tx: Sql, deps: StepDeps, op: OperationRow, d: DesktopRow, snapshot: boolean, gone: GoneInRestart | null = null): Promise<void> {
  const done = await transition(tx, d.id, ['hibernating'], 'hibernated');
  if (!done) throw new StepFailure('conflict', 'desktop left the hibernating state');
  // A snapshot made since the last wake is this hibernate's own, sent before the restart: it did stop the desktop.
  const died = gone !== null && !gone.snapshot;
  const data = died ? { reason: 'host_failure', cause: 'guest_gone', host_id: d.host_id, memory_snapshot: false } : { reason: op.reason, memory_snapshot: snapshot };
  await together(
    closeMeter(tx, d.id, gone?.at ?? null),
    recordEvent(tx, { orgId: d.org_id, desktopId: d.id, type: 'desktop.hibernated', data }),
    settle(tx, deps, op, { generation: done.generation, snapshot }),
  );
}

export async function destroy(deps: StepDeps, op: OperationRow): Promise<void> {
  const d = await loadDesktop(deps, op.desktop_id);
  // On a lost host the disk is gone with it: the record alone is destroyed (if the host comes
  // back anyway, the stale-copy sweep removes what it still holds), and nothing is billed past
  // the moment the host was last heard from.
  const lostSince = d.host_id ? await unlinkedAndLost(deps, d.host_id) : null;
  let gone: GoneInRestart | null = null;
  if (d.host_id && lostSince === null) {
    const hostId = await linkedHost(deps, d.host_id);
    // Only an awake desktop is billed by the hour: a hibernated one has no meter open.
    if (d.state === 'awake') gone = await goneInRestart(deps, op, hostId, d.id);
    await command(deps, hostId, 'desktop.destroy', { desktop_id: d.id, generation: d.generation, operation_id: op.id });
  }
  await inTransaction(deps.sql, (tx) => recordDestroyed(tx, deps, op, d, lostSince, gone?.at ?? null));
}

/**
 * The destroy's commit (also step-failure.ts's, for a destroy the host did). `lostSince`: its lost
 * host's last sighting; `diedAt`: when its guest died in a restart of its host (the meter's end).
 */
export async function recordDestroyed(tx: Sql, deps: StepDeps, op: OperationRow, d: DesktopRow, lostSince: Date | null, diedAt: Date | null = null): Promise<void> {
  const gone = await transition(tx, d.id, ['provisioning', 'awake', 'hibernated'], 'destroyed', { markDestroyed: true });
  if (!gone) throw new StepFailure('conflict', 'desktop changed state during destroy');
  // Monthly billing runs to `destroyed_at`: for a lost host, its disk went when the host did.
  if (lostSince !== null) await tx`UPDATE desktops SET destroyed_at = GREATEST(created_at, LEAST(destroyed_at, ${lostSince}::timestamptz)) WHERE id = ${d.id}`;
  await together(
    closeMeter(tx, d.id, lostSince ?? diedAt),
    deleteExposuresOf(tx, d.id),
    // A desktop written off with its lost host says so; a destroy a client asked for carries nothing.
    recordEvent(tx, { orgId: d.org_id, desktopId: d.id, type: 'desktop.destroyed', ...(op.reason === 'host_lost' ? { data: { reason: 'host_lost' } } : {}) }),
    settle(tx, deps, op, { generation: gone.generation }),
  );
}

/** Generation of a new fork: placed, never booted on its own (as a provisioned desktop). */
export const FORK_GENERATION = 1;
/** docs/api.md §4.1: the idle timeout of ephemeral forks. */
export const EPHEMERAL_IDLE_SECS = 900;

export interface ForkParams {
  count: number;
  ephemeral: boolean;
  desktop_ids: string[];
}

/**
 * Copies the hibernated source into its forks on the source's host, then records them
 * (hibernated, `desktop.created` each) and settles with their ids. The source keeps its state and
 * generation: no transition happened to it, and its open operation kept every other one out.
 */
export async function fork(deps: StepDeps, op: OperationRow): Promise<void> {
  const source = await loadDesktop(deps, op.desktop_id);
  const params = op.params as unknown as ForkParams;
  if (source.state !== 'hibernated' || !source.host_id) throw new StepFailure('conflict', `desktop is ${source.state}, not hibernated`);
  const hostId = await connectedHost(deps, source.host_id);
  await command(
    deps,
    hostId,
    'desktop.fork',
    {
      desktop_id: source.id,
      generation: source.generation,
      operation_id: op.id,
      forks: params.desktop_ids.map((id) => ({ desktop_id: id, generation: FORK_GENERATION })),
    },
    // Copies are cheap (copy-on-write), but twenty of them still take their time.
    deps.agentCommandTimeoutMs * 2,
  );
  await inTransaction(deps.sql, async (tx) => {
    const created = await insertForks(tx, source.id, params.desktop_ids, params.ephemeral, EPHEMERAL_IDLE_SECS);
    for (const f of created) {
      await recordEvent(tx, { orgId: f.org_id, desktopId: f.id, type: 'desktop.created', data: { tier: f.tier, host_id: hostId, forked_from: source.id } });
    }
    await settle(tx, deps, op, { desktop_ids: params.desktop_ids });
  });
}

/**
 * Placement in flight. The leader provisions several desktops at once, and each choice reads the
 * hosts' load from the database, where a desktop counts against its host only once its placement
 * commits: after its disk was created on the host, an agent round trip later. Left at that, a
 * burst of creates would all read the same fleet and land on the same host. So choices are made
 * one at a time, and a chosen desktop counts against its host from the moment it is chosen until
 * its placement is in the database or abandoned (`release`).
 *
 * Only the leader places, so what is in flight lives in its memory; a new leader starts with none
 * in flight, because the old one's unfinished placements are in no database row and are redone.
 *
 * A wake is admitted the same way, on the host the desktop is placed on (steps.ts `admitWake`):
 * its reservation holds from the admission until the desktop is awake, and counts against the
 * host's measured memory meanwhile. Waking desktops not yet admitted count nowhere, so a burst of
 * wakes larger than a host's room admits as many as fit and the rest wait for room, instead of
 * every one of them counting the others and none going ahead.
 */
import { TIER_SPECS, type Tier } from '../../../shared/src/tiers.js';
import type { HostCandidate } from './feasible.js';

export interface PlacementRequest {
  readonly desktopId: string;
  readonly tier: Tier;
  /** The desktop will run once placed (a wake), so it commits CPU and memory as well as slots. */
  readonly running: boolean;
}

export interface FleetView {
  readonly hosts: readonly HostCandidate[];
  /**
   * Of the desktops asked about, the host the database shows each placed on. A reservation counts
   * from the database only on that host: a desktop being moved counts on its source there and on
   * its target as a reservation, until its commit puts it on the target.
   */
  readonly placed: ReadonlyMap<string, string>;
}

export class PlacementReservations {
  private readonly held = new Map<string, PlacementRequest & { hostId: string }>();
  private turn: Promise<unknown> = Promise.resolve();

  /**
   * Chooses a host for the request with `pick`, one choice at a time. `read` is given the
   * desktops in flight and returns the fleet as the database has it, and which of those desktops
   * it already shows placed: those count once, from the database. `read` must take both from one
   * snapshot: a placement committing between two separate reads is counted twice (in the load and
   * as a reservation), which on a slow database skewed bursts (4/5/3 instead of 4/4/4).
   *
   * The reservations counted are those held when the read begins, not when it ends: one released
   * meanwhile committed after the read's snapshot was taken, so the database does not show it
   * either, and counting it from neither let a burst under load land a desktop over.
   */
  choose(
    request: PlacementRequest,
    read: (inFlight: string[]) => Promise<FleetView>,
    pick: (hosts: HostCandidate[]) => string | null,
    /** Asked when the choice's turn comes, before any read: true answers null at once (no room, known already). */
    known?: () => boolean,
  ): Promise<string | null> {
    const run = this.turn.then(async () => {
      if (known?.() === true) return null;
      const held = [...this.held.values()];
      const view = await read(held.map((r) => r.desktopId));
      const hosts = view.hosts.map((h) => withHeld(h, held, view.placed));
      const hostId = pick(hosts);
      if (hostId !== null) this.held.set(request.desktopId, { ...request, hostId });
      return hostId;
    });
    this.turn = run.catch(() => {});
    return run;
  }

  /** The desktop's placement committed (or was given up): the database counts it from now on. */
  release(desktopId: string): void {
    this.held.delete(desktopId);
  }

  /** How many placements are in flight (for tests and logs). */
  get size(): number {
    return this.held.size;
  }
}

/** The host as the database shows it plus the reservations on it the database does not show yet. */
function withHeld(h: HostCandidate, held: ReadonlyArray<PlacementRequest & { hostId: string }>, placed: ReadonlyMap<string, string>): HostCandidate {
  let { committedVcpus, committedMemoryMb, committedDesktops, slotsUsed } = h;
  for (const r of held) {
    if (r.hostId !== h.id) continue;
    // A running desktop weighs on measured memory from its reservation until it is awake (the
    // database counts a waking desktop there only once it is awake: store/hosts.ts committedLoad).
    if (r.running) committedDesktops += 1;
    if (placed.get(r.desktopId) === h.id) continue;
    const spec = TIER_SPECS[r.tier];
    slotsUsed += spec.slots;
    if (r.running) {
      committedVcpus += spec.vcpus;
      committedMemoryMb += spec.memoryMb;
    }
  }
  return { ...h, committedVcpus, committedMemoryMb, committedDesktops, slotsUsed };
}

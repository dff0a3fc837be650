/**
 * Fleet and tenant administration for operators: hosts as placement sees them, cordoning, removing
 * a host that is empty and whose agent is gone, writing off a host that is gone for good (and the
 * desktops only it held), forgetting a host's key, and orgs with their API keys.
 *
 * A host's capacity and use are computed by placement's own code (placement/candidates.ts), so
 * the numbers an operator reads are the ones placement decides by. Keys are created and revoked
 * through the same KeyService as `/v1/keys`: a revoked key is refused by every replica from its
 * next request, whichever API revoked it.
 */
import type { Sql } from '../store/db.js';
import { committedLoad, listHosts, slotsUsed } from '../store/hosts.js';
import type { HostRow } from '../store/rows.js';
import type { KeyService, ApiKeyJson } from '../services/keys.js';
import { hostCandidates } from '../placement/candidates.js';
import { cancelDrain } from '../store/moves.js';
import { drainJson } from './moves.js';
import { memoryReserveMb, memoryRoomMb, type PlacementPolicy } from '../placement/feasible.js';
import { ApiError, errors } from '../errors.js';
import { desktopStatesByHost, hostById, insertOrg, listOrgSummaries, markHostLost, orgExists, removeHost, resetHostKey, setHostCordoned, type OrgSummaryRow } from './store.js';
import type { AdminHostJson, AdminOrgJson, ForgetHostJson, HostDesktopCounts } from './schemas.js';
import type { LifecycleService } from '../services/lifecycle.js';
import { liveReplicas } from '../store/replicas.js';
import { placeBackOnSources } from './move-sources.js';
import { LEADER_LEASE, readLease } from '../store/leases.js';
import { REPLICA_LIVE_MS } from '../fleet/registry.js';
import { hostLinkView } from '../fleet/link-view.js';

export interface AdminServiceDeps {
  sql: Sql;
  keys: KeyService;
  /** Destroys of a lost host's desktops go through the same path as a client's. */
  lifecycle: Pick<LifecycleService, 'request'>;
  /** Whether this replica's link to the host's agent is up. */
  linked(hostId: string): boolean;
  placement: PlacementPolicy;
  /** Storage slots every host offers (CANTO_HOST_SLOTS). */
  hostSlots: number;
  /** Silence after which a host reads down (CANTO_HOST_DOWN_MS): a host heard from since is not lost. */
  hostDownMs: number;
}

/**
 * Whether placement may put new desktops on the host. Placement also needs the leader's link to
 * the agent, which only the leader knows; a ready host has one on every replica within a heartbeat.
 */
function schedulable(h: HostRow): boolean {
  return h.status === 'ready' && !h.cordoned;
}

function orgJson(row: OrgSummaryRow): AdminOrgJson {
  return { id: row.id, name: row.name, created_at: row.created_at.toISOString(), key_count: row.key_count, desktop_count: row.desktop_count };
}

export class AdminService {
  constructor(private readonly deps: AdminServiceDeps) {}

  async listHosts(): Promise<AdminHostJson[]> {
    return this.hostsJson(await listHosts(this.deps.sql));
  }

  async getHost(id: string): Promise<AdminHostJson> {
    const row = await hostById(this.deps.sql, id);
    if (!row) throw errors.hostNotFound();
    return (await this.hostsJson([row], id))[0]!;
  }

  /** Cordons or uncordons the host; doing it twice is the same as once. Uncordoning ends a drain. */
  async setCordoned(id: string, cordoned: boolean): Promise<AdminHostJson> {
    if (!(await setHostCordoned(this.deps.sql, id, cordoned))) throw errors.hostNotFound();
    if (!cordoned) await cancelDrain(this.deps.sql, id);
    return this.getHost(id);
  }

  /** Removes the host's record: only an empty host whose agent is gone (the runbook: drain, stop the agent, remove). */
  async removeHost(id: string): Promise<void> {
    const outcome = await removeHost(this.deps.sql, id, () => this.deps.linked(id));
    if (outcome.removed) return;
    if (outcome.why === 'not_found') throw errors.hostNotFound();
    if (outcome.why === 'holds_desktops') throw errors.hostHoldsDesktops(outcome.desktops);
    throw errors.hostStillLinked();
  }

  /**
   * Declares a down host lost for good and writes off its desktops, whose disks were only there:
   * each gets a destroy (reason `host_lost`; the engine destroys the record without the host).
   * A desktop a failed move committed to the host before it ever ran there is placed back on the
   * move's source instead, which kept its copy (move-sources.ts).
   * A desktop with another operation open waits: that operation fails at once now (the host is
   * lost) and the next call destroys it. Once the host holds none, its record goes. Asking again
   * goes on from where it stands; a host whose agent is connected is refused (409).
   */
  async forgetHost(id: string): Promise<ForgetHostJson> {
    const lost = this.deps.linked(id) ? 'up' : await markHostLost(this.deps.sql, id, this.deps.hostDownMs);
    if (lost === null) throw errors.hostNotFound();
    if (lost === 'up') throw errors.hostUpNotLost();
    await cancelDrain(this.deps.sql, id);
    const placedBack = await placeBackOnSources(this.deps.sql, id);
    const desktops = lost.desktops.filter((d) => !placedBack.some((p) => p.desktop_id === d.id));
    let destroying = 0;
    let waiting = 0;
    for (const d of desktops) {
      // A destroy already under way is counted; another operation fails at once on a lost host,
      // and the next call destroys its desktop.
      if (d.open_kind !== null) {
        if (d.open_kind === 'destroy') destroying++;
        else waiting++;
        continue;
      }
      try {
        // Still on the lost host under the row's lock: a forget asked at the same time may have
        // placed it back on its move's source, whose copy this destroy would take.
        await this.deps.lifecycle.request(d.org_id, d.id, 'destroy', { expectedGeneration: null, idempotencyKey: null, reason: 'host_lost', stillDue: (now) => now.host_id === id });
        destroying++;
      } catch (err) {
        // An operation opened meanwhile.
        if (!(err instanceof ApiError) || err.status !== 409) throw err;
        waiting++;
      }
    }
    const answer = { host_id: id, lost_at: lost.lostAt.toISOString(), destroying, waiting, placed_back: placedBack };
    if (desktops.length > 0) return { ...answer, removed: false };
    await this.removeHost(id);
    return { ...answer, removed: true };
  }

  /** Forgets the host's key, so that its agent's next hello registers the key it sends (a lost key file). */
  async resetHostKey(id: string): Promise<AdminHostJson> {
    const outcome = this.deps.linked(id) ? 'up' : await resetHostKey(this.deps.sql, id);
    if (outcome === null) throw errors.hostNotFound();
    if (outcome === 'up') throw errors.hostKeyInUse();
    return this.getHost(id);
  }

  async listOrgs(): Promise<AdminOrgJson[]> {
    return (await listOrgSummaries(this.deps.sql)).map(orgJson);
  }

  async createOrg(name: string): Promise<AdminOrgJson> {
    const id = await insertOrg(this.deps.sql, name);
    if (id === null) throw errors.orgExists();
    return orgJson((await listOrgSummaries(this.deps.sql, id))[0]!);
  }

  async listKeys(orgId: string): Promise<ApiKeyJson[]> {
    await this.requireOrg(orgId);
    return this.deps.keys.list(orgId);
  }

  async createKey(orgId: string, name: string | null): Promise<ApiKeyJson & { key: string }> {
    await this.requireOrg(orgId);
    return this.deps.keys.create(orgId, name);
  }

  async revokeKey(orgId: string, keyId: string): Promise<void> {
    await this.requireOrg(orgId);
    await this.deps.keys.revoke(orgId, keyId);
  }

  private async requireOrg(orgId: string): Promise<void> {
    if (!(await orgExists(this.deps.sql, orgId))) throw errors.orgNotFound();
  }

  private async hostsJson(rows: readonly HostRow[], hostId?: string): Promise<AdminHostJson[]> {
    const { sql, placement, hostSlots } = this.deps;
    const [load, slots, states, replicas, lease, [clock]] = await Promise.all([
      committedLoad(sql), slotsUsed(sql, hostId), desktopStatesByHost(sql, hostId),
      liveReplicas(sql, REPLICA_LIVE_MS), readLease(sql, LEADER_LEASE), sql<Array<{ now: Date }>>`SELECT now() AS now`,
    ]);
    const leader = lease?.live ? lease.holder : null;
    const candidates = hostCandidates(rows, load, slots, { isConnected: (id) => this.deps.linked(id), hostSlots });
    const drains = await Promise.all(rows.map((h) => drainJson(sql, h)));
    return rows.map((h, i) => {
      const c = candidates[i]!;
      const held = states.get(h.id) ?? new Map<string, number>();
      const desktops: HostDesktopCounts = {
        provisioning: held.get('provisioning') ?? 0,
        waking: held.get('waking') ?? 0,
        awake: held.get('awake') ?? 0,
        hibernating: held.get('hibernating') ?? 0,
        hibernated: held.get('hibernated') ?? 0,
        total: [...held.values()].reduce((a, b) => a + b, 0),
      };
      return {
        id: h.id,
        hostname: h.hostname,
        address: h.ingress_address,
        state: h.status,
        linked: c.connected,
        links: hostLinkView(h, replicas, leader, clock!.now),
        cordoned: h.cordoned,
        schedulable: schedulable(h),
        agent: { protocol: h.protocol, runtime: h.runtime, memory_snapshots: h.memory_snapshots, instance_id: h.agent_instance_id },
        last_heartbeat_at: h.last_seen_at.toISOString(),
        unrecorded_since: h.unrecorded_since?.toISOString() ?? null,
        registered_at: h.created_at.toISOString(),
        reported: { vcpus: h.vcpus, memory_mb: h.memory_mb },
        capacity: {
          vcpus: placement.cpuOvercommit > 0 ? c.vcpus * placement.cpuOvercommit : null,
          memory_mb: placement.memoryOvercommit > 0 ? c.memoryMb * placement.memoryOvercommit : null,
          slots: c.slots,
        },
        used: { vcpus: c.committedVcpus, memory_mb: c.committedMemoryMb, slots: c.slotsUsed },
        measured: h.measured_at === null ? null : {
          at: h.measured_at.toISOString(),
          running_desktops: h.running_desktops ?? 0,
          memory_available_mb: h.memory_available_mb ?? 0,
          desktops_memory_mb: h.desktops_memory_mb ?? 0,
          cpu_busy: h.cpu_busy ?? 0,
        },
        memory: {
          reserve_mb: memoryReserveMb(c, placement),
          room_mb: Math.max(0, memoryRoomMb(c, placement)),
          room_desktops: Math.max(0, Math.floor(memoryRoomMb(c, placement) / placement.desktopExpectedMb)),
        },
        desktops,
        drain: drains[i]!,
        lost_at: h.lost_at?.toISOString() ?? null,
      };
    });
  }
}

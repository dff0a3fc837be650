/** Hosts: one row per agent host, refreshed by its hello and heartbeats. */
import type { Sql } from './db.js';
import { TIER_SPECS } from '../../../shared/src/tiers.js';
import type { HostRow } from './rows.js';

export interface HostHello {
  id: string;
  hostname: string;
  agentInstanceId: string;
  protocol: string;
  runtime: string;
  memorySnapshots: boolean;
  vcpus: number;
  memoryMb: number;
  /** `host:port` of the agent's port gateway (IPv6 in brackets); null when the hello has none. */
  ingressAddress: string | null;
}

export async function upsertHost(sql: Sql, h: HostHello): Promise<void> {
  await sql`
    INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, ingress_address, status, last_seen_at)
    VALUES (${h.id}, ${h.hostname}, ${h.agentInstanceId}, ${h.protocol}, ${h.runtime}, ${h.memorySnapshots}, ${h.vcpus}, ${h.memoryMb}, ${h.ingressAddress}, 'ready', now())
    ON CONFLICT (id) DO UPDATE SET
      hostname = EXCLUDED.hostname, agent_instance_id = EXCLUDED.agent_instance_id,
      protocol = EXCLUDED.protocol, runtime = EXCLUDED.runtime,
      memory_snapshots = EXCLUDED.memory_snapshots, vcpus = EXCLUDED.vcpus,
      memory_mb = EXCLUDED.memory_mb, ingress_address = EXCLUDED.ingress_address, status = 'ready', last_seen_at = now()`;
}

export async function touchHost(sql: Sql, hostId: string): Promise<void> {
  await sql`UPDATE hosts SET last_seen_at = now(), status = 'ready' WHERE id = ${hostId}`;
}

export async function markHostDown(sql: Sql, hostId: string, agentInstanceId: string): Promise<void> {
  // Only the link that is going away marks the host down, not an older one closing late.
  await sql`UPDATE hosts SET status = 'down' WHERE id = ${hostId} AND agent_instance_id = ${agentInstanceId}`;
}

export async function listHosts(sql: Sql): Promise<HostRow[]> {
  return sql<HostRow[]>`SELECT * FROM hosts ORDER BY created_at, id`;
}

/** Resources committed on each host by desktops that are running or about to run. */
export async function committedLoad(sql: Sql): Promise<Array<{ host_id: string; tier: string; count: number }>> {
  return sql<Array<{ host_id: string; tier: string; count: number }>>`
    SELECT host_id, tier, count(*)::int AS count FROM desktops
    WHERE host_id IS NOT NULL AND state IN ('waking', 'awake', 'hibernating')
    GROUP BY host_id, tier`;
}

/** Storage slots held per host: every placed desktop that is not destroyed (TIER_SPECS.slots). */
export async function slotsUsed(sql: Sql, hostId?: string): Promise<Map<string, number>> {
  const rows = await sql<Array<{ host_id: string; slots: number }>>`
    SELECT host_id, sum(CASE tier WHEN 'small' THEN ${TIER_SPECS.small.slots}::int WHEN 'default' THEN ${TIER_SPECS.default.slots}::int
                                  ELSE ${TIER_SPECS.large.slots}::int END)::int AS slots
    FROM desktops WHERE host_id IS NOT NULL AND state <> 'destroyed'
    ${hostId === undefined ? sql`` : sql`AND host_id = ${hostId}`}
    GROUP BY host_id`;
  return new Map(rows.map((r) => [r.host_id, r.slots]));
}

/**
 * Awake desktops on hosts not heard from for `graceMs`, with no operation open. `connected`
 * lists hosts whose agent is linked to this replica right now: they are never failed, whatever
 * their last heartbeat write says.
 */
export async function desktopsOnSilentHosts(sql: Sql, graceMs: number, connected: string[]): Promise<Array<{ id: string; host_id: string }>> {
  return sql<Array<{ id: string; host_id: string }>>`
    SELECT d.id, d.host_id FROM desktops d JOIN hosts h ON h.id = d.host_id
    WHERE d.state = 'awake'
      AND h.last_seen_at < now() - make_interval(secs => ${graceMs / 1000})
      AND NOT (h.id = ANY(${connected}::text[]))
      AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.state IN ('pending', 'running'))
    ORDER BY d.id LIMIT 100`;
}

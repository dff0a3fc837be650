/** Hosts: one row per agent host, refreshed by its hello and heartbeats. */
import type { Sql } from './db.js';
import { TIER_SPECS } from '../../../shared/src/tiers.js';
import { termHolds } from './leases.js';
import type { HostRow } from './rows.js';
import type { HeartbeatPayload } from '../../../shared/src/protocol.js';

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
  /** `host:port` of the agent's transfer server (protocol 1.8); null when the hello has none. */
  transferAddress: string | null;
  /** SHA-256 (hex) of the host's key (protocol 1.15); null when the hello has none. */
  hostKeyHash: string | null;
}

/** What a hello made of the host's record: refused when the key is another's, or the host was declared lost. */
export type HelloRecord = 'recorded' | 'key_mismatch' | 'lost';

/**
 * Records a hello; answers why not, recording nothing, when the host id already has a key and the
 * hello brings another one or none (a host id is its first key's: migration 0012), or the host
 * was declared lost. An agent that
 * fences before taking work (protocol 1.7) leaves the status as it was until `markHostReady`; an
 * older one is ready at once. A new agent instance (a restart) keeps when the previous one was
 * last heard from, in `previous_seen_at`.
 */
export async function upsertHost(sql: Sql, h: HostHello, readyNow: boolean): Promise<HelloRecord> {
  const recorded = await sql`
    INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, ingress_address, transfer_address, status, last_seen_at, host_key_hash, instance_since)
    VALUES (${h.id}, ${h.hostname}, ${h.agentInstanceId}, ${h.protocol}, ${h.runtime}, ${h.memorySnapshots}, ${h.vcpus}, ${h.memoryMb}, ${h.ingressAddress},
            ${h.transferAddress}, ${readyNow ? 'ready' : 'down'}, now(), ${h.hostKeyHash}, now())
    ON CONFLICT (id) DO UPDATE SET
      host_key_hash = COALESCE(hosts.host_key_hash, EXCLUDED.host_key_hash),
      hostname = EXCLUDED.hostname, agent_instance_id = EXCLUDED.agent_instance_id,
      protocol = EXCLUDED.protocol, runtime = EXCLUDED.runtime,
      memory_snapshots = EXCLUDED.memory_snapshots, vcpus = EXCLUDED.vcpus,
      memory_mb = EXCLUDED.memory_mb, ingress_address = EXCLUDED.ingress_address, transfer_address = EXCLUDED.transfer_address,
      previous_seen_at = CASE WHEN hosts.agent_instance_id <> EXCLUDED.agent_instance_id THEN hosts.last_seen_at ELSE hosts.previous_seen_at END,
      instance_since = CASE WHEN hosts.agent_instance_id <> EXCLUDED.agent_instance_id THEN now() ELSE hosts.instance_since END,
      status = CASE WHEN ${readyNow} THEN 'ready' ELSE hosts.status END,
      measured_at = ${keptMeasure(sql, 'measured_at')}, running_desktops = ${keptMeasure(sql, 'running_desktops')},
      memory_available_mb = ${keptMeasure(sql, 'memory_available_mb')}, desktops_memory_mb = ${keptMeasure(sql, 'desktops_memory_mb')},
      cpu_busy = ${keptMeasure(sql, 'cpu_busy')},
      last_seen_at = now()
    WHERE (hosts.host_key_hash IS NULL OR hosts.host_key_hash = EXCLUDED.host_key_hash) AND hosts.lost_at IS NULL
    RETURNING id`;
  if (recorded.length === 1) return 'recorded';
  const [row] = await sql<Array<{ lost: boolean }>>`SELECT lost_at IS NOT NULL AS lost FROM hosts WHERE id = ${h.id}`;
  return row?.lost ? 'lost' : 'key_mismatch';
}

/** When a host an operator declared lost (admin `forget`) was last heard from; null for any other. */
export async function lostHostLastSeen(sql: Sql, hostId: string): Promise<Date | null> {
  const [row] = await sql<Array<{ last_seen_at: Date }>>`SELECT last_seen_at FROM hosts WHERE id = ${hostId} AND lost_at IS NOT NULL`;
  return row?.last_seen_at ?? null;
}

/**
 * A measured column as a hello leaves it: kept when the same agent instance says hello again
 * (a link to another replica, or a reconnect), cleared when a new instance starts, whose host may
 * be another machine's memory altogether. Placement reads a cleared measure as the nominal memory.
 */
function keptMeasure(sql: Sql, column: string) {
  return sql`CASE WHEN hosts.agent_instance_id = EXCLUDED.agent_instance_id THEN ${sql(`hosts.${column}`)} END`;
}

/** The host's agent fenced what it had to and takes work. */
export async function markHostReady(sql: Sql, hostId: string): Promise<void> {
  // Never a lost host's (admin `forget`): its hellos are refused, and one cannot come back by another way.
  await sql`UPDATE hosts SET status = 'ready', last_seen_at = now() WHERE id = ${hostId} AND lost_at IS NULL`;
}

/**
 * A heartbeat heard by this replica. Every replica records them, so one that takes over knows
 * the fleet; a heartbeat another replica recorded within `skipMs` makes this one a read (the
 * measured use it carries is then the one just recorded, within `skipMs`). A heartbeat without a
 * measure (an agent older than 1.11, or one that has not read it yet) leaves the last one.
 */
export async function touchHost(sql: Sql, hostId: string, ready: boolean, skipMs: number, beat: HeartbeatPayload): Promise<void> {
  const m = beat.measured;
  await sql`
    UPDATE hosts SET last_seen_at = now(), status = CASE WHEN ${ready} THEN 'ready' ELSE status END
      ${m === undefined ? sql`` : sql`, measured_at = now(), running_desktops = ${beat.running_desktops}, memory_available_mb = ${m.memory_available_mb},
        desktops_memory_mb = ${m.desktops_memory_mb}, cpu_busy = ${m.cpu_busy},
        unrecorded_since = CASE WHEN ${beat.running_desktops} > ${mayRun(sql, 'hosts.id')} THEN COALESCE(unrecorded_since, now()) ELSE NULL END`}
    WHERE id = ${hostId} AND lost_at IS NULL AND (last_seen_at < now() - make_interval(secs => ${skipMs / 1000}) OR (${ready} AND status <> 'ready'))`;
}

/**
 * How many desktops the records let run on the host whose id is the column `hostId`: those waking, awake
 * or hibernating there, and those an open move of an awake desktop is bringing there (started on
 * the target before its commit; once committed, the desktop's row names the target). A golden
 * template the agent builds runs unrecorded for a moment; `canto status` waits a minute.
 */
export function mayRun(sql: Sql, hostId: 'hosts.id' | 'h.id') {
  return sql`(
    (SELECT count(*) FROM desktops d WHERE d.host_id = ${sql(hostId)} AND d.state IN ('waking', 'awake', 'hibernating'))
    + (SELECT count(*) FROM operations o WHERE o.state IN ('pending', 'running') AND o.kind = 'move' AND o.params->>'target_host_id' = ${sql(hostId)}
         AND o.params->>'was_awake' = 'true' AND o.params->>'committed_at' IS NULL))`;
}

/**
 * Hosts no replica has recorded a heartbeat of for `silentMs`, now `down`, but for those `linked`
 * says are heard; fenced on the leader's term, whose host health decides.
 */
export async function markSilentHostsDown(
  sql: Sql,
  silentMs: number,
  linked: (hostId: string) => boolean,
  term: { readonly holder: string; readonly epoch: number },
): Promise<Array<{ id: string; last_seen_at: Date }>> {
  const silent = await sql<Array<{ id: string }>>`
    SELECT id FROM hosts WHERE status = 'ready' AND last_seen_at < now() - make_interval(secs => ${silentMs / 1000})`;
  const ids = silent.map((h) => h.id).filter((id) => !linked(id));
  if (ids.length === 0) return [];
  return sql<Array<{ id: string; last_seen_at: Date }>>`
    UPDATE hosts SET status = 'down'
    WHERE id = ANY(${ids}::text[]) AND status = 'ready' AND last_seen_at < now() - make_interval(secs => ${silentMs / 1000})
      AND ${termHolds(sql, term)}
    RETURNING id, last_seen_at`;
}

/**
 * In a force-hibernate's transaction: whether the host is still down and silent for `graceMs`,
 * its row locked, so a hello's update of it waits for this transaction (and its fence then reads
 * the desktop hibernated), or this one sees the hello.
 */
export async function stillSilent(tx: Sql, hostId: string, graceMs: number): Promise<boolean> {
  const [row] = await tx`
    SELECT 1 FROM hosts WHERE id = ${hostId} AND status = 'down' AND last_seen_at < now() - make_interval(secs => ${graceMs / 1000}) FOR UPDATE`;
  return row !== undefined;
}

export async function listHosts(sql: Sql): Promise<HostRow[]> {
  return sql<HostRow[]>`SELECT * FROM hosts ORDER BY created_at, id`;
}

/**
 * Resources committed on each host by desktops that are running or about to run; `started` of
 * them are awake or hibernating (a waking one counts against measured memory only once its wake
 * was admitted: placement/reservations.ts).
 */
export async function committedLoad(sql: Sql): Promise<Array<{ host_id: string; tier: string; count: number; started: number }>> {
  return sql<Array<{ host_id: string; tier: string; count: number; started: number }>>`
    SELECT host_id, tier, count(*)::int AS count, (count(*) FILTER (WHERE state <> 'waking'))::int AS started FROM desktops
    WHERE host_id IS NOT NULL AND state IN ('waking', 'awake', 'hibernating')
    GROUP BY host_id, tier`;
}

/**
 * For a fork's admission, in its transaction: the host's row locked, so forks of other sources
 * on it are admitted one after the other, each counting what the other reserved (`slotsUsed`).
 */
export async function lockHostForForks(tx: Sql, hostId: string): Promise<void> {
  await tx`SELECT 1 FROM hosts WHERE id = ${hostId} FOR NO KEY UPDATE`;
}

/**
 * Storage slots held per host: every placed desktop that is not destroyed, and the forks an open
 * fork operation will make on its source's host (their rows come only when the copies are made,
 * and placement and other forks must count them from the admission on) (TIER_SPECS.slots).
 */
export async function slotsUsed(sql: Sql, hostId?: string): Promise<Map<string, number>> {
  const slots = (tier: ReturnType<typeof sql>) =>
    sql`CASE ${tier} WHEN 'small' THEN ${TIER_SPECS.small.slots}::int WHEN 'default' THEN ${TIER_SPECS.default.slots}::int ELSE ${TIER_SPECS.large.slots}::int END`;
  const rows = await sql<Array<{ host_id: string; slots: number }>>`
    SELECT host_id, sum(slots)::int AS slots FROM (
      SELECT host_id, ${slots(sql`tier`)} AS slots
      FROM desktops WHERE host_id IS NOT NULL AND state <> 'destroyed'
      ${hostId === undefined ? sql`` : sql`AND host_id = ${hostId}`}
      UNION ALL
      SELECT s.host_id, (o.params->>'count')::int * ${slots(sql`s.tier`)} AS slots
      FROM operations o JOIN desktops s ON s.id = o.desktop_id
      WHERE o.kind = 'fork' AND o.state IN ('pending', 'running') AND s.host_id IS NOT NULL
      ${hostId === undefined ? sql`` : sql`AND s.host_id = ${hostId}`}
    ) held
    GROUP BY host_id`;
  return new Map(rows.map((r) => [r.host_id, r.slots]));
}

/** In a transaction: locks the desktop's row, and answers whether it is awake with no operation open. */
export async function awakeWithoutOperation(tx: Sql, desktopId: string): Promise<boolean> {
  const [row] = await tx<Array<{ state: string }>>`SELECT state FROM desktops WHERE id = ${desktopId} FOR UPDATE`;
  if (row?.state !== 'awake') return false;
  const open = await tx`SELECT 1 FROM operations WHERE desktop_id = ${desktopId} AND state IN ('pending', 'running') LIMIT 1`;
  return open.length === 0;
}

/**
 * Awake desktops, with no operation open, on `down` hosts not heard from for `graceMs`, with
 * the moment each host was last heard from (their meters close then).
 */
export async function desktopsOnSilentHosts(sql: Sql, graceMs: number): Promise<Array<{ id: string; host_id: string; last_seen_at: Date }>> {
  return sql<Array<{ id: string; host_id: string; last_seen_at: Date }>>`
    SELECT d.id, d.host_id, h.last_seen_at FROM desktops d JOIN hosts h ON h.id = d.host_id
    WHERE d.state = 'awake' AND h.status = 'down'
      AND h.last_seen_at < now() - make_interval(secs => ${graceMs / 1000})
      AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.state IN ('pending', 'running'))
    ORDER BY d.id LIMIT 100`;
}

/** Desktops placed on `hostId` that are not destroyed: what the host should hold. */
export async function desktopsOfHost(sql: Sql, hostId: string): Promise<Array<{ id: string; state: string; generation: number }>> {
  return sql<Array<{ id: string; state: string; generation: number }>>`
    SELECT id, state, generation FROM desktops WHERE host_id = ${hostId} AND state <> 'destroyed' ORDER BY id`;
}

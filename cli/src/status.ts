/**
 * `canto status`: the fleet as the database records it, for the person paged at 3 a.m. — the
 * scheduler replicas (advertised URL, leader or not, how long the current leader has held the
 * lease, version, when each was last seen), the hosts (status, when last heard from, desktops),
 * and warnings: no leader, replicas that disagree on settings they must share (compared by
 * fingerprint), versions that differ, hosts down with desktops on them, hosts whose agent is not
 * linked to every replica (the leader above all), hosts running more desktops than their records
 * let run, drains that stopped, operations open far longer than any of them takes.
 */
import type { Sql } from '../../scheduler/src/store/db.js';
import { allReplicas, type ReplicaRow } from '../../scheduler/src/store/replicas.js';
import { readLease } from '../../scheduler/src/store/leases.js';
import { REPLICA_LIVE_MS } from '../../scheduler/src/fleet/registry.js';
import { drainState, type DrainState } from '../../scheduler/src/store/moves.js';
import { mayRun } from '../../scheduler/src/store/hosts.js';
import { hostLinkView, linksLabel, linkWarning, type HostLinkView } from '../../scheduler/src/fleet/link-view.js';

export interface FleetStatus {
  now: string;
  lease: { holder: string; epoch: number; held_for_ms: number; expires_in_ms: number; live: boolean } | null;
  replicas: Array<{
    id: string;
    url: string;
    role: 'leader' | 'follower' | 'gone';
    version: string;
    started_at: string;
    last_seen_ms_ago: number;
  }>;
  hosts: Array<{
    id: string;
    hostname: string;
    status: string;
    cordoned: boolean;
    /** Declared lost (`canto hosts forget`): its desktops are being destroyed, and it goes once it holds none. */
    lost: boolean;
    last_heard_ms_ago: number;
    runtime: string;
    protocol: string;
    desktops: Record<string, number>;
    /** The host's drain as it last stood, or null when none was asked for since it was uncordoned. */
    drain: { state: DrainState; error: string | null } | null;
    /** Which live replicas its agent is linked to (fleet/link-view.ts). */
    links: HostLinkView;
    /** Its heartbeats count more running desktops than its records let run, since this long; null while they agree. */
    unrecorded: { for_ms: number; running: number; may_run: number } | null;
  }>;
  /** Operations open longer than STUCK_OPERATION_MS, oldest first (at most 5). */
  stuck_operations: Array<{ id: string; kind: string; desktop_id: string; state: string; open_ms: number }>;
  warnings: string[];
}

/** An operation open this long is past any wait the engine makes on purpose (capacity waits are 30 s). */
export const STUCK_OPERATION_MS = 5 * 60_000;

/** Running unrecorded this long is past any template build or move commit: worth a look. */
export const UNRECORDED_WARN_MS = 60_000;

export async function readFleetStatus(sql: Sql): Promise<FleetStatus> {
  const [clock] = await sql<Array<{ now: Date }>>`SELECT now() AS now`;
  const now = clock!.now;
  const since = (d: Date) => Math.max(0, now.getTime() - d.getTime());
  const lease = await readLease(sql, 'leader');
  const rows = await allReplicas(sql);
  const hosts = await sql<Array<{
    id: string; hostname: string; status: string; cordoned: boolean; last_seen_at: Date; runtime: string;
    memory_snapshots: boolean; protocol: string; desktops: Record<string, number> | null; lost: boolean;
    drain_requested_at: Date | null; drain_finished_at: Date | null; drain_error: string | null; instance_since: Date | null;
    unrecorded_since: Date | null; running_desktops: number | null; may_run: number;
  }>>`
    SELECT h.id, h.hostname, h.status, h.cordoned, h.last_seen_at, h.runtime, h.memory_snapshots, h.protocol, h.instance_since,
           h.unrecorded_since, h.running_desktops, ${mayRun(sql, 'h.id')}::int AS may_run,
           h.drain_requested_at, h.drain_finished_at, h.drain_error, h.lost_at IS NOT NULL AS lost,
           (SELECT jsonb_object_agg(state, n) FROM (
              SELECT state, count(*)::int AS n FROM desktops d WHERE d.host_id = h.id AND d.state <> 'destroyed' GROUP BY state) s) AS desktops
    FROM hosts h ORDER BY h.created_at, h.id`;
  const stuck = await sql<Array<{ id: string; kind: string; desktop_id: string; state: string; created_at: Date }>>`
    SELECT id, kind, desktop_id, state, created_at FROM operations
    WHERE state IN ('pending', 'running') AND created_at < ${now} - make_interval(secs => ${STUCK_OPERATION_MS / 1000})
    ORDER BY created_at LIMIT 5`;

  const live = (r: ReplicaRow) => since(r.last_seen_at) <= REPLICA_LIVE_MS;
  const leaderLive = lease !== null && lease.live;
  const liveRows = rows.filter(live);
  const status: FleetStatus = {
    now: now.toISOString(),
    lease: lease && {
      holder: lease.holder,
      epoch: lease.epoch,
      held_for_ms: since(lease.termStartedAt),
      expires_in_ms: lease.expiresAt.getTime() - now.getTime(),
      live: lease.live,
    },
    replicas: rows.map((r) => ({
      id: r.id,
      url: r.url,
      role: !live(r) ? 'gone' : leaderLive && lease.holder === r.id ? 'leader' : 'follower',
      version: r.version,
      started_at: r.started_at.toISOString(),
      last_seen_ms_ago: since(r.last_seen_at),
    })),
    hosts: hosts.map((h) => ({
      id: h.id,
      hostname: h.hostname,
      status: h.status,
      cordoned: h.cordoned,
      lost: h.lost,
      last_heard_ms_ago: since(h.last_seen_at),
      runtime: `${h.runtime}${h.memory_snapshots ? '+snapshots' : ''}`,
      protocol: h.protocol,
      desktops: h.desktops ?? {},
      drain: ((state) => (state === null ? null : { state, error: h.drain_error }))(drainState(h)),
      links: hostLinkView(h, liveRows, leaderLive ? lease.holder : null, now),
      unrecorded: h.unrecorded_since === null ? null : { for_ms: since(h.unrecorded_since), running: h.running_desktops ?? 0, may_run: h.may_run },
    })),
    stuck_operations: stuck.map((o) => ({ id: o.id, kind: o.kind, desktop_id: o.desktop_id, state: o.state, open_ms: since(o.created_at) })),
    warnings: [],
  };
  status.warnings = fleetWarnings(status, liveRows);
  return status;
}

/** What an operator should look at, in plain sentences. */
export function fleetWarnings(status: FleetStatus, liveRows: readonly ReplicaRow[]): string[] {
  const warnings: string[] = [];
  if (liveRows.length === 0) warnings.push('no scheduler replica is running (none refreshed its registry row lately)');
  else if (!status.lease?.live) warnings.push('no replica holds the leader lease: lifecycle operations wait until one does');
  const versions = new Set(liveRows.map((r) => r.version));
  if (versions.size > 1) warnings.push(`live replicas run different versions: ${[...versions].sort().join(', ')}`);
  const names = new Set(liveRows.flatMap((r) => Object.keys(r.settings)));
  for (const name of [...names].sort()) {
    const values = new Map<string, string[]>();
    for (const r of liveRows) {
      const value = String(r.settings[name] ?? 'unset');
      values.set(value, [...(values.get(value) ?? []), r.id]);
    }
    if (values.size > 1) {
      const detail = [...values].map(([value, ids]) => `${ids.join(', ')}: ${value}`).join('; ');
      warnings.push(`replicas disagree on ${name} (${detail})`);
    }
  }
  for (const h of status.hosts) {
    // Hibernated ones count too: their disks are on that host alone, so they cannot wake until it
    // returns (the failure grace hibernates the awake ones a minute into the outage).
    const held = Object.entries(h.desktops).filter(([state]) => state !== 'provisioning').reduce((n, [, c]) => n + c, 0);
    if (h.lost) warnings.push(`host ${h.id} (${h.hostname}) was declared lost: ${held} desktop(s) on it still to destroy; finish with canto hosts forget ${h.id} --yes --wait`);
    else if (h.status === 'down' && held > 0) warnings.push(`host ${h.id} (${h.hostname}) is down with ${held} desktop(s) on it: they cannot wake until it returns`);
    const unlinked = h.status === 'ready' && !h.lost ? linkWarning(h.links) : null;
    if (unlinked !== null) warnings.push(`host ${h.id} (${h.hostname}): ${unlinked}`);
    // Only while it reads ready: the count is its last heartbeat's, which says nothing of a host gone silent.
    if (h.unrecorded !== null && h.unrecorded.for_ms >= UNRECORDED_WARN_MS && h.status === 'ready' && !h.lost) {
      warnings.push(`host ${h.id} (${h.hostname}) has run ${h.unrecorded.running} desktop(s) for ${Math.round(h.unrecorded.for_ms / 60_000)} min where its records let ${h.unrecorded.may_run} run: ` +
        'one runs unbilled and out of sight; restart its agent, which then stops every desktop it may not run before it reads ready');
    }
    if (h.drain?.state === 'stopped') warnings.push(`host ${h.id} (${h.hostname}): its drain stopped: ${h.drain.error}; fix that, then run canto hosts drain ${h.id} again`);
  }
  for (const o of status.stuck_operations) {
    warnings.push(`operation ${o.id} (${o.kind} of ${o.desktop_id}) has been ${o.state} for ${Math.round(o.open_ms / 60_000)} min`);
  }
  return warnings;
}

/**
 * A host's status as tables show it: `ready`, `down`, with `cordoned` and a drain under way or
 * stopped; `lost` for a host being forgotten, whatever else it was.
 */
export function hostStatusLabel(state: string, cordoned: boolean, drain: DrainState | null, lost = false): string {
  if (lost) return 'lost';
  // A drained host says so: the next step of the runbook is stopping its agent and removing it.
  const drainWord = drain === 'draining' ? ['draining'] : drain === 'stopped' ? ['drain stopped'] : drain === 'drained' ? ['drained'] : [];
  return [state, ...(cordoned ? ['cordoned'] : []), ...drainWord].join(',');
}

/** "2.5 s ago", "42 s ago", "1.5 h ago": how long ago something was, `ms` before now. */
export function ago(ms: number): string {
  return ms < 10_000 ? `${(ms / 1000).toFixed(1)} s ago` : ms < 3_600_000 ? `${Math.round(ms / 1000)} s ago` : `${(ms / 3_600_000).toFixed(1)} h ago`;
}

/** `ago` for a moment the API gave as an ISO time. */
export const agoSince = (iso: string): string => ago(Math.max(0, Date.now() - Date.parse(iso)));

export function formatFleetStatus(status: FleetStatus): string {
  const replicaRows = status.replicas.map((r) => ({
    ID: r.id,
    URL: r.url,
    ROLE: r.role,
    LEASE: r.role === 'leader' && status.lease ? `epoch ${status.lease.epoch}, held ${Math.round(status.lease.held_for_ms / 1000)} s` : '',
    VERSION: r.version,
    'LAST SEEN': ago(r.last_seen_ms_ago),
  }));
  const hostRows = status.hosts.map((h) => ({
    ID: h.id,
    HOSTNAME: h.hostname,
    STATUS: hostStatusLabel(h.status, h.cordoned, h.drain?.state ?? null, h.lost),
    'LAST HEARD': ago(h.last_heard_ms_ago),
    LINKS: linksLabel(h.links),
    DESKTOPS: Object.entries(h.desktops).map(([state, n]) => `${n} ${state}`).join(', ') || 'none',
    RUNTIME: h.runtime,
    PROTOCOL: h.protocol,
  }));
  const parts = [
    'Replicas',
    table(replicaRows, ['ID', 'URL', 'ROLE', 'LEASE', 'VERSION', 'LAST SEEN'], '  '),
    '',
    'Hosts',
    table(hostRows, ['ID', 'HOSTNAME', 'STATUS', 'LAST HEARD', 'LINKS', 'DESKTOPS', 'RUNTIME', 'PROTOCOL'], '  '),
  ];
  if (status.warnings.length > 0) parts.push('', 'Warnings', ...status.warnings.map((w) => `  ! ${w}`));
  return `${parts.join('\n')}\n`;
}

/** A plain-text table: a header line, then a line per row; `(none)` when there are none. */
export function table(rows: ReadonlyArray<Record<string, string>>, columns: readonly string[], indent = ''): string {
  if (rows.length === 0) return `${indent}(none)`;
  const width = (c: string) => Math.max(c.length, ...rows.map((r) => (r[c] ?? '').length));
  const line = (r: Record<string, string>) => `${indent}${columns.map((c) => (r[c] ?? '').padEnd(width(c))).join('  ').trimEnd()}`;
  return [line(Object.fromEntries(columns.map((c) => [c, c]))), ...rows.map(line)].join('\n');
}

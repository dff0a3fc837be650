/**
 * `canto hosts drain --wait`: polls the host until its drain ends and draws one progress line on
 * a terminal (desktops moved of all, bytes, rate, time left), or plain lines when stderr is not a
 * terminal, so a log of a scripted drain still shows how it went. A watch rides out a minute of
 * an unreachable API (`readThrough`).
 */
import { CantoConnectionError, CantoProblem, unwrap, type AdminHost, type AdminOperation, type CantoAdmin } from '../../sdk/src/index.js';
import { agoSince } from './status.js';

const POLL_MS = 250;
/** How long a watch rides out an admin API it cannot reach (a replica failing over) before it gives up. */
export const WATCH_PATIENCE_MS = 60_000;

/**
 * One read of a watch (`--wait`). The drain or move goes on in the database whatever happens to
 * the replica the CLI asks, so a refused connection or a 5xx answer (a failover behind a load
 * balancer) is retried every `pauseMs` for up to `patienceMs`, said once; anything else throws.
 */
export async function readThrough<T>(read: () => Promise<T>, note: (line: string) => void, what: string, patienceMs = WATCH_PATIENCE_MS, pauseMs = 1_000): Promise<T> {
  const deadline = Date.now() + patienceMs;
  let told = false;
  for (;;) {
    try {
      return await read();
    } catch (err) {
      const transient = err instanceof CantoConnectionError || (err instanceof CantoProblem && err.status >= 500);
      if (!transient || Date.now() > deadline) throw err;
      if (!told) note(`the admin API did not answer (${err.message}); asking again for up to ${Math.round(patienceMs / 1000)} s: the ${what} goes on meanwhile`);
      told = true;
      await new Promise((resolve) => setTimeout(resolve, pauseMs));
    }
  }
}

const mib = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(1)} MiB`;

/** " in 2.4 s" from the drain's own times (the server's, not this watch's); "" when one is missing. */
function took(from: string, to: string | null | undefined): string {
  const ms = to ? Date.parse(to) - Date.parse(from) : NaN;
  return Number.isFinite(ms) && ms >= 0 ? ` in ${(ms / 1000).toFixed(1)} s` : '';
}

/** "1 desktop", "2 desktops". */
export const desktopCount = (n: number) => `${n} desktop${n === 1 ? '' : 's'}`;

function bar(fraction: number, width = 24): string {
  const full = Math.round(Math.max(0, Math.min(1, fraction)) * width);
  return `[${'#'.repeat(full)}${'.'.repeat(width - full)}]`;
}

/** Every desktop of the host's drain: moved, moving, or not taken yet. */
export function drainTotal(host: AdminHost): number {
  const d = host.drain;
  return d ? d.moved + d.running + d.remaining : 0;
}

/** One line: what moved, of how much, how fast, and what is left. */
export function progressLine(host: AdminHost, elapsedMs: number): string {
  const d = host.drain;
  if (!d) return `${host.id}: no drain`;
  const total = drainTotal(host);
  const rate = elapsedMs > 0 ? d.moved_bytes / (elapsedMs / 1000) : 0;
  const left = total - d.moved;
  const perDesktopMs = d.moved > 0 ? elapsedMs / d.moved : null;
  const eta = perDesktopMs === null || left === 0 ? '' : ` ETA ${Math.ceil((perDesktopMs * left) / 1000)} s`;
  return `${bar(total === 0 ? 1 : d.moved / total)} ${d.moved}/${total} desktops, ${mib(d.moved_bytes)} at ${mib(rate)}/s, ${d.running} moving${eta}${downHosts(host)}`;
}

/**
 * What to add when the drained host, or a host its moves copy to, is down: the moves retry until
 * that agent is back (or their deadline passes), and the bar stands still meanwhile.
 */
function downHosts(host: AdminHost): string {
  const targets = (host.drain?.down_targets ?? []).map((id) => `; ${id}, a target, is down: the moves to it wait for its agent`).join('');
  if (host.state !== 'down') return targets;
  return `; the host is down (last heard ${agoSince(host.last_heartbeat_at)}): its moves wait for its agent${targets}`;
}

/**
 * One line for `canto desktops move --wait`: the phase, the copy while it runs, and which of its
 * hosts (as last read) is down, since the move then waits for that host's agent.
 */
export function moveLine(op: AdminOperation, hosts: readonly AdminHost[] = []): string {
  const copy = op.copied_bytes !== null && op.total_bytes ? ` ${bar(op.copied_bytes / op.total_bytes)} ${mib(op.copied_bytes)} of ${mib(op.total_bytes)}` : '';
  const down = hosts.filter((h) => h.state === 'down').map((h) => `; host ${h.id} is down (last heard ${agoSince(h.last_heartbeat_at)}): the move waits for its agent`);
  return `moving ${op.desktop_id}: ${op.phase ?? op.state}${copy}${down.join('')}`;
}


/** How a settled move went: where to, what it copied, and how long an awake desktop was down. */
export function describeMove(op: AdminOperation): string {
  if (op.state !== 'succeeded') return `move of ${op.desktop_id} failed: ${op.error?.message ?? 'unknown'}`;
  const result = op.result ?? {};
  const downtime = typeof result.downtime_ms === 'number' ? `, down ${result.downtime_ms} ms` : '';
  return `moved ${op.desktop_id} from ${op.source_host_id} to ${op.target_host_id} (${mib(op.total_bytes ?? 0)}${downtime})`;
}

export function describeDrain(host: AdminHost): string {
  const d = host.drain;
  if (!d) return `${host.id}: no drain`;
  if (d.state === 'drained') {
    return `${host.id} drained${took(d.requested_at, d.finished_at)}: ${desktopCount(d.moved)} moved (${mib(d.moved_bytes)}); it holds none. Stop its agent, then: canto hosts remove ${host.id}`;
  }
  if (d.state === 'stopped') return `${host.id} drain stopped: ${d.error ?? 'a move failed'} (${d.moved} moved, ${d.remaining} left; drain again to resume)`;
  return `${host.id} draining: ${d.moved} moved, ${d.running} moving, ${d.remaining} left`;
}

/** Polls until the drain is drained or stopped; answers the host as last read. */
export async function watchDrain(admin: CantoAdmin, hostId: string, progress: NodeJS.WriteStream | null): Promise<AdminHost> {
  const started = Date.now();
  let lastPlain = '';
  const note = (line: string) => progress?.write(`${progress.isTTY ? '\n' : ''}${line}\n`);
  for (;;) {
    const host = await readThrough(async () => unwrap(await admin.api.GET('/admin/v1/hosts/{host_id}', { params: { path: { host_id: hostId } } })), note, 'drain');
    const line = progressLine(host, Date.now() - started);
    if (progress?.isTTY) progress.write(`\r${line}\x1b[K`);
    else if (progress && line !== lastPlain) progress.write(`${line}\n`);
    lastPlain = line;
    if (!host.drain || host.drain.state !== 'draining') {
      if (progress?.isTTY) progress.write('\n');
      return host;
    }
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

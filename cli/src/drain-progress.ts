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
      if (!transient(err) || Date.now() > deadline) throw err;
      if (!told) note(`the admin API did not answer (${err.message}); asking again for up to ${Math.round(patienceMs / 1000)} s: the ${what} goes on meanwhile`);
      told = true;
      await new Promise((resolve) => setTimeout(resolve, pauseMs));
    }
  }
}

/** A refused connection or a 5xx answer: what a failover behind a load balancer looks like. */
function transient(err: unknown): err is CantoConnectionError | CantoProblem {
  return err instanceof CantoConnectionError || (err instanceof CantoProblem && err.status >= 500);
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

/** Where a watch began: rate and time left count only what moved since (a resumed drain keeps what it moved before). */
export interface WatchStart {
  readonly atMs: number;
  readonly moved: number;
  readonly bytes: number;
}

export function watchStart(host: AdminHost, atMs = Date.now()): WatchStart {
  return { atMs, moved: host.drain?.moved ?? 0, bytes: host.drain?.moved_bytes ?? 0 };
}

/** What a plain (non-terminal) watch prints a line for: counts and down hosts, not the rate. */
function progressCounts(host: AdminHost): string {
  const d = host.drain;
  if (!d) return `${host.id}: no drain`;
  return `${d.moved}/${drainTotal(host)} desktops, ${mib(d.moved_bytes)}, ${d.running} moving${downHosts(host)}`;
}

/** One line: what moved, of how much, how fast (since the watch began), and what is left. */
export function progressLine(host: AdminHost, since: WatchStart, nowMs = Date.now()): string {
  const d = host.drain;
  if (!d) return `${host.id}: no drain`;
  const total = drainTotal(host);
  const elapsedMs = nowMs - since.atMs;
  const rate = elapsedMs > 0 ? Math.max(0, d.moved_bytes - since.bytes) / (elapsedMs / 1000) : 0;
  const left = total - d.moved;
  const movedHere = d.moved - since.moved;
  const eta = movedHere <= 0 || left === 0 ? '' : ` ETA ${Math.ceil(((elapsedMs / movedHere) * left) / 1000)} s`;
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
  if (!d) return `${host.id}: no drain (it ended when the host was uncordoned, or none was asked for)`;
  if (d.state === 'drained') {
    return `${host.id} drained${took(d.requested_at, d.finished_at)}: ${desktopCount(d.moved)} moved (${mib(d.moved_bytes)}); it holds none. Stop its agent for good (systemctl disable --now canto-agent), then: canto hosts remove ${host.id}`;
  }
  const running = d.running > 0 ? `, ${d.running} still moving` : '';
  if (d.state === 'stopped') return `${host.id} drain stopped: ${d.error ?? 'a move failed'} (${d.moved} moved${running}, ${d.remaining} left; drain again to resume)`;
  return `${host.id} draining: ${d.moved} moved, ${d.running} moving, ${d.remaining} left`;
}

/** `canto hosts show`: the drain in full, one `[label, value]` per line. */
export function drainDetails(host: AdminHost): Array<[string, string]> {
  const d = host.drain;
  if (!d) return [['Drain', 'none']];
  const lines: Array<[string, string]> = [
    ['Drain', describeDrain(host)],
    ['  copied', `${mib(d.moved_bytes)} of ${mib(d.total_bytes)} known so far, ${d.parallel} move(s) at a time`],
    ['  requested', `${d.requested_at}${d.resumed_at ? `, resumed ${d.resumed_at}` : ''}${d.finished_at ? `, finished ${d.finished_at}` : ''}`],
  ];
  if (d.failed > 0) lines.push(['  failed', `${d.failed} move(s)${d.resumed_at ? ' since it resumed' : ''}`]);
  if (d.down_targets.length > 0) lines.push(['  waiting on', `${d.down_targets.join(', ')} (target hosts that are down: the moves to them wait for their agents)`]);
  return lines;
}

/** How a watch ends when the admin API stays out of reach: the drain itself goes on. */
export class WatchLost extends Error {}

/**
 * Polls until the drain is drained or stopped; answers the host as last read. Lines go to
 * `progress` (a redrawn bar on a terminal; otherwise a line whenever the counts change).
 */
export async function watchDrain(admin: CantoAdmin, hostId: string, progress: NodeJS.WriteStream | null): Promise<AdminHost> {
  let since: WatchStart | null = null;
  let lastPlain = '';
  const note = (line: string) => progress?.write(`${progress.isTTY ? '\n' : ''}${line}\n`);
  const again = `watch it again: canto hosts show ${hostId} --wait`;
  // Ctrl-C ends the watch, not the drain, which lives in the database.
  const onInterrupt = () => {
    note(`stopped watching; the drain goes on (${again})`);
    process.exit(130);
  };
  process.once('SIGINT', onInterrupt);
  try {
    for (;;) {
      const host = await readThrough(async () => unwrap(await admin.api.GET('/admin/v1/hosts/{host_id}', { params: { path: { host_id: hostId } } })), note, 'drain').catch((err: unknown) => {
        // Only an API out of reach leaves the drain going on unseen; a 404 or 401 is an answer.
        if (!transient(err)) throw err;
        throw new WatchLost(`stopped watching: ${err instanceof Error ? err.message : String(err)}; the drain goes on (${again})`);
      });
      since ??= watchStart(host);
      if (progress?.isTTY) progress.write(`\r${progressLine(host, since)}\x1b[K`);
      else if (progress && progressCounts(host) !== lastPlain) progress.write(`${progressLine(host, since)}\n`);
      lastPlain = progressCounts(host);
      if (!host.drain || host.drain.state !== 'draining') {
        if (progress?.isTTY) progress.write('\n');
        return host;
      }
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
  } finally {
    process.off('SIGINT', onInterrupt);
  }
}

/** A plain progress line at most this often off a terminal (a new phase is told at once). */
const PLAIN_EVERY_MS = 5_000;

/**
 * Polls a move until it settles; answers the operation as last read. On a terminal its phase
 * and copy are redrawn on one line; otherwise a line is written when its phase changes, and every
 * few seconds while it copies (CI has no terminal, and printed nothing for minutes). `hostsOf`
 * reads its source and target about once a second, to say when one is down. Ctrl-C ends the
 * watch, not the move; an API out of reach past a minute throws WatchLost (the move goes on).
 */
export async function watchMove(
  admin: CantoAdmin, first: AdminOperation, progress: NodeJS.WriteStream | null, hostsOf: (op: AdminOperation) => Promise<AdminHost[]>,
): Promise<AdminOperation> {
  const again = `its operation: GET /admin/v1/operations/${first.id}`;
  const note = (line: string) => progress?.write(`${progress.isTTY ? '\r\x1b[K' : ''}${line}\n`);
  const onInterrupt = () => {
    note(`stopped watching; the move goes on (operation ${first.id})`);
    process.exit(130);
  };
  process.once('SIGINT', onInterrupt);
  let op = first;
  let hosts: AdminHost[] = [];
  let lastPhase = '';
  let lastAt = 0;
  try {
    for (let poll = 0; op.state === 'pending' || op.state === 'running'; poll++) {
      if (progress !== null && poll % 4 === 0) hosts = await hostsOf(op);
      const line = moveLine(op, hosts);
      const phase = `${op.phase ?? op.state}${hosts.some((h) => h.state === 'down') ? ' down' : ''}`;
      if (progress?.isTTY) progress.write(`\r${line}\x1b[K`);
      else if (progress && (phase !== lastPhase || Date.now() - lastAt >= PLAIN_EVERY_MS)) {
        progress.write(`${line}\n`);
        lastPhase = phase;
        lastAt = Date.now();
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
      op = await readThrough(() => admin.getOperation(op.id), (l) => note(l), 'move').catch((err: unknown) => {
        if (!transient(err)) throw err;
        throw new WatchLost(`stopped watching: ${err instanceof Error ? err.message : String(err)}; the move goes on (${again})`);
      });
    }
    if (progress?.isTTY) progress.write('\r\x1b[K');
    return op;
  } finally {
    process.off('SIGINT', onInterrupt);
  }
}

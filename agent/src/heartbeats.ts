/**
 * Heartbeats on every scheduler link, from one timer: each interval the host's use (running
 * desktops, memory, CPU: host-meter.ts) is read once, whatever the number of replicas, and every
 * link gets a heartbeat notification and a websocket ping. A replica that has stopped answering pings (nothing heard for
 * five intervals, and at least five seconds) is dropped: a half-open TCP connection would
 * otherwise look linked for ever. The schedulers judge the host by these heartbeats.
 *
 * A beat never waits for the measure: reading it is file-system calls, which queue behind every
 * other file operation of the agent (a move's copy, an upload) in libuv's small thread pool and
 * took seconds under load, long enough for the schedulers to read a healthy host as silent. Each
 * beat carries the last measure; a new one is read in the background. The measure never lists
 * desktops one by one (it once did, every second, which grew with the number of idle desktops).
 */
import type WebSocket from 'ws';
import type { Logger } from '../../shared/src/log.js';
import { HeartbeatPayload, parseMessage } from '../../shared/src/protocol.js';
import type { RpcPeer } from '../../shared/src/rpc.js';
import type { HostMeasure, HostMeter } from './host-meter.js';

const SILENT_REPLICA_MS = 5_000;

/** What the heartbeat needs of a link. */
export interface BeatingLink {
  readonly ws: WebSocket;
  readonly peer: RpcPeer | null;
  /** When the replica was last heard from (a pong or any message), in `performance.now()` time. */
  readonly lastSeenAt: number;
  readonly label: Record<string, unknown>;
}

export class Heartbeats {
  private timer: NodeJS.Timeout | null = null;
  private measuring = false;
  private last: HostMeasure | null = null;
  private intervalMs = 1_000;

  constructor(
    private readonly meter: HostMeter,
    private readonly links: () => BeatingLink[],
    private readonly log: Logger,
    /** Whether beats carry the measured use (protocol 1.11), or only the running count. */
    private readonly withMeasured = true,
  ) {}

  /** Starts beating every `intervalMs` (the first caller's interval wins); beats `first` at once. */
  async start(intervalMs: number, first: BeatingLink): Promise<void> {
    if (this.timer === null) {
      this.intervalMs = intervalMs;
      this.timer = setInterval(() => this.tick(), intervalMs);
    }
    this.beat(first, this.last);
    await this.measure();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  private tick(): void {
    for (const link of this.links()) this.beat(link, this.last);
    void this.measure();
  }

  /** Reads the host's use for the next beats; one read at a time. */
  private async measure(): Promise<void> {
    if (this.measuring) return;
    this.measuring = true;
    try {
      this.last = await this.meter.read();
    } catch (err) {
      this.log.warn({ message: err instanceof Error ? err.message : String(err) }, 'could not measure the host for the heartbeat');
    } finally {
      this.measuring = false;
    }
  }

  private beat(link: BeatingLink, last: HostMeasure | null): void {
    const peer = link.peer;
    if (peer === null || !peer.isOpen) return;
    if (performance.now() - link.lastSeenAt > Math.max(5 * this.intervalMs, SILENT_REPLICA_MS)) {
      this.log.warn(link.label, 'a scheduler replica stopped answering pings; dropping its link');
      link.ws.terminate();
      return;
    }
    try {
      link.ws.ping();
      const payload = last === null ? { running_desktops: 0 }
        : this.withMeasured ? { running_desktops: last.running, measured: last.measured } : { running_desktops: last.running };
      peer.notify('heartbeat', parseMessage(HeartbeatPayload, payload, 'heartbeat'));
    } catch (err) {
      this.log.warn({ message: err instanceof Error ? err.message : String(err) }, 'heartbeat failed');
    }
  }
}

/**
 * Runs `work` (a hello fence) while beating on a link not yet ready. A fence of many desktops
 * dumps them all and may take longer than the scheduler waits for a silent link: it hears from
 * this one meanwhile (a beat before `host.ready` leaves the host not ready), or it drops the link
 * and the next hello fences again, and again.
 */
export async function beatingMeanwhile<T>(peer: Pick<RpcPeer, 'isOpen' | 'notify'>, intervalMs: number, work: () => Promise<T>): Promise<T> {
  const timer = setInterval(() => {
    if (peer.isOpen) peer.notify('heartbeat', { running_desktops: 0 });
  }, intervalMs);
  try {
    return await work();
  } finally {
    clearInterval(timer);
  }
}

/**
 * Heartbeats on every scheduler link, from one timer: each interval the number of running
 * desktops is read once, whatever the number of replicas, and every link gets a heartbeat
 * notification and a websocket ping. A replica that has stopped answering pings (nothing heard for
 * five intervals, and at least five seconds) is dropped: a half-open TCP connection would
 * otherwise look linked for ever. The schedulers judge the host by these heartbeats.
 *
 * A beat never waits for the count: listing desktops is a round of file-system calls, which queue
 * behind every other file operation of the agent (a move's copy, an upload) in libuv's small
 * thread pool and took seconds under load, long enough for the schedulers to read a healthy host
 * as silent. Each beat carries the last count; a new one is read in the background.
 */
import type WebSocket from 'ws';
import type { Logger } from '../../shared/src/log.js';
import { HeartbeatPayload, parseMessage } from '../../shared/src/protocol.js';
import type { RpcPeer } from '../../shared/src/rpc.js';
import type { DesktopLifecycle } from './runtime/driver.js';

const SILENT_REPLICA_MS = 5_000;

/** What the heartbeat needs of a link. */
export interface BeatingLink {
  readonly ws: WebSocket;
  readonly peer: RpcPeer | null;
  /** When the replica was last heard from (a pong or any message). */
  readonly lastSeenAt: number;
  readonly label: Record<string, unknown>;
}

export class Heartbeats {
  private timer: NodeJS.Timeout | null = null;
  private counting = false;
  private running = 0;
  private intervalMs = 1_000;

  constructor(
    private readonly driver: Pick<DesktopLifecycle, 'list'>,
    private readonly links: () => BeatingLink[],
    private readonly log: Logger,
  ) {}

  /** Starts beating every `intervalMs` (the first caller's interval wins); beats `first` at once. */
  async start(intervalMs: number, first: BeatingLink): Promise<void> {
    if (this.timer === null) {
      this.intervalMs = intervalMs;
      this.timer = setInterval(() => this.tick(), intervalMs);
    }
    this.beat(first, this.running);
    await this.recount();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  private tick(): void {
    for (const link of this.links()) this.beat(link, this.running);
    void this.recount();
  }

  /** Reads the running count for the next beats; one read at a time. */
  private async recount(): Promise<void> {
    if (this.counting) return;
    this.counting = true;
    try {
      this.running = (await this.driver.list()).filter((d) => d.running).length;
    } catch (err) {
      this.log.warn({ message: err instanceof Error ? err.message : String(err) }, 'could not list desktops for the heartbeat');
    } finally {
      this.counting = false;
    }
  }

  private beat(link: BeatingLink, running: number): void {
    const peer = link.peer;
    if (peer === null || !peer.isOpen) return;
    if (Date.now() - link.lastSeenAt > Math.max(5 * this.intervalMs, SILENT_REPLICA_MS)) {
      this.log.warn(link.label, 'a scheduler replica stopped answering pings; dropping its link');
      link.ws.terminate();
      return;
    }
    try {
      link.ws.ping();
      peer.notify('heartbeat', parseMessage(HeartbeatPayload, { running_desktops: running }, 'heartbeat'));
    } catch (err) {
      this.log.warn({ message: err instanceof Error ? err.message : String(err) }, 'heartbeat failed');
    }
  }
}

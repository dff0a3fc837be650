/**
 * Port links carried into desktops by relays of their own (agent/native/port-relay.c), with the
 * agent out of the data path.
 *
 * A port link used to cross two relays per chunk: the agent's event loop (the gateway's TCP
 * connection to a Unix socket) and a forked Perl child of the desktop's forwarder (that socket to
 * the guest port). Measured through the ingress, those two cost about a third of the CPU of a
 * small proxied request, and every link of every desktop went through the agent's one thread.
 * Now, once the gateway has verified a link's line, the client's connection itself is handed to
 * the process spawner (spawner.ts) and becomes fd 1 of a `canto-spawn --relay` child: it joins the
 * desktop's cgroups, enters the guest's network namespace, drops to `nobody`, connects to the port,
 * answers the link `OK` or `ERR <code>` itself, and splices bytes both ways until both ends close.
 *
 * The agent keeps each relay's fd 0, a connection to it: closing that resets the relay's client
 * and guest connections and ends it, which is how a desktop's relays are ended before a hibernate
 * or a destroy (`closeAll`, under the driver's fence, so that no new link enters meanwhile), with
 * SIGKILL after GONE_MS as the backstop. A relay dies with the spawner, hence with the agent, as
 * the forwarder does.
 */
import type { Socket } from 'node:net';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { cgroupDirs } from '../host/cgroups.js';
import type { InitProcess } from '../host/cold-boot.js';
import { spawnProcess, type SpawnedProcess } from '../host/spawner.js';
import type { HandedOffLink, RelayOutcome } from '../../driver.js';

/** Bound on waiting for an ended relay to exit before it is killed, and then for it to be gone. */
const GONE_MS = 2_000;

/** How a relay ended, by its exit code (agent/native/canto-spawn.h). */
const OUTCOMES = new Map<number, RelayOutcome>([[0, 'relayed'], [10, 'not_running'], [11, 'refused'], [12, 'unavailable']]);

interface Relay {
  readonly started: Promise<SpawnedProcess>;
  readonly exited: Promise<void>;
}

export class PortRelays {
  private readonly byDesktop = new Map<string, Set<Relay>>();

  /** `program`: the built canto-spawn. */
  constructor(private readonly program: string) {}

  /**
   * Starts a relay of `client` into `port` of the desktop whose guest init is `init`; resolves
   * once it runs, when the client's connection is no longer the agent's. Registers it before any
   * await, so that `closeAll` finds it. Rejects (the client still the caller's) when it cannot start.
   */
  async start(desktopId: string, init: InitProcess, port: number, client: Socket): Promise<HandedOffLink> {
    const args = ['--relay', `/proc/${init.pid}/ns/net`, String(port), ...cgroupDirs(desktopId)];
    const started = spawnProcess(this.program, args, { stdio: ['pipe', 'ignore', 'ignore'], socket: client, env: {} });
    let settle!: (outcome: RelayOutcome) => void;
    const outcome = new Promise<RelayOutcome>((resolve) => (settle = resolve));
    const relay: Relay = { started, exited: outcome.then(() => undefined) };
    let set = this.byDesktop.get(desktopId);
    if (set === undefined) this.byDesktop.set(desktopId, (set = new Set()));
    set.add(relay);
    const forget = () => {
      set.delete(relay);
      if (set.size === 0 && this.byDesktop.get(desktopId) === set) this.byDesktop.delete(desktopId);
    };
    let child: SpawnedProcess;
    try {
      child = await started;
    } catch (err) {
      settle('unavailable');
      forget();
      throw new AgentFailure('runtime_error', `the port relay did not start: ${String(err)}`, true);
    }
    child.once('exit', (code: number | null) => {
      forget();
      settle(OUTCOMES.get(code ?? -1) ?? 'unavailable');
    });
    if (child.pid === undefined) {
      // Not started (Node's spawn says why with an `error` event, then `exit` or `close`).
      child.once('error', () => undefined);
      child.once('close', () => {
        forget();
        settle('unavailable');
      });
      throw new AgentFailure('runtime_error', 'the port relay did not start', true);
    }
    // The relay holds the client now; this copy closes without ending the connection.
    client.destroy();
    child.stdin?.on('error', () => undefined);
    // A relay must not keep the agent alive.
    child.unref();
    (child.stdin as Socket | null)?.unref();
    return { outcome };
  }

  /** Ends the desktop's relays (their clients are reset) and waits until they are gone. */
  async closeAll(desktopId: string): Promise<void> {
    const set = this.byDesktop.get(desktopId);
    if (set === undefined) return;
    this.byDesktop.delete(desktopId);
    await Promise.all([...set].map((relay) => end(relay)));
  }

  /** Ends every relay. */
  async close(): Promise<void> {
    const all = [...this.byDesktop.keys()];
    await Promise.all(all.map((desktopId) => this.closeAll(desktopId)));
  }
}

async function end(relay: Relay): Promise<void> {
  const child = await relay.started.catch(() => null);
  if (child === null || child.pid === undefined) return;
  child.stdin?.destroy();
  if (await within(relay.exited, GONE_MS)) return;
  child.kill('SIGKILL');
  await within(relay.exited, GONE_MS);
}

/** Whether `promise` settled within `ms`. */
async function within(promise: Promise<void>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const gone = await Promise.race([promise.then(() => true), new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), ms)))]);
  clearTimeout(timer);
  return gone;
}

/**
 * A stop (hibernate or destroy) that outlived a restart of its host's agent. The operation waits
 * for a host that went away and retries its command once the host is back; when the restart was
 * a reboot, the guest went with the old agent, and the command finds nothing running. The meter
 * must then close when the guest died, not when the operation finishes: the outage in between
 * ran nothing. When the old agent was last heard from (`previous_seen_at`, recorded at the new
 * one's first hello) is the best bound of that moment the scheduler has, as for a desktop found
 * gone after a relink (reconcile-awake.ts).
 *
 * Asked before the command: the host is inspected (queued behind anything it still runs for the
 * desktop) only when its agent instance is newer than the operation, so an ordinary stop costs
 * one small read. A guest that outlived the restart is running, and is billed until it stops.
 */
import type { CommandResult } from '../../../shared/src/protocol.js';
import type { OperationRow } from '../store/rows.js';
import type { StepDeps } from './steps.js';

/** What the host holds of a desktop now; null from an agent too old to say. */
export async function inspect(deps: StepDeps, hostId: string, desktopId: string): Promise<CommandResult<'desktop.inspect'> | null> {
  if (!deps.agents.speaks(hostId, 1, 7)) return null;
  return deps.agents.call(hostId, 'desktop.inspect', { desktop_id: desktopId }, deps.agentCommandTimeoutMs);
}

export interface GoneInRestart {
  /** When the old agent was last heard from: where the meter closes. */
  readonly at: Date;
  /**
   * Whether the host holds a memory snapshot of the desktop: a wake consumes the one it restores,
   * so this is the stop's own, made by the old agent before it went.
   */
  readonly snapshot: boolean;
}

/** What the host says of a desktop whose agent restarted since `op` began: null if it runs, or no restart came between. */
export async function goneInRestart(deps: StepDeps, op: OperationRow, hostId: string, desktopId: string): Promise<GoneInRestart | null> {
  const since = op.started_at ?? op.created_at;
  const [host] = await deps.sql<Array<{ previous_seen_at: Date | null }>>`
    SELECT previous_seen_at FROM hosts WHERE id = ${hostId} AND instance_since > ${since}`;
  if (!host?.previous_seen_at) return null;
  const held = await inspect(deps, hostId, desktopId);
  if (held === null || held.running) return null;
  return { at: host.previous_seen_at, snapshot: held.has_snapshot };
}

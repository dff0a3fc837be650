/**
 * Fencing of port-link lines. A line names the desktop's generation as the scheduler signed it,
 * and the agent checks it against the generation store (generations.ts) the way it checks a
 * command, with one difference: it only reads the store. Commands move the fence; connections
 * do not, so a flood of connections never writes to disk.
 *
 * A line for a desktop this host holds no generation for (never placed here, or destroyed), or
 * one older than the generation held (signed before a transition this host has seen since, such
 * as a recovery elsewhere followed by a reconcile here), is refused. A newer one is normal: the
 * scheduler signs the desktop's current generation, and its transition to awake bumps the
 * generation once more after the start command this host last saw.
 */
import type { PortTarget } from '../../../shared/src/port-link.js';
import { AgentFailure } from '../../../shared/src/protocol.js';

/** Throws `stale_generation` (the gateway answers `ERR not_running`) for a line this host must not serve. */
export function fencePortLine(held: number | undefined, target: PortTarget): void {
  if (held === undefined) throw new AgentFailure('stale_generation', `${target.desktopId} is not held here`, false);
  if (target.generation < held) {
    throw new AgentFailure('stale_generation', `generation ${target.generation} of ${target.desktopId} is older than ${held} held here`, false);
  }
}

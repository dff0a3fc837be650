/**
 * Disks a provision made on a host whose placement was never recorded there. A provision prepares
 * the desktop's disk on the chosen host, then records the placement; when that record fails (a
 * passing database fault, a COMMIT lost on the way), the operation is tried again and placement
 * may choose another host, leaving the first host a disk of a desktop placed elsewhere. That
 * host's next hello would sweep it (stale-copies.ts), but a host that stays linked says no hello,
 * and the disk would stay for good. So this engine remembers where it prepared disks it could not
 * record, and once the desktop is placed removes those on any other host.
 *
 * Kept in the engine's memory, for its term: a leader deposed between the prepare and the record
 * cannot send commands any more, and what it left is the next hello's to sweep.
 */
import type { DesktopRow } from '../store/rows.js';
import { command, LeaseLost, type StepDeps } from './steps.js';

export class PreparedDisks {
  /** Hosts holding a disk of the desktop whose placement was not recorded, by desktop. */
  private readonly unrecorded = new Map<string, Set<string>>();

  /** `hostId` holds a disk of the desktop that its placement record may not name. */
  add(desktopId: string, hostId: string): void {
    let hosts = this.unrecorded.get(desktopId);
    if (hosts === undefined) this.unrecorded.set(desktopId, (hosts = new Set()));
    hosts.add(hostId);
  }

  /**
   * Once `d` is placed (or destroyed), removes the disks it has on hosts other than its own; best
   * effort, each failure logged (the host's next hello sweeps what is left).
   */
  async removeLeftovers(deps: StepDeps, d: DesktopRow): Promise<void> {
    const hosts = this.unrecorded.get(d.id);
    if (hosts === undefined || (d.host_id === null && d.state !== 'destroyed')) return;
    this.unrecorded.delete(d.id);
    for (const hostId of hosts) {
      if (hostId === d.host_id) continue;
      try {
        // The record's generation is at least the prepare's, which the host's fence lets through.
        await command(deps, hostId, 'desktop.destroy', { desktop_id: d.id, generation: d.generation, operation_id: 'provision-leftover' });
        deps.logger.info({ desktopId: d.id, hostId, placedOn: d.host_id }, 'removed the disk a provision left on a host it was not placed on');
      } catch (err) {
        if (err instanceof LeaseLost) throw err;
        deps.logger.warn({ err, desktopId: d.id, hostId }, "the disk a provision left on a host it was not placed on could not be removed; the host's next hello sweeps it");
      }
    }
  }
}

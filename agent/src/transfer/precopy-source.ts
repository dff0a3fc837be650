/**
 * The sending side of a pre-copy (shared/src/precopy.ts): what the source remembers of the files
 * it sent ahead, per desktop, in memory only.
 *
 * `begin` picks the files and remembers each one's identity under a new id. `send` streams them;
 * once the stream is out it looks at each file again and keeps only those whose identity did not
 * change while they were read (a change moves ctime: precopy-files.ts). At the stop, `reusable`
 * answers which of those are still unchanged, once, and keeps that answer while the desktop stays
 * stopped, so that the listing and every fetch of the `desktop` unit leave out the same files.
 *
 * Forgetting is always safe: without a manifest the unit is listed whole. An agent restart, a
 * start, fork or destroy of the desktop here (`forget`), a newer `begin`: each drops it.
 */
import { randomBytes } from 'node:crypto';
import type { Writable } from 'node:stream';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { sameIdentity, type DesktopTransfer, type PrecopyEntry, type PrecopyFiles } from '../runtime/transfer.js';
import { pump } from './pump.js';

interface Manifest {
  readonly id: string;
  readonly generation: number;
  readonly entries: readonly PrecopyEntry[];
  /** Entries read unchanged by the last stream that went out whole; null before one did. */
  sent: readonly PrecopyEntry[] | null;
  /** At the stop: the paths left out of the `desktop` unit, decided once. */
  reused: readonly string[] | null;
}

export class PrecopySource {
  private readonly manifests = new Map<string, Manifest>();

  constructor(private readonly transfer: DesktopTransfer) {}

  /** Picks the files of the (running) desktop to send ahead; `unsupported` when the driver cannot. */
  async begin(desktopId: string, generation: number): Promise<{ id: string; files: number; bytes: number }> {
    const entries = await this.files().scan(desktopId);
    const id = `pc_${randomBytes(18).toString('base64url')}`;
    this.manifests.set(desktopId, { id, generation, entries, sent: null, reused: null });
    return { id, files: entries.length, bytes: entries.reduce((sum, e) => sum + e.identity.size, 0) };
  }

  /** The pre-copy of the desktop at `generation` that went out whole, or null. */
  sentId(desktopId: string, generation: number): string | null {
    const manifest = this.manifests.get(desktopId);
    return manifest !== undefined && manifest.generation === generation && manifest.sent !== null ? manifest.id : null;
  }

  /** Whether pre-copy `id` of the desktop at `generation` is known here. */
  knows(desktopId: string, generation: number, id: string): boolean {
    const manifest = this.manifests.get(desktopId);
    return manifest !== undefined && manifest.id === id && manifest.generation === generation;
  }

  /**
   * Streams the pre-copy into `out` (which it does not end); resolves with the stream's sha256.
   * `not_found` for an id this agent does not know (it restarted, or a newer one replaced it).
   */
  async send(desktopId: string, generation: number, id: string, out: Writable, onStream: (stop: () => void) => () => void): Promise<string> {
    const manifest = this.manifests.get(desktopId);
    if (manifest === undefined || !this.knows(desktopId, generation, id)) throw new AgentFailure('not_found', `no pre-copy ${id} of ${desktopId} here`, false);
    const files = this.files();
    manifest.sent = null;
    const paths = manifest.entries.map((e) => e.path);
    const stream = await files.read(desktopId, paths, { slabs: true });
    const untrack = onStream(() => stream.body.destroy(new Error(`${desktopId} changed on the source`)));
    let sha256: string;
    try {
      sha256 = await pump(stream, out, 0);
    } finally {
      untrack();
    }
    // Read whole: what did not change from the first look to now was read as it is.
    const now = await files.identify(desktopId, paths);
    if (this.manifests.get(desktopId) === manifest) manifest.sent = manifest.entries.filter((e, i) => sameIdentity(now[i]!, e.identity));
    return sha256;
  }

  /**
   * The member names the stopped desktop's `desktop` unit leaves out for pre-copy `id`: those
   * sent and unchanged since. Null when there is no such pre-copy here (the unit goes whole).
   */
  async reusable(desktopId: string, generation: number, id: string): Promise<readonly string[] | null> {
    const manifest = this.manifests.get(desktopId);
    if (manifest === undefined || manifest.id !== id || manifest.generation !== generation || manifest.sent === null) return null;
    if (manifest.reused === null) {
      const sent = manifest.sent;
      const now = await this.files().identify(desktopId, sent.map((e) => e.path));
      manifest.reused = sent.filter((e, i) => sameIdentity(now[i]!, e.identity)).map((e) => e.path);
    }
    return manifest.reused;
  }

  /** The desktop may change (or is gone): its pre-copy is no longer trusted. */
  forget(desktopId: string): void {
    this.manifests.delete(desktopId);
  }

  private files(): PrecopyFiles {
    const files = this.transfer.precopy;
    if (files === undefined) throw new AgentFailure('unsupported', 'this runtime cannot pre-copy desktops', false);
    return files;
  }
}

/**
 * Moving desktops of the in-memory fake driver (fake.ts) between hosts, so that tests of the
 * scheduler's moves and drains run against fake agents through the real transfer server and
 * importer. A fake desktop is one unit, `desktop`: its state (tier aside) as canonical JSON, keys
 * in a fixed order and files sorted by path, so the bytes are the same on every read while the
 * desktop stays stopped, as the real units' are. The fake has no disk layers: its forks copy.
 *
 * Staged units are files under a staging directory on disk (the importer spools there); an
 * installed copy's import record is kept in memory until it starts, as the sandbox keeps it on disk.
 */
import { createWriteStream, mkdtempSync } from 'node:fs';
import { finished } from 'node:stream/promises';
import { mkdir, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { ProcessStatus } from './driver.js';
import type { FakeDesktop } from './fake.js';
import { DESKTOP_UNIT, type DesktopTransfer, type HeldDesktop, type InstallSpec, type UnitSink, type UnitStream } from './transfer.js';

/** The moved part of a fake desktop; counters of boots and restores start again on each host. */
interface Image {
  readonly v: 1;
  readonly hasSnapshot: boolean;
  readonly firstBoot: FakeDesktop['firstBoot'];
  readonly firstBootRuns: number;
  readonly display: FakeDesktop['display'];
  readonly files: Array<[path: string, base64: string]>;
  readonly processes: Array<[id: string, status: ProcessStatus]>;
}

const DESKTOP_ID = /^[A-Za-z0-9_-]{1,64}$/;

export class FakeTransfer implements DesktopTransfer {
  private root: string | null;
  private ownRoot = false;
  /** Closed: an import still in flight must not make the removed root again. */
  private closed = false;

  constructor(
    private readonly desktops: Map<string, FakeDesktop>,
    /** Where imports stage; a temporary directory, made on first use, when null. */
    stagingRoot: string | null,
  ) {
    this.root = stagingRoot;
  }

  async inspect(desktopId: string): Promise<HeldDesktop> {
    const desktop = this.desktops.get(desktopId);
    return { held: desktop !== undefined, running: desktop?.running ?? false, imported: desktop?.imported ?? null };
  }

  async units(desktopId: string): Promise<string[]> {
    const desktop = this.desktops.get(desktopId);
    if (desktop === undefined) throw new AgentFailure('not_found', `no disk for ${desktopId} on this host`, false);
    if (desktop.running) throw new AgentFailure('conflict', `${desktopId} is running on this host`, false);
    return [DESKTOP_UNIT];
  }

  async read(desktopId: string, unitId: string): Promise<UnitStream> {
    return { body: Readable.from([this.image(desktopId, unitId)]), done: Promise.resolve() };
  }

  /** The unit's bytes: the desktop as JSON. */
  private image(desktopId: string, unitId: string): Buffer {
    const desktop = this.desktops.get(desktopId);
    if (desktop === undefined || unitId !== DESKTOP_UNIT) throw new AgentFailure('not_found', `no ${unitId} of ${desktopId} on this host`, false);
    const image: Image = {
      v: 1,
      hasSnapshot: desktop.hasSnapshot,
      firstBoot: desktop.firstBoot,
      firstBootRuns: desktop.firstBootRuns,
      display: { width: desktop.display.width, height: desktop.display.height },
      files: [...desktop.files].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([path, bytes]) => [path, bytes.toString('base64')]),
      processes: [...desktop.processes].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
    };
    return Buffer.from(JSON.stringify(image));
  }

  /** The image is in memory: its length is what a sized listing needs. */
  async size(desktopId: string, unitId: string): Promise<number> {
    return this.image(desktopId, unitId).length;
  }

  async holds(): Promise<boolean> {
    return false;
  }

  stagingDir(desktopId: string): string {
    if (!DESKTOP_ID.test(desktopId)) throw new AgentFailure('bad_request', `invalid desktop id ${JSON.stringify(desktopId)}`, false);
    // Closed: a directory of its own is gone (or was never made) and must not be made now.
    if (this.closed && (this.ownRoot || this.root === null)) throw new AgentFailure('runtime_error', 'the runtime is closed', true);
    if (this.root === null) {
      this.root = mkdtempSync(join(tmpdir(), 'canto-fake-incoming-'));
      this.ownRoot = true;
    }
    return join(this.root, desktopId);
  }

  async stagedChain(): Promise<string[]> {
    return [];
  }

  async unpack(desktopId: string, unitId: string): Promise<UnitSink> {
    if (unitId !== DESKTOP_UNIT) throw new AgentFailure('bad_request', `the fake runtime has no unit ${unitId}`, false);
    const dir = join(this.stagingDir(desktopId), 'x');
    await mkdir(dir, { recursive: true });
    const input = createWriteStream(join(dir, unitId));
    const done = finished(input);
    done.catch(() => undefined);
    return { input, done, abort: () => input.destroy(new Error('the unpacking was abandoned')) };
  }

  async install(desktopId: string, spec: InstallSpec): Promise<void> {
    if (this.desktops.has(desktopId)) throw new AgentFailure('conflict', `${desktopId} is already on this host`, false);
    const staging = this.stagingDir(desktopId);
    let image: Image;
    try {
      image = JSON.parse(await readFile(join(staging, 'x', DESKTOP_UNIT), 'utf8')) as Image;
    } catch {
      throw new AgentFailure('runtime_error', `the desktop unit of ${desktopId} is not unpacked`, true);
    }
    this.desktops.set(desktopId, {
      tier: spec.tier,
      running: false,
      hasSnapshot: image.hasSnapshot,
      firstBoot: image.firstBoot,
      firstBootRuns: image.firstBootRuns,
      coldBoots: 0,
      restores: 0,
      files: new Map(image.files.map(([path, data]) => [path, Buffer.from(data, 'base64')])),
      processes: new Map(image.processes),
      display: image.display,
      cursor: { x: 0, y: 0 },
      imported: spec.record,
    });
    await rm(staging, { recursive: true, force: true });
  }

  /** The fake's desktops live in memory: nothing to write. */
  async flush(): Promise<void> {}

  async started(desktopId: string): Promise<boolean> {
    const desktop = this.desktops.get(desktopId);
    if (desktop?.imported === undefined) return false;
    delete desktop.imported;
    return true;
  }

  async discard(desktopId: string): Promise<void> {
    const desktop = this.desktops.get(desktopId);
    if (desktop !== undefined) {
      if (desktop.running) throw new AgentFailure('conflict', `${desktopId} is running on this host`, false);
      if (desktop.imported === undefined) {
        throw new AgentFailure('conflict', `${desktopId} has run on this host since it was imported (or was never imported); it is kept`, false);
      }
      this.desktops.delete(desktopId);
    }
    // No staging root yet: nothing was ever staged (and none is made just to be emptied).
    if (this.root !== null) await rm(this.stagingDir(desktopId), { recursive: true, force: true });
  }

  async stagedDesktops(): Promise<string[]> {
    if (this.root === null) return [];
    return (await readdir(this.root).catch(() => [] as string[])).filter((name) => DESKTOP_ID.test(name)).sort();
  }

  async dropStaging(desktopId: string): Promise<void> {
    if (this.root !== null) await rm(this.stagingDir(desktopId), { recursive: true, force: true });
  }

  /** Removes the temporary staging root, if this object made one. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.ownRoot && this.root !== null) await rm(this.root, { recursive: true, force: true });
  }
}

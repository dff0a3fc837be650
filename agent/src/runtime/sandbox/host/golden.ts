/**
 * Golden templates: a new desktop's first wake restores a desktop session booted once per host,
 * instead of booting its own.
 *
 * For the boot it stands for (the guest init and its mounts, the screen sizes, the X server's and
 * window manager's binaries, the CRIU binary: the template's key), the agent boots one hidden
 * desktop, lets its session come up and hibernates it with memory. A new desktop is then made as a
 * fork of it (layers.ts): the template's disk frozen into a shared read-only layer under an empty writable
 * layer of the desktop's own, hard links to the memory images (CRIU only reads them), and its own
 * copy of the framebuffer file. Its first wake restores that snapshot, gives the guest its own
 * hostname (after every restore, sandbox-lifecycle.ts) and applies its first boot (env file,
 * setup script) through guest calls, as for a desktop already running when its first boot is
 * applied. Clones share nothing writable with the template or with each other.
 *
 * A template lives among the desktops, marked by `template.json`, which hides it from `list()`
 * (the scheduler never hears of it) and keeps its layer from being collected. It is built when the
 * driver starts and whenever a new desktop finds none; a creation that finds none ready gets an
 * empty disk and boots cold (it never waits for a build).
 * A template whose key is not the current one, or that never finished, is destroyed at start. A
 * clone whose first restore fails (a library under the template changed, say) boots cold, and the
 * template is dropped and built again for the next; when a clone of that new template fails too
 * (within the retry period), clones cannot be restored on this host for now, and creations boot
 * cold for the retry period, as after a failed build, instead of paying a build and a failed
 * restore each.
 */
import { createHash } from 'node:crypto';
import { mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { newId } from '../../../../../shared/src/ids.js';
import type { Tier } from '../../../../../shared/src/tiers.js';
import type { TemplateStats } from '../../driver.js';
import { bwrapArgs, DEFAULT_SCREEN, MAX_SCREEN } from '../guest/guest-init.js';
import { GUEST_FILTER } from '../guest/guest-filter.js';
import { guestFile } from '../guest/guest-programs.js';
import type { CriuInfo } from './criu.js';
import { renderEnvFile, writeEnvOnFreshDisk } from './first-boot.js';
import { desktopPaths, desktopsDir, exists, hasDisk, readJson, TEMPLATE_CLONE_FILE, TEMPLATE_FILE, type DesktopPaths } from './layout.js';
import type { RuntimeLog } from '../runtime-log.js';

/** What the templates need of the lifecycle (sandbox-lifecycle.ts). */
export interface TemplateLifecycle {
  prepare(desktopId: string, tier: Tier): Promise<void>;
  start(spec: { desktopId: string; tier: Tier; firstBoot: null }): Promise<{ restored: boolean }>;
  hibernate(desktopId: string): Promise<{ snapshot: boolean }>;
  fork(sourceId: string, forkIds: readonly string[]): Promise<{ snapshot: boolean }>;
  destroy(desktopId: string): Promise<void>;
}

interface TemplateRecord {
  readonly key: string;
  readonly state: 'building' | 'ready';
}

/** Binaries whose processes are in the template's memory: a change means another template. */
const SESSION_BINARIES = ['/bin/sh', '/usr/bin/Xvfb', '/usr/bin/openbox', '/usr/bin/sleep'];

/** After a build that failed, creations boot cold this long before another build is tried. */
const RETRY_BUILD_MS = 5 * 60_000;

export class GoldenTemplates {
  private current: string | null = null;
  private building: Promise<string | null> | null = null;
  private failedAt = -Infinity;
  /** When a clone's restore last failed. */
  private cloneFailedAt = -Infinity;
  private closed = false;
  private cloned = 0;
  private empty = 0;

  private constructor(
    private readonly stateDir: string,
    private readonly key: string,
    private readonly lifecycle: TemplateLifecycle,
    private readonly log: RuntimeLog,
  ) {}

  /** Finds the current template, destroys the others, and starts building one if there is none. */
  static async open(stateDir: string, criu: CriuInfo, lifecycle: TemplateLifecycle, log: RuntimeLog): Promise<GoldenTemplates> {
    const templates = new GoldenTemplates(stateDir, await templateKey(criu), lifecycle, log);
    for (const { id, record } of await templates.found()) {
      if (record?.state === 'ready' && record.key === templates.key && templates.current === null) templates.current = id;
      else await templates.drop(id, 'not the current template');
    }
    templates.buildIfMissing();
    return templates;
  }

  /**
   * Makes a new desktop's disk: a clone of the template when there is one, else an empty disk
   * (and the template is built meanwhile, for the next). A creation never waits for a build: it
   * boots cold as fast as it would without templates. A desktop that has a disk is left as it is.
   */
  async prepare(desktopId: string, tier: Tier): Promise<void> {
    if (!(await hasDisk(desktopPaths(this.stateDir, desktopId)))) {
      const template = this.current;
      this.buildIfMissing();
      if (template !== null) {
        try {
          await this.lifecycle.fork(template, [desktopId]);
          this.cloned++;
          return;
        } catch (err) {
          this.log('cloning the template failed; the desktop boots cold', { desktopId, template, error: String(err) }, 'warn');
        }
      }
      this.empty++;
    }
    await this.lifecycle.prepare(desktopId, tier);
  }

  /** What the metrics show (observability.ts). */
  stats(): TemplateStats {
    const state = this.current !== null ? 'ready' : this.building !== null ? 'building' : 'none';
    return { state, cloned: this.cloned, empty: this.empty };
  }

  /**
   * A clone's first restore failed: the template goes, and another is built for the next, unless
   * a clone failed shortly before too (then the next build waits out the retry period).
   */
  async cloneFailed(desktopId: string): Promise<void> {
    const template = await readFile(join(desktopPaths(this.stateDir, desktopId).dir, TEMPLATE_CLONE_FILE), 'utf8').catch(() => null);
    if (template === null || template !== this.current) return;
    this.current = null;
    await this.drop(template, `the restore of its clone ${desktopId} failed`);
    const now = performance.now();
    if (now - this.cloneFailedAt < RETRY_BUILD_MS) {
      this.failedAt = now;
      this.log('clones of a fresh desktop template fail to restore too: new desktops boot cold', { retryInMs: RETRY_BUILD_MS }, 'warn');
    }
    this.cloneFailedAt = now;
    this.buildIfMissing();
  }

  /** Waits for a template being built (none is left running). */
  async close(): Promise<void> {
    this.closed = true;
    await this.building;
  }

  /** The template being built, or one that is (or was just) ready; null when none is coming. */
  whenReady(): Promise<string | null> {
    return this.building ?? Promise.resolve(this.current);
  }

  /** Starts building a template in the background unless there is one, or one is being built. */
  private buildIfMissing(): void {
    if (this.current !== null || this.building !== null || this.closed) return;
    // A host where a template cannot be built does not pay for another try at every creation.
    if (performance.now() - this.failedAt < RETRY_BUILD_MS) return;
    this.building = this.build().finally(() => {
      this.building = null;
    });
  }

  private async build(): Promise<string | null> {
    const id = newId('desktop');
    const paths = desktopPaths(this.stateDir, id);
    const t0 = performance.now();
    try {
      // Marked first: whatever a crash leaves of it is a template, hidden, destroyed at start.
      await mkdir(paths.dir, { recursive: true });
      await this.mark(id, 'building');
      await this.lifecycle.prepare(id, 'small');
      await this.lifecycle.start({ desktopId: id, tier: 'small', firstBoot: null });
      const { snapshot } = await this.lifecycle.hibernate(id);
      if (!snapshot) throw new Error('its memory could not be snapshotted');
      // Clones carry the template's id (createFork copies the file), for `cloneFailed`.
      await writeFile(join(paths.dir, TEMPLATE_CLONE_FILE), id);
      await this.mark(id, 'ready');
      this.current = id;
      this.log('desktop template built', { template: id, ms: Math.round(performance.now() - t0) });
      return id;
    } catch (err) {
      this.failedAt = performance.now();
      this.log('no desktop template: new desktops boot cold', { error: String(err), retryInMs: RETRY_BUILD_MS }, 'warn');
      await this.drop(id, 'its build failed');
      return null;
    }
  }

  private mark(id: string, state: TemplateRecord['state']): Promise<void> {
    return writeFile(join(desktopPaths(this.stateDir, id).dir, TEMPLATE_FILE), JSON.stringify({ key: this.key, state } satisfies TemplateRecord));
  }

  private async found(): Promise<Array<{ id: string; record: TemplateRecord | null }>> {
    const out: Array<{ id: string; record: TemplateRecord | null }> = [];
    for (const id of await templateIds(this.stateDir)) {
      out.push({ id, record: await readJson<TemplateRecord>(join(desktopsDir(this.stateDir), id, TEMPLATE_FILE)) });
    }
    return out;
  }

  private async drop(id: string, why: string): Promise<void> {
    try {
      await this.lifecycle.destroy(id);
      this.log('desktop template removed', { template: id, why });
    } catch (err) {
      this.log('a desktop template could not be removed', { template: id, why, error: String(err) }, 'warn');
    }
  }
}

/**
 * Before a template clone's first wake (it has run nothing of its own yet), writes its env file
 * into its disk from the host, sparing the wake a cold guest process; false if not a clone.
 */
export async function writeCloneEnv(paths: DesktopPaths, env: Readonly<Record<string, string>>): Promise<boolean> {
  if (!(await exists(join(paths.dir, TEMPLATE_CLONE_FILE)))) return false;
  await writeEnvOnFreshDisk(paths.disk, renderEnvFile(env));
  return true;
}

/** The templates under a driver's state directory, whatever their state (for cleaning up). */
export async function templateIds(stateDir: string): Promise<string[]> {
  const out: string[] = [];
  for (const name of await readdir(desktopsDir(stateDir)).catch(() => [] as string[])) {
    if (await exists(join(desktopsDir(stateDir), name, TEMPLATE_FILE))) out.push(name);
  }
  return out;
}

/** What a template stands for: a change to any of it makes the current template another one. */
async function templateKey(criu: CriuInfo): Promise<string> {
  const hash = createHash('sha256');
  hash.update(guestFile('init.sh')).update(`\0${MAX_SCREEN}\0${DEFAULT_SCREEN}\0${criu.path}\0${criu.version}`);
  // The guest's mounts as bwrap makes them (for a stand-in desktop): a template keeps the layout
  // it was booted with, so a change to it means another template.
  const standIn = `dsk_${'0'.repeat(24)}`;
  hash.update(`\0${bwrapArgs(desktopPaths('/', standIn), standIn).join('\0')}`);
  // The seccomp filter the guest runs under: a restore refuses images made under another (criu.ts).
  hash.update(GUEST_FILTER);
  for (const binary of SESSION_BINARIES) {
    const st = await stat(binary).catch(() => null);
    hash.update(`\0${binary}\0${st?.size ?? -1}\0${st?.mtimeMs ?? -1}`);
  }
  return hash.digest('hex').slice(0, 32);
}

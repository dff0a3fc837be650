/**
 * The agent's half of the hello fence (scheduler/src/fleet/hello-fence.ts): a hello reply names
 * the desktops this host runs that their records say may not run. Each, queued behind earlier
 * commands for it, takes the named generation (so no older command acts on it again) and is
 * hibernated, keeping its memory; one a newer command has reached meanwhile is left alone. The
 * agent reports `host.ready` only after this.
 */
import type { Logger } from '../../shared/src/log.js';
import { AgentFailure, type FenceEntry } from '../../shared/src/protocol.js';
import type { DesktopQueue } from './desktop-queue.js';
import type { GenerationStore } from './generations.js';
import type { LifecycleSlots } from './lifecycle-slots.js';
import type { DesktopLifecycle } from './runtime/driver.js';

export interface FenceDeps {
  readonly queue: DesktopQueue;
  /** The host's bound on CPU-heavy lifecycle commands (lifecycle-slots.ts): a fence's dumps take their turns too. */
  readonly slots: Pick<LifecycleSlots, 'run'>;
  readonly generations: GenerationStore;
  readonly driver: Pick<DesktopLifecycle, 'status' | 'hibernate'>;
  /** Closes the desktop's streams, which cannot be snapshotted. */
  releaseStreams(desktopId: string): void;
  readonly log: Logger;
}

/** Stops what `entries` name; answers how many it stopped. */
export async function applyFence(deps: FenceDeps, entries: readonly FenceEntry[]): Promise<number> {
  let stopped = 0;
  await Promise.all(
    entries.map((entry) =>
      deps.queue
        .run(entry.desktop_id, async () => {
          try {
            await deps.generations.check(entry.desktop_id, entry.generation);
          } catch (err) {
            if (err instanceof AgentFailure && err.code === 'stale_generation') return;
            throw err;
          }
          const held = await deps.driver.status(entry.desktop_id);
          if (!held?.running) return;
          deps.releaseStreams(entry.desktop_id);
          const { snapshot } = await deps.slots.run(() => deps.driver.hibernate(entry.desktop_id));
          stopped++;
          deps.log.warn({ desktop_id: entry.desktop_id, generation: entry.generation, snapshot }, 'stopped a desktop this host may no longer run');
        })
        .catch((err: unknown) => deps.log.error({ desktop_id: entry.desktop_id, err }, 'could not stop a fenced desktop')),
    ),
  );
  return stopped;
}

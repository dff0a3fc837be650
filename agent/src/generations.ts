/**
 * Fencing. Every desktop command carries the desktop's `generation`, which the scheduler bumps on
 * every lifecycle transition. This store remembers the highest generation seen per desktop and
 * refuses an older one with `stale_generation`. The case it exists for: a host is declared failed,
 * its desktops are recovered with a higher generation, and then the old agent (or a leader that
 * lost its lease) comes back with commands from before the recovery. Those must not act.
 *
 * The store is a JSON file written atomically (temporary file, fsync, rename) before the command
 * runs, so fencing survives an agent restart: a restarted agent does not forget that it has
 * already seen generation 7 and accept a replayed 5. Mutations are applied in the order they came,
 * and memory changes only once the file has. They are committed in groups: those that arrive
 * while a write is under way go to disk together in the next one, so a burst of commands (ten
 * wakes at once, a class's desktops created together) costs two writes instead of one each, one
 * after another. A caller's promise settles only once a write holding its change is on disk.
 *
 * Destroy leaves a tombstone instead of deleting the entry. Without one, a start re-sent from
 * before the destroy (same or older generation) would find no entry, pass the check and bring a
 * destroyed desktop back. With a tombstone, only a repeated destroy (idempotent) is accepted at or
 * above the tombstone's generation; any other command must carry a strictly newer generation,
 * which only the scheduler can mint (a desktop legitimately placed on this host again). Tombstones
 * are dropped after `tombstoneTtlMs`: by then every operation that could replay has settled.
 */
import { mkdir, open, readFile, rename, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentFailure } from '../../shared/src/protocol.js';

export const GENERATIONS_FILE = 'generations.json';
const FILE_VERSION = 1;
const DEFAULT_TOMBSTONE_TTL_MS = 30 * 24 * 3600 * 1000;

interface Entry {
  readonly generation: number;
  /** Epoch ms when the desktop was destroyed; absent while it lives. */
  readonly destroyedAt?: number;
}

/** `destroy` may repeat on a tombstone; every other command is a `command`. */
export type FenceKind = 'command' | 'destroy';

export interface GenerationStoreOptions {
  /** How long a destroyed desktop's tombstone is kept, in ms. Default 30 days. */
  readonly tombstoneTtlMs?: number;
  readonly now?: () => number;
}

interface Mutation {
  readonly desktopId: string;
  readonly change: (entry: Entry | undefined) => Entry | undefined;
  readonly resolve: () => void;
  readonly reject: (err: unknown) => void;
}

export class GenerationStore {
  /** Mutations waiting for the next write. */
  private pending: Mutation[] = [];
  private writing = false;

  private constructor(
    private readonly file: string,
    private entries: ReadonlyMap<string, Entry>,
    private readonly now: () => number,
  ) {}

  static async open(stateDir: string, options: GenerationStoreOptions = {}): Promise<GenerationStore> {
    await mkdir(stateDir, { recursive: true, mode: 0o700 });
    const now = options.now ?? Date.now;
    const ttl = options.tombstoneTtlMs ?? DEFAULT_TOMBSTONE_TTL_MS;
    const file = join(stateDir, GENERATIONS_FILE);
    const entries = await readEntries(file);
    for (const [id, entry] of entries) {
      if (entry.destroyedAt !== undefined && now() - entry.destroyedAt > ttl) entries.delete(id);
    }
    return new GenerationStore(file, entries, now);
  }

  /** The generation held for a live desktop; undefined when unknown or destroyed. */
  get(desktopId: string): number | undefined {
    const entry = this.entries.get(desktopId);
    return entry && entry.destroyedAt === undefined ? entry.generation : undefined;
  }

  isDestroyed(desktopId: string): boolean {
    return this.entries.get(desktopId)?.destroyedAt !== undefined;
  }

  /**
   * Refuses a command older than what this host has seen, else records its generation (durably,
   * before returning) so nothing older is accepted afterwards.
   */
  check(desktopId: string, generation: number, kind: FenceKind = 'command'): Promise<void> {
    return this.mutate(desktopId, (entry) => {
      if (entry === undefined) return { generation };
      if (generation < entry.generation) {
        throw stale(`generation ${generation} of ${desktopId} is older than ${entry.generation} held here`);
      }
      if (entry.destroyedAt !== undefined) {
        if (kind === 'destroy') {
          return generation > entry.generation ? { generation, destroyedAt: entry.destroyedAt } : undefined;
        }
        if (generation === entry.generation) {
          throw stale(`${desktopId} was destroyed at generation ${generation}`);
        }
        return { generation }; // A strictly newer generation: the scheduler placed it here again.
      }
      return generation > entry.generation ? { generation } : undefined;
    });
  }

  /** Marks a desktop destroyed, keeping its generation as a tombstone (see the module comment). */
  forget(desktopId: string): Promise<void> {
    return this.mutate(desktopId, (entry) => {
      if (entry?.destroyedAt !== undefined) return undefined;
      return { generation: entry?.generation ?? 0, destroyedAt: this.now() };
    });
  }

  /**
   * Runs `change` after every earlier mutation; it returns the desktop's new entry or undefined
   * for no change, or throws to refuse. Resolves once the file holds the change (and every change
   * before it); a failed write rejects every mutation of its group and leaves memory as it was, so
   * the commands fail instead of running unfenced.
   */
  private mutate(desktopId: string, change: (entry: Entry | undefined) => Entry | undefined): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.pending.push({ desktopId, change, resolve, reject });
      if (!this.writing) void this.commitPending();
    });
  }

  private async commitPending(): Promise<void> {
    this.writing = true;
    try {
      while (this.pending.length > 0) {
        const group = this.pending.splice(0);
        // Copied at the group's first change only: most commands (every guest call) change nothing.
        let updated: Map<string, Entry> | null = null;
        const accepted: Mutation[] = [];
        for (const m of group) {
          let result: Entry | undefined;
          try {
            // Each sees the group's earlier changes, as if they had been written one by one.
            result = m.change((updated ?? this.entries).get(m.desktopId));
          } catch (err) {
            m.reject(err);
            continue;
          }
          accepted.push(m);
          if (result === undefined) continue;
          updated ??= new Map(this.entries);
          updated.set(m.desktopId, result);
        }
        if (updated !== null) {
          try {
            await writeEntries(this.file, updated);
          } catch (err) {
            for (const m of accepted) m.reject(err);
            continue;
          }
          this.entries = updated;
        }
        for (const m of accepted) m.resolve();
      }
    } finally {
      this.writing = false;
    }
  }
}

function stale(message: string): AgentFailure {
  return new AgentFailure('stale_generation', message, false);
}

async function readEntries(file: string): Promise<Map<string, Entry>> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return new Map();
    throw err;
  }
  // A damaged file is fatal rather than treated as empty: starting empty would silently switch
  // fencing off for every desktop on this host. Atomic writes make this an operator matter.
  const fail = (why: string): never => {
    throw new Error(`${file} is unreadable (${why}); restore it or remove it to reset fencing`);
  };
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    fail('not JSON');
  }
  const doc = parsed as { version?: unknown; desktops?: unknown };
  if (doc?.version !== FILE_VERSION || typeof doc.desktops !== 'object' || doc.desktops === null) {
    fail(`expected version ${FILE_VERSION}`);
  }
  const entries = new Map<string, Entry>();
  for (const [id, raw] of Object.entries(doc.desktops as Record<string, unknown>)) {
    const { generation, destroyedAt } = (raw ?? {}) as { generation?: unknown; destroyedAt?: unknown };
    if (!Number.isInteger(generation) || (destroyedAt !== undefined && typeof destroyedAt !== 'number')) {
      fail(`bad entry for ${id}`);
    }
    entries.set(id, destroyedAt === undefined
      ? { generation: generation as number }
      : { generation: generation as number, destroyedAt: destroyedAt as number });
  }
  return entries;
}

let tempCounter = 0;

async function writeEntries(file: string, entries: ReadonlyMap<string, Entry>): Promise<void> {
  const doc = { version: FILE_VERSION, desktops: Object.fromEntries(entries) };
  const temp = `${file}.tmp-${process.pid}-${++tempCounter}`;
  try {
    const handle = await open(temp, 'w', 0o600);
    try {
      await handle.writeFile(`${JSON.stringify(doc, null, 1)}\n`);
      // fsync before rename: otherwise a power loss can leave the new name pointing at empty data.
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(temp, file);
  } catch (err) {
    await unlink(temp).catch(() => {});
    throw err;
  }
}

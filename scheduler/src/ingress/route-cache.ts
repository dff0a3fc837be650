/**
 * A short-lived cache of exposure lookups, so a page that loads fifty assets does not cost fifty
 * database round trips. Only routes that could carry traffic (`bound`) are kept, for two seconds,
 * and an entry is dropped as soon as anything suggests it is stale: this replica deleted or
 * created the exposure, or a link opened with it failed (for example the desktop was hibernated
 * and woken since, so its generation moved). A delete made on another replica arrives as a
 * notification (services/ports.ts); one lost while the listen connection reconnects is seen here
 * within the two seconds.
 */
import { isBound, type PortRoute } from '../services/ports.js';

export const ROUTE_CACHE_TTL_MS = 2_000;
const MAX_ENTRIES = 10_000;

export class RouteCache {
  private readonly entries = new Map<string, { route: PortRoute; expiresAt: number }>();
  /** Bumped by every `forget`: a lookup that was in flight across one is not cached. */
  private epoch = 0;

  constructor(
    private readonly lookup: (desktopId: string, port: number) => Promise<PortRoute | null>,
    private readonly ttlMs = ROUTE_CACHE_TTL_MS,
    private readonly now: () => number = Date.now,
  ) {}

  async get(desktopId: string, port: number): Promise<PortRoute | null> {
    const key = keyOf(desktopId, port);
    const hit = this.entries.get(key);
    if (hit && hit.expiresAt > this.now()) return hit.route;
    this.entries.delete(key);
    const epoch = this.epoch;
    const route = await this.lookup(desktopId, port);
    if (route && isBound(route) && epoch === this.epoch) {
      // Map order is insertion order: when full, the oldest entry goes.
      if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value!);
      this.entries.set(key, { route, expiresAt: this.now() + this.ttlMs });
    }
    return route;
  }

  forget(desktopId: string, port: number): void {
    this.epoch++;
    this.entries.delete(keyOf(desktopId, port));
  }

  clear(): void {
    this.entries.clear();
  }
}

export function keyOf(desktopId: string, port: number): string {
  return `${desktopId}:${port}`;
}

/**
 * A short-lived cache of exposure lookups, so a page that loads fifty assets does not cost fifty
 * database round trips. Only routes that could carry traffic (`bound`) are kept, for two seconds,
 * and an entry is dropped as soon as anything suggests it is stale: this replica deleted or
 * created the exposure, a link opened with it failed (for example the desktop was hibernated
 * and woken since, so its generation moved), or its desktop's row changed. A delete or a desktop
 * change made on another replica arrives as a notification (services/ports.ts); one lost while the
 * listen connection reconnects is seen here within the two seconds.
 */
import { isBound, type PortRoute } from '../services/ports.js';

export const ROUTE_CACHE_TTL_MS = 2_000;
const MAX_ENTRIES = 10_000;

export class RouteCache {
  private readonly entries = new Map<string, { route: PortRoute; expiresAt: number }>();
  /** The ports of each desktop that have an entry, so a change of the desktop drops them all. */
  private readonly ports = new Map<string, Set<number>>();
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
    this.drop(desktopId, port);
    const epoch = this.epoch;
    const route = await this.lookup(desktopId, port);
    if (route && isBound(route) && epoch === this.epoch) {
      // Map order is insertion order: when full, the oldest entry goes.
      if (this.entries.size >= MAX_ENTRIES) {
        const oldest = this.entries.values().next().value!.route;
        this.drop(oldest.desktop_id, oldest.port);
      }
      this.entries.set(key, { route, expiresAt: this.now() + this.ttlMs });
      let ports = this.ports.get(desktopId);
      if (!ports) this.ports.set(desktopId, (ports = new Set()));
      ports.add(port);
    }
    return route;
  }

  forget(desktopId: string, port: number): void {
    this.epoch++;
    this.drop(desktopId, port);
  }

  /** Forgets every port of the desktop. */
  forgetDesktop(desktopId: string): void {
    this.epoch++;
    for (const port of this.ports.get(desktopId) ?? []) this.entries.delete(keyOf(desktopId, port));
    this.ports.delete(desktopId);
  }

  clear(): void {
    this.epoch++;
    this.entries.clear();
    this.ports.clear();
  }

  private drop(desktopId: string, port: number): void {
    if (!this.entries.delete(keyOf(desktopId, port))) return;
    const ports = this.ports.get(desktopId);
    ports?.delete(port);
    if (ports?.size === 0) this.ports.delete(desktopId);
  }
}

export function keyOf(desktopId: string, port: number): string {
  return `${desktopId}:${port}`;
}

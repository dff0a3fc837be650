/** Usage reports: meter intervals and desktop lifetimes from the store, arithmetic in compute-usage. */
import type { Sql } from '../store/db.js';
import { usageRows } from '../store/events.js';
import { computeUsage, parseUsageRange, type UsageReport } from '../usage/compute-usage.js';
import { errors } from '../errors.js';
import type { Tier } from '../../../shared/src/tiers.js';

export class UsageService {
  constructor(private readonly sql: Sql) {}

  async report(orgId: string, query: { start?: string; end?: string }): Promise<UsageReport> {
    // The database's clock: every time the meter records is its `now()`, and an interval still
    // open ends at the same clock's now (a replica's own clock may be off by its skew).
    const [clock] = await this.sql<Array<{ now: Date }>>`SELECT now() AS now`;
    const now = clock!.now;
    const range = parseUsageRange(query, now);
    if ('error' in range) throw errors.badRequest(range.error);
    const rows = await usageRows(this.sql, orgId, range.start, range.end);
    return computeUsage(
      rows.desktops.map((d) => ({
        id: d.id,
        tier: d.tier as Tier,
        billingMode: d.billing_mode as 'monthly' | 'hourly',
        createdAt: d.created_at,
        destroyedAt: d.destroyed_at,
      })),
      rows.intervals.map((i) => ({ desktopId: i.desktop_id, startedAt: i.started_at, endedAt: i.ended_at })),
      { start: range.start, end: range.end, now },
    );
  }
}

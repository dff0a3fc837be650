/**
 * The fence a returning host applies before it takes work. Its hello lists the desktops it still
 * runs; any of them whose record says it may not run there (hibernated, force-hibernated while
 * the host was silent, destroyed, placed elsewhere, or unknown to this deployment) is named in
 * the hello reply with the generation the record holds. The agent stops each one (a hibernate
 * that keeps its memory, so nothing is lost), records that generation so no older command acts on
 * it again, and only then reports ready: nothing runs unbilled once a host is back.
 *
 * Any replica answers a hello, so any replica computes the fence. A lifecycle command racing it
 * is safe: a wake bumps the generation first, and the agent refuses the fence's older one.
 */
import type { FenceEntry, HelloPayload } from '../../../shared/src/protocol.js';
import type { Sql } from '../store/db.js';

/** Record states in which a desktop placed on this host may be running there. */
const MAY_RUN = new Set(['waking', 'awake', 'hibernating']);

export async function helloFence(sql: Sql, hostId: string, reported: HelloPayload['desktops']): Promise<FenceEntry[]> {
  const running = reported.filter((d) => d.running);
  if (running.length === 0) return [];
  const rows = await sql<Array<{ id: string; state: string; host_id: string | null; generation: number }>>`
    SELECT id, state, host_id, generation FROM desktops WHERE id = ANY(${running.map((d) => d.desktop_id)}::text[])`;
  const records = new Map(rows.map((r) => [r.id, r]));
  const fence: FenceEntry[] = [];
  for (const d of running) {
    const record = records.get(d.desktop_id);
    if (record && record.host_id === hostId && MAY_RUN.has(record.state)) continue;
    fence.push({ desktop_id: d.desktop_id, generation: Math.max(record?.generation ?? 0, d.generation) });
  }
  return fence;
}

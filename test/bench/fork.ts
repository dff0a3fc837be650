/**
 * Fork benchmarks: time to a settled fork operation for 1, 5 and 20 forks, and the wake of a fork,
 * from a source with a 1 GiB file on its disk against a source with an empty disk. The empty
 * source is the baseline: a ratio near 1 says the cost does not grow with the disk.
 */
import { median, table, timed, type Row } from './stats.js';

export interface ForkBenchContext {
  readonly schedulerUrl: string;
  readonly apiKey: string;
  readonly runs: number;
}

const COUNTS = [1, 5, 20] as const;

export async function benchFork(ctx: ForkBenchContext): Promise<void> {
  const headers = { authorization: `Bearer ${ctx.apiKey}`, 'content-type': 'application/json' };
  const post = async (path: string, body: unknown = {}) => {
    const res = await fetch(ctx.schedulerUrl + path, { method: 'POST', headers, body: JSON.stringify(body) });
    const json = (await res.json()) as Record<string, any>;
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  const prepared = async (bigFile: boolean) => {
    const id = (await post('/v1/desktops', { tier: 'small' })).id as string;
    await post(`/v1/desktops/${id}/wake?wait=true`);
    if (bigFile) {
      const out = await post(`/v1/desktops/${id}/exec`, { command: 'head -c 1073741824 /dev/urandom > /root/big.bin && sync', timeout_secs: 300 });
      if (out.exit_code !== 0) throw new Error(`writing 1 GiB failed: ${JSON.stringify(out)}`);
    }
    await post(`/v1/desktops/${id}/hibernate?wait=true`);
    return id;
  };

  const sources = { empty: await prepared(false), big: await prepared(true) };
  const results: Record<string, Record<'empty' | 'big', number[]>> = {};
  const record = (name: string, which: 'empty' | 'big', ms: number) => {
    ((results[name] ??= { empty: [], big: [] })[which]).push(ms);
  };
  const runs = Math.max(3, Math.min(ctx.runs, 5));
  try {
    for (let run = 0; run < runs; run++) {
      for (const which of ['empty', 'big'] as const) {
        for (const count of COUNTS) {
          let ids: string[] = [];
          record(`fork ×${count} (settled)`, which, await timed(async () => {
            const op = await post(`/v1/desktops/${sources[which]}/fork?wait=true`, { count, acknowledge_shared_state: true });
            ids = op.result.desktop_ids as string[];
          }));
          record('wake of a fork', which, await timed(() => post(`/v1/desktops/${ids[0]}/wake?wait=true`)));
          for (const id of ids) await post(`/v1/desktops/${id}/destroy?wait=true`);
        }
      }
      process.stderr.write(`fork run ${run + 1}/${runs}\r`);
    }
    const rows: Row[] = COUNTS.map((count) => {
      const r = results[`fork ×${count} (settled)`]!;
      return [`fork ×${count}, 1 GiB source`, median(r.big), median(r.empty), 'ms', count === 20 ? '< 2000 ms, ratio < 1.2' : 'ratio < 1.2'];
    });
    const wakes = results['wake of a fork']!;
    rows.push(['wake of a fork, 1 GiB source', median(wakes.big), median(wakes.empty), 'ms', 'ratio < 1.2']);
    table(`Fork (ms, ${runs} runs each; wake of a fork over all counts); baseline = the same from a source with an empty disk`, rows);
  } finally {
    for (const id of Object.values(sources)) await post(`/v1/desktops/${id}/destroy?wait=true`).catch(() => undefined);
  }
}

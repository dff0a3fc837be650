/**
 * Moving a hibernated desktop with 100 MiB written on its disk between two agents on this machine,
 * straight on the agents' command handlers (no scheduler: what is measured is the bytes' path).
 * The source is a process of its own (move-source.ts), as agents are; this process is the target.
 *
 * - export: the listing (sized: each unit's size counted without reading it, as moves between
 *   agents of 1.10 do; hashed: each unit's tar stream produced once and hashed) and the ticket;
 * - import: fetch over loopback HTTP, hash, spool, unpack, verify, install;
 * - move: both, the rate a drain of stopped desktops could reach.
 * Baseline: `cp -a` of the same desktop directory on the same disk, the cheapest local copy.
 * Each run imports into a clean target (the copy is aborted after it) and exports at a new
 * generation, so no kept digest helps.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ExportResult, ImportResult } from '../../shared/src/transfer.js';
import { startMoveHost } from '../helpers/move-hosts.js';
import { median, table, timed } from './stats.js';

const MIB = 1 << 20;
const DATA_MIB = 100;

/** One request to the source process, answered in order. */
function ask<T>(child: ChildProcess, message: object): Promise<T> {
  return new Promise((resolve, reject) => {
    child.once('message', (m: { ok: boolean; value?: T; error?: string }) => (m.ok ? resolve(m.value as T) : reject(new Error(m.error))));
    child.send(message);
  });
}

export async function benchMove(options: { runs: number }): Promise<void> {
  const runs = Math.max(3, Math.min(options.runs, 7));
  const base = mkdtempSync(join(tmpdir(), 'canto-bench-move-'));
  const source = fork(fileURLToPath(new URL('./move-source.ts', import.meta.url)), [join(base, 'a')], {
    execArgv: ['--import', 'tsx'],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  const target = await startMoveHost(join(base, 'b'));
  try {
    await new Promise<void>((resolve, reject) => {
      source.once('message', () => resolve());
      source.once('exit', (code) => reject(new Error(`the source process exited (${code})`)));
    });
    const { id } = await ask<{ id: string }>(source, { type: 'setup', mib: DATA_MIB });
    const exportMs: number[] = [];
    const hashedMs: number[] = [];
    const importMs: number[] = [];
    const copyMs: number[] = [];
    let total = 0;
    for (let i = 0; i < runs; i++) {
      // Each export is at a new generation, so no kept digest or size helps the next.
      hashedMs.push((await ask<{ ms: number }>(source, { type: 'export', listing: 'hashed' })).ms);
      const exp = await ask<{ result: ExportResult; generation: number; ms: number }>(source, { type: 'export', listing: 'sized' });
      exportMs.push(exp.ms);
      total = exp.result.total_bytes;
      const payload = { desktop_id: id, generation: exp.generation, tier: 'small', source: { url: exp.result.url, ticket: exp.result.ticket } };
      let got!: ImportResult;
      importMs.push(await timed(async () => {
        got = (await target.handlers.handle('desktop.import', payload)) as ImportResult;
      }));
      if (got.fetched_bytes !== total) throw new Error(`fetched ${got.fetched_bytes} of ${total} bytes`);
      await target.handlers.handle('desktop.import.abort', { desktop_id: id, generation: exp.generation });
      copyMs.push((await ask<{ ms: number }>(source, { type: 'copy', to: join(base, `copy-${i}`) })).ms);
      process.stderr.write(`move run ${i + 1}/${runs}\r`);
    }
    const rate = (ms: number) => total / MIB / (ms / 1000);
    const cp = rate(median(copyMs));
    const movedMs = exportMs.map((e, i) => e + importMs[i]!);
    table(`Move of a stopped desktop with ${DATA_MIB} MiB written (${(total / MIB).toFixed(1)} MiB in units; MiB/s, median of ${runs}); baseline = cp -a of its directory`, [
      ['export, sized listing (what moves use)', rate(median(exportMs)), cp, 'MiB/s', '', exportMs.map(rate)],
      ['export, hashed listing (tar + sha256 pass; agents before 1.10)', rate(median(hashedMs)), cp, 'MiB/s', '', hashedMs.map(rate)],
      ['import (fetch, verify, unpack, install)', rate(median(importMs)), cp, 'MiB/s', '≥ 500 MB/s', importMs.map(rate)],
      ['move (export + import)', rate(median(movedMs)), cp, 'MiB/s', '≥ 500 MB/s', movedMs.map(rate)],
    ]);
    console.log(`move: export ${median(exportMs).toFixed(0)} ms (hashed ${median(hashedMs).toFixed(0)} ms), import ${median(importMs).toFixed(0)} ms, cp -a ${median(copyMs).toFixed(0)} ms`);
  } finally {
    if (source.exitCode === null) {
      await ask(source, { type: 'close' }).catch(() => undefined);
      await new Promise((resolve) => (source.exitCode === null ? source.once('exit', resolve) : resolve(null)));
    }
    for (const d of await target.driver.list()) await target.driver.destroy(d.desktopId);
    await target.close();
    rmSync(base, { recursive: true, force: true });
  }
}

/**
 * Schema migrations, applied in order at scheduler start. Each entry runs once, inside a
 * transaction holding an advisory lock, so several schedulers starting together on one database
 * do not race. Migrations are append-only: never edit one that has shipped.
 *
 * Each migration is a file of plain SQL, `migrations/NNNN_name.sql`: NNNN is its id, and the name
 * recorded in `schema_migrations` is the rest with `_` read as a space. They are read from disk
 * at first use, from the `migrations/` folder beside this module: scheduler/src/store/migrations/
 * from source (vitest, tsx), dist/migrations/ when built (tsup copies the folder there, beside the
 * bundle; tsup.config.ts), as the agent reads its guest programs.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { inTransaction, type Sql } from './db.js';

interface Migration {
  readonly id: number;
  readonly name: string;
  readonly sql: string;
}

const FILE_NAME = /^(\d{4})_([a-z0-9_]+)\.sql$/;

let loaded: readonly Migration[] | undefined;

/** Every migration this build knows, by increasing id. */
function migrations(): readonly Migration[] {
  if (loaded !== undefined) return loaded;
  const folder = join(dirname(fileURLToPath(import.meta.url)), 'migrations');
  const found: Migration[] = [];
  for (const file of readdirSync(folder).sort()) {
    const match = FILE_NAME.exec(file);
    if (match === null) throw new Error(`unexpected file among the migrations: ${join(folder, file)}`);
    found.push({ id: Number(match[1]), name: match[2]!.replaceAll('_', ' '), sql: readFileSync(join(folder, file), 'utf8') });
  }
  if (found.length === 0) throw new Error(`no migrations in ${folder}`);
  // Ids are applied once each, in order: two files with one id would skip the second for ever.
  for (let i = 1; i < found.length; i++) {
    if (found[i]!.id <= found[i - 1]!.id) throw new Error(`migration ids must increase: ${found[i]!.id} after ${found[i - 1]!.id}`);
  }
  return (loaded = found);
}

const LOCK_KEY = 0x63616e74; // "cant"

export async function migrate(sql: Sql): Promise<number> {
  let applied = 0;
  // Read first: a transaction waits on nothing but its own queries (store/db.ts).
  const all = migrations();
  await inTransaction(sql, async (tx) => {
    await tx`SELECT pg_advisory_xact_lock(${LOCK_KEY})`;
    await tx`CREATE TABLE IF NOT EXISTS schema_migrations (id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`;
    const done = new Set((await tx<{ id: number }[]>`SELECT id FROM schema_migrations`).map((r) => r.id));
    for (const m of all) {
      if (done.has(m.id)) continue;
      await tx.unsafe(m.sql);
      await tx`INSERT INTO schema_migrations (id, name) VALUES (${m.id}, ${m.name})`;
      applied++;
    }
  });
  return applied;
}

/** Null when the database carries every migration this build knows; else what is missing. */
export async function schemaProblem(sql: Sql): Promise<string | null> {
  const all = migrations();
  const latest = all[all.length - 1]!.id;
  const [row] = await sql<{ id: number | null }[]>`SELECT max(id) AS id FROM schema_migrations`;
  const applied = row?.id ?? 0;
  return applied >= latest ? null : `database schema is at migration ${applied}, this build needs ${latest}`;
}

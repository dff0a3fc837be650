/**
 * Test-run setup: one real PostgreSQL cluster for the whole run (the embedded one `canto up`
 * uses), with a migrated `canto_template` database. Each test file clones the template into a
 * fresh database of its own (see db.ts), which takes milliseconds.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TestProject } from 'vitest/node';
import { startEmbeddedPostgres } from '../../scheduler/src/pg/embedded.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { migrate } from '../../scheduler/src/store/migrations.js';

declare module 'vitest' {
  export interface ProvidedContext {
    pgUrl: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dir = mkdtempSync(join(tmpdir(), 'canto-pg-'));
  const pg = await startEmbeddedPostgres({ dir, database: 'canto_template', fast: true });
  const sql = connectDatabase(pg.url, { max: 1 });
  await migrate(sql);
  await sql.end();
  project.provide('pgUrl', pg.url);
  return async () => {
    await pg.stop();
    rmSync(dir, { recursive: true, force: true });
  };
}

/**
 * Schema migrations read from their SQL files (scheduler/src/store/migrations/): on an empty
 * database they apply in order under the ids and names databases already record (so a database
 * migrated before the files existed upgrades with nothing to do), a second run applies nothing,
 * and the built CLI finds the files it was shipped with (dist/migrations/), which its `status` names
 * rather than migrates.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, inject, it } from 'vitest';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { migrate, schemaProblem } from '../../scheduler/src/store/migrations.js';
import { freshDatabaseUrl } from '../helpers/db.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');

/** What every database records: ids and names must never change once shipped. */
const SHIPPED = [
  { id: 1, name: 'foundation' },
  { id: 2, name: 'forks' },
  { id: 3, name: 'webhooks' },
  { id: 4, name: 'ports' },
  { id: 5, name: 'change notifications' },
  { id: 6, name: 'fleet' },
  { id: 7, name: 'api key management' },
  { id: 8, name: 'moves and drains' },
  { id: 9, name: 'measured use' },
  { id: 10, name: 'desktop route notifications' },
  { id: 11, name: 'drain resume' },
  { id: 12, name: 'host keys' },
  { id: 13, name: 'lost hosts' },
  { id: 14, name: 'provisioning queue' },
  { id: 15, name: 'agent instance since' },
  { id: 16, name: 'failed forks' },
  { id: 17, name: 'lease instance' },
  { id: 18, name: 'replica links' },
  { id: 19, name: 'bound desktop secrets' },
  { id: 20, name: 'unrecorded desktops' },
];

const made: string[] = [];
const adminUrl = () => inject('pgUrl').replace('/canto_template?', '/postgres?');

/** An empty database, dropped after the file. */
async function emptyDatabaseUrl(): Promise<string> {
  const name = `m_${randomBytes(6).toString('hex')}`;
  const admin = connectDatabase(adminUrl(), { max: 1 });
  try {
    await admin.unsafe(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  made.push(name);
  return inject('pgUrl').replace('/canto_template?', `/${name}?`);
}

async function recorded(url: string): Promise<Array<{ id: number; name: string }>> {
  const sql = connectDatabase(url, { max: 1 });
  try {
    return [...(await sql<Array<{ id: number; name: string }>>`SELECT id, name FROM schema_migrations ORDER BY id`)];
  } finally {
    await sql.end();
  }
}

afterAll(async () => {
  const admin = connectDatabase(adminUrl(), { max: 1 });
  try {
    for (const name of made) await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
  } finally {
    await admin.end();
  }
});

describe('migrations', () => {
  it('apply in order on an empty database, under the ids and names already shipped, and only once', async () => {
    const url = await emptyDatabaseUrl();
    const sql = connectDatabase(url, { max: 1 });
    try {
      expect(await migrate(sql)).toBe(SHIPPED.length);
      expect(await schemaProblem(sql)).toBeNull();
      expect(await migrate(sql)).toBe(0);
      // The schema is really there: a table of the first migration, a column of the last.
      const [column] = await sql<Array<{ n: number }>>`
        SELECT count(*)::int AS n FROM information_schema.columns WHERE table_name = 'hosts' AND column_name = 'transfer_address'`;
      expect(column!.n).toBe(1);
    } finally {
      await sql.end();
    }
    expect(await recorded(url)).toEqual(SHIPPED);
  });

  it('find nothing to do on a database of the template every test clones', async () => {
    const url = await freshDatabaseUrl();
    made.push(new URL(url).pathname.slice(1));
    const sql = connectDatabase(url, { max: 1 });
    try {
      expect(await migrate(sql)).toBe(0);
    } finally {
      await sql.end();
    }
    expect(await recorded(url)).toEqual(SHIPPED);
  });

  it('are found by the built CLI, whose status refuses a schema behind its build instead of migrating it', async () => {
    expect(existsSync(CLI), 'dist/cli.js is missing: run `npx tsup` (npm test does)').toBe(true);
    const status = (url: string) =>
      promisify(execFile)(process.execPath, [CLI, 'status', '--json', '--database-url', url], { timeout: 60_000 }).catch((err: { code: number; stderr: string }) => err);
    const empty = await emptyDatabaseUrl();
    expect(await status(empty)).toMatchObject({ code: 1, stderr: expect.stringContaining('the database holds no Canto schema') });
    const latest = SHIPPED[SHIPPED.length - 1]!;
    const url = await freshDatabaseUrl();
    const sql = connectDatabase(url, { max: 1 });
    try {
      await sql`DELETE FROM schema_migrations WHERE id = ${latest.id}`;
    } finally {
      await sql.end();
    }
    // The number it names comes from the migration files it was shipped with.
    expect(await status(url)).toMatchObject({
      code: 1,
      stderr: expect.stringContaining(`database schema is at migration ${latest.id - 1}, this build needs ${latest.id}: canto status reads and does not migrate`),
    });
    expect(await recorded(url)).toEqual(SHIPPED.slice(0, -1));
  }, 90_000);
});

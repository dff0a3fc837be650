/**
 * One database fault, injected once: the next row change of `desktops` that matches `when` (a
 * trigger condition on OLD and NEW) fails with `sqlstate`. A sequence counts the firings, and is
 * not rolled back with the failed transaction, so the fault happens exactly once.
 */
import type { Sql } from '../../scheduler/src/store/db.js';

export async function failDesktopsOnce(sql: Sql, sqlstate: string, on: 'INSERT' | 'UPDATE', when = 'true'): Promise<void> {
  await sql.unsafe(`
    DROP TRIGGER IF EXISTS fault_once ON desktops;
    DROP SEQUENCE IF EXISTS fault_seq;
    CREATE SEQUENCE fault_seq;
    CREATE OR REPLACE FUNCTION fault_once() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF nextval('fault_seq') = 1 THEN RAISE EXCEPTION 'injected fault' USING ERRCODE = '${sqlstate}'; END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER fault_once BEFORE ${on} ON desktops FOR EACH ROW WHEN (${when}) EXECUTE FUNCTION fault_once();`);
}

/** Removes the fault, fired or not. */
export async function clearDesktopsFault(sql: Sql): Promise<void> {
  await sql`DROP TRIGGER IF EXISTS fault_once ON desktops`;
}

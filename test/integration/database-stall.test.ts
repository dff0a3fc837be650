/**
 * A replica that stalls inside a transaction (store/db.ts), on a real database: the server ends
 * the idle transaction after `idleTransactionMs`, so another replica waiting on its row locks goes
 * on; the stalled caller gets an error; whatever its transaction's callback sends when it
 * resumes reaches no session (not even the pool's reconnected one, outside any transaction);
 * and the pool keeps answering.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { connectDatabase, inTransaction, TransactionGone, type Sql } from '../../scheduler/src/store/db.js';
import { freshDatabaseUrl } from '../helpers/db.js';

let url: string;
/** The other replica's pool. */
let other: Sql;

beforeAll(async () => {
  url = await freshDatabaseUrl();
  other = connectDatabase(url, { max: 2 });
  await other`CREATE TABLE stall_probe (id int PRIMARY KEY, v int NOT NULL)`;
});

afterAll(async () => {
  await other?.end();
});

/** A gate the test opens: the stalled callback waits on it, as a paused process would. */
function gate(): { wait: Promise<void>; open(): void } {
  let open = () => {};
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

it.each([
  ['writes when it resumes', true],
  ['only returns when it resumes', false],
])('ends a stalled transaction that %s, and nothing of it lands', async (_, writes) => {
  const id = writes ? 1 : 2;
  await other`INSERT INTO stall_probe (id, v) VALUES (${id}, 0)`;
  // One connection: the pool must reconnect the very one the transaction had.
  const stalledPool = connectDatabase(url, { max: 1, idleTransactionMs: 300 });
  try {
    const resume = gate();
    let locked = () => {};
    const holding = new Promise<void>((resolve) => (locked = resolve));
    let callbackEnded: (outcome: string) => void = () => {};
    const callbackOutcome = new Promise<string>((resolve) => (callbackEnded = resolve));
    const stalled = inTransaction(stalledPool, async (tx) => {
      try {
        await tx`SELECT v FROM stall_probe WHERE id = ${id} FOR UPDATE`;
        locked();
        await resume.wait;
        if (writes) await tx`UPDATE stall_probe SET v = 99 WHERE id = ${id}`;
        callbackEnded('returned');
        return 'committed';
      } catch (err) {
        callbackEnded(err instanceof TransactionGone ? 'refused' : `failed: ${String(err)}`);
        throw err;
      }
    });
    const settled = stalled.then(() => 'committed', (err: { code?: string }) => `rejected ${err.code ?? ''}`);
    await holding;

    // The other replica's write waits on the lock only until the server ends the idle transaction.
    await other`UPDATE stall_probe SET v = 1 WHERE id = ${id}`;
    expect(await settled).toBe('rejected CONNECTION_CLOSED');
    // The pool's one connection, reconnected for someone else, before the stalled callback resumes.
    expect(await stalledPool`SELECT 1 AS one`).toEqual([{ one: 1 }]);

    resume.open();
    expect(await callbackOutcome).toBe(writes ? 'refused' : 'returned');
    // Give a write that got out (or a COMMIT) time to land before looking.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await other`SELECT v FROM stall_probe WHERE id = ${id}`).toEqual([{ v: 1 }]);
    expect(await stalledPool`SELECT 2 AS two`).toEqual([{ two: 2 }]);
  } finally {
    await stalledPool.end({ timeout: 1 });
  }
});

it('ends a transaction whose query the server cut off without sending it anything more, and the pool answers', async () => {
  const pool = connectDatabase(url, { max: 1 });
  try {
    let pid = 0;
    const cut = inTransaction(pool, async (tx) => {
      pid = (await tx<Array<{ pid: number }>>`SELECT pg_backend_pid() AS pid`)[0]!.pid;
      await tx`SELECT pg_sleep(5)`;
      return 'committed';
    }).then(() => 'committed', (err: { code?: string }) => `rejected ${err.code ?? ''}`);
    while (pid === 0) await new Promise((resolve) => setTimeout(resolve, 10));
    await new Promise((resolve) => setTimeout(resolve, 100));
    // A database failover or an operator's pg_terminate_backend, while the query runs.
    await other`SELECT pg_terminate_backend(${pid})`;
    expect(await cut).toMatch(/^rejected (CONNECTION_CLOSED|57P01)$/);
    expect(await pool`SELECT 1 AS one`).toEqual([{ one: 1 }]);
    expect(await pool`SELECT 2 AS two`).toEqual([{ two: 2 }]);
  } finally {
    await pool.end({ timeout: 1 });
  }
});

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
import { until } from '../helpers/wait.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';

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

/** `fn` with a pool of one connection, ended after it: a reconnect must be of that very one. */
async function withPoolOfOne<T>(fn: (pool: Sql) => Promise<T>): Promise<T> {
  const pool = connectDatabase(url, { max: 1 });
  try {
    return await fn(pool);
  } finally {
    await pool.end({ timeout: 1 });
  }
}

/**
 * A transaction on `pool` whose long query the server cuts off (a failover, or an operator's
 * pg_terminate_backend) while it runs; its callback then `throws` (the query's error goes on),
 * swallows the error and `returns`, or `queries` again. Answers how the caller saw it end.
 */
async function cutOffTransaction(pool: Sql, after: 'throws' | 'returns' | 'queries'): Promise<string> {
  let pid = 0;
  const cut = inTransaction(pool, async (tx) => {
    pid = (await tx<Array<{ pid: number }>>`SELECT pg_backend_pid() AS pid`)[0]!.pid;
    const sleeping = tx`SELECT pg_sleep(5)`;
    await (after === 'throws' ? sleeping : sleeping.catch(() => undefined));
    if (after === 'queries') await tx`SELECT 1`;
    return 'committed';
  }).then(() => 'committed', (err: { code?: string }) => `rejected ${err.code ?? ''}`);
  await until(() => pid !== 0, 5_000, 'the transaction to start');
  await new Promise((resolve) => setTimeout(resolve, 100));
  await other`SELECT pg_terminate_backend(${pid})`;
  return cut;
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
  await withPoolOfOne(async (pool) => {
    expect(await cutOffTransaction(pool, 'throws')).toBe('rejected CONNECTION_CLOSED');
    // Not the dead session's last error, handed to the first query of the new one.
    expect(await pool`SELECT 1 AS one`).toEqual([{ one: 1 }]);
    expect(await pool`SELECT 2 AS two`).toEqual([{ two: 2 }]);
  });
});

it('rolls back at once a transaction that fails for a reason of its own, whatever code its error has', async () => {
  await other`INSERT INTO stall_probe (id, v) VALUES (3, 0)`;
  await withPoolOfOne(async (pool) => {
    const failed = await inTransaction(pool, async (tx) => {
      await tx`UPDATE stall_probe SET v = 5 WHERE id = 3`;
      // What reading a file inside a transaction may throw (migrations do): not the connection's end.
      throw Object.assign(new Error('no such file'), { code: 'ENOENT' });
    }).then(() => 'committed', (err: { code?: string }) => err.code);
    expect(failed).toBe('ENOENT');
    expect(await other`SELECT v FROM stall_probe WHERE id = 3`).toEqual([{ v: 0 }]);
    expect(await pool`SELECT 1 AS one`).toEqual([{ one: 1 }]);
  });
});

it('keeps its connection in the pool when a callback carries on after its query was cut off', async () => {
  await withPoolOfOne(async (pool) => {
    for (const after of ['returns', 'queries'] as const) {
      expect(await cutOffTransaction(pool, after)).toBe('rejected CONNECTION_CLOSED');
      expect(await pool`SELECT ${after} AS after`).toEqual([{ after }]);
    }
  });
});

it('fails a query whose connection the database refuses to start again, rather than waiting for good', async () => {
  const name = new URL(url).pathname.slice(1);
  // A database cannot refuse connections while the session asking is one of them.
  const admin = connectDatabase(url.replace(`/${name}?`, '/postgres?'), { max: 1 });
  const pool = connectDatabase(url, { max: 1 });
  try {
    let pid = 0;
    const cut = pool`SELECT pg_backend_pid() AS pid, pg_sleep(5)`.then(() => 'answered', () => 'cut');
    await until(async () => {
      const rows = await other<Array<{ pid: number }>>`SELECT pid FROM pg_stat_activity WHERE query LIKE '%pg_sleep(5)%' AND pid <> pg_backend_pid()`;
      pid = rows[0]?.pid ?? 0;
      return pid !== 0;
    }, 5_000, 'the query to run');
    await admin`ALTER DATABASE ${admin(name)} ALLOW_CONNECTIONS false`;
    try {
      await other`SELECT pg_terminate_backend(${pid})`;
      expect(await cut).toBe('cut');
      // The server's refusal of the new session, not silence and a reconnect without pause.
      const refused = await pool`SELECT 1 AS one`.then(() => 'answered', (err: { code?: string }) => err.code);
      expect(refused).toBe('55000');
    } finally {
      await admin`ALTER DATABASE ${admin(name)} ALLOW_CONNECTIONS true`;
    }
    expect(await pool`SELECT 2 AS two`).toEqual([{ two: 2 }]);
  } finally {
    await pool.end({ timeout: 1 });
    await admin.end({ timeout: 1 });
  }
});

it("refuses a query a transaction's callback sends after it ended, which would run outside the transaction", async () => {
  await withPoolOfOne(async (pool) => {
    let late = 'not sent';
    const failed = await inTransaction(pool, async (tx) => {
      const first = tx`SELECT 1 / 0`;
      await Promise.all([
        first,
        (async () => {
          // Right after its sibling failed: while the ROLLBACK is on its way.
          await first.catch(() => undefined);
          await new Promise((resolve) => setImmediate(resolve));
          try {
            await tx`INSERT INTO stall_probe (id, v) VALUES (4, 4)`;
            late = 'sent';
          } catch (err) {
            late = (err as Error).constructor.name;
          }
        })(),
      ]);
    }).then(() => 'committed', (err: { code?: string }) => err.code);
    expect(failed).toBe('22012');
    await until(() => late !== 'not sent', 5_000, 'the late branch');
    expect(late).toBe('TransactionGone');
    expect(await other`SELECT v FROM stall_probe WHERE id = 4`).toEqual([]);
  });
});

it('asks each connection for the idle transaction timeout, or for none with 0 (CANTO_DB_IDLE_TRANSACTION_MS)', async () => {
  const setting = async (idleTransactionMs?: number) => {
    const pool = connectDatabase(url, { max: 1, ...(idleTransactionMs === undefined ? {} : { idleTransactionMs }) });
    try {
      return (await pool<Array<{ v: string }>>`SELECT current_setting('idle_in_transaction_session_timeout') AS v`)[0]!.v;
    } finally {
      await pool.end({ timeout: 1 });
    }
  };
  expect(await setting()).toBe('5s');
  expect(await setting(0)).toBe('0');
  expect(loadSchedulerConfig({ DATABASE_URL: 'postgres://x', CANTO_SECRET_KEY: 'x' }).databaseIdleTransactionMs).toBe(5_000);
  expect(loadSchedulerConfig({ DATABASE_URL: 'postgres://x', CANTO_SECRET_KEY: 'x', CANTO_DB_IDLE_TRANSACTION_MS: '0' }).databaseIdleTransactionMs).toBe(0);
});

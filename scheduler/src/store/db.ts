/**
 * The PostgreSQL connection. `DATABASE_URL` is a normal `postgres://` URL; a `?host=/dir` query
 * parameter (libpq's convention) selects a unix socket directory, which is how the embedded
 * cluster of `canto up` is reached.
 */
import postgres from 'postgres';

export type Sql = postgres.Sql;
export type TxSql = postgres.TransactionSql;

export function connectDatabase(url: string, options: { max?: number } = {}): Sql {
  const parsed = new URL(url);
  const socketDir = parsed.searchParams.get('host');
  parsed.searchParams.delete('host');
  return postgres(parsed.toString(), {
    ...(socketDir ? { host: socketDir } : {}),
    max: options.max ?? 10,
    onnotice: () => {},
    transform: { undefined: null },
    connection: { application_name: 'canto' },
  });
}

/**
 * Runs `fn` in a transaction. The transaction handle is typed as `Sql` so store functions take
 * one type whether or not they run inside a transaction (postgres.js types the two apart only
 * by `begin`/`end`, which store functions never call).
 */
export async function inTransaction<T>(sql: Sql, fn: (tx: Sql) => Promise<T>): Promise<T> {
  return (await sql.begin((tx) => fn(tx as unknown as Sql))) as T;
}

/** Several reads that must see one snapshot of the database (a read-only repeatable-read transaction). */
export async function inSnapshot<T>(sql: Sql, fn: (tx: Sql) => Promise<T>): Promise<T> {
  return (await sql.begin('isolation level repeatable read read only', (tx) => fn(tx as unknown as Sql))) as T;
}

/**
 * Statements of one transaction that do not depend on each other, sent together: postgres.js
 * pipelines them on the transaction's connection, one round trip instead of one each, and the
 * server still runs them in order. The first failure is thrown (the transaction rolls back).
 */
export async function together(...statements: Array<Promise<unknown>>): Promise<void> {
  await Promise.all(statements);
}

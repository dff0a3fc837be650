/**
 * The PostgreSQL connection. `DATABASE_URL` is a normal `postgres://` URL; a `?host=/dir` query
 * parameter (libpq's convention) selects a unix socket directory, which is how the embedded
 * cluster of `canto up` is reached.
 */
import postgres from 'postgres';

export type Sql = postgres.Sql;
export type TxSql = postgres.TransactionSql;

/**
 * How long the server lets a transaction sit idle (`idle_in_transaction_session_timeout`) before
 * it ends the session. A replica that stalls inside a transaction (paused, its VM frozen, its
 * network gone) otherwise holds that transaction's row locks until TCP gives up on it, hours
 * later, and its successor's steps and every API call on those rows wait as long. Every
 * transaction here runs queries back to back (nothing else is awaited inside one), so idling
 * this long is a stall.
 */
export const IDLE_TRANSACTION_MS = 5_000;

/** `idleTransactionMs` 0 leaves the server's own setting (the startup parameter is not sent). */
export function connectDatabase(url: string, options: { max?: number; idleTransactionMs?: number } = {}): Sql {
  const parsed = new URL(url);
  const socketDir = parsed.searchParams.get('host');
  parsed.searchParams.delete('host');
  const idle = options.idleTransactionMs ?? IDLE_TRANSACTION_MS;
  return postgres(parsed.toString(), {
    ...(socketDir ? { host: socketDir } : {}),
    max: options.max ?? 10,
    onnotice: () => {},
    transform: { undefined: null },
    connection: {
      application_name: 'canto',
      ...(idle > 0 ? { idle_in_transaction_session_timeout: idle } : {}),
    } as postgres.Options<never>['connection'],
  });
}

/** The error a query of a transaction whose connection is gone gets from `guarded`. */
export class TransactionGone extends Error {
  readonly code = 'CONNECTION_CLOSED';
}

/**
 * Whether a query may have failed because its connection is gone: postgres.js's own codes, a
 * socket's errno, or the server's (class 08, connection exception; 57P, the server shutting down or
 * ending the session; 25P03, the idle transaction timeout).
 */
function looksGone(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return (
    typeof code === 'string' &&
    /^(CONNECTION_(CLOSED|DESTROYED|ENDED)|ECONNRESET|ECONNABORTED|ECONNREFUSED|EPIPE|ETIMEDOUT|ENOTCONN|EHOSTUNREACH|ENETUNREACH|08...|57P..|25P03)$/.test(code)
  );
}

/**
 * Runs `fn` in a transaction, guarded against the end of its connection (the server ends an
 * idle one after IDLE_TRANSACTION_MS; a network or server failure ends any). postgres.js 3.4
 * rejects the transaction then, but lets the callback go on: a query the callback sends
 * afterwards, or the COMMIT or ROLLBACK that follows the callback, goes to the dead connection
 * (refused, with scripts/patch-deps.mjs) or, once the pool has reconnected it for another caller,
 * out of any transaction on the new session. So once the connection is gone the callback's
 * queries throw TransactionGone here and are never sent, and the callback's end is not passed
 * on: the library's transaction is left waiting, sends nothing more, and the caller gets the
 * rejection. A callback that failed with an error that looks like its connection's end is judged
 * a turn of the event loop later (the library closes the connection and rejects the transaction
 * in one synchronous call, so by then it has said so); any other failure rolls back at once.
 * Once the callback has ended, its queries are refused too: a branch of it still running would
 * otherwise send one after the COMMIT or ROLLBACK, outside the transaction.
 */
async function guarded<T>(begin: (fn: (tx: Sql) => Promise<T>) => Promise<T>, fn: (tx: Sql) => Promise<T>): Promise<T> {
  let gone = false;
  let ended = false;
  const refuse = () => {
    if (gone) throw new TransactionGone('the transaction ended: its database connection is gone');
    if (ended) throw new TransactionGone('the transaction ended: its callback had returned');
  };
  try {
    return await begin(
      (raw) =>
        new Promise<T>((resolve, reject) => {
          const tx = new Proxy(raw, {
            apply(target, self, args) {
              refuse();
              return Reflect.apply(target, self, args) as unknown;
            },
            get(target, prop, receiver) {
              const value = Reflect.get(target, prop, receiver) as unknown;
              if (prop !== 'unsafe' || typeof value !== 'function') return value;
              return (...args: unknown[]) => {
                refuse();
                return (value as (...a: unknown[]) => unknown).apply(target, args);
              };
            },
          });
          Promise.resolve()
            .then(() => fn(tx))
            .then(
              (value) => {
                ended = true;
                if (!gone) resolve(value);
              },
              (err: unknown) => {
                ended = true;
                if (!looksGone(err)) reject(err);
                else setImmediate(() => (gone ? undefined : reject(err)));
              },
            );
        }),
    );
  } catch (err) {
    gone = true;
    throw err;
  }
}

/**
 * Runs `fn` in a transaction. The transaction handle is typed as `Sql` so store functions take
 * one type whether or not they run inside a transaction (postgres.js types the two apart only
 * by `begin`/`end`, which store functions never call).
 */
export async function inTransaction<T>(sql: Sql, fn: (tx: Sql) => Promise<T>): Promise<T> {
  return guarded((body) => sql.begin((tx) => body(tx as unknown as Sql)) as Promise<T>, fn);
}

/** Several reads that must see one snapshot of the database (a read-only repeatable-read transaction). */
export async function inSnapshot<T>(sql: Sql, fn: (tx: Sql) => Promise<T>): Promise<T> {
  return guarded((body) => sql.begin('isolation level repeatable read read only', (tx) => body(tx as unknown as Sql)) as Promise<T>, fn);
}

/**
 * Statements of one transaction that do not depend on each other, sent together: postgres.js
 * pipelines them on the transaction's connection, one round trip instead of one each, and the
 * server still runs them in order. The first failure is thrown (the transaction rolls back).
 */
export async function together(...statements: Array<Promise<unknown>>): Promise<void> {
  await Promise.all(statements);
}

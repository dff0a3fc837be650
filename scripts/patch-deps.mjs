#!/usr/bin/env node
// Fixes to installed dependencies that their releases do not have yet, applied after every
// install (package.json `postinstall`, and scripts/prepare on each start). Each is an exact text
// replacement in a known file of a known version: a dependency whose text no longer matches fails
// the install loudly, so an upgrade is looked at rather than left unpatched. Applying twice
// changes nothing.
//
// postgres 3.4.9, src/connection.js (and its CommonJS and Cloudflare copies): a connection the
// server closed (a failover, a restart, pg_terminate_backend, the idle transaction timeout)
// keeps four things of the dead session. The error the server sent last is handed to the first
// query of the reconnected session, which then fails for nothing; a write buffered for the dead
// socket stays queued with its timer, and the reconnected session's own writes wait behind it
// for good; the query that was running stays the current one, so an error the server sends while
// the connection starts again (the database still starting, too many clients) is taken for that
// query's and dropped: the waiting query never settles and the connection retries without pause;
// and a query sent to the connection before it reconnects (a transaction's COMMIT or ROLLBACK
// after its connection went) throws an uncaught TypeError on the missing socket. Such a query is
// now refused, and the connection reported ready for the next (a falsy answer would park it in
// the pool's `full` queue for good). docs/decisions.md tells how they were found.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', 'node_modules');
const MARK = '/* canto: patched */';

const patches = [
  {
    module: 'postgres',
    version: '3.4.9',
    files: ['src/connection.js', 'cjs/src/connection.js', 'cf/src/connection.js'],
    edits: [
      {
        from: '  async function closed(hadError) {\n    incoming = Buffer.alloc(0)\n    remaining = 0\n    incomings = null\n    clearImmediate(nextWriteTimer)\n',
        to: `  async function closed(hadError) {\n    incoming = Buffer.alloc(0)\n    remaining = 0\n    incomings = null\n    clearImmediate(nextWriteTimer)\n    nextWriteTimer = chunk = errorResponse = null ${MARK}\n`,
      },
      {
        from: "    if (initial)\n      return reconnect()\n\n    !hadError && (query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))\n",
        to:
          `    if (initial) { ${MARK}\n      query && queryError(query, Errors.connection('CONNECTION_CLOSED', options))\n` +
          `      while (sent.length) queryError(sent.shift(), Errors.connection('CONNECTION_CLOSED', options))\n` +
          `      query = null\n      return reconnect()\n    }\n\n` +
          `    !hadError && (query || sent.length) && error(Errors.connection('CONNECTION_CLOSED', options, socket))\n    query = null ${MARK}\n`,
      },
      {
        from: "  function execute(q) {\n    if (terminated)\n      return queryError(q, Errors.connection('CONNECTION_DESTROYED', options))\n",
        to: `  function execute(q) {\n    if (terminated)\n      return queryError(q, Errors.connection('CONNECTION_DESTROYED', options))\n\n    if (!socket) ${MARK}\n      return (queryError(q, Errors.connection('CONNECTION_CLOSED', options)), true)\n`,
      },
    ],
  },
];

let failed = false;
for (const patch of patches) {
  const dir = join(root, patch.module);
  if (!existsSync(dir)) continue;
  const version = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')).version;
  if (version !== patch.version) {
    console.error(`patch-deps: ${patch.module} is ${version}, the fixes are for ${patch.version}: check whether it still needs them (scripts/patch-deps.mjs)`);
    failed = true;
    continue;
  }
  for (const name of patch.files) {
    const file = join(dir, name);
    if (!existsSync(file)) continue;
    const before = readFileSync(file, 'utf8');
    let text = before;
    // Each edit on its own: one made already is skipped, one added since is still made.
    for (const edit of patch.edits) {
      if (text.includes(edit.to)) continue;
      if (!text.includes(edit.from)) {
        console.error(`patch-deps: ${patch.module}/${name} has neither the text a fix replaces nor the fix`);
        failed = true;
        continue;
      }
      text = text.replace(edit.from, edit.to);
    }
    if (text !== before) writeFileSync(file, text);
  }
}
process.exit(failed ? 1 : 0);

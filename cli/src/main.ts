/**
 * The `canto` command line. Each subcommand parses its flags, maps them onto the same `CANTO_*`
 * settings the environment can give, and calls one start-up function; configuration is parsed
 * once, here.
 */
import cluster from 'node:cluster';
import { readFileSync } from 'node:fs';
import { Command, Option } from 'commander';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { startScheduler, STOP_BUDGET_MS } from '../../scheduler/src/main.js';
import { startSchedulerCluster } from '../../scheduler/src/cluster/primary.js';
import { runSchedulerWorker } from '../../scheduler/src/cluster/worker.js';
import { workerIndexFrom } from '../../scheduler/src/cluster/worker-config.js';
import { createRootLogger } from '../../shared/src/log.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { schemaProblem } from '../../scheduler/src/store/migrations.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { runAgent } from '../../agent/src/main.js';
import { DEFAULT_DATA_DIR, openDataDirDatabase } from './data-dir.js';
import { up } from './up.js';
import { tuneHeapForStreaming } from './heap.js';
import { bridgeOnce, parseStreamUrl } from './vnc-bridge.js';
import { attachTerminal, parseTerminalUrl } from './terminal-client.js';
import { formatHostPort, parseHostPort } from '../../shared/src/host-port.js';
import { formatFleetStatus, readFleetStatus } from './status.js';
import { registerAdminCommands } from './admin-commands.js';

const env = process.env;
const program = new Command('canto').description('Canto: persistent Linux cloud desktops').showHelpAfterError();

program
  .command('up')
  .description('run PostgreSQL (embedded), the scheduler and a local agent with embedded defaults')
  .option('--data-dir <dir>', 'data directory', env.CANTO_DATA_DIR || DEFAULT_DATA_DIR)
  .option('--listen <host:port>', 'API listen address', env.CANTO_LISTEN || '127.0.0.1:8080')
  .option('--hosts <n>', 'local agents to run, each its own host (1-8; for trying cordon, drain and moves)', '1')
  .action(async (opts: { dataDir: string; listen: string; hosts: string }) => {
    const hosts = Number(opts.hosts);
    if (!Number.isInteger(hosts) || hosts < 1 || hosts > 8) throw new Error('--hosts must be a whole number from 1 to 8');
    tuneHeapForStreaming();
    await up({ ...opts, hosts }, env);
    // Everything has stopped by now; a handle a library left open must not keep the process
    // running after it said so (stdout to a pipe or terminal is written synchronously).
    process.exit(process.exitCode ?? 0);
  });

program
  .command('scheduler')
  .description('run the scheduler (needs DATABASE_URL and CANTO_SECRET_KEY)')
  .option('--listen <host:port>', 'API listen address (CANTO_LISTEN)')
  .action(async (opts: { listen?: string }) => {
    tuneHeapForStreaming();
    const settings = { ...env, ...(opts.listen ? { CANTO_LISTEN: opts.listen } : {}) };
    const config = loadSchedulerConfig(settings);
    // Several workers: this process is only their primary (scheduler/src/cluster/primary.ts).
    const scheduler = config.workers > 1
      ? await startSchedulerCluster({ config, env: settings, logger: createRootLogger({ level: config.logLevel, name: 'canto-scheduler' }) })
      : await startScheduler(config);
    // The handler stays installed for the whole stop: removing it while a signal is delivered
    // would leave another library's listener (execa's signal-exit) to re-raise it and kill us.
    let stopping = false;
    const onSignal = () => {
      if (stopping) process.exit(1);
      stopping = true;
      setTimeout(() => process.exit(1), STOP_BUDGET_MS).unref();
      void scheduler.close().then(
        () => process.exit(0),
        () => process.exit(1),
      );
    };
    process.on('SIGINT', onSignal);
    process.on('SIGTERM', onSignal);
  });

program
  .command('agent')
  .description('run a host agent')
  .option('--scheduler <url>', 'scheduler base URL(s), comma-separated (CANTO_SCHEDULER_URL)')
  .option('--token-file <file>', 'file holding the join token (CANTO_AGENT_TOKEN_FILE; or the token itself in CANTO_AGENT_TOKEN)')
  .addOption(new Option('--token <token>').hideHelp())
  .option('--state-dir <dir>', 'agent state directory (CANTO_AGENT_STATE_DIR)')
  .option('--runtime <name>', 'runtime driver: sandbox or fake (CANTO_AGENT_RUNTIME)')
  .action(async (opts: { scheduler?: string; token?: string; tokenFile?: string; stateDir?: string; runtime?: string }) => {
    if (opts.token !== undefined) {
      throw new Error('--token would show the join token to everyone on this host (ps); use --token-file FILE or CANTO_AGENT_TOKEN');
    }
    tuneHeapForStreaming();
    const tokenFile = opts.tokenFile ?? env.CANTO_AGENT_TOKEN_FILE;
    const token = tokenFile ? readTokenFile(tokenFile) : undefined;
    await runAgent(loadAgentConfig(env, { scheduler: opts.scheduler, token, stateDir: opts.stateDir, runtime: opts.runtime }));
  });

/** The join token from a file (its first line, trimmed); the error names the file, never its content. */
function readTokenFile(path: string): string {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new Error(`cannot read the join token file ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  const token = text.split('\n', 1)[0]!.trim();
  if (token === '') throw new Error(`the join token file ${path} is empty`);
  return token;
}

/**
 * A ticket url from the argument, else from `variable`: a command line is readable by every user
 * of the machine (`ps`), and a ticket is good for one connection to whoever presents it first;
 * a process's environment is its user's alone.
 */
function ticketUrl(argument: string | undefined, variable: string): string {
  const url = argument ?? process.env[variable];
  if (!url) throw new Error(`give the url as the argument, or in ${variable} (out of other users' sight on a shared machine)`);
  return url;
}

program
  .command('vnc')
  .description('relay one VNC viewer to a desktop stream: give it the url from POST /v1/desktops/{id}/stream (or set CANTO_STREAM_URL)')
  .argument('[stream-url]', 'tcp://host:port/?ticket=… (default: $CANTO_STREAM_URL)')
  .option('--listen <host:port>', 'where the viewer connects', '127.0.0.1:5900')
  .action(async (streamUrl: string | undefined, opts: { listen: string }) => {
    const target = parseStreamUrl(ticketUrl(streamUrl, 'CANTO_STREAM_URL'));
    const listen = parseHostPort(opts.listen);
    if (listen === null) throw new Error(`--listen must be host:port, got "${opts.listen}"`);
    await bridgeOnce(target, {
      listenHost: listen.host,
      listenPort: listen.port,
      onListening: (port) =>
        process.stdout.write(`Point a VNC viewer at ${formatHostPort(listen.host, port)} (one connection: the ticket works once).\n`),
    });
    process.stdout.write('The viewer disconnected.\n');
  });

program
  .command('terminal')
  .description('attach this terminal to a desktop terminal: give it the url from POST /v1/desktops/{id}/terminals (or set CANTO_TERMINAL_URL)')
  .argument('[terminal-url]', 'ws://host:port/terminal?ticket=… (default: $CANTO_TERMINAL_URL)')
  .action(async (terminalUrl: string | undefined) => {
    const url = parseTerminalUrl(ticketUrl(terminalUrl, 'CANTO_TERMINAL_URL'));
    process.exitCode = await attachTerminal(url, { stdin: process.stdin, stdout: process.stdout, stderr: process.stderr });
  });

interface DbOpts {
  dataDir?: string;
  databaseUrl?: string;
}

/**
 * Runs `fn` on the database named by --database-url / DATABASE_URL, else the data directory's,
 * with one connection that is closed afterwards. It only reads: a schema this build does not
 * match is refused rather than migrated (a diagnostic run must not change a fleet's schema).
 */
async function withDatabase<T>(opts: DbOpts, fn: (sql: Sql) => Promise<T>): Promise<T> {
  const run = async (url: string) => {
    const sql = connectDatabase(url, { max: 1 });
    try {
      const problem = await schemaProblem(sql).catch((err: unknown) => {
        // 42P01: no schema_migrations table, so no Canto schema at all.
        if ((err as { code?: string }).code === '42P01') return 'the database holds no Canto schema';
        throw err;
      });
      if (problem) throw new Error(`${problem}: canto status reads and does not migrate; start a scheduler of this version on it first, or use the canto that matches it`);
      return await fn(sql);
    } finally {
      await sql.end();
    }
  };
  // The same rule as --token: everyone on this host reads a command line (ps).
  if (opts.databaseUrl !== undefined && URL.canParse(opts.databaseUrl) && new URL(opts.databaseUrl).password !== '') {
    throw new Error('--database-url would show its password to everyone on this host (ps); set DATABASE_URL instead');
  }
  const explicit = opts.databaseUrl ?? (opts.dataDir ? undefined : env.DATABASE_URL);
  if (explicit) return run(explicit);
  const db = await openDataDirDatabase(opts.dataDir ?? env.CANTO_DATA_DIR ?? DEFAULT_DATA_DIR);
  try {
    return await run(db.url);
  } finally {
    await db.stop();
  }
}

registerAdminCommands(program, env);

program
  .command('status')
  .description('scheduler replicas (leader, lease, version), hosts, and what needs a look')
  .option('--data-dir <dir>', 'data directory of `canto up`')
  .option('--database-url <url>', 'scheduler database (DATABASE_URL)')
  .option('--json', 'print JSON for scripts')
  .action(async (opts: DbOpts & { json?: boolean }) => {
    const status = await withDatabase(opts, readFleetStatus);
    process.stdout.write(opts.json ? `${JSON.stringify(status, null, 2)}\n` : formatFleetStatus(status));
  });

// A scheduler worker runs this same program (node:cluster forks it with the primary's
// arguments): it is a worker by its index, whatever the command line says.
const workerIndex = cluster.isWorker ? workerIndexFrom(env) : null;
const run = async () => {
  if (workerIndex === null) return program.parseAsync(process.argv);
  tuneHeapForStreaming();
  return runSchedulerWorker(env, workerIndex);
};
run().catch((err: unknown) => {
  process.stderr.write(`canto: ${errorLine(err)}\n`);
  process.exit(1);
});

/**
 * One line for a failure. Node's connect to a name with several addresses that all refuse throws
 * an AggregateError whose own message is empty (the CLI printed `canto: ` and nothing): its
 * errors say what happened.
 */
function errorLine(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  if (err.message !== '') return err.message;
  const inner = err instanceof AggregateError ? err.errors.map((e: unknown) => (e instanceof Error ? e.message : String(e))).filter(Boolean) : [];
  return inner.length > 0 ? [...new Set(inner)].join('; ') : (err as { code?: string }).code ?? err.name;
}

/**
 * The `canto` command line. Each subcommand parses its flags, maps them onto the same `CANTO_*`
 * settings the environment can give, and calls one start-up function; configuration is parsed
 * once, here.
 */
import { Command } from 'commander';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { startScheduler } from '../../scheduler/src/main.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { migrate } from '../../scheduler/src/store/migrations.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { listHosts } from '../../scheduler/src/store/hosts.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { runAgent } from '../../agent/src/main.js';
import { DEFAULT_DATA_DIR, openDataDirDatabase } from './data-dir.js';
import { up } from './up.js';
import { tuneHeapForStreaming } from './heap.js';
import { bridgeOnce, parseStreamUrl } from './vnc-bridge.js';
import { formatHostPort, parseHostPort } from '../../shared/src/host-port.js';

const env = process.env;
const program = new Command('canto').description('Canto: persistent Linux cloud desktops').showHelpAfterError();

program
  .command('up')
  .description('run PostgreSQL (embedded), the scheduler and a local agent with embedded defaults')
  .option('--data-dir <dir>', 'data directory', env.CANTO_DATA_DIR || DEFAULT_DATA_DIR)
  .option('--listen <host:port>', 'API listen address', env.CANTO_LISTEN || '127.0.0.1:8080')
  .action(async (opts: { dataDir: string; listen: string }) => {
    tuneHeapForStreaming();
    await up(opts, env);
  });

program
  .command('scheduler')
  .description('run the scheduler (needs DATABASE_URL and CANTO_SECRET_KEY)')
  .option('--listen <host:port>', 'API listen address (CANTO_LISTEN)')
  .action(async (opts: { listen?: string }) => {
    tuneHeapForStreaming();
    const config = loadSchedulerConfig({ ...env, ...(opts.listen ? { CANTO_LISTEN: opts.listen } : {}) });
    const scheduler = await startScheduler(config);
    const stop = () => void scheduler.close().then(() => process.exit(0));
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });

program
  .command('agent')
  .description('run a host agent')
  .option('--scheduler <url>', 'scheduler base URL (CANTO_SCHEDULER_URL)')
  .option('--token <token>', 'join token (CANTO_AGENT_TOKEN)')
  .option('--state-dir <dir>', 'agent state directory (CANTO_AGENT_STATE_DIR)')
  .option('--runtime <name>', 'runtime driver: sandbox or fake (CANTO_AGENT_RUNTIME)')
  .action(async (opts: { scheduler?: string; token?: string; stateDir?: string; runtime?: string }) => {
    tuneHeapForStreaming();
    await runAgent(loadAgentConfig(env, opts));
  });

program
  .command('vnc')
  .description('relay one VNC viewer to a desktop stream: give it the url from POST /v1/desktops/{id}/stream')
  .argument('<stream-url>', 'tcp://host:port/?ticket=…')
  .option('--listen <host:port>', 'where the viewer connects', '127.0.0.1:5900')
  .action(async (streamUrl: string, opts: { listen: string }) => {
    const target = parseStreamUrl(streamUrl);
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

interface DbOpts {
  dataDir?: string;
  databaseUrl?: string;
}

/** Opens the database named by --database-url / DATABASE_URL, else the data directory's. */
async function withDatabase<T>(opts: DbOpts, fn: (url: string) => Promise<T>): Promise<T> {
  const explicit = opts.databaseUrl ?? (opts.dataDir ? undefined : env.DATABASE_URL);
  if (explicit) return fn(explicit);
  const db = await openDataDirDatabase(opts.dataDir ?? env.CANTO_DATA_DIR ?? DEFAULT_DATA_DIR);
  try {
    return await fn(db.url);
  } finally {
    await db.stop();
  }
}

const keys = program.command('keys').description('API keys');
keys
  .command('create')
  .description('create an API key (and the org, if new); prints only the key')
  .requiredOption('--org <name>', 'org name')
  .option('--data-dir <dir>', 'data directory of `canto up`')
  .option('--database-url <url>', 'scheduler database (DATABASE_URL)')
  .action(async (opts: DbOpts & { org: string }) => {
    const key = await withDatabase(opts, async (url) => {
      const sql = connectDatabase(url, { max: 1 });
      try {
        await migrate(sql);
        return (await createApiKey(sql, opts.org)).key;
      } finally {
        await sql.end();
      }
    });
    process.stdout.write(`${key}\n`);
  });

const hosts = program.command('hosts').description('agent hosts');
hosts
  .command('list')
  .description('list hosts with their status and capacity')
  .option('--data-dir <dir>', 'data directory of `canto up`')
  .option('--database-url <url>', 'scheduler database (DATABASE_URL)')
  .action(async (opts: DbOpts) => {
    const rows = await withDatabase(opts, async (url) => {
      const sql = connectDatabase(url, { max: 1 });
      try {
        await migrate(sql);
        return await listHosts(sql);
      } finally {
        await sql.end();
      }
    });
    const table = rows.map((h) => ({
      id: h.id,
      hostname: h.hostname,
      status: h.cordoned ? `${h.status},cordoned` : h.status,
      runtime: `${h.runtime}${h.memory_snapshots ? '+snapshots' : ''}`,
      capacity: `${h.vcpus} vCPU / ${h.memory_mb} MiB`,
      last_seen: h.last_seen_at.toISOString(),
    }));
    const cols = ['id', 'hostname', 'status', 'runtime', 'capacity', 'last_seen'] as const;
    const width = (c: (typeof cols)[number]) => Math.max(c.length, ...table.map((r) => r[c].length));
    const line = (r: Record<string, string>) => cols.map((c) => r[c]!.padEnd(width(c))).join('  ').trimEnd();
    process.stdout.write([line(Object.fromEntries(cols.map((c) => [c, c.toUpperCase()]))), ...table.map(line)].join('\n') + '\n');
  });

program.parseAsync(process.argv).catch((err: unknown) => {
  process.stderr.write(`canto: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});

/**
 * The agent daemon's wiring, and the only place it happens: build the root logger, pick the
 * runtime driver, start the channel, and stop cleanly on SIGINT/SIGTERM. Importing this module
 * does nothing; the CLI calls `runAgent(loadAgentConfig(process.env, flags))`.
 *
 * The sandbox driver is loaded with a dynamic import so that the fake runtime (tests, demos) does
 * not pull in the sandbox's system dependencies, and a host that cannot run sandboxes fails with
 * the driver's own error rather than at module load.
 *
 * Stopping leaves desktops running: they are independent of the agent process, and a restarted
 * agent finds them again through `driver.list()` and reports them in its hello.
 */
import { join } from 'node:path';
import { createRootLogger, type Logger } from '../../shared/src/log.js';
import { startAgent, type AgentHandle } from './channel.js';
import type { AgentConfig } from './config.js';
import type { RuntimeDriver } from './runtime/driver.js';
import { FakeDriver } from './runtime/fake.js';

/** How long a signal-triggered stop may take before the process exits anyway, in ms. */
const STOP_GRACE_MS = 5_000;

export interface RunAgentOptions {
  /** Defaults to a root logger at `config.logLevel`. */
  readonly logger?: Logger;
  /** Install SIGINT/SIGTERM handlers. Default true; tests that embed the agent pass false. */
  readonly handleSignals?: boolean;
}

export async function runAgent(config: AgentConfig, options: RunAgentOptions = {}): Promise<AgentHandle> {
  const logger = options.logger ?? createRootLogger({ level: config.logLevel, name: 'canto-agent' });
  const log = logger.child({ component: 'agent-main' });
  const driver = await createDriver(config, logger);
  let handle: AgentHandle;
  try {
    handle = await startAgent({ config, driver, logger });
  } catch (err) {
    await driver.close();
    throw err;
  }
  log.info(
    { host_id: handle.hostId, runtime: config.runtime, schedulers: config.schedulerUrls, state_dir: config.stateDir },
    'agent started',
  );
  if (options.handleSignals === false) return handle;

  let stopping = false;
  const onSignal = (signal: NodeJS.Signals): void => {
    if (stopping) {
      // A second signal means the operator does not want to wait for the graceful stop.
      log.warn({ signal }, 'second signal; exiting now');
      process.exit(1);
    }
    stopping = true;
    log.info({ signal }, 'stopping the agent');
    // unref: the grace timer must not itself keep a cleanly stopped process alive.
    setTimeout(() => {
      log.error('agent did not stop in time; exiting');
      process.exit(1);
    }, STOP_GRACE_MS).unref();
    handle.stop().then(
      () => removeSignalHandlers(),
      (err: unknown) => {
        log.error({ err }, 'agent stop failed');
        process.exit(1);
      },
    );
  };
  const removeSignalHandlers = (): void => {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  return {
    ...handle,
    stop: async () => {
      removeSignalHandlers();
      await handle.stop();
    },
  };
}

async function createDriver(config: AgentConfig, logger: Logger): Promise<RuntimeDriver> {
  if (config.runtime === 'fake') return new FakeDriver({ memorySnapshots: config.memorySnapshots, stagingDir: join(config.stateDir, 'incoming') });
  const runtimeLog = logger.child({ component: 'agent-runtime' });
  const { createSandboxDriver } = await import('./runtime/sandbox/index.js');
  return await createSandboxDriver({
    stateDir: join(config.stateDir, 'runtime'),
    memorySnapshots: config.memorySnapshots,
    goldenTemplates: config.goldenTemplates,
    log: (msg, fields, level) => (level === 'warn' ? runtimeLog.warn(fields ?? {}, msg) : runtimeLog.info(fields ?? {}, msg)),
  });
}

/**
 * A "host" for moving sandbox desktops without a scheduler: a sandbox driver on a state dir of its
 * own, its fencing store, a transfer server on loopback and the command handlers wired as the
 * agent wires them (agent/src/channel.ts). Two of them on one machine stand for two hosts.
 */
import { join } from 'node:path';
import { GenerationStore } from '../../agent/src/generations.js';
import { CommandHandlers } from '../../agent/src/handlers.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { DesktopMoves } from '../../agent/src/transfer/moves.js';
import { TransferServer } from '../../agent/src/transfer/server.js';
import { TransferSource } from '../../agent/src/transfer/source.js';
import { TransferTickets } from '../../agent/src/transfer/tickets.js';
import { silentLogger } from '../../shared/src/log.js';

export interface MoveHost {
  /** The agent's state dir; the driver's is `runtime/` under it. */
  readonly state: string;
  readonly driver: SandboxDriver;
  readonly handlers: CommandHandlers;
  readonly server: TransferServer;
  close(): Promise<void>;
}

export async function startMoveHost(state: string, options: { retries?: number; backoffMs?: number } = {}): Promise<MoveHost> {
  const driver = await createSandboxDriver({ stateDir: join(state, 'runtime') });
  const generations = await GenerationStore.open(state);
  const tickets = new TransferTickets();
  const log = () => undefined;
  const source = new TransferSource({ transfer: driver.transfer, tickets, log });
  const server = await TransferServer.start({ listenHost: '127.0.0.1', port: 0, advertiseHost: '127.0.0.1', source, tickets, generations, log });
  const moves = new DesktopMoves({ driver, source, url: server.url, log, ...options });
  return {
    state,
    driver,
    server,
    handlers: new CommandHandlers({ driver, generations, logger: silentLogger(), moves }),
    async close() {
      await server.close();
      await driver.close();
    },
  };
}

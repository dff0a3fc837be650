/**
 * Agents on the fake runtime for tests of moves (agent/src/transfer/): each host has its real
 * command handlers and a real transfer server on a port of its own, and a clock tests move on to
 * expire tickets. `closeFakeMoveHosts` stops every host made since the last call.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { GenerationStore } from '../../agent/src/generations.js';
import { CommandHandlers } from '../../agent/src/handlers.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { DesktopMoves } from '../../agent/src/transfer/moves.js';
import { TransferServer } from '../../agent/src/transfer/server.js';
import { TransferSource } from '../../agent/src/transfer/source.js';
import { TransferTickets } from '../../agent/src/transfer/tickets.js';
import { silentLogger } from '../../shared/src/log.js';
import type { ExportResult, ImportResult } from '../../shared/src/transfer.js';

export interface FakeMoveHost {
  dir: string;
  driver: FakeDriver;
  handlers: CommandHandlers;
  server: TransferServer;
  /** The transfer server's tickets, for tests that grant one as an export would. */
  tickets: TransferTickets;
  clock: { now: number };
}

const hosts: FakeMoveHost[] = [];

export async function fakeMoveHost(): Promise<FakeMoveHost> {
  const dir = await mkdtemp(join(tmpdir(), 'canto-move-fake-'));
  const driver = new FakeDriver({ stagingDir: join(dir, 'incoming') });
  const generations = await GenerationStore.open(dir);
  const clock = { now: Date.now() };
  const tickets = new TransferTickets(() => clock.now);
  const log = () => undefined;
  const source = new TransferSource({ transfer: driver.transfer, tickets, log });
  const server = await TransferServer.start({ listenHost: '127.0.0.1', port: 0, advertiseHost: '127.0.0.1', source, tickets, generations, log });
  const moves = new DesktopMoves({ driver, source, url: server.url, log, retries: 2, backoffMs: 5 });
  const handlers = new CommandHandlers({ driver, generations, logger: silentLogger(), moves });
  const h = { dir, driver, handlers, server, tickets, clock };
  hosts.push(h);
  return h;
}

export async function closeFakeMoveHosts(): Promise<void> {
  for (const h of hosts.splice(0)) {
    await h.server.close();
    await h.driver.close();
    await rm(h.dir, { recursive: true, force: true });
  }
}

/** The desktop tests move. */
export const D = 'dsk_aaaaaaaaaaaaaaaaaaaaaaaa';
/** What it holds at /root/big. */
export const BIG = randomBytes(3 << 20);

/** A desktop on `h` with /root/big and /root/note written, hibernated at generation 3. */
export async function stoppedDesktop(h: FakeMoveHost, id = D): Promise<void> {
  await h.handlers.handle('desktop.prepare', { desktop_id: id, generation: 1, tier: 'small' });
  await h.handlers.handle('desktop.start', { desktop_id: id, generation: 2, operation_id: 'op_1', tier: 'small', first_boot: { env: { A: '1' }, setup_script: null } });
  const write = async (path: string, data: Buffer) => h.driver.writeFile(id, { path, appendAt: null }, (async function* () { yield data; })());
  await write('/root/big', BIG);
  await write('/root/note', Buffer.from('hello'));
  await h.handlers.handle('desktop.hibernate', { desktop_id: id, generation: 3, operation_id: 'op_2' });
}

export const exportFrom = (h: FakeMoveHost, generation = 4, id = D, listing?: 'hashed' | 'sized') =>
  h.handlers.handle('desktop.export', { desktop_id: id, generation, ttl_ms: 60_000, ...(listing ? { listing } : {}) }) as Promise<ExportResult>;

export function importInto(h: FakeMoveHost, exp: { url: string; ticket: string }, notify?: (type: string, payload: unknown) => void, generation = 4, operationId?: string) {
  const payload = { desktop_id: D, generation, tier: 'default', source: { url: exp.url, ticket: exp.ticket }, ...(operationId === undefined ? {} : { operation_id: operationId }) };
  return h.handlers.handle('desktop.import', payload, { upload: null, ...(notify ? { notify } : {}) }) as Promise<ImportResult>;
}

/**
 * What each scheduler command does on this host: one entry per command of the protocol's table
 * (shared/src/protocol.ts `AGENT_COMMANDS`), typed by it, so a command without a handler, or a
 * handler answering the wrong shape, fails to compile. Each entry takes its already-validated
 * payload, picks how it is admitted (the queued and fenced `lifecycle`, the fenced `guest`, the
 * `exclusive` guest operation refused while a stream client holds control, or `computerUse`), and
 * translates between the wire's snake_case and the driver's camelCase. The admission machinery
 * itself (queues, fences, logging, error translation) is handlers.ts.
 */
import { inputBatchProblem } from '../../shared/src/computer-use.js';
import { AgentFailure, type AgentCommand, type CommandPayload, type CommandResult } from '../../shared/src/protocol.js';
import { WithDownload } from '../../shared/src/byte-stream.js';
import { EXEC_MAX_OUTPUT_BYTES } from '../../shared/src/guest-commands.js';
import type { FenceKind, GenerationStore } from './generations.js';
import type { RuntimeDriver } from './runtime/driver.js';
import type { DesktopMoves, MoveCommand } from './transfer/moves.js';
import type { StreamClaim } from '../../shared/src/computer-use.js';
import type { RequestContext } from '../../shared/src/rpc.js';
import type { TerminalSpec } from './runtime/driver.js';

/** What the handlers need from the stream gateway (agent/src/stream/gateway.ts). */
export interface StreamAccess {
  grant(desktopId: string, claim: StreamClaim, generation?: number): { ticket: string; expiresAt: Date; host: string; port: number };
  /** A single-use terminal ticket for the desktop's generation (gateway.ts). */
  grantTerminal(desktopId: string, generation: number, spec: TerminalSpec): { ticket: string; expiresAt: Date; host: string; port: number };
  /** True while a stream client holds the desktop's control claim. */
  controlHeld(desktopId: string): boolean;
  /** Drops the desktop's tickets, closes its connections and releases its claim. */
  release(desktopId: string): void;
}

/** A request's context, with a way to notify the scheduler link it came on. */
export type CommandContext = RequestContext & { readonly notify?: (type: string, payload: unknown) => void };

/** A command's handler: its validated payload in, its result (or the result and a download) out. */
export type CommandHandler<C extends AgentCommand> = (p: CommandPayload<C>, context: CommandContext) => Promise<CommandResult<C> | WithDownload>;

export type CommandTable = { readonly [C in AgentCommand]: CommandHandler<C> };

interface DesktopCommand {
  readonly desktop_id: string;
  readonly generation: number;
  readonly operation_id?: string;
  readonly leader_epoch?: number;
}

/** How a command is admitted (handlers.ts), and what the entries act on. */
export interface CommandKit {
  readonly driver: RuntimeDriver;
  readonly generations: GenerationStore;
  readonly stream: StreamAccess | null;
  readonly moves: DesktopMoves;
  lifecycle<T>(type: AgentCommand, cmd: DesktopCommand, fence: FenceKind, work: () => Promise<T>): Promise<T>;
  guest<T>(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<T>): Promise<T>;
  exclusive<T>(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<T>): Promise<T>;
  computerUse<T>(type: AgentCommand, cmd: DesktopCommand, work: () => Promise<T>): Promise<T>;
  /** Runs work in the desktop's queue without the fences (inspect sees what commands before it left). */
  queued<T>(desktopId: string, work: () => Promise<T>): Promise<T>;
  /** Whether a command would pass the fences now. */
  current(cmd: DesktopCommand): boolean;
}

/** Output kept per stream of a synchronous exec when the scheduler names no cap. */
export const DEFAULT_MAX_OUTPUT_BYTES = EXEC_MAX_OUTPUT_BYTES;

const refuse = (code: AgentFailure['code'], message: string) => Promise.reject(new AgentFailure(code, message, false));

export function commandTable(k: CommandKit): CommandTable {
  const { driver, generations, moves } = k;
  const move = (type: MoveCommand) =>
    (p: CommandPayload<typeof type>, context: CommandContext) =>
      moves.command(type, p, { lifecycle: (cmd, work) => k.lifecycle(type, cmd, 'command', work), current: (cmd) => k.current(cmd), notify: context.notify }) as Promise<never>;
  return {
    'desktop.prepare': (p) =>
      k.lifecycle('desktop.prepare', p, 'command', async () => {
        await driver.prepare(p.desktop_id, p.tier);
        return {};
      }),
    'desktop.start': (p) => {
      const firstBoot = p.first_boot && { env: p.first_boot.env, setupScript: p.first_boot.setup_script };
      return k.lifecycle('desktop.start', p, 'command', async () => {
        // Only a first boot may begin on an empty disk (the sandbox makes one where none is): a
        // desktop that ran before and has no disk here lost it (a wiped or replaced state
        // directory), and booting an empty one would hand its user a blank desktop as theirs.
        if (firstBoot === null && (await driver.status(p.desktop_id)) === null) {
          throw new AgentFailure('not_found', 'this host holds no disk of the desktop; it was lost with the state directory, or never came here', false);
        }
        const moved = await moves.starting(p.desktop_id);
        const { restored } = await driver.start({ desktopId: p.desktop_id, tier: p.tier, firstBoot, inUse: moved });
        return { restored };
      });
    },
    'desktop.hibernate': (p) =>
      k.lifecycle('desktop.hibernate', p, 'command', async () => {
        // Stream clients are disconnected (their VNC servers cannot be snapshotted) and lose their claims.
        k.stream?.release(p.desktop_id);
        const { snapshot } = await driver.hibernate(p.desktop_id, { keepDetached: p.keep_detached === true, requireSnapshot: p.require_snapshot === true });
        // Again: a grant is not queued behind a hibernate, and one made meanwhile (a route the
        // scheduler had cached as awake) would hold a control claim over the next wake.
        k.stream?.release(p.desktop_id);
        // Kept detached processes mean a move's stop.
        if (p.keep_detached === true) moves.stoppedForMove(p.desktop_id, p.generation);
        return { snapshot };
      }),
    // Queued on the source, so no wake can restore (and delete) the snapshot being copied.
    'desktop.fork': (p) =>
      k.lifecycle('desktop.fork', p, 'command', async () => {
        for (const f of p.forks) await generations.check(f.desktop_id, f.generation);
        moves.forking(p.desktop_id);
        const forked = await driver.fork(p.desktop_id, p.forks.map((f) => f.desktop_id));
        // A fork the scheduler gave up on (it timed out) has its copies destroyed, each in its own
        // queue: those that came while this one was copying found nothing yet. What they left
        // behind is removed here.
        for (const f of p.forks) if (generations.isDestroyed(f.desktop_id)) await driver.destroy(f.desktop_id);
        return forked;
      }),
    'desktop.destroy': (p) => {
      if (k.current(p)) moves.cancelImport(p.desktop_id);
      return k.lifecycle('desktop.destroy', p, 'destroy', async () => {
        k.stream?.release(p.desktop_id);
        moves.destroying(p.desktop_id);
        await driver.destroy(p.desktop_id);
        await moves.destroyed(p.desktop_id);
        // Only after the disk is gone: if destroy fails, the scheduler retries a live desktop.
        await generations.forget(p.desktop_id);
        return {};
      });
    },
    'desktop.inspect': (p) =>
      k.queued(p.desktop_id, async () => {
        const held = await driver.status(p.desktop_id);
        return { running: held?.running ?? false, has_snapshot: held?.hasSnapshot ?? false };
      }),
    'desktop.export': move('desktop.export'),
    'desktop.import': move('desktop.import'),
    'desktop.import.abort': move('desktop.import.abort'),
    'desktop.precopy.export': move('desktop.precopy.export'),
    'desktop.precopy.import': move('desktop.precopy.import'),
    'guest.exec': (p) =>
      k.exclusive('guest.exec', p, async () => {
        const out = await driver.exec(p.desktop_id, {
          command: p.command,
          timeoutMs: p.timeout_ms,
          maxOutputBytes: p.max_output_bytes ?? DEFAULT_MAX_OUTPUT_BYTES,
        });
        return {
          exit_code: out.exitCode,
          stdout: out.stdout,
          stderr: out.stderr,
          stdout_truncated: out.stdoutTruncated,
          stderr_truncated: out.stderrTruncated,
        };
      }),
    'guest.spawn': (p) =>
      k.exclusive('guest.spawn', p, async () => {
        await driver.spawnDetached(p.desktop_id, { processId: p.process_id, command: p.command });
        return {};
      }),
    'guest.process': (p) =>
      k.guest('guest.process', p, async () => {
        const st = await driver.processStatus(p.desktop_id, p.process_id, p.tail_bytes);
        if (st === null) return { found: false, status: 'lost' as const, exit_code: null, stdout_tail: '', stderr_tail: '' };
        return { found: true, status: st.status, exit_code: st.exitCode, stdout_tail: st.stdoutTail, stderr_tail: st.stderrTail };
      }),
    'guest.file.read': (p) =>
      k.exclusive('guest.file.read', p, async () => {
        const read = await driver.readFile(p.desktop_id, { path: p.path, offset: p.offset, length: p.length, maxWholeBytes: p.max_whole_bytes });
        return new WithDownload({ size: read.size, length: read.length, eof: read.eof }, read.body);
      }),
    'guest.file.write': (p, context) => {
      const upload = context.upload;
      if (upload === null) return refuse('bad_request', 'guest.file.write needs an upload');
      return k.exclusive('guest.file.write', p, async () => {
        await driver.writeFile(p.desktop_id, { path: p.path, appendAt: p.append_at }, upload);
        return {};
      });
    },
    'guest.file.delete': (p) =>
      k.exclusive('guest.file.delete', p, async () => {
        await driver.deletePath(p.desktop_id, p.path, p.recursive);
        return {};
      }),
    'guest.file.stat': (p) =>
      k.exclusive('guest.file.stat', p, async () => {
        const st = await driver.statPath(p.desktop_id, p.path);
        return { file_type: st.fileType, size_bytes: st.sizeBytes, modified_at: st.modifiedAt, mode: st.mode };
      }),
    'guest.dir.list': (p) =>
      k.exclusive('guest.dir.list', p, async () => {
        const list = await driver.listDir(p.desktop_id, p.path, p.limit);
        return {
          entries: list.entries.map((e) => ({ name: e.name, file_type: e.fileType, size_bytes: e.sizeBytes, modified_at: e.modifiedAt })),
          truncated: list.truncated,
        };
      }),
    'guest.display.get': (p) => k.computerUse('guest.display.get', p, () => driver.getDisplay(p.desktop_id)),
    'guest.display.set': (p) => k.computerUse('guest.display.set', p, () => driver.setDisplay(p.desktop_id, { width: p.width, height: p.height })),
    'guest.screenshot': (p) =>
      k.computerUse('guest.screenshot', p, async () => {
        const shot = await driver.screenshot(p.desktop_id, { region: p.region, scalePercent: p.scale_percent, maxBytes: p.max_bytes });
        return { png: shot.png, width: shot.width, height: shot.height };
      }),
    'guest.input': (p) => {
      const problem = inputBatchProblem(p.actions);
      if (problem !== null) return refuse('bad_request', problem);
      return k.computerUse('guest.input', p, () => driver.input(p.desktop_id, p.actions));
    },
    'stream.grant': (p) => {
      const stream = k.stream;
      if (stream === null) return refuse('unsupported', 'streaming is turned off on this host');
      // The scheduler granted it for an awake desktop; the gateway checks again when the client dials.
      return k.computerUse('stream.grant', p, async () => {
        const grant = stream.grant(p.desktop_id, p.claim, p.generation);
        return { ticket: grant.ticket, expires_at: grant.expiresAt.toISOString(), host: grant.host, port: grant.port, websocket: true };
      });
    },
    'terminal.grant': (p) => {
      const stream = k.stream;
      if (stream === null) return refuse('unsupported', 'terminals need the stream gateway, which is off on this host');
      // Not gated by a stream control claim: a terminal is a person at the desktop, like a control stream.
      return k.guest('terminal.grant', p, async () => {
        const grant = stream.grantTerminal(p.desktop_id, p.generation, { cols: p.cols, rows: p.rows, command: p.command });
        return { ticket: grant.ticket, expires_at: grant.expiresAt.toISOString(), host: grant.host, port: grant.port };
      });
    },
  };
}

/**
 * The agent's move commands (`desktop.export`, `desktop.import`, `desktop.import.abort`, and
 * from 1.12 `desktop.precopy.export` and `desktop.precopy.import`) and what the other lifecycle commands must tell the move machinery. The handlers (handlers.ts)
 * validate, queue and fence each command as any lifecycle command; this file does the work.
 *
 * - A desktop that starts, forks or is destroyed here may change: its kept digests are dropped
 *   and the streams being sent of it are cut (source.ts). A start also ends its life as an
 *   imported copy: from then on an abort keeps it.
 * - A desktop that starts or is destroyed here is read by no move any more: the tickets its
 *   exports granted are revoked (tickets.ts). A start on the source is a move rolled back, a
 *   destroy is a move finished (or the desktop gone); a later move exports again. A fork keeps
 *   them (the desktop stays where it is, and a fresh listing lists what it is now), and so does
 *   the stop for a move, whose copy may fetch with the pre-copy's ticket.
 * - An import runs inside its desktop's queue; an abort or a destroy of that desktop cancels it
 *   first (they would otherwise wait behind a copy nobody wants any more). So does a pre-copy's
 *   import on the target; the source's side of a pre-copy only picks files in the queue, and its
 *   stream goes out from the transfer server while the desktop runs on.
 */
import { AgentFailure, parseMessage } from '../../../shared/src/protocol.js';
import {
  ExportPayload, ImportAbortPayload, ImportPayload, type ExportResult, type ImportProgressPayload, type ImportResult, type ListingMode,
} from '../../../shared/src/transfer.js';
import { PrecopyExportPayload, PrecopyImportPayload, type PrecopyExportResult, type PrecopyImportResult } from '../../../shared/src/precopy.js';
import type { RuntimeDriver } from '../runtime/driver.js';
import type { DesktopTransfer } from '../runtime/transfer.js';
import { importDesktop, type ImportSpec } from './importer.js';
import { importPrecopy } from './precopy-import.js';
import type { TransferSource } from './source.js';

export interface MovesDeps {
  readonly driver: RuntimeDriver;
  /** The sending side; null when the transfer server is turned off here. */
  readonly source: TransferSource | null;
  /** Where the transfer server is reached, `http://host:port`. */
  readonly url: string | null;
  readonly log: (msg: string, fields?: object) => void;
  /** Passed to the importer (tests shorten them). */
  readonly retries?: number;
  readonly backoffMs?: number;
}

/** A lifecycle command's desktop, generation and leader term, as the handlers fence them. */
interface Fenced {
  readonly desktop_id: string;
  readonly generation: number;
  readonly leader_epoch?: number;
}

/** What the handlers lend a move command: their queue and fences, and the link it came on. */
export interface CommandRunner {
  /** Runs `work` in the desktop's queue, behind the epoch and generation fences. */
  lifecycle(cmd: Fenced, work: () => Promise<unknown>): Promise<unknown>;
  /** Whether the command would pass the fences now. */
  current(cmd: Fenced): boolean;
  notify: ((type: string, payload: unknown) => void) | undefined;
}

export type MoveCommand = 'desktop.export' | 'desktop.import' | 'desktop.import.abort' | 'desktop.precopy.export' | 'desktop.precopy.import';

export class DesktopMoves {
  private readonly imports = new Map<string, AbortController>();

  constructor(private readonly deps: MovesDeps) {}

  /** Validates and runs one of the three move commands. */
  command(type: MoveCommand, raw: unknown, run: CommandRunner): Promise<unknown> {
    try {
      switch (type) {
        case 'desktop.export': {
          const p = parseMessage(ExportPayload, raw, `${type} payload`);
          return run.lifecycle(p, () => this.exportDesktop(p.desktop_id, p.generation, p.ttl_ms, p.listing ?? 'hashed', p.reuse ?? null));
        }
        case 'desktop.import': {
          const p = parseMessage(ImportPayload, raw, `${type} payload`);
          const { notify } = run;
          const progress = notify && ((payload: ImportProgressPayload) => notify('desktop.import.progress', payload));
          const spec = { desktopId: p.desktop_id, generation: p.generation, tier: p.tier, source: p.source, ...(p.operation_id === undefined ? {} : { operationId: p.operation_id }) };
          return run.lifecycle(p, () => this.importDesktop(spec, progress));
        }
        case 'desktop.precopy.export': {
          const p = parseMessage(PrecopyExportPayload, raw, `${type} payload`);
          return run.lifecycle(p, () => this.exportPrecopy(p.desktop_id, p.generation, p.ttl_ms));
        }
        case 'desktop.precopy.import': {
          const p = parseMessage(PrecopyImportPayload, raw, `${type} payload`);
          const spec = { desktopId: p.desktop_id, generation: p.generation, precopyId: p.precopy_id, source: p.source };
          return run.lifecycle(p, () => this.importPrecopy(spec));
        }
        case 'desktop.import.abort': {
          const p = parseMessage(ImportAbortPayload, raw, `${type} payload`);
          // At once: the import it stops holds the desktop's queue, in which the abort waits.
          if (run.current(p)) this.cancelImport(p.desktop_id);
          return run.lifecycle(p, async () => {
            await this.abortImport(p.desktop_id);
            return {};
          });
        }
      }
    } catch (err) {
      return Promise.reject(err);
    }
  }

  async exportDesktop(desktopId: string, generation: number, ttlMs: number, listing: ListingMode = 'hashed', reuse: string | null = null): Promise<ExportResult> {
    const transfer = this.transfer();
    if (this.deps.source === null || this.deps.url === null) {
      throw new AgentFailure('unsupported', 'the transfer server is turned off on this host', false);
    }
    const here = await transfer.inspect(desktopId);
    if (!here.held) throw new AgentFailure('not_found', `no disk for ${desktopId} on this host`, false);
    if (here.running) throw new AgentFailure('conflict', `${desktopId} is running on this host; hibernate it first`, false);
    const { ticket, units, total_bytes } = await this.deps.source.exportDesktop(desktopId, generation, ttlMs, listing, reuse);
    return { url: this.deps.url, ticket, units, total_bytes };
  }

  async exportPrecopy(desktopId: string, generation: number, ttlMs: number): Promise<PrecopyExportResult> {
    const transfer = this.transfer();
    if (this.deps.source === null || this.deps.url === null) {
      throw new AgentFailure('unsupported', 'the transfer server is turned off on this host', false);
    }
    if (!(await transfer.inspect(desktopId)).held) throw new AgentFailure('not_found', `no disk for ${desktopId} on this host`, false);
    const { ticket, id, files, bytes } = await this.deps.source.exportPrecopy(desktopId, generation, ttlMs);
    return { url: this.deps.url, ticket, precopy_id: id, files, bytes };
  }

  async importPrecopy(spec: { desktopId: string; generation: number; precopyId: string; source: { url: string; ticket: string } }): Promise<PrecopyImportResult> {
    const transfer = this.transfer();
    const cancel = new AbortController();
    this.imports.set(spec.desktopId, cancel);
    try {
      return await importPrecopy({ transfer, signal: cancel.signal, log: this.deps.log }, spec);
    } finally {
      if (this.imports.get(spec.desktopId) === cancel) this.imports.delete(spec.desktopId);
    }
  }

  async importDesktop(
    spec: ImportSpec,
    progress?: (payload: ImportProgressPayload) => void,
  ): Promise<ImportResult> {
    const transfer = this.transfer();
    const cancel = new AbortController();
    this.imports.set(spec.desktopId, cancel);
    try {
      return await importDesktop(
        {
          transfer,
          signal: cancel.signal,
          log: this.deps.log,
          ...(progress === undefined ? {} : { progress }),
          ...(this.deps.retries === undefined ? {} : { retries: this.deps.retries }),
          ...(this.deps.backoffMs === undefined ? {} : { backoffMs: this.deps.backoffMs }),
        },
        spec,
      );
    } finally {
      if (this.imports.get(spec.desktopId) === cancel) this.imports.delete(spec.desktopId);
    }
  }

  /** Removes what an import staged or installed of a desktop that never started here. */
  async abortImport(desktopId: string): Promise<void> {
    await this.transfer().discard(desktopId);
  }

  /** Cancels an import of the desktop in progress, at once (outside the desktop's queue). */
  cancelImport(desktopId: string): void {
    this.imports.get(desktopId)?.abort();
  }

  /**
   * The desktop starts here: see the module comment. Answers whether it starts here for the first
   * time since it was moved here.
   */
  async starting(desktopId: string): Promise<boolean> {
    this.deps.source?.revoke(desktopId);
    this.deps.source?.invalidate(desktopId);
    return (await this.deps.driver.transfer?.started(desktopId)) ?? false;
  }

  /**
   * The desktop stopped here for a move: what the target will ask of it first is counted now
   * (TransferSource.prime), while the scheduler moves on to the import.
   */
  stoppedForMove(desktopId: string, generation: number): void {
    this.deps.source?.prime(desktopId, generation);
  }

  /** The desktop forks here: its own unit changes (its writable layer is frozen). */
  forking(desktopId: string): void {
    this.deps.source?.invalidate(desktopId);
  }

  /**
   * The desktop is about to be destroyed here: its tickets go first, so that nothing of it is
   * sent from here even should removing its disk fail (the scheduler sends the destroy again).
   */
  destroying(desktopId: string): void {
    this.deps.source?.revoke(desktopId);
  }

  /** The desktop was destroyed here: nothing of it may be sent, and its staging goes. */
  async destroyed(desktopId: string): Promise<void> {
    this.deps.source?.invalidate(desktopId);
    await this.deps.driver.transfer?.discard(desktopId);
  }

  private transfer(): DesktopTransfer {
    const transfer = this.deps.driver.transfer;
    if (transfer === undefined) throw new AgentFailure('unsupported', 'this runtime cannot move desktops', false);
    return transfer;
  }
}

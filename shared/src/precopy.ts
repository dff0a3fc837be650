/**
 * Pre-copy (protocol 1.12): copying an awake desktop's cold files to the target while it still
 * runs, so that only what changed since, and its memory, travel after it stops
 * (scheduler/src/engine/move.ts, phase `precopied`). As QEMU's pre-copy migration does for RAM,
 * one round here: files hot at the look go with the stop.
 *
 *   1. `desktop.precopy.export` to the source: it picks the files (agent/src/runtime/sandbox/host/
 *      precopy-files.ts), remembers each one's identity (inode, size, ctime, mtime) under a new
 *      `precopy_id`, and grants a ticket as `desktop.export` does.
 *   2. `desktop.precopy.import` to the target: it fetches `GET {url}/v1/transfer/{desktop_id}/
 *      precopy/{precopy_id}` (one tar stream of those files, with the `x-canto-sha256` trailer),
 *      verifies it and keeps it in staging, marked with the id. The source, once it has sent the
 *      stream, looks at every file again and keeps only those unchanged while they were read.
 *   3. After the stop, the target's import asks for the listing with `?reuse={precopy_id}` when
 *      it holds that pre-copy whole. The source lists the `desktop` unit without the files still
 *      unchanged, naming them in the unit's `reuse`; the fetches of the unit carry the same query.
 *      A source that no longer knows the id (it restarted) lists the unit whole.
 *
 * Best effort throughout: a pre-copy that fails or is refused leaves the move to copy everything
 * at the stop, as before 1.12.
 */
import { Type, type Static } from '@sinclair/typebox';
import { DesktopRef } from './desktop-ref.js';

const LeaderEpoch = { leader_epoch: Type.Optional(Type.Integer({ minimum: 0 })) };

export const PRECOPY_ID_PATTERN = '^pc_[A-Za-z0-9_-]{16,64}$';

export const PrecopyExportPayload = Type.Object({
  ...DesktopRef,
  ...LeaderEpoch,
  ttl_ms: Type.Integer({ minimum: 1000, maximum: 86_400_000 }),
});
export const PrecopyExportResult = Type.Object({
  url: Type.String({ minLength: 1 }),
  ticket: Type.String({ minLength: 32 }),
  precopy_id: Type.String({ pattern: PRECOPY_ID_PATTERN }),
  /** Files picked, and the sum of their sizes (the stream is a little longer: tar headers). */
  files: Type.Integer({ minimum: 0 }),
  bytes: Type.Integer({ minimum: 0 }),
});
export type PrecopyExportResult = Static<typeof PrecopyExportResult>;

export const PrecopyImportPayload = Type.Object({
  ...DesktopRef,
  ...LeaderEpoch,
  precopy_id: Type.String({ pattern: PRECOPY_ID_PATTERN }),
  source: Type.Object({ url: Type.String({ minLength: 1 }), ticket: Type.String({ minLength: 32 }) }),
});
export const PrecopyImportResult = Type.Object({
  /** Bytes of the stream fetched. */
  fetched_bytes: Type.Integer({ minimum: 0 }),
});
export type PrecopyImportResult = Static<typeof PrecopyImportResult>;

/** In a listing asked for with `?reuse=`: the pre-copy the `desktop` unit leaves files of out. */
export const UnitReuse = Type.Object({
  precopy_id: Type.String({ pattern: PRECOPY_ID_PATTERN }),
  /** Member names of the files left out; the target puts its pre-copied ones there. */
  paths: Type.Array(Type.String({ minLength: 1, maxLength: 4096 })),
});
export type UnitReuse = Static<typeof UnitReuse>;

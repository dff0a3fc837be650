/**
 * Moving a desktop between hosts (protocol 1.8): what the scheduler asks of the two agents, and
 * the HTTP surface one agent serves the other. Bulk bytes never pass through the scheduler.
 *
 * A stopped desktop is a set of *units*: its own directory (writable layer, memory snapshot,
 * display record, markers) and each frozen disk layer its chain stands on. Each unit travels as
 * one deterministic tar stream, so the same bytes come out every time the source is asked while
 * the desktop stays stopped; that is what makes a broken copy resumable at a byte offset.
 *
 *   1. `desktop.export` to the source: it checks the desktop is stopped there and grants a ticket
 *      (a bearer secret, bound to the desktop and its generation, valid `ttl_ms` or until the
 *      desktop starts or is destroyed there, usable for every request of this copy; one the
 *      source no longer knows fails the import retryably, and the next try exports again) and
 *      answers where its transfer server listens and the units. A sized listing (1.10) gives
 *      each unit's size without reading it (tar counts a stream it writes to /dev/null without
 *      reading file data) and leaves the hash to the fetch's trailer: the bytes are read once per
 *      move instead of twice.
 *   2. `desktop.import` to the target: it fetches `GET {url}/v1/transfer/{desktop_id}/units`
 *      and then each unit it does not already hold (`GET …/units/{unit}?offset=N` resumes a
 *      partial one; the answer's `x-canto-sha256` trailer is the whole unit's hash, or the
 *      digest at the end of the raw stream, RAW_UNIT_PROTOCOL below), verifies
 *      every unit's sha256, and installs the desktop and any layer it lacks atomically. A repeated
 *      import finds the work done. Layers it already holds (a fork moved earlier) are not fetched.
 *   3. The scheduler commits the new host in its database; only then does it send
 *      `desktop.destroy` to the source, which drops the source copy (shared layers stay while
 *      another desktop there stands on them).
 *   Rollback before the commit: `desktop.import.abort` to the target removes what it staged or
 *   installed of a desktop that never started there; the source copy was never touched.
 */
import { Type, type Static } from '@sinclair/typebox';
import { DesktopRef } from './desktop-ref.js';
import { PRECOPY_ID_PATTERN, UnitReuse } from './precopy.js';
import { TierSchema } from './tiers.js';

const LeaderEpoch = { leader_epoch: Type.Optional(Type.Integer({ minimum: 0 })) };

/** A unit id: `desktop`, or `layer-<layer id>`. Safe as a path component and a URL segment. */
export const UNIT_ID_PATTERN = '^(desktop|layer-[A-Za-z0-9_-]{1,64})$';

export const TransferUnit = Type.Object({
  id: Type.String({ pattern: UNIT_ID_PATTERN }),
  /** Size of the unit's tar stream in bytes. */
  bytes: Type.Integer({ minimum: 0 }),
  /**
   * sha256 of the unit's tar stream, hex. Absent from a sized listing (1.10), where the hash
   * comes only as the trailer of the unit's fetch.
   */
  sha256: Type.Optional(Type.String({ pattern: '^[0-9a-f]{64}$' })),
  /**
   * Which contents the listing describes (1.10): the same id and version always mean the same
   * bytes, so an importer may keep what it fetched of a unit while its version stays.
   */
  version: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  /** The files of a pre-copy this unit leaves out (1.12, shared/src/precopy.ts). */
  reuse: Type.Optional(UnitReuse),
});
export type TransferUnit = Static<typeof TransferUnit>;

export const ExportPayload = Type.Object({
  ...DesktopRef,
  ...LeaderEpoch,
  ttl_ms: Type.Integer({ minimum: 1000, maximum: 86_400_000 }),
  /**
   * `sized` (1.10): list units by size only, without hashing them first; their fetches carry the
   * hash as a trailer. Sent only when both agents speak 1.10. Default `hashed`.
   */
  listing: Type.Optional(Type.Union([Type.Literal('hashed'), Type.Literal('sized')])),
  /**
   * (1.13) The pre-copy the target holds: a sized listing counts the `desktop` unit without its
   * unchanged pre-copied files, as the target's own listing request (`?reuse=`) will ask, so
   * the unit is counted once, not once whole and once again without them.
   */
  reuse: Type.Optional(Type.String({ pattern: PRECOPY_ID_PATTERN })),
});
export type ListingMode = 'hashed' | 'sized';
export const ExportResult = Type.Object({
  /** `http://host:port` of the source's transfer server. */
  url: Type.String({ minLength: 1 }),
  ticket: Type.String({ minLength: 32 }),
  units: Type.Array(TransferUnit),
  total_bytes: Type.Integer({ minimum: 0 }),
});
export type ExportResult = Static<typeof ExportResult>;

export const ImportPayload = Type.Object({
  ...DesktopRef,
  ...LeaderEpoch,
  /**
   * 1.15: the move this import belongs to. A copy an earlier move left here at the same generation
   * (it failed after the install and could not abort it) is another move's: fetched afresh.
   */
  operation_id: Type.Optional(Type.String({ minLength: 1 })),
  tier: TierSchema,
  source: Type.Object({ url: Type.String({ minLength: 1 }), ticket: Type.String({ minLength: 32 }) }),
});
export const ImportResult = Type.Object({
  /** Bytes fetched by this command (0 when everything was already there). */
  fetched_bytes: Type.Integer({ minimum: 0 }),
  /** Bytes of the units that were already verified or partly fetched before this command. */
  resumed_bytes: Type.Integer({ minimum: 0 }),
  units: Type.Integer({ minimum: 0 }),
});
export type ImportResult = Static<typeof ImportResult>;

export const ImportAbortPayload = Type.Object({ ...DesktopRef, ...LeaderEpoch });
export const ImportAbortResult = Type.Object({});

/** Notification (agent → scheduler) while an import runs, at most a few times a second. */
export const ImportProgressPayload = Type.Object({
  desktop_id: Type.String(),
  done_bytes: Type.Integer({ minimum: 0 }),
  total_bytes: Type.Integer({ minimum: 0 }),
});
export type ImportProgressPayload = Static<typeof ImportProgressPayload>;

/** The HTTP header carrying a unit's sha256 as a trailer of its stream. */
export const SHA256_TRAILER = 'x-canto-sha256';

/**
 * The `Upgrade` token under which a unit's stream comes raw, with no HTTP framing to parse (the
 * receiver reads it into buffers it reuses). A source that predates it ignores the header and
 * answers the chunked stream, so this needs no protocol version. After
 * `101 Switching Protocols` with `x-canto-offset` and `x-canto-unit-bytes` headers, the source
 * sends exactly the unit's bytes from the offset, then the whole stream's sha256 as 64 hex
 * characters, and closes. A stream whose length turns out other than announced is cut instead.
 * A pre-copy (whose length is not known ahead) is answered `101` without those headers: its bytes
 * run to the end of the connection, the last 64 characters being the digest, and a failed one is
 * cut with a reset.
 */
export const RAW_UNIT_PROTOCOL = 'canto-unit/1';

/** Length of the digest that ends a raw unit stream. */
export const RAW_DIGEST_CHARS = 64;

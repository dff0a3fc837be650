/**
 * Desktops of every org as operators need to see them: where each one is (host, and whether that
 * host is up), its state and generation, and the operation at work on it, if any. The org API
 * shows a desktop to its own org only; an SRE with a host down or a drain stopped needs to know
 * which desktops are on that host, and which one a move is carrying.
 *
 * Listed in id order, a page at a time (`after` the last id of the previous page), so a page is
 * stable however many desktops are created meanwhile. Destroyed desktops are left out unless the
 * `destroyed` state is asked for.
 */
import { Type, type Static } from '@sinclair/typebox';
import { idPattern } from '../../../shared/src/ids.js';
import type postgres from 'postgres';
import type { Sql } from '../store/db.js';
import { DESKTOP_STATES, type DesktopState } from '../store/rows.js';
import { errors } from '../errors.js';

const nullable = <T extends ReturnType<typeof Type.String>>(schema: T) => Type.Union([schema, Type.Null()]);

export const AdminDesktopJson = Type.Object({
  id: Type.String({ description: '`dsk_…`' }),
  org_id: Type.String({ description: '`org_…`' }),
  state: Type.Union(DESKTOP_STATES.map((s) => Type.Literal(s))),
  tier: Type.String(),
  host_id: nullable(Type.String({ description: 'The host holding its disk; null before its first placement' })),
  host_state: Type.Union([Type.Literal('ready'), Type.Literal('down'), Type.Null()], { description: "Its host's state; null without a host" }),
  generation: Type.Integer({ minimum: 0 }),
  ephemeral: Type.Boolean(),
  forked_from: nullable(Type.String({ description: 'The desktop it was forked from' })),
  created_at: Type.String({ format: 'date-time' }),
  last_woken_at: nullable(Type.String({ format: 'date-time' })),
  operation: Type.Union(
    [
      Type.Object({
        id: Type.String({ description: '`op_…`: read it with GET /admin/v1/operations/{id}' }),
        kind: Type.String({ description: '`wake`, `hibernate`, `destroy`, `fork` or `move`' }),
        state: Type.Union([Type.Literal('pending'), Type.Literal('running')]),
        phase: nullable(Type.String({ description: "A move's phase; null for other kinds" })),
      }),
      Type.Null(),
    ],
    { description: 'The operation at work on the desktop (at most one is open at a time); null when none' },
  ),
});
export type AdminDesktopJson = Static<typeof AdminDesktopJson>;

export const MAX_DESKTOP_PAGE = 1000;
const DEFAULT_DESKTOP_PAGE = 100;

export const AdminDesktopQuery = Type.Object(
  {
    host_id: Type.Optional(Type.String({ pattern: idPattern('host'), description: 'Only the desktops on this host' })),
    org_id: Type.Optional(Type.String({ pattern: idPattern('org'), description: "Only this org's desktops" })),
    state: Type.Optional(Type.Union(DESKTOP_STATES.map((s) => Type.Literal(s)), { description: 'Only desktops in this state; destroyed ones are listed only when asked for' })),
    limit: Type.Optional(Type.String({ pattern: '^[0-9]{1,4}$', description: `Desktops per page, 1 to ${MAX_DESKTOP_PAGE}; default ${DEFAULT_DESKTOP_PAGE}` })),
    after: Type.Optional(Type.String({ pattern: idPattern('desktop'), description: 'The `next_after` of the previous page' })),
  },
  { additionalProperties: false },
);
export type AdminDesktopQuery = Static<typeof AdminDesktopQuery>;

export const AdminDesktopPage = Type.Object({
  desktops: Type.Array(AdminDesktopJson),
  next_after: nullable(Type.String({ description: 'Pass as `after` for the next page; null on the last one' })),
});
export type AdminDesktopPage = Static<typeof AdminDesktopPage>;

interface AdminDesktopRow {
  id: string;
  org_id: string;
  state: DesktopState;
  tier: string;
  host_id: string | null;
  host_status: 'ready' | 'down' | null;
  generation: number;
  ephemeral: boolean;
  forked_from: string | null;
  created_at: Date;
  last_woken_at: Date | null;
  op_id: string | null;
  op_kind: string | null;
  op_state: 'pending' | 'running' | null;
  op_phase: string | null;
}

function desktopJson(r: AdminDesktopRow): AdminDesktopJson {
  return {
    id: r.id,
    org_id: r.org_id,
    state: r.state,
    tier: r.tier,
    host_id: r.host_id,
    host_state: r.host_status,
    generation: r.generation,
    ephemeral: r.ephemeral,
    forked_from: r.forked_from,
    created_at: r.created_at.toISOString(),
    last_woken_at: r.last_woken_at?.toISOString() ?? null,
    operation: r.op_id === null ? null : { id: r.op_id, kind: r.op_kind!, state: r.op_state!, phase: r.op_kind === 'move' ? r.op_phase : null },
  };
}

async function selectDesktops(sql: Sql, where: postgres.Fragment, limit: number): Promise<AdminDesktopRow[]> {
  return sql<AdminDesktopRow[]>`
    SELECT d.id, d.org_id, d.state, d.tier, d.host_id, h.status AS host_status, d.generation, d.ephemeral, d.forked_from,
           d.created_at, d.last_woken_at, o.id AS op_id, o.kind AS op_kind, o.state AS op_state, o.params->>'phase' AS op_phase
    FROM desktops d
    LEFT JOIN hosts h ON h.id = d.host_id
    LEFT JOIN LATERAL (
      SELECT id, kind, state, params FROM operations
      WHERE desktop_id = d.id AND state IN ('pending', 'running') ORDER BY created_at LIMIT 1
    ) o ON true
    WHERE ${where}
    ORDER BY d.id
    LIMIT ${limit}`;
}

export class AdminDesktops {
  constructor(private readonly sql: Sql) {}

  async list(q: AdminDesktopQuery): Promise<AdminDesktopPage> {
    const { sql } = this;
    const limit = q.limit === undefined ? DEFAULT_DESKTOP_PAGE : Number(q.limit);
    if (limit < 1 || limit > MAX_DESKTOP_PAGE) throw errors.badRequest(`limit must be between 1 and ${MAX_DESKTOP_PAGE}, got ${q.limit}`);
    const where = sql`true
      ${q.state === undefined ? sql`AND d.state <> 'destroyed'` : sql`AND d.state = ${q.state}`}
      ${q.host_id === undefined ? sql`` : sql`AND d.host_id = ${q.host_id}`}
      ${q.org_id === undefined ? sql`` : sql`AND d.org_id = ${q.org_id}`}
      ${q.after === undefined ? sql`` : sql`AND d.id > ${q.after}`}`;
    // One more than the page: whether another page follows, without a count.
    const rows = await selectDesktops(sql, where, limit + 1);
    const page = rows.slice(0, limit);
    return { desktops: page.map(desktopJson), next_after: rows.length > limit ? page.at(-1)!.id : null };
  }

  async get(id: string): Promise<AdminDesktopJson> {
    const [row] = await selectDesktops(this.sql, this.sql`d.id = ${id}`, 1);
    if (!row) throw errors.desktopNotFound();
    return desktopJson(row);
  }
}

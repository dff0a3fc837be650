/**
 * Desktop records: create (with per-org idempotency), list, get and patch. `env` and
 * `setup_script` are sealed with the scheduler's secret key before they touch the database and
 * are never returned.
 */
import { inTransaction, type Sql } from '../store/db.js';
import * as store from '../store/desktops.js';
import type { DesktopRow, DesktopState } from '../store/rows.js';
import { errors } from '../errors.js';
import type { CreateDesktopBody, DesktopJson } from '../api/schemas.js';
import { toDesktopJson } from './json.js';
import { DesktopReads } from '../store/desktop-reads.js';
import { DesktopList } from './desktop-list.js';
import { notifyNewWork } from '../store/operations.js';
import type { SecretBox } from '../crypto/secret-box.js';
import { sealDesktopSecret } from '../crypto/desktop-secrets.js';

export const ENV_MAX_BYTES = 64 * 1024;
export const SETUP_SCRIPT_MAX_BYTES = 64 * 1024;

export interface DesktopServiceDeps {
  sql: Sql;
  secrets: SecretBox;
  defaultImageVersion: string;
  /** Desktops an org may hold (CANTO_ORG_DESKTOP_QUOTA); 0: no quota. */
  orgDesktopQuota: number;
}

export class DesktopService {
  private readonly reads: DesktopReads;
  private readonly list: DesktopList;

  constructor(private readonly deps: DesktopServiceDeps) {
    this.reads = new DesktopReads(deps.sql);
    this.list = new DesktopList(deps.sql);
  }

  async create(orgId: string, body: CreateDesktopBody, idempotencyKey: string | null): Promise<{ created: boolean; desktop: DesktopJson }> {
    checkCaps(body);
    const { sql, secrets } = this.deps;
    if (idempotencyKey) {
      const existing = await store.idempotentDesktop(sql, orgId, idempotencyKey);
      if (existing) return { created: false, desktop: toDesktopJson((await store.getDesktop(sql, orgId, existing))!) };
    }
    const sealedEnv = body.env && Object.keys(body.env).length > 0 ? sealDesktopSecret(secrets, orgId, 'env', JSON.stringify(body.env)) : null;
    const sealedScript = body.setup_script ? sealDesktopSecret(secrets, orgId, 'setup_script', body.setup_script) : null;
    const outcome = await inTransaction(sql, async (tx) => {
      const row = await store.insertDesktop(tx, {
        orgId,
        tier: body.tier,
        imageVersion: body.image_version ?? this.deps.defaultImageVersion,
        idleTimeoutSecs: body.idle_timeout_secs ?? 0,
        billingMode: body.billing_mode || 'hourly',
        envSealed: sealedEnv,
        setupScriptSealed: sealedScript,
      });
      if (idempotencyKey && !(await store.claimDesktopKey(tx, orgId, idempotencyKey, row.id))) {
        // A concurrent request with the same key won; roll this desktop back and return theirs.
        throw new KeyTaken();
      }
      // Counted with the new row, after the key: a repeat that lost the race answers the winner.
      const quota = this.deps.orgDesktopQuota;
      if (quota > 0 && (await store.heldByOrgLocked(tx, orgId)) > quota) throw errors.desktopQuota(quota);
      // Delivered at commit: the leader's engine places the desktop now, not at its next poll.
      await notifyNewWork(tx, row.id);
      return row;
    }).catch((err: unknown) => {
      if (err instanceof KeyTaken) return null;
      throw err;
    });
    if (!outcome) {
      const winner = (await store.idempotentDesktop(sql, orgId, idempotencyKey!))!;
      return { created: false, desktop: toDesktopJson((await store.getDesktop(sql, orgId, winner))!) };
    }
    return { created: true, desktop: toDesktopJson(outcome) };
  }

  /** The org's list as `render` writes it, answered from memory while unchanged (desktop-list.ts). */
  listBody(orgId: string, state: DesktopState | null, render: (desktops: DesktopJson[]) => string): Promise<Buffer> {
    return this.list.body(orgId, state, render);
  }

  /** The API's view of one desktop, read in a batch with the other reads of this turn. */
  async get(orgId: string, id: string): Promise<DesktopJson> {
    const view = await this.reads.get(orgId, id);
    if (!view) throw errors.desktopNotFound();
    return toDesktopJson(view);
  }

  async row(orgId: string, id: string): Promise<DesktopRow> {
    const row = await store.getDesktop(this.deps.sql, orgId, id);
    if (!row) throw errors.desktopNotFound();
    return row;
  }

  async patch(orgId: string, id: string, body: { idle_timeout_secs?: number }): Promise<DesktopJson> {
    if (body.idle_timeout_secs === undefined) return this.get(orgId, id);
    const row = await store.setIdleTimeout(this.deps.sql, orgId, id, body.idle_timeout_secs);
    if (!row) throw errors.desktopNotFound();
    return toDesktopJson(row);
  }
}

class KeyTaken extends Error {}

function checkCaps(body: CreateDesktopBody): void {
  if (body.env && Buffer.byteLength(JSON.stringify(body.env)) > ENV_MAX_BYTES) {
    throw errors.badRequest(`env exceeds ${ENV_MAX_BYTES} bytes serialized`);
  }
  if (body.setup_script !== undefined && Buffer.byteLength(body.setup_script) > SETUP_SCRIPT_MAX_BYTES) {
    throw errors.badRequest(`setup_script exceeds ${SETUP_SCRIPT_MAX_BYTES} bytes`);
  }
}

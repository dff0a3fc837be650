/**
 * A desktop's write-only secrets (`env` and `setup_script`), sealed bound to their context: the
 * desktop's org and the field. The context is the seal's associated data (secret-box.ts), so a
 * value someone who can write the database but lacks the key copies into another org's desktop,
 * or from one field into the other, no longer opens: the first boot that would hand it to the
 * guest fails instead. The org, not the desktop, is the context because forks inherit their
 * source's sealed values as they are (store/desktops.ts), and a fork of a desktop never woken
 * opens them at its own first boot.
 *
 * Values sealed before this binding (`secrets_bound` false) open without a context, and every
 * scheduler start seals them again, bound (`bindLegacySecrets`), so they do not stay that way:
 * after the first start of this version only rows an older replica writes during a rolling
 * upgrade are unbound, until the next start. A value always opens bound first, whatever the row's
 * flag says (a fork an older replica made copies the value, not the flag); the flag only lets an
 * unbound one open without a context. So the flag, which a database writer can set too, opens
 * nothing sealed by this version: what it still lets through is a value sealed before it, which
 * such a writer would have to have kept (a backup), and the next start then binds it to the org of
 * the row it was put in.
 */
import type { Logger } from '../../../shared/src/log.js';
import type { Sql } from '../store/db.js';
import type { SecretBox } from './secret-box.js';

export type DesktopSecretField = 'env' | 'setup_script';

function context(orgId: string, field: DesktopSecretField): string {
  return `canto desktop ${field} of ${orgId}`;
}

export function sealDesktopSecret(box: SecretBox, orgId: string, field: DesktopSecretField, plaintext: string): Buffer {
  return box.seal(plaintext, context(orgId, field));
}

/**
 * Opens a value bound to its org and field, or, on a row not marked bound (`secrets_bound` false:
 * sealed before the binding), one sealed without a context. Throws when it was altered or moved.
 */
export function openDesktopSecret(box: SecretBox, orgId: string, field: DesktopSecretField, sealed: Buffer, bound: boolean): string {
  try {
    return box.open(sealed, context(orgId, field));
  } catch (err) {
    if (bound) throw err;
    return box.open(sealed);
  }
}

interface LegacyRow {
  id: string;
  org_id: string;
  env_sealed: Buffer | null;
  setup_script_sealed: Buffer | null;
}

/**
 * Seals every unbound value again, bound to its org; returns how many desktops were. A value
 * that does not open (another key, or altered) is left as it is and logged: its first boot will
 * fail the same way it would have. Each row is written only if it is still what was read.
 */
export async function bindLegacySecrets(sql: Sql, box: SecretBox, log: Logger): Promise<number> {
  let bound = 0;
  const failed = new Set<string>();
  for (;;) {
    const rows = await sql<LegacyRow[]>`
      SELECT id, org_id, env_sealed, setup_script_sealed FROM desktops
      WHERE NOT secrets_bound AND (env_sealed IS NOT NULL OR setup_script_sealed IS NOT NULL)
        AND NOT (id = ANY(${sql.array([...failed])}::text[]))
      ORDER BY id LIMIT 200`;
    if (rows.length === 0) return bound;
    for (const row of rows) {
      let env: Buffer | null;
      let script: Buffer | null;
      try {
        env = row.env_sealed && sealDesktopSecret(box, row.org_id, 'env', box.open(row.env_sealed));
        script = row.setup_script_sealed && sealDesktopSecret(box, row.org_id, 'setup_script', box.open(row.setup_script_sealed));
      } catch (err) {
        failed.add(row.id);
        log.error({ desktopId: row.id, err: (err as Error).message }, "a desktop's sealed env or setup script does not open with this key; left as it is");
        continue;
      }
      const updated = await sql`
        UPDATE desktops SET env_sealed = ${env}, setup_script_sealed = ${script}, secrets_bound = true
        WHERE id = ${row.id} AND NOT secrets_bound
          AND env_sealed IS NOT DISTINCT FROM ${row.env_sealed} AND setup_script_sealed IS NOT DISTINCT FROM ${row.setup_script_sealed}`;
      bound += updated.count;
    }
  }
}

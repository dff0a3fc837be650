/**
 * What a memory snapshot's guest ran confined by, recorded at the dump and required at the
 * restore. A guest booted by an agent before a confinement existed keeps running without it
 * (nothing puts a seccomp filter on a running process from outside; its /proc is sealed at the
 * agent's start, running-seal.ts, but a descriptor it opened before stays), and its snapshot
 * would bring it back that way at every wake: such a snapshot is refused, and the
 * desktop boots cold, confined, with its disk (criu.ts `restore`).
 *
 * Recorded from the guest init as the kernel shows it: under a seccomp filter (guest-filter.ts),
 * and which of the paths of /proc the agent seals it saw read-only (proc-seal.ts). The filter's own bytes must also be among
 * the filters CRIU kept (seccomp.img keeps each as is): the record alone cannot tell this
 * filter from another version of it.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { GUEST_FILTER, GUEST_FILTER_ID } from '../guest/guest-filter.js';
import { readOnlyProcPaths, SEALED_PROC_PATHS, unsealedProcPaths } from './proc-seal.js';
import { maskedProcFiles } from '../guest/guest-init.js';
import { parseMountTable } from './mount-table.js';
import { existsSync } from 'node:fs';

/** In a snapshot directory. */
const CONFINEMENT_FILE = 'confinement.json';

interface Confinement {
  /** The id of the filter the init ran under (this agent's, when it ran under one), or null. */
  readonly seccomp_filter: string | null;
  /** The sealed paths of /proc (proc-seal.ts) the init saw read-only. */
  readonly proc_read_only: string[];
}

/** Records into `snapshotDir` what the running init `pid` is confined by. */
export async function recordConfinement(snapshotDir: string, pid: number): Promise<void> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
  const record: Confinement = {
    seccomp_filter: /^Seccomp:\s+2$/m.test(status) ? GUEST_FILTER_ID : null,
    proc_read_only: await readOnlyProcPaths(pid),
  };
  await writeFile(join(snapshotDir, CONFINEMENT_FILE), `${JSON.stringify(record)}\n`);
}

/** Throws, saying what is missing, unless the snapshot's guest ran confined as this agent confines guests. */
export async function requireConfinement(snapshotDir: string): Promise<void> {
  const record = JSON.parse(await readFile(join(snapshotDir, CONFINEMENT_FILE), 'utf8').catch(() => '{}')) as Partial<Confinement>;
  const filters = await readFile(join(snapshotDir, 'seccomp.img')).catch(() => null);
  const missing = [
    ...(record.seccomp_filter === GUEST_FILTER_ID && filters !== null && filters.includes(GUEST_FILTER) ? [] : [`the seccomp filter ${GUEST_FILTER_ID}`]),
    // Every path this host seals (one its kernel has): a list that grows refuses older snapshots.
    ...SEALED_PROC_PATHS.filter((p) => existsSync(p) && !(record.proc_read_only ?? []).includes(p)).map((p) => `a read-only ${p}`),
  ];
  if (missing.length > 0) throw new Error(`the memory snapshot's guest runs without ${missing.join(' and ')}, which this host puts every guest under`);
}

/**
 * What a restored guest lacks of its confinement, as the kernel shows its init now (empty when
 * nothing): the record said it had it at the dump, and this checks that CRIU brought it back, as
 * the init checks a cold boot (agent/guest/init.sh).
 */
export async function missingConfinement(pid: number): Promise<string[]> {
  const [status, mountinfo, unsealed] = await Promise.all([
    readFile(`/proc/${pid}/status`, 'utf8').catch(() => ''),
    readFile(`/proc/${pid}/mountinfo`, 'utf8').catch(() => ''),
    unsealedProcPaths(pid),
  ]);
  const mounted = new Set(parseMountTable(mountinfo).map((m) => m.mountPoint));
  return [
    ...(/^Seccomp:\s+2$/m.test(status) ? [] : ['a seccomp filter']),
    ...unsealed.map((p) => `a read-only ${p}`),
    ...maskedProcFiles().filter((f) => !mounted.has(f)).map((f) => `the cover of ${f}`),
  ];
}

/** Throws, naming what is missing, unless the guest of `pid` runs confined (missingConfinement). */
export async function requireRunningConfinement(pid: number): Promise<void> {
  const missing = await missingConfinement(pid);
  if (missing.length > 0) throw new Error(`the restored guest runs without ${missing.join(', ')}`);
}

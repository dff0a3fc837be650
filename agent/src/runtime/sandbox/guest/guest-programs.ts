/**
 * The guest programs: the Perl, shell and awk the agent runs in and around a desktop. Each is a
 * file in its own language under agent/guest/, where `npm run lint` checks it (perl -c under
 * strict and warnings, shellcheck, awk's parser) and an editor sees it for what it is.
 *
 * They are read from disk at first use and kept. Built, the CLI reads them from dist/guest/, which
 * tsup copies there (tsup.config.ts); run from source (vitest, `node --import tsx`), this module
 * finds agent/guest/ four folders up. One mechanism, the same text in all three ways the code runs.
 *
 * Values a Perl program needs from the agent (system call numbers, errno values, open flags,
 * paths, limits) come in as constant subs, `sub NAME () { VALUE }`, written ahead of the program by
 * perlProgram: Perl folds them into the code at compile time like literals, and loads no module
 * for them (startup time is paid on every guest operation). Only the names a program mentions are
 * written. A value is an integer or a string, single-quoted with `\` and `'` escaped, so no value
 * ever becomes code. Shell and awk programs take their values as arguments or environment.
 */
import { constants as fsc, existsSync, readFileSync } from 'node:fs';
import { constants as osc } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export type PerlValue = number | string;

/** Raw system call numbers, which differ between architectures: the one table of them. */
const SYSCALLS: Readonly<Record<string, Readonly<Record<'statx' | 'linkat' | 'setsid' | 'prctl' | 'ppoll' | 'pidfdOpen' | 'exitGroup' | 'capget' | 'capset', number>>>> = {
  x64: { statx: 332, linkat: 265, setsid: 112, prctl: 157, ppoll: 271, pidfdOpen: 434, exitGroup: 231, capget: 125, capset: 126 },
  arm64: { statx: 291, linkat: 37, setsid: 157, prctl: 167, ppoll: 73, pidfdOpen: 434, exitGroup: 94, capget: 90, capset: 91 },
};

/** `__O_TMPFILE` is the same on every Linux architecture Node supports; O_TMPFILE adds O_DIRECTORY. */
const O_TMPFILE = 0o20000000 | fsc.O_DIRECTORY;
const NB = fsc.O_NONBLOCK | fsc.O_NOCTTY;

/** A file whose presence marks the folder (checked when it is located). */
const MARKER = 'cgroup-join.sh';

let folder: string | undefined;

/** Where the guest programs are: beside the bundle, or in the source tree. */
export function guestFolder(): string {
  if (folder !== undefined) return folder;
  const here = dirname(fileURLToPath(import.meta.url));
  const candidates = [join(here, 'guest'), join(here, '..', '..', '..', '..', 'guest')];
  const found = candidates.find((dir) => existsSync(join(dir, MARKER)));
  if (found === undefined) throw new Error(`the guest programs are missing (looked in ${candidates.join(' and ')})`);
  return (folder = found);
}

const texts = new Map<string, string>();

/** The text of one guest program file, by its path under the folder (`helper/op-stat.pl`). */
export function guestFile(name: string): string {
  let text = texts.get(name);
  if (text === undefined) texts.set(name, (text = readFileSync(join(guestFolder(), name), 'utf8')));
  return text;
}

/** The values every Perl program may use: system calls, errno values by name, open flags. */
function sharedValues(): Record<string, PerlValue> {
  const sys = SYSCALLS[process.arch];
  if (sys === undefined) throw new Error(`the guest programs do not know the system calls of ${process.arch}`);
  return {
    ...(osc.errno as Record<string, number>),
    SYS_statx: sys.statx,
    SYS_linkat: sys.linkat,
    SYS_setsid: sys.setsid,
    SYS_prctl: sys.prctl,
    SYS_ppoll: sys.ppoll,
    SYS_pidfd_open: sys.pidfdOpen,
    SYS_exit_group: sys.exitGroup,
    SYS_capget: sys.capget,
    SYS_capset: sys.capset,
    O_RDONLY_NB: fsc.O_RDONLY | NB,
    O_WRONLY_NB: fsc.O_WRONLY | NB,
    O_WRONLY_CREAT_NB: fsc.O_WRONLY | fsc.O_CREAT | NB,
    O_WRONLY_CREAT_EXCL: fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL,
    O_TMPFILE_WRONLY: O_TMPFILE | fsc.O_WRONLY,
  };
}

function perlLiteral(name: string, value: PerlValue): string {
  if (typeof value === 'number') {
    if (!Number.isSafeInteger(value)) throw new Error(`guest constant ${name} is not an integer`);
    return String(value);
  }
  return `'${value.replace(/[\\']/g, (c) => `\\${c}`)}'`;
}

/**
 * A Perl program from its parts (file texts, or text the caller composed), with a constant sub
 * ahead of it for each value it names: the shared ones and `values`, which win on a clash.
 */
export function perlProgram(parts: readonly string[], values: Readonly<Record<string, PerlValue>> = {}): string {
  const body = parts.join('');
  const all = { ...sharedValues(), ...values };
  const words = new Set(body.match(/\b[A-Za-z_][A-Za-z0-9_]*\b/g) ?? []);
  const header = Object.entries(all)
    .filter(([name]) => /^[A-Z][A-Za-z0-9_]*$/.test(name) && words.has(name))
    .map(([name, value]) => `sub ${name} () { ${perlLiteral(name, value)} }\n`);
  return header.join('') + body;
}

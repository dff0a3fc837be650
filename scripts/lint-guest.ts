/**
 * The guest programs' lint (`npm run lint` runs it after eslint): every Perl program the agent can
 * build is compiled by `perl -c` under strict and warnings, exactly as the agent builds it (the
 * constant subs ahead of it included); every shell file goes through shellcheck and every awk file
 * through the parser of the guest's awk (mawk, Debian's default). A warning counts as an error.
 * Files under agent/guest/ that no check reaches fail the run too, so a new program cannot slip by.
 *
 *   node --import tsx scripts/lint-guest.ts
 */
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { pathToFileURL } from 'node:url';
import { criuKeeperProgram } from '../agent/src/runtime/sandbox/host/criu.js';
import { execRelay } from '../agent/src/runtime/sandbox/guest/exec-relay.js';
import { guestHelperProgram, warmHelperProgram, type HelperOp } from '../agent/src/runtime/sandbox/guest/guest-helper.js';
import { execServerProgram, warmPrologue } from '../agent/src/runtime/sandbox/guest/warm-perl.js';
import { forwarderProgram } from '../agent/src/runtime/sandbox/ports/guest-ports-perl.js';
import { guestFile, guestFolder } from '../agent/src/runtime/sandbox/guest/guest-programs.js';
import { guestFilterProgram } from '../agent/src/runtime/sandbox/guest/guest-filter.js';
import { terminalWriterProgram } from '../agent/src/runtime/sandbox/guest/guest-terminal.js';

export interface Finding {
  readonly program: string;
  readonly text: string;
}

const HELPER_OPS: readonly HelperOp[] = ['stat', 'list', 'read', 'write', 'delete', 'spawn', 'status', 'kill-detached', 'xsize'];

/** Every Perl program the agent runs, by a name for the report. */
export function perlPrograms(): Record<string, string> {
  const programs: Record<string, string> = {
    'warm file server': warmHelperProgram(),
    'warm exec server': execServerProgram('exec /bin/sh -c "$0"', 4, 2),
    'warm prologue': warmPrologue(),
    'exec relay': execRelay(),
    'port forwarder': forwarderProgram(),
    'criu keeper': criuKeeperProgram(),
    'terminal writer': terminalWriterProgram(),
    'guest filter': guestFilterProgram(),
  };
  for (const op of HELPER_OPS) programs[`helper ${op}`] = guestHelperProgram(op);
  return programs;
}

/** Compiles a Perl program under strict and warnings; anything but "syntax OK" is a finding. */
export function checkPerl(program: string, text: string): Finding[] {
  const out = spawnSync('perl', ['-Mstrict', '-Mwarnings', '-c', '-e', text], { encoding: 'utf8' });
  if (out.error) return [{ program, text: `cannot run perl: ${out.error.message}` }];
  const said = out.stderr.trim();
  return out.status === 0 && said === '-e syntax OK' ? [] : [{ program, text: said || `perl exited ${out.status}` }];
}

/** shellcheck on a file (its `# shellcheck shell=sh` line says the dialect). */
export function checkShell(path: string): Finding[] {
  const out = spawnSync('shellcheck', ['--format=gcc', path], { encoding: 'utf8' });
  if (out.error) return [{ program: path, text: `cannot run shellcheck (scripts/setup installs it): ${out.error.message}` }];
  return out.status === 0 ? [] : [{ program: path, text: (out.stdout + out.stderr).trim() }];
}

/** mawk's parser: `-W dump` compiles the program and lists it, without running it. */
export function checkAwk(path: string): Finding[] {
  const out = spawnSync('mawk', ['-W', 'dump', '-f', path], { encoding: 'utf8' });
  if (out.error) return [{ program: path, text: `cannot run mawk: ${out.error.message}` }];
  return out.status === 0 && out.stderr.trim() === '' ? [] : [{ program: path, text: out.stderr.trim() || `mawk exited ${out.status}` }];
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? filesUnder(join(dir, e.name)) : [join(dir, e.name)],
  );
}

/** Every finding for the guest programs in the folder. */
export function lintGuest(): Finding[] {
  const findings: Finding[] = [];
  const programs = perlPrograms();
  for (const [name, text] of Object.entries(programs)) findings.push(...checkPerl(name, text));
  const folder = guestFolder();
  for (const path of filesUnder(folder)) {
    const name = relative(folder, path);
    if (name.endsWith('.sh')) findings.push(...checkShell(path));
    else if (name.endsWith('.awk')) findings.push(...checkAwk(path));
    else if (name.endsWith('.pl')) {
      if (!Object.values(programs).some((text) => text.includes(guestFile(name)))) {
        findings.push({ program: name, text: 'no program the agent builds uses this file, so nothing checks it' });
      }
    } else if (name !== 'README.md') {
      findings.push({ program: name, text: 'not a guest program the lint knows (.pl, .sh, .awk)' });
    }
  }
  return findings;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const findings = lintGuest();
  for (const f of findings) console.error(`${f.program}: ${f.text}`);
  if (findings.length > 0) {
    console.error(`guest programs: ${findings.length} problem(s) in ${relative(process.cwd(), guestFolder())}`);
    process.exitCode = 1;
  }
}

/**
 * The guest programs (agent/guest/) outside any desktop: each one that needs no guest runs here
 * against stand-ins (temporary directories for cgroups and the guest's files, /bin/sh for the
 * guest command), as the agent builds it. The lint's own checks are shown to fail on broken
 * programs, so a clean `npm run lint` means something.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { JOIN_FAILED, joinArgv } from '../../agent/src/runtime/sandbox/cgroups.js';
import { criuKeeperProgram } from '../../agent/src/runtime/sandbox/criu.js';
import { execRelay } from '../../agent/src/runtime/sandbox/exec-relay.js';
import { guestHelperProgram } from '../../agent/src/runtime/sandbox/guest-helper.js';
import { perlProgram } from '../../agent/src/runtime/sandbox/guest-programs.js';
import { checkAwk, checkPerl, checkShell, lintGuest } from '../../scripts/lint-guest.js';

let dir: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'canto-guest-programs-'));
});

afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function run(argv: string[], input = '') {
  const [file, ...args] = argv as [string, ...string[]];
  const out = spawnSync(file, args, { input, encoding: 'latin1', timeout: 20_000 });
  expect(out.error).toBeUndefined();
  return { code: out.status, stdout: out.stdout, stderr: out.stderr };
}

describe('the lint', () => {
  it('finds nothing in the guest programs', () => {
    expect(lintGuest()).toEqual([]);
  });

  it('fails a Perl syntax error, a strict violation and a warning', () => {
    expect(checkPerl('ok', 'my $x = 1; print $x;')).toEqual([]);
    expect(checkPerl('syntax', 'my $x = ;')[0]?.text).toMatch(/syntax error/);
    expect(checkPerl('strict', '$undeclared = 1;')[0]?.text).toMatch(/Global symbol/);
    expect(checkPerl('warning', 'my $x = 1; my $x = 2; print $x;')[0]?.text).toMatch(/masks earlier declaration/);
  });

  it('fails a shell mistake and an awk syntax error', () => {
    const sh = join(dir, 'bad.sh');
    writeFileSync(sh, '# shellcheck shell=sh\nrm -rf $1/tmp\n');
    expect(checkShell(sh)[0]?.text).toMatch(/SC2086/);
    const awk = join(dir, 'bad.awk');
    writeFileSync(awk, 'BEGIN { print ( }\n');
    expect(checkAwk(awk)).toHaveLength(1);
    writeFileSync(awk, 'BEGIN { print 1 }\n');
    expect(checkAwk(awk)).toEqual([]);
  });
});

describe('perlProgram', () => {
  it('passes values in as constants that no value can break out of', () => {
    const nasty = `a'b\\c'; print "pwned"; '`;
    const program = perlProgram(['print NASTY, "|", SYS_prctl, "|", ENOENT;'], { NASTY: nasty });
    expect(run(['perl', '-e', program]).stdout).toBe(`${nasty}|${process.arch === 'x64' ? 157 : 167}|2`);
    // Only the names the program mentions are written.
    expect(program).not.toMatch(/EINTR|SYS_statx/);
    expect(() => perlProgram(['X;'], { X: 1.5 })).toThrow(/not an integer/);
  });
});

describe('cgroup-join.sh', () => {
  it('writes its pid into every group, then execs the program as that pid', () => {
    const groups = ['memory', 'cpu'].map((g) => join(dir, g));
    for (const g of groups) mkdirSync(g, { recursive: true });
    const [, script, name] = joinArgv('dsk_x') as [string, string, string];
    const out = run(['/bin/sh', '-c', script, name, '2', ...groups, '/bin/sh', '-c', 'echo $$']);
    expect(out.code).toBe(0);
    for (const g of groups) expect(readFileSync(join(g, 'cgroup.procs'), 'utf8')).toBe(out.stdout);
  });

  it('runs nothing when a group cannot be joined', () => {
    const [, script, name] = joinArgv('dsk_x') as [string, string, string];
    const missing = join(dir, 'no-such-group');
    const out = run(['/bin/sh', '-c', script, name, '1', missing, '/bin/echo', 'ran']);
    expect(out.code).toBe(97);
    expect(out.stdout).toBe('');
    expect(out.stderr).toBe(`${JOIN_FAILED} ${missing}\n`);
  });
});

describe('exec-relay.pl', () => {
  it('feeds stdin, relays both outputs and passes the exit code through', () => {
    const out = run(['perl', '-e', execRelay(), '--', '/bin/sh', '-c', 'cat; echo oops >&2; exit 3'], 'hello\n');
    expect(out).toEqual({ code: 3, stdout: 'hello\n', stderr: 'oops\n' });
    expect(run(['perl', '-e', execRelay(), '--', '/bin/sh', '-c', 'kill -TERM $$']).code).toBe(128 + 15);
  });

  it('returns when the command does, even while a background job holds the pipes', () => {
    const out = run(['perl', '-e', execRelay(), '--', '/bin/sh', '-c', 'sleep 30 & echo started']);
    expect(out).toEqual({ code: 0, stdout: 'started\n', stderr: '' });
  });
});

describe('criu-keeper.pl', () => {
  it('reports the exit code of what it runs, and exits with it', () => {
    expect(run(['perl', '-e', criuKeeperProgram(), '--', '/bin/sh', '-c', 'exit 0'])).toMatchObject({ code: 0, stdout: 'criu-exit 0\n' });
    expect(run(['perl', '-e', criuKeeperProgram(), '--', '/bin/sh', '-c', 'exit 3'])).toMatchObject({ code: 3, stdout: 'criu-exit 3\n' });
  });
});

describe('the guest helper, on a directory standing in for the guest', () => {
  const helper = (op: Parameters<typeof guestHelperProgram>[0], args: string[], input = '') =>
    run(['perl', '-e', guestHelperProgram(op), '--', op, ...args], input);

  it('writes, stats, lists, reads and deletes a file', () => {
    const root = join(dir, 'guest');
    const file = join(root, 'sub', 'a b.txt');
    expect(helper('write', [file, '-', '100'], '3\nhel2\nlo0\n')).toEqual({ code: 0, stdout: 'OK\n', stderr: '' });
    expect(readFileSync(file, 'utf8')).toBe('hello');
    expect(helper('write', [file, '5', '100'], '1\n!0\n').stdout).toBe('OK\n');
    expect(helper('stat', [file]).stdout).toMatch(/^OK file 6 [0-9]+ 644\n$/);
    expect(helper('list', [join(root, 'sub'), '10']).stdout).toMatch(/^OK 0\nfile 6 [0-9]+ a b\.txt\0$/);
    expect(helper('read', [file, '-', '0', '100']).stdout).toBe('OK 6 6\nhello!');
    expect(helper('read', [file, '1', '3', '100']).stdout).toBe('OK 6 3\nell');
    expect(helper('delete', [file, '0']).stdout).toBe('OK\n');
    expect(helper('stat', [file]).stdout).toBe('ERR path_missing - cannot stat: No such file or directory\n');
  });

  it('answers with the failure codes the agent maps', () => {
    const root = join(dir, 'codes');
    mkdirSync(join(root, 'd'), { recursive: true });
    writeFileSync(join(root, 'f'), 'x');
    expect(helper('read', [join(root, 'd'), '-', '0', '100']).stdout).toBe('ERR path_conflict - path is a directory\n');
    expect(helper('read', [join(root, 'f'), '-', '0', '0']).stdout).toMatch(/^ERR too_large - file is 1 bytes/);
    expect(helper('delete', [join(root, 'd'), '0']).stdout).toMatch(/^ERR path_conflict - path is a directory/);
    expect(helper('write', [join(root, 'f'), '0', '100'], '1\nx0\n').stdout).toBe('ERR path_conflict 1 file size is 1, append offset is 0\n');
    // An upload that ends before its end marker changes nothing.
    expect(helper('write', [join(root, 'f'), '-', '100'], '1\ny').stdout).toMatch(/^ERR aborted /);
    expect(readFileSync(join(root, 'f'), 'utf8')).toBe('x');
    expect(helper('list', [root, 'x']).stdout).toBe('ERR bad_request - malformed number\n');
  });
});

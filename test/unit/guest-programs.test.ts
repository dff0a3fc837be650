/**
 * The guest programs (agent/guest/) outside any desktop: each one that needs no guest runs here
 * against stand-ins (temporary directories for cgroups and the guest's files, /bin/sh for the
 * guest command), as the agent builds it. The lint's own checks are shown to fail on broken
 * programs, so a clean `npm run lint` means something.
 */
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createConnection, createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { JOIN_FAILED, joinArgv } from '../../agent/src/runtime/sandbox/host/cgroups.js';
import { criuKeeperProgram } from '../../agent/src/runtime/sandbox/host/criu.js';
import { execRelay } from '../../agent/src/runtime/sandbox/guest/exec-relay.js';
import { guestHelperProgram, helperRequest, warmHelperProgram } from '../../agent/src/runtime/sandbox/guest/guest-helper.js';
import { forwarderProgram } from '../../agent/src/runtime/sandbox/ports/guest-ports-perl.js';
import { perlProgram } from '../../agent/src/runtime/sandbox/guest/guest-programs.js';
import { execServerProgram, TOKEN_HEX, warmPrologue } from '../../agent/src/runtime/sandbox/guest/warm-perl.js';
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

// The servers accept only root as a peer (SO_PEERCRED), as in a desktop.
describe.skipIf(process.getuid?.() !== 0)('the warm prologue and the servers behind it, on the host', () => {
  /** Reads from a socket until `done` says the bytes so far are complete. */
  function collect(socket: ReturnType<typeof createConnection>, done: (b: Buffer) => boolean): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      let got = Buffer.alloc(0);
      socket.on('data', (chunk: Buffer) => {
        got = Buffer.concat([got, chunk]);
        if (done(got)) resolve(got);
      });
      socket.on('error', reject);
      socket.on('close', () => resolve(got));
    });
  }

  /** `<tag><8 hex length><data>` frames, as the agent reads them. */
  function frames(b: Buffer): [string, string][] {
    const out: [string, string][] = [];
    for (let at = 0; at + 9 <= b.length; ) {
      const n = parseInt(b.subarray(at + 1, at + 9).toString('latin1'), 16);
      out.push([b.toString('latin1', at, at + 1), b.toString('utf8', at + 9, at + 9 + n)]);
      at += 9 + n;
    }
    return out;
  }

  /** A server behind the warm prologue, on the host: its socket, and a stop that ends its stdin. */
  async function startServer(name: string, program: string[], token?: string) {
    const server = spawn('perl', ['-e', warmPrologue(), '--', dir, name, 'perl', '-e', ...program], { stdio: ['pipe', 'pipe', 'inherit'] });
    if (token !== undefined) server.stdin.write(token);
    await new Promise<void>((resolve, reject) => {
      server.stdout.on('data', (c: Buffer) => (c.toString().includes('ready') ? resolve() : undefined));
      server.on('exit', (code) => reject(new Error(`the server exited (${code})`)));
    });
    return {
      socket: join(dir, name),
      // The server exits when its stdin ends, as when the agent goes away.
      stop: async () => {
        server.stdin.end();
        if (server.exitCode === null && server.signalCode === null) await new Promise((resolve) => server.on('exit', resolve));
      },
    };
  }

  it('a warm file helper serves one operation per connection', async () => {
    const token = `${randomBytes(TOKEN_HEX / 2).toString('hex')}\n`;
    const server = await startServer('files.sock', [warmHelperProgram(), '--'], token);
    try {
      const file = join(dir, 'warm.txt');
      writeFileSync(file, 'hello');
      for (let i = 0; i < 3; i++) {
        const conn = createConnection(server.socket);
        conn.write(token);
        conn.write(helperRequest('stat', [file]));
        expect((await collect(conn, () => false)).toString()).toMatch(/^\+OK file 5 [0-9]+ 644\n$/);
      }
    } finally {
      await server.stop();
    }
  });

  it('the port forwarder relays a connection to a local port both ways', async () => {
    const echo = createServer((c) => {
      c.on('data', (d: Buffer) => c.write(d.toString().toUpperCase()));
      c.on('end', () => c.end());
    });
    await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
    const server = await startServer('ports.sock', [forwarderProgram(), '--', 'dsk_test']);
    try {
      const conn = createConnection(server.socket);
      const port = Buffer.alloc(2);
      port.writeUInt16BE((echo.address() as AddressInfo).port);
      conn.write(port);
      conn.write('hello');
      conn.end();
      // One status byte (0: connected), then the answer, then both ends close.
      expect((await collect(conn, () => false)).toString('latin1')).toBe('\0HELLO');
    } finally {
      await server.stop();
      echo.close();
    }
  });

  it('the exec server checks the token, runs a command and relays its output and exit code', async () => {
    const token = `${randomBytes(TOKEN_HEX / 2).toString('hex')}\n`;
    const server = await startServer('exec.sock', [execServerProgram('exec /bin/sh -c "$0"', 4, 2), '--'], token);
    try {
      // A wrong token gets nothing and the connection is closed.
      const stranger = createConnection(server.socket);
      stranger.write(`${'0'.repeat(TOKEN_HEX)}\n`);
      expect((await collect(stranger, () => false)).length).toBe(0);

      const conn = createConnection(server.socket);
      conn.write(token);
      const command = Buffer.from('echo out; echo err >&2; exit 7');
      conn.write(`${command.length.toString(16).padStart(8, '0')}\n`);
      conn.write(command);
      const got = await collect(conn, (b) => b.includes('x00000001'));
      expect(got.toString('latin1', 0, 1)).toBe('+');
      const seen = frames(got.subarray(1));
      expect(seen[0]).toEqual(['s', '']);
      expect(seen.filter(([tag]) => tag === 'o').map(([, d]) => d).join('')).toBe('out\n');
      expect(seen.filter(([tag]) => tag === 'e').map(([, d]) => d).join('')).toBe('err\n');
      expect(seen.at(-1)).toEqual(['x', '7']);
      conn.destroy();
    } finally {
      await server.stop();
    }
  });
});

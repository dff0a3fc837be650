/**
 * The warm exec server's own program (agent/guest/exec-server.pl behind the warm prologue, the
 * chain warm-pool.ts starts inside a desktop) run on the host, so that its environment is the
 * test's: an LD_PRELOAD shim (test/fixtures/select-delay.c) makes every select(2) without a
 * deadline sleep 30 ms first. A command that closes its output and exits during that sleep is the
 * race that left warm execs hanging until their timeout now and then: the exit's SIGCHLD was taken
 * before select was entered, and a Perl handler only runs once select returns. The shim needs a C
 * compiler; without one the file is skipped, saying so.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { constants, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lengthFramed, WARM_IDLE } from '../../agent/src/runtime/sandbox/guest/guest-helper.js';
import { execServerProgram, TOKEN_HEX, warmPrologue } from '../../agent/src/runtime/sandbox/guest/warm-perl.js';

const CC = ['/usr/bin/cc', '/usr/bin/gcc'].find((path) => existsSync(path));
if (CC === undefined) console.warn('warm exec server race test skipped: no C compiler for its LD_PRELOAD shim');

/** No env file on the host: the command runs as `sh -c` would run it. */
const PLAIN = 'exec /bin/sh -c "$0"';

interface Answer {
  readonly started: boolean;
  /** The `x` frame's exit code; null when the connection ended (or the wait ran out) without one. */
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

describe.skipIf(CC === undefined)('warm exec server', () => {
  let dir: string;
  let shim: string;
  const servers: ChildProcess[] = [];

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'canto-exec-server-'));
    shim = join(dir, 'select-delay.so');
    execFileSync(CC as string, ['-shared', '-fPIC', '-O2', '-o', shim, fileURLToPath(new URL('../fixtures/select-delay.c', import.meta.url)), '-ldl']);
  });

  afterAll(async () => {
    for (const server of servers) server.kill('SIGKILL');
    await rm(dir, { recursive: true, force: true });
  });

  /** A server listening in `dir`, with the shim preloaded or not; resolves once it says `ready`. */
  async function startServer(preload: boolean): Promise<{ socket: string; token: string }> {
    const name = `exec-${randomBytes(4).toString('hex')}.sock`;
    const token = `${randomBytes(TOKEN_HEX / 2).toString('hex')}\n`;
    const server = spawn(
      '/usr/bin/perl',
      ['-e', warmPrologue(), '--', dir, name, '/usr/bin/perl', '-e', execServerProgram(PLAIN, constants.errno.EINTR, WARM_IDLE), '--'],
      { env: { PATH: '/usr/bin:/bin', ...(preload ? { LD_PRELOAD: shim } : {}) }, stdio: ['pipe', 'pipe', 'inherit'] },
    );
    servers.push(server);
    server.stdin.write(token);
    await new Promise<void>((resolve, reject) => {
      let said = '';
      server.stdout.on('data', (chunk: Buffer) => {
        said += chunk.toString('latin1');
        if (said.startsWith('ready\n')) resolve();
      });
      server.once('exit', (code) => reject(new Error(`the exec server exited (${code})`)));
    });
    return { socket: join(dir, name), token };
  }

  /** One command on a warm child: the frames it answers within `waitMs`. */
  function run(server: { socket: string; token: string }, command: string, waitMs = 3_000): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const conn = connect(server.socket);
      let buffered = Buffer.alloc(0);
      let acknowledged = false;
      const answer = { started: false, code: null as number | null, stdout: '', stderr: '' };
      const timer = setTimeout(() => conn.destroy(), waitMs);
      conn.on('error', reject);
      conn.on('connect', () => conn.write(server.token));
      conn.on('data', (chunk: Buffer) => {
        buffered = Buffer.concat([buffered, chunk]);
        if (!acknowledged) {
          if (buffered[0] !== 0x2b) return reject(new Error(`no acknowledgement: ${buffered.toString('latin1')}`));
          acknowledged = true;
          buffered = buffered.subarray(1);
          conn.write(lengthFramed(Buffer.from(command)));
        }
        while (buffered.length >= 9) {
          const end = 9 + parseInt(buffered.toString('latin1', 1, 9), 16);
          if (buffered.length < end) break;
          const tag = String.fromCharCode(buffered[0] as number);
          const data = buffered.toString('utf8', 9, end);
          buffered = buffered.subarray(end);
          if (tag === 's') answer.started = true;
          else if (tag === 'o') answer.stdout += data;
          else if (tag === 'e') answer.stderr += data;
          else if (tag === 'x') answer.code = Number(data);
        }
      });
      conn.on('close', () => {
        clearTimeout(timer);
        resolve(answer);
      });
    });
  }

  it('relays output and the exit code, then ends the connection', async () => {
    const server = await startServer(false);
    expect(await run(server, 'echo out; echo err >&2; exit 3')).toEqual({ started: true, code: 3, stdout: 'out\n', stderr: 'err\n' });
    expect(await run(server, 'kill -9 $$')).toMatchObject({ started: true, code: 137 });
  });

  it('sees a command exit that lands just before it waits, after the command closed its output', async () => {
    const server = await startServer(true);
    // The output ends at once; the exit comes 10-50 ms later, inside the shim's 30 ms sleep before
    // one of the server's waits. Before the fix most of these hung until the connection was cut.
    const answers: Array<{ delay: string; answer: Answer; ms: number }> = [];
    for (const delay of ['0.01', '0.02', '0.035', '0.045', '0.05']) {
      for (let i = 0; i < 2; i++) {
        const t0 = performance.now();
        const answer = await run(server, `exec >&- 2>&-; sleep ${delay}; exit 5`);
        answers.push({ delay, answer, ms: performance.now() - t0 });
      }
    }
    expect(answers.filter((a) => a.answer.code !== 5).map((a) => `${a.delay}s: ${JSON.stringify(a.answer)}`)).toEqual([]);
    expect(Math.max(...answers.map((a) => a.ms))).toBeLessThan(2_000);
  });
});

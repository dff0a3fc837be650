/**
 * What an operation does when the desktop's warm server is still starting (host/warm-pool.ts):
 * it waits briefly for it instead of running cold beside it, but not for a server that has been
 * starting for long (it may be stuck). A stand-in server process (a real one, on a real socket)
 * says `ready` when told to, and answers every connection the way a warm server's child does.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { spawnProcess } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { WarmPool } from '../../agent/src/runtime/sandbox/host/warm-pool.js';

/**
 * Listens on ARGV[0]; says `ready` after ARGV[1] ms (never for -1); answers each connection's
 * token line with `+`. Perl, which starts in milliseconds (Node would take most of the wait).
 */
const STAND_IN = `
use IO::Socket::UNIX; use IO::Select; use Time::HiRes qw(time);
my ($path, $ready_ms) = @ARGV; $| = 1;
my $l = IO::Socket::UNIX->new(Local => $path, Listen => 16) or die "listen: $!";
my $sel = IO::Select->new($l, \\*STDIN);
my $at = $ready_ms >= 0 ? time + $ready_ms / 1000 : undef;
while (1) {
  my $wait = defined $at ? ($at - time > 0 ? $at - time : 0) : undef;
  my @r = $sel->can_read($wait);
  if (defined $at && time >= $at) { print "ready\\n"; undef $at; }
  for my $h (@r) {
    if ($h == $l) { my $c = $l->accept; $sel->add($c); next; }
    my $n = sysread($h, my $buf, 4096);
    if ($h == \\*STDIN) { exit 0 unless $n; next; }
    if ($n) { syswrite($h, '+'); } $sel->remove($h);
  }
}
`;

const INIT = { pid: process.pid, startTime: '1' };
let dir: string;
let pool: WarmPool;

function poolWithServerReadyAfter(readyMs: number): WarmPool {
  return new WarmPool({
    start: (_kind, _desktopId, _init, socketDir, socketName) =>
      spawnProcess('perl', ['-e', STAND_IN, join(socketDir, socketName), String(readyMs)], { detached: true, stdio: ['pipe', 'pipe', 'pipe'] }),
    socketDir: () => dir,
    fenced: () => false,
  });
}

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'canto-warm-starting-'));
});

afterEach(async () => {
  await pool?.close();
  await rm(dir, { recursive: true, force: true });
});

it('waits for a server on its way and is served by it', async () => {
  // Ready as soon as it listens: the call comes before that, right after the spawn.
  pool = poolWithServerReadyAfter(0);
  pool.prewarm('file', 'dsk_aaaaaaaaaaaaaaaaaaaaaaaa', INIT);
  const warm = await pool.connect('file', 'dsk_aaaaaaaaaaaaaaaaaaaaaaaa', INIT);
  expect(warm).not.toBeNull();
  warm!.socket.destroy();
});

it('runs cold after the bound when the server is not ready by then', async () => {
  pool = poolWithServerReadyAfter(-1);
  pool.prewarm('exec', 'dsk_bbbbbbbbbbbbbbbbbbbbbbbb', INIT);
  const started = performance.now();
  expect(await pool.connect('exec', 'dsk_bbbbbbbbbbbbbbbbbbbbbbbb', INIT)).toBeNull();
  const waited = performance.now() - started;
  expect(waited).toBeGreaterThanOrEqual(140);
  expect(waited).toBeLessThan(2_000);
});

it('does not wait for a server that has been starting for more than a second', async () => {
  pool = poolWithServerReadyAfter(-1);
  pool.prewarm('file', 'dsk_cccccccccccccccccccccccc', INIT);
  await new Promise((resolve) => setTimeout(resolve, 1_100));
  const started = performance.now();
  expect(await pool.connect('file', 'dsk_cccccccccccccccccccccccc', INIT)).toBeNull();
  // Below the 150 ms a wait would take.
  expect(performance.now() - started).toBeLessThan(140);
});

/**
 * The check a restore runs once the guest resumes (agent/native/restore-action.c, post-resume):
 * the X connection setup on display :0's abstract socket in the guest's network namespace. Here
 * the "guest" is a fake X server in a network namespace of its own, answering as told, and the
 * check's report is read where the agent reads it.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { helperPath } from '../../agent/src/runtime/sandbox/host/spawner.js';

/**
 * Listens on X :0's abstract name and answers every client by `mode`; prints the setup bytes it
 * got. Perl, not Node: Node 20 binds an abstract name padded with NULs to the whole sun_path,
 * which is another name than X's.
 */
const FAKE_X = String.raw`
use strict; use warnings; use Socket;
my $mode = shift;
my %answer = (
  success => pack('C8', 1, 0, 11, 0, 0, 0, 0, 0),
  failed => pack('C8a4', 0, 4, 11, 0, 0, 0, 1, 0, 'nope'),
  authenticate => pack('C8a4', 2, 0, 0, 0, 0, 0, 1, 0, 'nope'),
  short => pack('C2', 1, 0),
);
socket(my $server, AF_UNIX, SOCK_STREAM, 0) or die "socket: $!";
bind($server, pack_sockaddr_un("\0/tmp/.X11-unix/X0")) or die "bind: $!";
listen($server, 16) or die "listen: $!";
$| = 1;
print "ready\n";
my @held;
while (accept(my $client, $server)) {
  my $setup = '';
  sysread($client, $setup, 12);
  print 'setup ', unpack('H*', $setup), "\n";
  # 'silent' keeps the connection and says nothing; 'drip' answers Success a byte every 0.4 s.
  if (exists $answer{$mode}) { syswrite($client, $answer{$mode}); close($client); }
  elsif ($mode eq 'drip') { for my $byte (unpack('C8', $answer{success})) { select(undef, undef, undef, 0.4); syswrite($client, chr($byte)) or last; } close($client); }
  else { push @held, $client; }
}
`;

const children: ChildProcess[] = [];
const dirs: string[] = [];

afterEach(() => {
  for (const c of children.splice(0)) c.kill('SIGKILL');
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** A fake X server in a new network namespace; resolves with its pid and what it has printed so far. */
async function fakeX(mode: string): Promise<{ pid: number; output: () => string }> {
  const child = spawn('unshare', ['--net', 'perl', '-e', FAKE_X, mode], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(child);
  let text = '';
  child.stdout!.on('data', (c: Buffer) => (text += c.toString()));
  await new Promise<void>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`fake X exited ${code}`)));
    const check = () => (text.includes('ready') ? resolve() : setTimeout(check, 10));
    check();
  });
  return { pid: child.pid!, output: () => text };
}

/** Runs the post-resume stage against the network namespace of `pid`; the report it leaves. */
async function check(pid: number, seconds = 5): Promise<{ ok: boolean; error: string | null }> {
  const dir = mkdtempSync(join(tmpdir(), 'canto-restore-check-'));
  dirs.push(dir);
  const probe = join(dir, 'restore-answered');
  await new Promise<void>((resolve, reject) => {
    execFile(helperPath()!, [], {
      env: { CRTOOLS_SCRIPT_ACTION: 'post-resume', CRTOOLS_INIT_PID: String(pid), CANTO_PROBE_FILE: probe, CANTO_PROBE_SECONDS: String(seconds) },
    }, (err) => (err ? reject(err) : resolve()));
  });
  const ok = existsSync(probe);
  if (ok) expect(readFileSync(probe, 'utf8')).toBe('');
  return { ok, error: existsSync(`${probe}.err`) ? readFileSync(`${probe}.err`, 'utf8') : null };
}

describe.skipIf(helperPath() === null)('the check after a restore resumes', () => {
  it('passes when X answers Success to a client with no authorization', async () => {
    const x = await fakeX('success');
    expect(await check(x.pid)).toEqual({ ok: true, error: null });
    // Little-endian, protocol 11.0, empty authorization name and data.
    expect(x.output()).toContain('setup 6c000b000000000000000000');
  });

  it('fails, saying why, when X refuses or asks for authorization', async () => {
    expect(await check((await fakeX('failed')).pid)).toEqual({ ok: false, error: 'X on :0 refused a client (setup failed)' });
    expect(await check((await fakeX('authenticate')).pid)).toEqual({ ok: false, error: 'X on :0 refused a client (it asks for authorization)' });
  });

  it('fails when the answer ends early or never comes', async () => {
    expect(await check((await fakeX('short')).pid)).toEqual({ ok: false, error: 'X on :0 did not answer a client: it closed the connection' });
    const started = Date.now();
    expect(await check((await fakeX('silent')).pid, 1)).toEqual({ ok: false, error: 'X on :0 did not answer a client: timed out' });
    expect(Date.now() - started).toBeLessThan(4000);
    // One deadline for the whole check: an answer that keeps coming, too slowly, still ends it.
    const dripStarted = Date.now();
    expect(await check((await fakeX('drip')).pid, 1)).toEqual({ ok: false, error: 'X on :0 did not answer a client: timed out' });
    expect(Date.now() - dripStarted).toBeLessThan(2500);
  });

  it('fails when nothing listens in the namespace, even where X listens in another', async () => {
    // Another desktop's X answers in a namespace of its own; the checked one has none.
    await fakeX('success');
    const empty = spawn('unshare', ['--net', 'sleep', '30'], { stdio: 'ignore' });
    children.push(empty);
    const ours = readlinkSync('/proc/self/ns/net');
    for (let i = 0; i < 200 && readlinkSync(`/proc/${empty.pid!}/ns/net`) === ours; i++) await new Promise((r) => setTimeout(r, 10));
    expect(readlinkSync(`/proc/${empty.pid!}/ns/net`)).not.toBe(ours);
    expect(await check(empty.pid!)).toEqual({ ok: false, error: 'X on :0 takes no client: Connection refused' });
  });
});

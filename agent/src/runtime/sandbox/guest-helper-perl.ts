/**
 * The guest helper's Perl source, in sections: a prelude every operation needs, shared routines,
 * and one body per operation (the detached-process and display ones here, the file ones in
 * guest-helper-perl-files.ts). guest-helper.ts sends a cold helper only the sections its operation
 * uses, because Perl compiles the whole program on every start and compile time grows with its
 * length; a warm helper (warm-pool.ts) compiles everything before it is needed, so it gets it all.
 *
 * Constants that differ between platforms (errno values, open flags, system call numbers) come in
 * as `k` and are written into the text, so the program needs neither Fcntl nor POSIX nor Errno.
 */
import { perlPrefork } from './warm-perl.js';

export interface PerlConstants {
  /** errno value by name. */
  readonly E: (name: string) => number;
  readonly O_RDONLY_NB: number;
  readonly O_WRONLY_NB: number;
  readonly O_WRONLY_CREAT_NB: number;
  readonly O_WRONLY_CREAT_EXCL: number;
  readonly O_TMPFILE_WRONLY: number;
  readonly SYS_statx: number;
  readonly SYS_linkat: number;
  readonly SYS_setsid: number;
  readonly processesDir: string;
  readonly processId: string;
  /** The runner shell of a detached process; holds no single quote. */
  readonly runner: string;
  /** Children a warm file server keeps waiting for connections. */
  readonly warmIdle: number;
  /** The guest X server's Unix socket, as the guest sees it. */
  readonly xSocket: string;
  /** Seconds the X server has to answer a connection before `xsize` gives up. */
  readonly xAnswerSec: number;
}

export interface PerlPart {
  /** Shared routines the body calls, by section name, in order. */
  readonly needs: readonly string[];
  readonly body: string;
}

/**
 * How a warm helper gets its operation: a child of the file server (warm-perl.ts) holding a
 * connection reads one request from it, `<8 hex digits: length>\n<op>\0<arg>\0...`, with
 * exact-length reads so that not a byte of what follows (upload chunks) is taken early. The process
 * title then names the operation, as a cold helper's arguments do.
 */
function perlWarmRequest(k: PerlConstants): string {
  return String.raw`
${perlPrefork()}
prefork('canto-helper', ${k.warmIdle}, ${k.E('EINTR')});
my $head = take_from(\*STDIN, 9) // exit 0;
exit 1 unless $head =~ /^([0-9a-f]{8})\n$/;
@ARGV = split /\0/, take_from(\*STDIN, hex $1) // exit(0), -1;
$0 = "canto-helper @ARGV";
# A write may answer before it has read its upload. Closing a connection with input unread resets
# it, and the agent would lose the answer; so the answer is followed by our end of the stream, and
# the rest of the input is read until the agent ends its side (it does once it has the answer).
my $drain = $ARGV[0] eq 'write';
END {
  if ($drain) {
    shutdown(STDOUT, 1);
    alarm 30;
    1 while sysread(STDIN, my $rest, 65536);
  }
}
`;
}

/** What every operation starts with: output, failures (errno → AgentFailure code), small tools. */
export function perlPrelude(k: PerlConstants, warm = false): string {
  const E = k.E;
  const missing = ['ENOENT', 'ENOTDIR'].map(E).join(',');
  const conflict = [
    'EISDIR', 'EEXIST', 'ENOTEMPTY', 'EBUSY', 'ELOOP', 'ETXTBSY', 'ENOSPC', 'EDQUOT', 'EFBIG',
    'EXDEV', 'EMLINK', 'EROFS', 'EACCES', 'EPERM', 'ENXIO',
  ].map(E).join(',');

  return String.raw`
$SIG{PIPE} = 'IGNORE';
umask 022;
binmode STDIN; binmode STDOUT;
${warm ? perlWarmRequest(k) : ''}
my ($op, @arg) = @ARGV;
sub out {
  my $s = shift; my $o = 0;
  while ($o < length $s) {
    my $w = syswrite(STDOUT, $s, length($s) - $o, $o);
    exit 1 unless $w;
    $o += $w;
  }
}
sub fail {
  my ($code, $msg, $size) = @_;
  $msg =~ tr/\r\n/  /;
  out("ERR $code " . (defined $size ? $size : '-') . " $msg\n");
  exit 0;
}
my %missing = map { $_ => 1 } (${missing});
my %conflict = map { $_ => 1 } (${conflict});
# Fails with the code for errno. ENOTDIR is a conflict when writing (a parent is a file, which
# cannot be created through) but "missing" when reading.
sub oserr {
  my ($what, $writing) = @_;
  my $n = $! + 0; my $text = "$!";
  $text = 'read-only file system' if $n == ${E('EROFS')};
  $text = 'permission denied (read-only location)' if $n == ${E('EACCES')} || $n == ${E('EPERM')};
  my $code = $n == ${E('ENAMETOOLONG')} ? 'bad_request'
    : $n == ${E('ENOTDIR')} && $writing ? 'path_conflict'
    : $missing{$n} ? 'path_missing' : $conflict{$n} ? 'path_conflict' : 'runtime_error';
  fail($code, "$what: $text");
}
sub dirname { my $p = shift; $p =~ s{/+[^/]*$}{}; return $p eq '' ? '/' : $p; }
sub child { my ($d, $n) = @_; return $d eq '/' ? "/$n" : "$d/$n"; }
sub num { my $v = shift; fail('bad_request', 'malformed number') unless defined $v && $v =~ /^[0-9]{1,16}$/; return $v + 0; }
sub put {
  my ($fh, $data) = @_; my $o = 0;
  while ($o < length $data) {
    my $w = syswrite($fh, $data, length($data) - $o, $o);
    return 0 unless $w;
    $o += $w;
  }
  return 1;
}
`;
}

/** Sections and operations for detached processes (see guest-processes.ts). */
export function perlProcessParts(k: PerlConstants): { sections: Record<string, string>; ops: Record<string, PerlPart> } {
  const E = k.E;
  const procs = String.raw`
my $id_re = qr/^${k.processId}$/;
my $procs = '${k.processesDir}';
# Reads a small guest file without blocking on a FIFO; undef unless it is a regular file.
sub small {
  my ($path, $max) = @_;
  sysopen(my $fh, $path, ${k.O_RDONLY_NB}) or return undef;
  return undef unless -f $fh;
  my $s = ''; 1 while length($s) < $max && sysread($fh, $s, $max - length($s), length $s);
  return $s;
}
# A detached process's runner, alive and not a zombie: the recorded pid with the recorded start
# time (field 22 of /proc/PID/stat), or, after a memory snapshot was restored (which gives every
# process a new start time), the recorded pid still running the runner of this very directory,
# whose path is the last word of its command line.
sub alive {
  my ($pid, $start, $dir) = @_;
  my $s = small("/proc/$pid/stat", 4096);
  return 0 unless defined $s && $s =~ /\) (.*)$/s;
  my @f = split / /, $1;
  return 0 if $f[0] eq 'Z' || $f[0] eq 'X' || !defined $f[19];
  return 1 if $f[19] eq $start;
  my $cmd = small("/proc/$pid/cmdline", 65536);
  return defined $cmd && substr($cmd, 0, 8) eq "/bin/sh\0" && substr($cmd, -length($dir) - 2) eq "\0$dir\0";
}
sub recorded { my $s = small("$procs/$_[0]/pid", 256); return defined $s && $s =~ /^([0-9]+) ([0-9]+)\n?$/ ? ($1, $2) : (); }
`;

  const spawn = String.raw`
my $id = $arg[0];
fail('bad_request', 'malformed process id') unless $id =~ $id_re;
for my $d ('/root/.canto', $procs) { mkdir($d, 0700) or $! == ${E('EEXIST')} or oserr('cannot create process directory', 1); }
my $dir = "$procs/$id";
# A repeated command (the scheduler re-sends after a lost reply) must not start a second copy.
if (-e $dir) { out("OK\n"); exit 0; }
my $script = do { local $/; <STDIN> } // '';
# The directory appears complete (script inside) or not at all.
my $tmp = "$procs/.$id.$$";
mkdir($tmp, 0700) or oserr('cannot create process directory', 1);
my $sf;
sysopen($sf, "$tmp/script", ${k.O_WRONLY_CREAT_EXCL}, 0600) && put($sf, $script) && close($sf)
  or oserr('cannot write script', 1);
if (!rename($tmp, $dir)) {
  my $err = $!; unlink("$tmp/script"); rmdir($tmp);
  if ($err == ${E('EEXIST')} || $err == ${E('ENOTEMPTY')}) { out("OK\n"); exit 0; }
  $! = $err; oserr('cannot create process directory', 1);
}
pipe(my $r, my $w) or oserr('pipe');
my $pid = fork() // oserr('fork');
if ($pid == 0) {
  close($r);
  $SIG{PIPE} = 'DEFAULT';
  syscall(${k.SYS_setsid});
  open(STDIN, '<', '/dev/null'); open(STDOUT, '>', '/dev/null'); open(STDERR, '>', '/dev/null');
  # pid and start time: a pid reused after a wake or a cold boot is never taken for this process.
  my $stat = small('/proc/self/stat', 4096) // '';
  my @f = $stat =~ /\) (.*)$/s ? split(/ /, $1) : ();
  my $pf;
  my $ok = defined $f[19] && open($pf, '>', "$dir/.pid.tmp") && print($pf "$$ $f[19]\n") && close($pf)
    && rename("$dir/.pid.tmp", "$dir/pid");
  if (!$ok) { syswrite($w, "cannot record the pid: $!"); exit 1; }
  { exec('/bin/sh', '-c', '${k.runner}', $dir); }
  syswrite($w, "cannot start /bin/sh: $!");
  exit 127;
}
close($w);
# The pipe is close-on-exec: EOF without a message means the runner started.
my $msg = do { local $/; <$r> } // '';
fail('runtime_error', $msg) if length $msg;
out("OK\n");
`;

  const status = String.raw`
my ($id, $n) = ($arg[0], num($arg[1]));
fail('bad_request', 'malformed process id') unless $id =~ $id_re;
my $dir = "$procs/$id";
if (!-d $dir) { out("OK none\n"); exit 0; }
my ($status, $code) = ('lost', '-');
my ($pid, $start) = recorded($id);
if (defined $pid && alive($pid, $start, $dir)) {
  $status = 'running';
} else {
  # Read after the liveness check: the runner renames exit_code into place before it exits.
  my $c = small("$dir/exit_code", 64);
  ($status, $code) = ('exited', $1 + 0) if defined $c && $c =~ /^([0-9]{1,3})\n?$/;
}
sub tail {
  my ($path, $n) = @_;
  sysopen(my $fh, $path, ${k.O_RDONLY_NB}) or return '';
  return '' unless -f $fh;
  my $size = -s _;
  sysseek($fh, $size > $n ? $size - $n : 0, 0);
  my $s = ''; 1 while length($s) < $n && sysread($fh, $s, $n - length($s), length $s);
  return $s;
}
my ($o, $e) = (tail("$dir/stdout", $n), tail("$dir/stderr", $n));
out("OK $status $code " . length($o) . ' ' . length($e) . "\n$o$e");
`;

  const killDetached = String.raw`
my @leaders;
if (opendir(my $dh, $procs)) {
  for my $id (grep { $_ =~ $id_re } readdir($dh)) {
    my ($pid, $start) = recorded($id);
    push @leaders, $pid if defined $pid && $pid > 1 && alive($pid, $start, "$procs/$id");
  }
}
if (@leaders) {
  # Each runner leads its own session and process group. Its whole tree goes, runner first, so
  # it cannot record an exit code: the process then reads as lost.
  my (%kids, %group);
  opendir(my $pd, '/proc') or oserr('cannot list processes');
  for my $p (grep { /^[0-9]+$/ } readdir($pd)) {
    my $s = small("/proc/$p/stat", 4096);
    next unless defined $s && $s =~ /\) (.*)$/s;
    my @f = split / /, $1;
    push @{$kids{$f[1]}}, $p;
    push @{$group{$f[2]}}, $p;
    push @{$group{$f[3]}}, $p if $f[3] != $f[2];
  }
  my %doomed;
  for my $leader (@leaders) {
    my @queue = ($leader, @{$group{$leader} // []});
    while (@queue) {
      my $p = shift @queue;
      next if $doomed{$p} || $p <= 1;
      $doomed{$p} = 1;
      push @queue, @{$kids{$p} // []};
    }
  }
  kill('KILL', @leaders);
  kill('KILL', keys %doomed);
  # Gone or a zombie before the caller snapshots the guest.
  for (1 .. 200) {
    last unless grep { my $s = small("/proc/$_/stat", 4096); defined $s && $s !~ /\) [ZX] / } keys %doomed;
    select(undef, undef, undef, 0.01);
  }
}
out('OK ' . scalar(@leaders) . "\n");
`;

  return {
    sections: { procs },
    ops: {
      spawn: { needs: ['procs'], body: spawn },
      status: { needs: ['procs'], body: status },
      'kill-detached': { needs: ['procs'], body: killDetached },
    },
  };
}

/**
 * The X server's current screen size, for screenshots (screenshot.ts). It is read from the setup
 * reply of a fresh connection rather than with a RandR request: the connection block holds screen
 * 0's size, RandR rewrites it on every resize (RREditConnectionInfo; checked against `xrandr --fb`,
 * including a resize made by a guest user), and the setup reply is the server's first answer, so
 * one round trip is all it costs (≈0.1 ms). No module: the socket constants of Linux (AF_UNIX 1,
 * SOCK_STREAM 1) and sockaddr_un are written out, as the warm prologue does.
 */
export function perlDisplayParts(k: PerlConstants): { sections: Record<string, string>; ops: Record<string, PerlPart> } {
  const xsize = String.raw`
# Anything the guest put at the socket's path may answer, or not; it gets a deadline and a bounded read.
$SIG{ALRM} = sub { fail('runtime_error', 'X session down: the X server did not answer') };
alarm ${k.xAnswerSec};
sub xread {
  my ($fh, $n) = @_; my $s = '';
  while (length($s) < $n) { sysread($fh, $s, $n - length $s, length $s) or return undef; }
  return $s;
}
my $x;
socket($x, 1, 1, 0) or fail('runtime_error', "cannot create a socket: $!");
connect($x, pack('S a108', 1, '${k.xSocket}')) or fail('runtime_error', "X session down: cannot connect to the X server: $!");
# Little-endian replies ('l'), protocol 11.0, no authorization (Xvfb lets local clients in).
put($x, pack('a x v v v v x2', 'l', 11, 0, 0, 0)) or fail('runtime_error', "X session down: $!");
my $head = xread($x, 8) // fail('runtime_error', 'X session down: the X server closed the connection');
my ($status, $why_len, $words) = unpack('C C x4 v', $head);
my $body = xread($x, 4 * $words) // fail('runtime_error', 'X session down: the X server closed the connection');
if ($status != 1) {
  my $why = $status == 0 ? substr($body, 0, $why_len) : 'authorization required';
  $why =~ tr/\x20-\x7e//cd;
  fail('runtime_error', "X session down: the X server refused the connection: $why");
}
# After 32 fixed bytes: the vendor string (padded to 4), 8 bytes per pixmap format, then screen 0,
# whose width and height in pixels are at bytes 20 and 22.
fail('runtime_error', 'the X server sent a malformed setup reply') if length($body) < 32;
my ($vendor, $screens, $formats) = unpack('x16 v x2 C C', $body);
my $at = 32 + (($vendor + 3) & ~3) + 8 * $formats;
fail('runtime_error', 'the X server sent a malformed setup reply') unless $screens >= 1 && length($body) >= $at + 24;
my ($w, $h) = unpack("x$at x20 v v", $body);
out("OK $w $h\n");
`;
  return { sections: {}, ops: { xsize: { needs: [], body: xsize } } };
}

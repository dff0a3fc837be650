/**
 * The Perl of warm servers (warm-pool.ts): the host-side prologue that gives a server its
 * listening socket, the pre-forking loop every server runs inside the guest, and the exec server.
 *
 * A server is started like a cold helper — `perl -e PROLOGUE` joins the desktop's cgroups, then
 * nsenter (and, for exec, setpriv) puts it inside the guest — except that the prologue first binds
 * a Unix socket on the host, in the desktop's driver-only `run/` directory, and hands it down the
 * chain as an open descriptor. Inside the guest the server keeps a few children blocked in
 * accept(2). A child that takes a connection checks that the peer is root and that the connection
 * opens with the server's token (which the agent gave the server on its stdin), answers `+`, then
 * serves exactly one operation with the connection as stdin and stdout, and exits; the server
 * forks a replacement as soon as a child is taken. Nothing is carried from one operation to the
 * next, and an operation costs a connect and a fork inside the guest instead of a fork of the
 * agent, a shell, nsenter and a Perl compile.
 *
 * The server says `ready` on stdout once its first children wait. It exits when its stdin ends
 * (the agent is gone), and its children die with it (PR_SET_PDEATHSIG), so no warm process outlives
 * the agent that started it.
 */
import { JOIN_FAILED } from './cgroups.js';

/** prctl(2) and setsid(2) by architecture: the programs load no modules. */
const SYSCALLS: Readonly<Record<string, { prctl: number; setsid: number }>> = {
  x64: { prctl: 157, setsid: 112 },
  arm64: { prctl: 167, setsid: 157 },
};

function syscalls(): { prctl: number; setsid: number } {
  const sys = SYSCALLS[process.arch];
  if (sys === undefined) throw new Error(`warm servers do not know the system calls of ${process.arch}`);
  return sys;
}

/** Length of the token that opens every connection (hex digits, then a newline). */
export const TOKEN_HEX = 32;

/**
 * `perl -e WARM_PROLOGUE -- <n> <cgroup dir>... <socket dir> <socket name> <program> <args>...`:
 * joins the groups, listens on the name inside the directory (bound relative to it, so the
 * directory's depth never meets the 108 bytes of sun_path), and execs the program with the
 * socket's descriptor number appended.
 */
export const WARM_PROLOGUE = String.raw`
use strict;
my $n = shift @ARGV;
for my $g (splice(@ARGV, 0, $n)) {
  my $f;
  my $ok = open($f, '>', "$g/cgroup.procs") && print($f "$$\n") && close($f);
  if (!$ok) { print STDERR "${JOIN_FAILED} $g\n"; exit 97; }
}
my ($dir, $name) = splice(@ARGV, 0, 2);
# Perl marks descriptors above $^F close-on-exec; this one must reach the server.
$^F = 1023;
my $l;
chdir($dir) && (unlink($name) || 1) && socket($l, 1, 1, 0) && bind($l, pack('S a108', 1, $name)) && listen($l, 128)
  or do { print STDERR "canto: cannot listen on $dir/$name: $!\n"; exit 98; };
exec(@ARGV, fileno($l)) or do { print STDERR "canto: cannot start $ARGV[0]: $!\n"; exit 127; };
`;

/**
 * The pre-forking loop, as Perl subs: `prefork($title, $idle, $eintr)` never returns in the server
 * and returns in a child that holds a connection (as STDIN and STDOUT) whose token checked out.
 */
export function perlPrefork(): string {
  const sys = syscalls();
  return String.raw`
sub take_from {
  my ($fh, $n) = @_; my $s = '';
  while (length($s) < $n) { sysread($fh, $s, $n - length $s, length $s) or return undef; }
  return $s;
}
sub prefork {
  my ($title, $idle, $eintr) = @_;
  open(my $listen, '<&=', $ARGV[-1]) or exit 1;
  @ARGV = ();
  # F_SETFD FD_CLOEXEC: nothing the server or its children start may hold the socket.
  fcntl($listen, 2, 1);
  my $token = take_from(\*STDIN, ${TOKEN_HEX + 1});
  exit 0 unless defined $token;
  my $server = $$;
  # PR_SET_PDEATHSIG SIGKILL: the server dies with nsenter, its children with the server.
  syscall(${sys.prctl}, 1, 9);
  pipe(my $taken_r, my $taken_w) or exit 1;
  pipe(my $sig_r, my $sig_w) or exit 1;
  $0 = $title;
  # Children waiting in accept(2), by pid: one that exits before it took a connection (the guest
  # may kill it) is replaced like one that took a connection.
  my %idle;
  my $fork = sub {
    my $pid = fork();
    $idle{$pid} = 1 if $pid;
    return 0 if !defined $pid || $pid;
    syscall(${sys.prctl}, 1, 9);
    exit 0 if getppid() != $server;
    $SIG{CHLD} = 'DEFAULT';
    close($_) for ($taken_r, $sig_r, $sig_w);
    my $c;
    for (;;) {
      if (!accept($c, $listen)) { next if $! == $eintr; exit 1; }
      # SO_PEERCRED: only root on the host reaches the socket's path; this makes sure of it.
      my $cred = getsockopt($c, 1, 17);
      my (undef, $uid) = defined $cred ? unpack('l L', $cred) : (0, 1);
      last if $uid == 0;
      close($c);
    }
    syswrite($taken_w, "$$\n");
    close($taken_w); close($listen);
    open(STDIN, '<&', $c) or exit 1;
    open(STDOUT, '>&', $c) or exit 1;
    close($c);
    binmode STDIN; binmode STDOUT;
    my $t = take_from(\*STDIN, ${TOKEN_HEX + 1});
    exit 0 unless defined $t && $t eq $token;
    # The agent waits for this before it sends anything: a server that cannot serve is noticed.
    syswrite(STDOUT, '+') or exit 0;
    return 1;
  };
  for (1 .. $idle) { return if $fork->(); }
  # A child's exit wakes the select below through this pipe; a signal alone could come just
  # before it and be missed.
  $SIG{CHLD} = sub { syswrite($sig_w, '.'); };
  syswrite(STDOUT, "ready\n");
  for (;;) {
    my $rin = '';
    vec($rin, $_, 1) = 1 for (0, fileno($taken_r), fileno($sig_r));
    my $ready = select(my $rout = $rin, undef, undef, undef);
    my $wanted = 0;
    if ($ready > 0) {
      sysread($sig_r, my $junk, 64) if vec($rout, fileno($sig_r), 1);
      if (vec($rout, 0, 1)) { exit 0 unless sysread(STDIN, my $junk, 64); }
      if (vec($rout, fileno($taken_r), 1)) {
        sysread($taken_r, my $pids, 4096);
        for my $pid ($pids =~ /([0-9]+)\n/g) { $wanted++ if delete $idle{$pid}; }
      }
    }
    while ((my $pid = waitpid(-1, 1)) > 0) { $wanted++ if delete $idle{$pid}; }
    for (1 .. $wanted) { return if $fork->(); }
  }
}
`;
}

/**
 * The exec server, inside the guest with the guest's capabilities. A child takes
 * `<length as 8 hex digits>\n<command>` and runs it as a cold exec would (`setsid`, then `/bin/sh
 * -c WITH_ENV command`, stdin empty, stdout and stderr real pipes), and relays as frames of a tag
 * byte, 8 hex digits of length and the data: `s` once the command started, `o`/`e` output, `x`
 * the exit code (128 + n for signal n). Like the cold relay it stops at most 5 rounds of 20 ms
 * after the command exits, even while a background job holds the pipes. A `k` from the agent
 * kills the command as a cold kill would (kill_command) and ends the connection without `x`; the
 * agent simply going away leaves the command running, as it does a cold one.
 */
export function execServerProgram(withEnv: string, eintr: number, idle: number): string {
  if (withEnv.includes("'") || withEnv.includes('\\')) throw new Error('the exec wrapper must not hold quotes');
  return String.raw`
use strict;
$SIG{PIPE} = 'IGNORE';
${perlPrefork()}
prefork('canto-exec', ${idle}, ${eintr});
my $head = take_from(\*STDIN, 9) // exit 0;
exit 0 unless $head =~ /^([0-9a-f]{8})\n$/;
my $command = take_from(\*STDIN, hex $1) // exit 0;
# A write blocked on a full socket is interrupted by SIGCHLD (the handler above) when the command
# exits, which it often does right after its last output: that is retried, or the frame (often
# the command's last words on stderr) would be lost.
sub frame {
  my ($tag, $data) = @_;
  my $s = $tag . sprintf('%08x', length $data) . $data;
  my $o = 0;
  while ($o < length $s) {
    my $w = syswrite(STDOUT, $s, length($s) - $o, $o);
    if (!defined $w) { next if $! == ${eintr}; return; }
    return unless $w;
    $o += $w;
  }
}
# Kills the command as a cold exec's kill does: its shell, every descendant, and every session one
# of them leads (background jobs reparented to the guest init included). Several passes: a process
# forked while one pass scanned is caught by the next.
sub kill_command {
  my $root = shift;
  for (1 .. 3) {
    opendir(my $pd, '/proc') or return;
    my (%parent, %session);
    for my $p (grep { /^[0-9]+$/ } readdir($pd)) {
      sysopen(my $fh, "/proc/$p/stat", 0) or next;
      my $s = ''; sysread($fh, $s, 4096);
      next unless $s =~ /\) (.*)$/s;
      my @f = split / /, $1;
      next if $f[0] eq 'Z' || $f[0] eq 'X';
      ($parent{$p}, $session{$p}) = ($f[1], $f[3]);
    }
    my %doomed = map { $_ => 1 } grep { $_ == $root || $session{$_} == $root } keys %parent;
    for (my $grew = 1; $grew; ) {
      $grew = 0;
      for my $p (keys %parent) { if (!$doomed{$p} && $doomed{$parent{$p}}) { $doomed{$p} = 1; $grew = 1; } }
    }
    my %leads = map { $_ => 1 } grep { $session{$_} == $_ } keys %doomed;
    $doomed{$_} = 1 for grep { $leads{$session{$_}} } keys %session;
    delete $doomed{$$};
    last unless %doomed;
    kill('KILL', keys %doomed);
  }
}
pipe(my $in_r, my $in_w) or exit 1;
pipe(my $out_r, my $out_w) or exit 1;
pipe(my $err_r, my $err_w) or exit 1;
pipe(my $sig_r, my $sig_w) or exit 1;
$SIG{CHLD} = sub { syswrite($sig_w, '.'); };
# "Started" goes out before the fork: a child that dies after it (killed by the guest or a stop)
# then reads as "may have run", never as "did not run", so the agent never runs the command twice.
frame('s', '');
my $pid = fork() // exit 1;
if ($pid == 0) {
  # An ignored SIGPIPE would be inherited through exec: the command gets the default back.
  $SIG{PIPE} = 'DEFAULT';
  syscall(${syscalls().setsid});
  open(STDIN, '<&', $in_r); open(STDOUT, '>&', $out_w); open(STDERR, '>&', $err_w);
  close($_) for ($in_r, $in_w, $out_r, $out_w, $err_r, $err_w, $sig_r, $sig_w);
  # Where a cold exec starts (nsenter --wdns): a command sees the same directory either way.
  chdir('/root') or chdir('/');
  exec { '/bin/sh' } '/bin/sh', '-c', '${withEnv}', $command;
  exit 127;
}
close($_) for ($in_r, $in_w, $out_w, $err_w);
my %open = (fileno($out_r) => [$out_r, 'o'], fileno($err_r) => [$err_r, 'e']);
my ($watch, $status, $grace) = (1);
for (;;) {
  my $rin = '';
  vec($rin, $_, 1) = 1 for (keys %open, fileno($sig_r));
  vec($rin, 0, 1) = 1 if $watch;
  my $ready = select(my $rout = $rin, undef, undef, defined $status ? 0.02 : undef);
  if ($ready > 0) {
    sysread($sig_r, my $junk, 64) if vec($rout, fileno($sig_r), 1);
    if ($watch && vec($rout, 0, 1)) {
      my $got = sysread(STDIN, my $said, 64);
      if ($got && index($said, 'k') >= 0) { kill_command($pid); waitpid($pid, 0); exit 0; }
      $watch = 0 unless $got;
    }
    for my $fd (keys %open) {
      next unless vec($rout, $fd, 1);
      my $got = sysread($open{$fd}[0], my $buf, 65536);
      next if !defined $got && $! == ${eintr};
      if (!$got) { delete $open{$fd}; next; }
      frame($open{$fd}[1], $buf);
    }
  }
  # WNOHANG is 1 on Linux.
  if (!defined $status && waitpid($pid, 1) == $pid) { $status = $?; $grace = 5; }
  last if defined $status && (!%open || $grace-- <= 0);
}
frame('x', $status & 127 ? 128 + ($status & 127) : $status >> 8);
`;
}

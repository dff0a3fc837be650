# The port forwarder (see agent/src/runtime/sandbox/guest-ports.ts), run as
# `perl -e FORWARDER -- <desktop id> <listening fd>`: a pre-forking relay in a desktop's network
# namespace. Constants are Linux's, the same on x86-64 and arm64: F_GETFL 3, F_SETFL 4, F_SETFD 2,
# O_NONBLOCK 04000, EINTR 4, EAGAIN 11, SHUT_WR 1, SOL_SOCKET 1, SO_PEERCRED 17, IPPROTO_TCP 6,
# TCP_NODELAY 1, PR_SET_PDEATHSIG 1, PR_SET_DUMPABLE 4; poll events POLLIN 1, POLLOUT 4, POLLERR 8,
# POLLHUP 16.
use strict;
$SIG{PIPE} = 'IGNORE';
my ($desktop, $fd) = @ARGV;
@ARGV = ();
open(my $listen, '<&=', $fd) or exit 1;
fcntl($listen, 2, 1);
# Dies with the agent; not dumpable, so no other process of this uid can ptrace it.
syscall(SYS_prctl, 1, 9);
syscall(SYS_prctl, 4, 0);
# Children are reaped by the kernel.
$SIG{CHLD} = 'IGNORE';
$0 = "canto-ports $desktop";
my $server = $$;

# Both directions of one connection, each [from, to, pending bytes, still reading] over the
# handles (c, t), with backpressure: a direction reads only once what it read before is written.
# ppoll rather than select: only POLLHUP tells the agent closing its end for good from a half-close.
sub relay {
  my ($c, $t) = @_;
  my @fh = ($c, $t);
  for my $fh (@fh) { fcntl($fh, 4, fcntl($fh, 3, 0) | 2048) or return; }
  my @dir = ([0, 1, '', 1], [1, 0, '', 1]);
  for (;;) {
    my @ev = (0, 0);
    my $live = 0;
    for my $d (@dir) {
      if (length $d->[2]) { $ev[$d->[1]] |= 4; $live = 1; }
      elsif ($d->[3]) { $ev[$d->[0]] |= 1; $live = 1; }
    }
    return unless $live;
    my $fds = pack('iss iss', fileno($c), $ev[0], 0, fileno($t), $ev[1], 0);
    if (syscall(SYS_ppoll, $fds, 2, 0, 0, 8) < 0) { next if $! == 4; return; }
    my @rev = (unpack('iss iss', $fds))[2, 5];
    # POLLHUP from the agent's end with nothing left to read, while the guest's answer still flows
    # to it: the agent closed for good (its client went away), so nothing more is wanted.
    return if ($rev[0] & 16) && !($rev[0] & 1) && (length $dir[1][2] || $dir[1][3]);
    for my $d (@dir) {
      if (length $d->[2]) {
        next unless $rev[$d->[1]] & 28;
        my $w = syswrite($fh[$d->[1]], $d->[2]);
        if (!defined $w) { next if $! == 11 || $! == 4; return; }
        substr($d->[2], 0, $w, '');
      } elsif ($d->[3] && ($rev[$d->[0]] & 25)) {
        my $r = sysread($fh[$d->[0]], $d->[2], 262144);
        if (!defined $r) { next if $! == 11 || $! == 4; return; }
        # The end of one side is a half-close of the other.
        if ($r == 0) { $d->[3] = 0; shutdown($fh[$d->[1]], 1); }
      }
    }
  }
}

sub serve {
  my $c = shift;
  # SO_PEERCRED: only root on the host reaches the socket's path; this makes sure of it.
  my $cred = getsockopt($c, 1, 17);
  my (undef, $uid) = defined $cred ? unpack('l L', $cred) : (0, 1);
  return if $uid != 0;
  my $head = '';
  alarm CHILD_CONNECT_SEC;
  while (length $head < 2) { sysread($c, $head, 2 - length $head, length $head) or return; }
  my $port = unpack('n', $head);
  my $t;
  if (!socket($t, 2, 1, 6) || !connect($t, pack('S n C4 x8', 2, $port, 127, 0, 0, 1))) {
    my $errno = ($! + 0) & 255;
    syswrite($c, chr($errno || 255));
    return;
  }
  alarm 0;
  setsockopt($t, 6, 1, 1);
  syswrite($c, "\0") or return;
  relay($c, $t);
}

syswrite(STDOUT, "ready\n");
for (;;) {
  my $rin = '';
  vec($rin, 0, 1) = 1;
  vec($rin, fileno($listen), 1) = 1;
  my $rout = $rin;
  if (select($rout, undef, undef, undef) < 0) { next if $! == 4; exit 1; }
  # The agent is gone.
  if (vec($rout, 0, 1)) { exit 0 unless sysread(STDIN, my $junk, 64); }
  next unless vec($rout, fileno($listen), 1);
  accept(my $c, $listen) or next;
  my $pid = fork();
  if (!defined $pid || $pid) { close($c); next; }
  syscall(SYS_prctl, 1, 9);
  exit 0 if getppid() != $server;
  close($listen); close(STDIN); close(STDOUT);
  serve($c);
  exit 0;
}

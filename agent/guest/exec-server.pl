# The warm exec server, inside the guest with the guest's capabilities (see
# agent/src/runtime/sandbox/warm-perl.ts for the protocol). The prefork subs come first.
use strict;
$SIG{PIPE} = 'IGNORE';
prefork('canto-exec', WARM_IDLE, EINTR);
my $head = take_from(\*STDIN, 9) // exit 0;
exit 0 unless $head =~ /^([0-9a-f]{8})\n$/;
my $command = take_from(\*STDIN, hex $1) // exit 0;
# A write interrupted by a signal is retried, or the frame (often the command's last words on
# stderr) would be lost.
sub frame {
  my ($tag, $data) = @_;
  my $s = $tag . sprintf('%08x', length $data) . $data;
  my $o = 0;
  while ($o < length $s) {
    my $w = syswrite(STDOUT, $s, length($s) - $o, $o);
    if (!defined $w) { next if $! == EINTR; return; }
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
# "Started" goes out before the fork: a child that dies after it (killed by the guest or a stop)
# then reads as "may have run", never as "did not run", so the agent never runs the command twice.
frame('s', '');
my $pid = fork() // exit 1;
if ($pid == 0) {
  # An ignored SIGPIPE would be inherited through exec: the command gets the default back.
  $SIG{PIPE} = 'DEFAULT';
  syscall(SYS_setsid);
  open(STDIN, '<&', $in_r); open(STDOUT, '>&', $out_w); open(STDERR, '>&', $err_w);
  close($_) for ($in_r, $in_w, $out_r, $out_w, $err_r, $err_w);
  # Where a cold exec starts (nsenter --wdns): a command sees the same directory either way.
  chdir('/root') or chdir('/');
  exec { '/bin/sh' } '/bin/sh', '-c', WITH_ENV, $command;
  exit 127;
}
close($_) for ($in_r, $in_w, $out_w, $err_w);
# The command's exit wakes the select below through a pidfd, readable once the shell has exited. Not
# through a SIGCHLD handler: Perl runs handlers between its own steps, so a signal that lands just
# before select(2) is handled only after select returns, which can be never once the pipes have
# ended (the command closed them and then exited). Without pidfds (Linux before 5.3) the wait polls.
my $pidfd = syscall(SYS_pidfd_open, $pid, 0);
my %open = (fileno($out_r) => [$out_r, 'o'], fileno($err_r) => [$err_r, 'e']);
my ($watch, $status, $grace) = (1);
for (;;) {
  my $rin = '';
  vec($rin, $_, 1) = 1 for keys %open;
  vec($rin, $pidfd, 1) = 1 if $pidfd >= 0 && !defined $status;
  vec($rin, 0, 1) = 1 if $watch;
  my $ready = select(my $rout = $rin, undef, undef, defined $status || $pidfd < 0 ? 0.02 : undef);
  if ($ready > 0) {
    if ($watch && vec($rout, 0, 1)) {
      my $got = sysread(STDIN, my $said, 64);
      if ($got && index($said, 'k') >= 0) { kill_command($pid); waitpid($pid, 0); exit 0; }
      $watch = 0 unless $got;
    }
    for my $fd (keys %open) {
      next unless vec($rout, $fd, 1);
      my $got = sysread($open{$fd}[0], my $buf, 65536);
      next if !defined $got && $! == EINTR;
      if (!$got) { delete $open{$fd}; next; }
      frame($open{$fd}[1], $buf);
    }
  }
  # WNOHANG is 1 on Linux.
  if (!defined $status && waitpid($pid, 1) == $pid) { $status = $?; $grace = 5; }
  last if defined $status && (!%open || $grace-- <= 0);
}
frame('x', $status & 127 ? 128 + ($status & 127) : $status >> 8);

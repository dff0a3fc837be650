# The exec relay, between the agent and nsenter, inside the desktop's cgroups (cgroup-join.sh
# runs first): `perl -e RELAY -- <program> <args>...`. Where the spawner binary is built, its
# `--exec` mode is this relay (agent/native/guest-enter.c); this one serves hosts without it. It gives the guest command real pipes and
# copies them to the agent (see agent/src/runtime/sandbox/exec-relay.ts for why).
use strict;
$SIG{PIPE} = 'IGNORE';
my $input = do { local $/; <STDIN> } // '';
pipe(my $in_r, my $in_w) or die "pipe: $!";
pipe(my $out_r, my $out_w) or die "pipe: $!";
pipe(my $err_r, my $err_w) or die "pipe: $!";
my $pid = fork() // die "fork: $!";
if ($pid == 0) {
  # An ignored SIGPIPE would be inherited through exec: the command gets the default back.
  $SIG{PIPE} = 'DEFAULT';
  open(STDIN, '<&', $in_r); open(STDOUT, '>&', $out_w); open(STDERR, '>&', $err_w);
  close($_) for ($in_r, $in_w, $out_r, $out_w, $err_r, $err_w);
  exec(@ARGV) or exit 127;
}
close($_) for ($in_r, $out_w, $err_w);
if (length $input) {
  my $writer = fork() // die "fork: $!";
  if ($writer == 0) {
    close($out_r); close($err_r);
    # Unbuffered: a command that stops reading leaves nothing to flush (and warn about) at exit.
    my $off = 0;
    while ($off < length $input) {
      my $w = syswrite($in_w, $input, length($input) - $off, $off);
      last unless $w;
      $off += $w;
    }
    exit 0;
  }
}
close($in_w);
# Copy both pipes with select(2); once the command has exited, keep going for at most 5 more
# 20 ms rounds. No modules are loaded: this runs once per exec and startup time counts.
my %dst = (fileno($out_r) => \*STDOUT, fileno($err_r) => \*STDERR);
my %open = (fileno($out_r) => $out_r, fileno($err_r) => $err_r);
my ($status, $grace);
while (%open) {
  my $rin = '';
  vec($rin, $_, 1) = 1 for keys %open;
  my $ready = select(my $rout = $rin, undef, undef, 0.02);
  for my $fd (keys %open) {
    next unless $ready > 0 && vec($rout, $fd, 1);
    my $got = sysread($open{$fd}, my $buf, 65536);
    if (!$got) { delete $open{$fd}; next; }
    my $off = 0;
    while ($off < $got) {
      my $w = syswrite($dst{$fd}, $buf, $got - $off, $off);
      last unless defined $w;
      $off += $w;
    }
  }
  # WNOHANG is 1 on Linux.
  if (!defined $status && waitpid($pid, 1) == $pid) { $status = $?; $grace = 5; }
  last if defined $grace && $grace-- <= 0;
}
if (!defined $status) { waitpid($pid, 0); $status = $?; }
exit($status & 127 ? 128 + ($status & 127) : $status >> 8);

# A terminal's input writer (agent/src/runtime/sandbox/guest-terminal.ts): copies what is typed,
# from stdin, into the pty master it was given as fd 3. A program that stops reading fills the
# pty and blocks this process, not the agent; its pipe then fills and the agent stops reading the
# client. Exits when stdin ends or the pty is gone.
use strict;

$SIG{PIPE} = 'IGNORE';
open(my $pty, '>&=', 3) or exit 1;
while (1) {
  my $n = sysread(STDIN, my $buf, 65536);
  last unless $n;
  for (my $off = 0; $off < $n;) {
    my $w = syswrite($pty, $buf, $n - $off, $off);
    # EAGAIN if the fd was ever made non-blocking: wait a little and write on.
    if (!defined $w) { exit 0 unless $! == EAGAIN; select(undef, undef, undef, 0.01); next; }
    $off += $w;
  }
}

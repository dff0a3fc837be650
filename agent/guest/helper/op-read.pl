# read <path> <offset|-> <length> <max whole> [<handoff from>] (see guest-files.ts).
my ($path, $offset, $length, $max) = ($arg[0], $arg[1], num($arg[2]), num($arg[3]));
sysopen(my $fh, $path, O_RDONLY_NB) or oserr('cannot read');
fail('path_conflict', 'path is a directory') if -d $fh;
fail('path_conflict', 'not a regular file') unless -f _;
fail('path_conflict', 'a file of the kernel (/proc, /sys), not of the desktop') if kernel_file($fh);
my $size = -s $fh;
my ($from, $len) = (0, $size);
if ($offset eq '-') {
  fail('too_large', "file is $size bytes, over the whole-file limit of $max bytes") if $size > $max;
} else {
  $from = num($offset);
  $len = $from >= $size ? 0 : $size - $from < $length ? $size - $from : $length;
}
if (defined $arg[4] && $len > 0 && $len >= num($arg[4])) {
  # Handoff (guest-handoff.ts): the agent opens this very descriptor through /proc and reads the
  # bytes itself; the file stays open here until the agent ends the call.
  my @st = stat($fh);
  out("OK $size $len $$ " . fileno($fh) . " $st[0] $st[1]\n");
  1 while sysread(STDIN, my $ignored, 4096);
  exit 0;
}
out("OK $size $len\n");
sysseek($fh, $from, 0) if $len > 0;
my $buf;
while ($len > 0) {
  # A file that shrinks under the read ends the stream early; the caller sees a short body.
  my $got = sysread($fh, $buf, $len < 1048576 ? $len : 1048576);
  exit 1 unless $got;
  out($buf);
  $len -= $got;
}

# write <path> <append at|-> <max append> [h]: replaces or appends from chunked stdin (see guest-files.ts).
my ($path, $at, $max, $handoff) = ($arg[0], $arg[1], num($arg[2]), ($arg[3] // '') eq 'h');
my $target = follow($path);
if ($at eq '-') {
  my @st = stat($target);
  if (@st) {
    fail('path_conflict', 'path is a directory') if -d _;
    fail('path_conflict', 'not a regular file') unless -f _;
  } elsif ($! == ENOENT) {
    mkparents(dirname($target));
  } else {
    oserr('cannot write', 1);
  }
  # The content goes to an anonymous file (O_TMPFILE) in the target's directory: if the upload
  # aborts or the helper is killed, it vanishes with the process. It gets a name only once
  # complete, and rename(2) then swaps it in atomically. No fsync: the rename is atomic against
  # process death, and on power loss ext4's auto_da_alloc (which writes out a file's data when a
  # rename replaces an existing file) leaves the old or the new content, not an empty file.
  my $dir = dirname($target);
  my ($fh, $tmp);
  if (!sysopen($fh, $dir, O_TMPFILE_WRONLY, 0600)) {
    my $n = $! + 0;
    oserr('cannot write', 1) unless $n == EOPNOTSUPP || $n == EISDIR || $n == EINVAL;
    # No O_TMPFILE on this filesystem: a named temporary, removed on every failure we see.
    $tmp = child($dir, ".canto-write-$$-" . int(rand(1e9)));
    sysopen($fh, $tmp, O_WRONLY_CREAT_EXCL, 0600) or oserr('cannot write', 1);
  }
  my $done;
  if ($handoff) {
    # The agent writes the content through this descriptor (guest-handoff.ts), then sends the
    # commit marker alone; data on the connection would be a protocol error.
    my @fs = stat($fh);
    out("OK $$ " . fileno($fh) . " $fs[0] $fs[1]\n");
    $done = receive(sub { unlink($tmp) if defined $tmp; fail('bad_request', 'data sent on a handed-off write'); });
  } else {
    $done = receive(sub {
      put($fh, $_[0]) or do { my $err = $!; unlink($tmp) if defined $tmp; $! = $err; oserr('cannot write', 1); };
    });
  }
  if (!$done) { unlink($tmp) if defined $tmp; fail('aborted', 'the upload ended before its end marker'); }
  if (@st) { chown($st[4], $st[5], $fh); chmod($st[2] & 07777, $fh); } else { chmod(0644, $fh); }
  if (!defined $tmp) {
    $tmp = child($dir, ".canto-write-$$-" . int(rand(1e9)));
    my $anon = '/proc/self/fd/' . fileno($fh);
    syscall(SYS_linkat, -100, $anon, -100, $tmp, 0x400) == 0 or oserr('cannot write', 1);
  }
  # The replaced content is freed when its last reference goes, inside rename(2) unless something
  # still holds it: for a large file that is milliseconds of page-cache and block release. Held
  # here, it is freed when this helper exits, after the answer is on its way.
  my $old;
  sysopen($old, $target, O_RDONLY_NB) if @st;
  rename($tmp, $target) or do { my $err = $!; unlink($tmp); $! = $err; oserr('cannot write', 1); };
  out("OK\n");
} else {
  $at = num($at);
  # The whole chunk is received before the target is touched, so an aborted upload changes nothing.
  # Kept as a list of pieces: growing one string copies it over and over.
  my (@data, $total);
  my $done = receive(sub {
    push @data, $_[0];
    fail('too_large', "append chunk over $max bytes") if ($total += length $_[0]) > $max;
  });
  fail('aborted', 'the upload ended before its end marker') unless $done;
  my $fh;
  if (!sysopen($fh, $target, O_WRONLY_NB)) {
    oserr('cannot write', 1) unless $! == ENOENT;
    fail('path_conflict', "file does not exist (size 0), append offset is $at", 0) if $at != 0;
    mkparents(dirname($target));
    sysopen($fh, $target, O_WRONLY_CREAT_NB, 0644) or oserr('cannot write', 1);
  }
  # The lock makes check-and-write one step: of two appends at the same offset, one wins.
  fail('path_conflict', 'a file of the kernel (/proc, /sys), not of the desktop') if kernel_file($fh);
  flock($fh, 2) or oserr('cannot lock');
  fail('path_conflict', 'not a regular file') unless -f $fh;
  my $size = -s _;
  fail('path_conflict', "file size is $size, append offset is $at", $size) if $size != $at;
  sysseek($fh, $at, 0);
  for my $piece (@data) {
    next if put($fh, $piece);
    my $err = $!; truncate($fh, $at); $! = $err; oserr('cannot write', 1);
  }
  out("OK\n");
}

/**
 * The guest helper's file operations in Perl (see guest-helper-perl.ts for how the sections are
 * put together, and guest-files.ts for the agent's side of each operation).
 */
import type { PerlConstants, PerlPart } from './guest-helper-perl.js';

export function perlFileParts(k: PerlConstants): { sections: Record<string, string>; ops: Record<string, PerlPart> } {
  const E = k.E;
  const xstat = String.raw`
# statx(2): (type, size, mtime ms, permission bits in octal) or () with $! set.
sub xstat {
  my ($path, $follow) = @_;
  my $buf = "\0" x 256;
  return () if syscall(${k.SYS_statx}, -100, $path, $follow ? 0 : 0x100, 0x7ff, $buf) != 0;
  my ($mode) = unpack('x28 S', $buf);
  my ($size) = unpack('x40 Q', $buf);
  my ($sec, $nsec) = unpack('x112 q L', $buf);
  my $fmt = $mode & 0170000;
  my $type = $fmt == 0100000 ? 'file' : $fmt == 0040000 ? 'directory' : $fmt == 0120000 ? 'symlink' : 'other';
  return ($type, $size, $sec * 1000 + int($nsec / 1000000), sprintf('%o', $mode & 07777));
}
`;

  const files = String.raw`
# Follows a final symlink chain inside the guest, for writes: the content goes to the link's target.
sub follow {
  my $p = shift;
  for (1 .. 40) {
    my $l = readlink($p);
    return $p unless defined $l;
    $l =~ s{(.)/+$}{$1};
    $p = substr($l, 0, 1) eq '/' ? $l : child(dirname($p), $l);
  }
  fail('path_conflict', 'too many levels of symbolic links');
}
sub mkparents {
  my $p = '';
  for my $c (grep { length } split m{/}, shift) {
    $p .= "/$c";
    next if -d $p;
    mkdir($p, 0755) or $! == ${E('EEXIST')} or oserr('cannot create parent directory', 1);
  }
}
# Chunked stdin: calls $sink for each piece; 1 after the commit marker, 0 on EOF before it.
sub receive {
  my $sink = shift;
  my ($ib, $buf) = ('', '');
  for (;;) {
    my $i;
    while (($i = index($ib, "\n")) < 0) {
      return 0 if length($ib) > 20 || !sysread(STDIN, $ib, 65536, length $ib);
    }
    my $n = substr($ib, 0, $i + 1, '');
    return 0 unless $n =~ /^([0-9]{1,12})\n$/;
    $n = $1 + 0;
    return 1 if $n == 0;
    if (length $ib) {
      my $take = length($ib) < $n ? length($ib) : $n;
      $sink->(substr($ib, 0, $take, ''));
      $n -= $take;
    }
    while ($n > 0) {
      # Straight into a reused buffer: no copy of the data on the way to the sink.
      my $got = sysread(STDIN, $buf, $n < 1048576 ? $n : 1048576);
      return 0 unless $got;
      $sink->($buf);
      $n -= $got;
    }
  }
}
`;

  const stat = String.raw`
my @s = xstat($arg[0], 0) or oserr('cannot stat');
out("OK @s\n");
`;

  const list = String.raw`
my ($path, $limit) = ($arg[0], num($arg[1]));
my @s = xstat($path, 1) or oserr('cannot list');
fail('path_conflict', 'not a directory') unless $s[0] eq 'directory';
opendir(my $dh, $path) or oserr('cannot list');
# No "use locale": sort compares the raw bytes of the names.
my @names = sort grep { $_ ne '.' && $_ ne '..' } readdir($dh);
my $truncated = @names > $limit ? 1 : 0;
splice(@names, $limit) if $truncated;
my $o = "OK $truncated\n";
for my $name (@names) {
  my @e = xstat(child($path, $name), 0) or next;
  $o .= "$e[0] $e[1] $e[2] $name\0";
}
out($o);
`;

  const read = String.raw`
my ($path, $offset, $length, $max) = ($arg[0], $arg[1], num($arg[2]), num($arg[3]));
sysopen(my $fh, $path, ${k.O_RDONLY_NB}) or oserr('cannot read');
fail('path_conflict', 'path is a directory') if -d $fh;
fail('path_conflict', 'not a regular file') unless -f _;
my $size = -s _;
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
`;

  const write = String.raw`
my ($path, $at, $max, $handoff) = ($arg[0], $arg[1], num($arg[2]), ($arg[3] // '') eq 'h');
my $target = follow($path);
if ($at eq '-') {
  my @st = stat($target);
  if (@st) {
    fail('path_conflict', 'path is a directory') if -d _;
    fail('path_conflict', 'not a regular file') unless -f _;
  } elsif ($! == ${E('ENOENT')}) {
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
  if (!sysopen($fh, $dir, ${k.O_TMPFILE_WRONLY}, 0600)) {
    my $n = $! + 0;
    oserr('cannot write', 1) unless $n == ${E('EOPNOTSUPP')} || $n == ${E('EISDIR')} || $n == ${E('EINVAL')};
    # No O_TMPFILE on this filesystem: a named temporary, removed on every failure we see.
    $tmp = child($dir, ".canto-write-$$-" . int(rand(1e9)));
    sysopen($fh, $tmp, ${k.O_WRONLY_CREAT_EXCL}, 0600) or oserr('cannot write', 1);
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
    syscall(${k.SYS_linkat}, -100, $anon, -100, $tmp, 0x400) == 0 or oserr('cannot write', 1);
  }
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
  if (!sysopen($fh, $target, ${k.O_WRONLY_NB})) {
    oserr('cannot write', 1) unless $! == ${E('ENOENT')};
    fail('path_conflict', "file does not exist (size 0), append offset is $at", 0) if $at != 0;
    mkparents(dirname($target));
    sysopen($fh, $target, ${k.O_WRONLY_CREAT_NB}, 0644) or oserr('cannot write', 1);
  }
  # The lock makes check-and-write one step: of two appends at the same offset, one wins.
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
`;

  const del = String.raw`
my ($path, $recursive) = @arg;
fail('bad_request', 'cannot delete the root') if $path eq '/';
lstat($path) or oserr('cannot delete');
if (-d _) {
  fail('path_conflict', 'path is a directory; delete it recursively') unless $recursive eq '1';
  # rm walks the tree with openat and never follows a symlink; other mounts inside stay untouched.
  pipe(my $r, my $w) or oserr('pipe');
  my $pid = fork() // oserr('fork');
  if ($pid == 0) {
    $SIG{PIPE} = 'DEFAULT';
    open(STDIN, '<', '/dev/null'); open(STDOUT, '>', '/dev/null'); open(STDERR, '>&', $w);
    exec('/bin/rm', '-rf', '--one-file-system', '--', $path) or exit 127;
  }
  close($w);
  my $msg = do { local $/; <$r> } // '';
  waitpid($pid, 0);
  if ($?) { $msg =~ s/\n.*//s; fail('path_conflict', "could not remove everything: $msg"); }
} else {
  unlink($path) or oserr('cannot delete');
}
out("OK\n");
`;

  return {
    sections: { xstat, files },
    ops: {
      stat: { needs: ['xstat'], body: stat },
      list: { needs: ['xstat'], body: list },
      read: { needs: [], body: read },
      write: { needs: ['files'], body: write },
      delete: { needs: [], body: del },
    },
  };
}

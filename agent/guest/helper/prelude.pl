# What every operation starts with: output, failures (errno to AgentFailure code), small tools.
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
my %missing = map { $_ => 1 } (ENOENT, ENOTDIR);
my %conflict = map { $_ => 1 } (
  EISDIR, EEXIST, ENOTEMPTY, EBUSY, ELOOP, ETXTBSY, ENOSPC, EDQUOT, EFBIG,
  EXDEV, EMLINK, EROFS, EACCES, EPERM, ENXIO,
);
# Fails with the code for errno. ENOTDIR is a conflict when writing (a parent is a file, which
# cannot be created through) but "missing" when reading.
sub oserr {
  my ($what, $writing) = @_;
  my $n = $! + 0; my $text = "$!";
  $text = 'read-only file system' if $n == EROFS;
  $text = 'permission denied (read-only location)' if $n == EACCES || $n == EPERM;
  my $code = $n == ENAMETOOLONG ? 'bad_request'
    : $n == ENOTDIR && $writing ? 'path_conflict'
    : $missing{$n} ? 'path_missing' : $conflict{$n} ? 'path_conflict' : 'runtime_error';
  fail($code, "$what: $text");
}
# Whether an open file lives on the kernel's own filesystems (/proc, /sys). A helper runs with
# more privilege than the guest (it must read any file of the guest's); through a file route or a
# link a guest planted, it would open what the kernel lets only that privilege open (the host's
# memory in /proc/kcore, a lower oom_score_adj). Such files are never the guest's files.
sub kernel_file {
  my $dev = (stat($_[0]))[0];
  my $root = (stat('/'))[0];
  for my $dir ('/proc', '/sys') {
    my $at = (stat($dir))[0];
    return 1 if defined $at && defined $root && $at != $root && defined $dev && $dev == $at;
  }
  return 0;
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

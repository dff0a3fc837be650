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
# From here on, no more privilege than the guest's root (docs/decisions.md): the guest's
# capabilities, and undumpable first. A helper starts with every capability (but `spawn`'s, which
# starts with the guest's and hands the agent nothing), which alone keeps the guest (root, with
# fewer) from tracing it; with the guest's set it would be the guest's to trace, and a traced
# helper could have the agent open any descriptor it names. Undumpable, it takes CAP_SYS_PTRACE,
# which the guest lacks, to trace it or open its /proc entries. The bounding set goes too, for
# what a helper starts; past the kernel's last capability the drop is EINVAL. The sets kept are
# the guest's within those the helper has: capset cannot add one a host withheld from it.
syscall(SYS_prctl, 4, 0) == 0 or fail('runtime_error', "cannot make the helper undumpable: $!");
for my $cap (0 .. 63) {
  next if (GUEST_CAP_MASK >> $cap) & 1;
  next if syscall(SYS_prctl, 24, $cap) == 0;
  last if $! == EINVAL;
  fail('runtime_error', "cannot drop capability $cap from the helper's bounding set: $!");
}
{
  # _LINUX_CAPABILITY_VERSION_3, this process; effective, permitted, inheritable per 32 bits. In
  # variables: syscall() passes a string as a pointer, which capget writes through.
  my ($head, $data) = (pack('L2', 0x20080522, 0), "\0" x 24);
  syscall(SYS_capget, $head, $data) == 0 or fail('runtime_error', "cannot read the helper's capabilities: $!");
  my (undef, $perm_lo, undef, undef, $perm_hi) = unpack('L6', $data);
  my ($lo, $hi) = (GUEST_CAP_MASK & 0xffffffff & $perm_lo, (GUEST_CAP_MASK >> 32) & $perm_hi);
  $data = pack('L6', $lo, $lo, 0, $hi, $hi, 0);
  syscall(SYS_capset, $head, $data) == 0 or fail('runtime_error', "cannot drop the helper's capabilities: $!");
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
# Whether an open file lives on the kernel's own filesystems (/proc, /sys). Such files are never
# the guest's files, and the agent, which opens what a helper hands it with the host's privilege,
# refuses them too (guest-handoff.ts): the helper says so first, with the file route's answer.
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

# Shared by stat and list.
# statx(2): (type, size, mtime ms, permission bits in octal) or () with $! set.
sub xstat {
  my ($path, $follow) = @_;
  my $buf = "\0" x 256;
  return () if syscall(SYS_statx, -100, $path, $follow ? 0 : 0x100, 0x7ff, $buf) != 0;
  my ($mode) = unpack('x28 S', $buf);
  my ($size) = unpack('x40 Q', $buf);
  my ($sec, $nsec) = unpack('x112 q L', $buf);
  my $fmt = $mode & 0170000;
  my $type = $fmt == 0100000 ? 'file' : $fmt == 0040000 ? 'directory' : $fmt == 0120000 ? 'symlink' : 'other';
  return ($type, $size, $sec * 1000 + int($nsec / 1000000), sprintf('%o', $mode & 07777));
}

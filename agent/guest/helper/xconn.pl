# A connection to the guest's X server, for `xsize` and `xinput`: the setup request and the
# server's setup reply, read whole. No module: the socket constants of Linux (AF_UNIX 1,
# SOCK_STREAM 1) and sockaddr_un are written out, as the warm prologue does. Anything the guest put
# at the socket's path may answer, or not; the caller arms a deadline, and reads are bounded.
sub xread {
  my ($fh, $n) = @_; my $s = '';
  while (length($s) < $n) { sysread($fh, $s, $n - length $s, length $s) or return undef; }
  return $s;
}
# The connection, the setup reply's body, and the offset in it of screen 0's block.
sub xconnect {
  my $x;
  socket($x, 1, 1, 0) or fail('runtime_error', "cannot create a socket: $!");
  connect($x, pack('S a108', 1, X_SOCKET)) or fail('runtime_error', "X session down: cannot connect to the X server: $!");
  # Little-endian replies ('l'), protocol 11.0, no authorization (Xvfb lets local clients in).
  put($x, pack('a x v v v v x2', 'l', 11, 0, 0, 0)) or fail('runtime_error', "X session down: $!");
  my $head = xread($x, 8) // fail('runtime_error', 'X session down: the X server closed the connection');
  my ($status, $why_len, $words) = unpack('C C x4 v', $head);
  my $body = xread($x, 4 * $words) // fail('runtime_error', 'X session down: the X server closed the connection');
  if ($status != 1) {
    my $why = $status == 0 ? substr($body, 0, $why_len) : 'authorization required';
    $why =~ tr/\x20-\x7e//cd;
    fail('runtime_error', "X session down: the X server refused the connection: $why");
  }
  # After 32 fixed bytes: the vendor string (padded to 4), 8 bytes per pixmap format, then screen
  # 0: its root window first, its width and height in pixels at bytes 20 and 22.
  fail('runtime_error', 'the X server sent a malformed setup reply') if length($body) < 32;
  my ($vendor, $screens, $formats) = unpack('x16 v x2 C C', $body);
  my $at = 32 + (($vendor + 3) & ~3) + 8 * $formats;
  fail('runtime_error', 'the X server sent a malformed setup reply') unless $screens >= 1 && length($body) >= $at + 24;
  return ($x, $body, $at);
}

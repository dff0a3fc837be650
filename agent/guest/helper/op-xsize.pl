# xsize: the X server's current screen size, for screenshots (screenshot.ts). It is read from the
# setup reply of a fresh connection rather than with a RandR request: the connection block holds
# screen 0's size, RandR rewrites it on every resize (RREditConnectionInfo; checked against
# `xrandr --fb`, including a resize made by a guest user), and the setup reply is the server's
# first answer, so one round trip is all it costs (about 0.1 ms). No module: the socket constants
# of Linux (AF_UNIX 1, SOCK_STREAM 1) and sockaddr_un are written out, as the warm prologue does.
# Anything the guest put at the socket's path may answer, or not; it gets a deadline and a bounded read.
$SIG{ALRM} = sub { fail('runtime_error', 'X session down: the X server did not answer') };
alarm X_ANSWER_SEC;
sub xread {
  my ($fh, $n) = @_; my $s = '';
  while (length($s) < $n) { sysread($fh, $s, $n - length $s, length $s) or return undef; }
  return $s;
}
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
# After 32 fixed bytes: the vendor string (padded to 4), 8 bytes per pixmap format, then screen 0,
# whose width and height in pixels are at bytes 20 and 22.
fail('runtime_error', 'the X server sent a malformed setup reply') if length($body) < 32;
my ($vendor, $screens, $formats) = unpack('x16 v x2 C C', $body);
my $at = 32 + (($vendor + 3) & ~3) + 8 * $formats;
fail('runtime_error', 'the X server sent a malformed setup reply') unless $screens >= 1 && length($body) >= $at + 24;
my ($w, $h) = unpack("x$at x20 v v", $body);
out("OK $w $h\n");

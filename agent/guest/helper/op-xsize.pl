# xsize: the X server's current screen size, for screenshots (screenshot.ts). It is read from the
# setup reply of a fresh connection (xconn.pl) rather than with a RandR request: the connection
# block holds screen 0's size, RandR rewrites it on every resize (RREditConnectionInfo; checked
# against `xrandr --fb`, including a resize made by a guest user), and the setup reply is the
# server's first answer, so one round trip is all it costs (about 0.1 ms).
$SIG{ALRM} = sub { fail('runtime_error', 'X session down: the X server did not answer') };
alarm X_ANSWER_SEC;
my ($x, $body, $at) = xconnect();
my ($w, $h) = unpack("x$at x20 v v", $body);
out("OK $w $h\n");

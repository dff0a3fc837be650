# The start of every warm server, on the host (guest-entry.ts: the program it execs enters the
# guest): `perl -e PROLOGUE -- <socket dir> <socket name> <program> <args>...` listens on the name
# inside the directory (bound relative to it, so the directory's depth never meets the 108 bytes
# of sun_path), and execs the program with the socket's descriptor number appended.
use strict;
my ($dir, $name) = splice(@ARGV, 0, 2);
# Perl marks descriptors above $^F close-on-exec; this one must reach the server.
$^F = 1023;
my $l;
chdir($dir) && (unlink($name) || 1) && socket($l, 1, 1, 0) && bind($l, pack('S a108', 1, $name)) && listen($l, 128)
  or do { print STDERR "canto: cannot listen on $dir/$name: $!\n"; exit 98; };
exec(@ARGV, fileno($l)) or do { print STDERR "canto: cannot start $ARGV[0]: $!\n"; exit 127; };

# How a warm helper gets its operation: a child of the file server (prefork.pl) holding a
# connection reads one request from it, `<8 hex digits: length>\n<op>\0<arg>\0...`, with
# exact-length reads so that not a byte of what follows (upload chunks) is taken early. The process
# title then names the operation, as a cold helper's arguments do.
prefork('canto-helper', WARM_IDLE, EINTR);
my $head = take_from(\*STDIN, 9) // exit 0;
exit 1 unless $head =~ /^([0-9a-f]{8})\n$/;
@ARGV = split /\0/, take_from(\*STDIN, hex $1) // exit(0), -1;
$0 = "canto-helper @ARGV";
# A write may answer before it has read its upload. Closing a connection with input unread resets
# it, and the agent would lose the answer; so the answer is followed by our end of the stream, and
# the rest of the input is read until the agent ends its side (it does once it has the answer).
my $drain = $ARGV[0] eq 'write';
END {
  if ($drain) {
    shutdown(STDOUT, 1);
    alarm 30;
    1 while sysread(STDIN, my $rest, 65536);
  }
}

# pointer: a batch of pointer steps played into the X server over one connection
# (agent/src/runtime/sandbox/computer-use/guest-input.ts `pointerSteps`), then the cursor read
# back from the server. What xdotool does for the same actions, without a process and a connection
# per action: a move is WarpPointer to the root window (xdotool's mousemove), a button goes down or
# up through the XTEST extension's FakeInput (xdotool's click, mousedown, mouseup). Steps:
#   m X Y   move to (X, Y)
#   h X Y   move halfway from where the cursor is to (X, Y) (a drag's middle motion)
#   p B     press button B        r B   release button B
#   s MS    sleep MS milliseconds (the server keeps what was sent; nothing waits on it)
# Requests that answer nothing are written as they come; a reply is awaited only for the XTEST
# opcode, a halfway move and the final QueryPointer, which also tells that every request before
# it was carried out. An X error fails the call, as a failing xdotool fails its action; events the
# server sends every client (MappingNotify) are skipped. Each reply gets the X_ANSWER_SEC deadline.
$SIG{ALRM} = sub { fail('runtime_error', 'X session down: the X server did not answer') };
alarm X_ANSWER_SEC;
my @steps = @arg;
my ($x, $body, $at) = xconnect();
alarm 0; # until the next reply is awaited: a batch's waits may sleep longer than a reply may take
my $root = unpack("x$at V", $body);
my $sent = 0;
my $send = sub {
  put($x, shift) or fail('runtime_error', "X session down: $!");
  $sent++;
};
# The reply to the request just sent, whole.
my $reply = sub {
  my $want = $sent & 0xffff;
  alarm X_ANSWER_SEC;
  for (;;) {
    my $p = xread($x, 32) // fail('runtime_error', 'X session down: the X server closed the connection');
    my ($kind, $code, $seq, $more) = unpack('C C v V', $p);
    fail('runtime_error', "the X server refused a pointer request (X error $code)") if $kind == 0;
    my $rest = ($kind == 1 || ($kind & 0x7f) == 35) && $more ? xread($x, 4 * $more) : '';
    fail('runtime_error', 'X session down: the X server closed the connection') unless defined $rest;
    next unless $kind == 1 && $seq == $want;
    alarm 0;
    return $p . $rest;
  }
};
my $cursor = sub {
  $send->(pack('C x v V', 38, 2, $root));
  return unpack('x16 s s', $reply->());
};
my $warp = sub { $send->(pack('C x v V V s s v v s s', 41, 6, 0, $root, 0, 0, 0, 0, @_)); };
my $xtest;
my $button = sub {
  my ($type, $b) = @_;
  unless (defined $xtest) {
    $send->(pack('C x v v x2 a8', 98, 4, 5, 'XTEST'));
    my ($present, $opcode) = unpack('x8 C C', $reply->());
    fail('runtime_error', 'the X server has no XTEST extension') unless $present;
    $xtest = $opcode;
  }
  # FakeInput: event type, button, time 0 (at once), root None (the pointer's), no motion.
  $send->(pack('C C v C C x2 V V x8 s s x8', $xtest, 2, 9, $type, $b, 0, 0, 0, 0));
};
while (@steps) {
  my $step = shift @steps;
  if ($step eq 'm') {
    $warp->(num(shift @steps), num(shift @steps));
  } elsif ($step eq 'h') {
    my ($tx, $ty) = (num(shift @steps), num(shift @steps));
    my ($cx, $cy) = $cursor->();
    $warp->(int(($cx + $tx) / 2), int(($cy + $ty) / 2));
  } elsif ($step eq 'p' || $step eq 'r') {
    my $b = num(shift @steps);
    fail('bad_request', 'no such button') unless $b >= 1 && $b <= 7;
    $button->($step eq 'p' ? 4 : 5, $b);
  } elsif ($step eq 's') {
    select(undef, undef, undef, num(shift @steps) / 1000);
  } else {
    fail('bad_request', 'unknown pointer step');
  }
}
my ($cx, $cy) = $cursor->();
out("OK $cx $cy\n");

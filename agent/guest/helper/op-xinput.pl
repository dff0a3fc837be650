# xinput: a batch of pointer and key steps played into the X server over one connection
# (agent/src/runtime/sandbox/computer-use/input-steps.ts), then the cursor read back from the
# server. What xdotool does for the same actions, without a process and a connection per action:
# a move is WarpPointer to the root window (xdotool's mousemove), a button or a key goes down or up
# through the XTEST extension's FakeInput (its click, mousedown, mouseup, key). Steps:
#   m X Y   move to (X, Y)
#   h X Y   move halfway from where the cursor is to (X, Y) (a drag's middle motion)
#   p B     press button B        r B   release button B
#   k S     press the key of keysym S   u S   release it
#   c S US  type keysym S as xdotool's type does: Shift down when S is on its key's second level,
#           the key down, US microseconds, Shift up, the key up, US microseconds
#   s MS    sleep MS milliseconds (the server keeps what was sent; nothing waits on it)
# A keysym is pressed on the lowest keycode that carries it, as xdotool picks it, and only when it
# is that key's first level (or, typed, its second): otherwise xdotool would add other modifiers
# or bind a spare key, and the answer is `OK script` (run the batch as the script), given before
# anything is sent.
# Requests that answer nothing are written as they come; a reply is awaited only for the XTEST
# opcode, the keyboard mapping, a halfway move with no earlier move in the batch, and the final
# QueryPointer, which also tells that every request before it was carried out. An X error fails
# the call, as a failing xdotool fails its action; events the server sends every client
# (MappingNotify) are skipped. Each reply gets the X_ANSWER_SEC deadline.
# Carried out is not yet processed: after a press the window manager's synchronous grab (openbox
# grabs the buttons on client windows to focus on click) makes the server hold every later pointer
# event, a warp's included, until the window manager lets them through, and QueryPointer reports
# the cursor as of the events processed. So the helper keeps where its moves put the cursor
# (clamped to the screen, as the server clamps them): a halfway move starts from there, and the
# final read is repeated every 5 ms until the server reports it, for X_SETTLE_SEC at most (by the
# clock's whole seconds, so between one less and that).
$SIG{ALRM} = sub { fail('runtime_error', 'X session down: the X server did not answer') };
alarm X_ANSWER_SEC;
my %arity = (m => 2, h => 2, p => 1, r => 1, k => 1, u => 1, c => 2, s => 1);
my @plan;
while (@arg) {
  my $step = shift @arg;
  my $n = $arity{$step} // fail('bad_request', 'unknown input step');
  push @plan, [$step, map { num(shift @arg) } 1 .. $n];
}
my ($x, $body, $at) = xconnect();
alarm 0; # until the next reply is awaited: a batch's waits may sleep longer than a reply may take
my ($root, $width, $height) = unpack("x$at V x16 v v", $body);
# Where the steps put the cursor, once a move has placed it.
my ($px, $py);
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
    fail('runtime_error', "the X server refused an input request (X error $code)") if $kind == 0;
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
my $clamp = sub { my ($v, $size) = @_; return $v < 0 ? 0 : $v >= $size ? $size - 1 : $v; };
my $warp = sub {
  ($px, $py) = ($clamp->($_[0], $width), $clamp->($_[1], $height));
  # As asked, not clamped: the screen may have grown since the setup reply told its size.
  $send->(pack('C x v V V s s v v s s', 41, 6, 0, $root, 0, 0, 0, 0, @_));
};
my $xtest;
# The keycode of each keysym the steps name (see above), from the core keyboard mapping.
my %key;
my %shifted;
my $shift;
my @syms = map { [$_->[1], $_->[0] eq 'c'] } grep { $_->[0] eq 'k' || $_->[0] eq 'u' || $_->[0] eq 'c' } @plan;
if (@syms) {
  my ($min, $max) = unpack('x26 C C', $body);
  $send->(pack('C x v C C x2', 101, 2, $min, $max - $min + 1));
  my $map = $reply->();
  my $per = unpack('x C', $map) || 1;
  my @codes = unpack('x32 V*', $map);
  my %first;
  for my $i (0 .. $#codes) {
    $first{$codes[$i]} //= [$min + int($i / $per), $i % $per] if $codes[$i];
  }
  for (@syms) {
    my ($sym, $typed) = @$_;
    my $place = $first{$sym};
    if (!$place || $place->[1] > ($typed ? 1 : 0)) { out("OK script\n"); exit 0; }
    $key{$sym} = $place->[0];
    $shifted{$sym} = 1 if $place->[1] == 1;
  }
  if (%shifted) {
    # The first key of the Shift modifier, as xdotool presses it (GetModifierMapping).
    $send->(pack('C x v', 119, 1));
    my $mods = $reply->();
    $shift = unpack('x32 C', $mods);
    if (!$shift) { out("OK script\n"); exit 0; }
  }
}
my $fake = sub {
  my ($type, $detail) = @_;
  unless (defined $xtest) {
    $send->(pack('C x v v x2 a8', 98, 4, 5, 'XTEST'));
    my ($present, $opcode) = unpack('x8 C C', $reply->());
    fail('runtime_error', 'the X server has no XTEST extension') unless $present;
    $xtest = $opcode;
  }
  # FakeInput: event type, button or keycode, time 0 (at once), root None (the pointer's).
  $send->(pack('C C v C C x2 V V x8 s s x8', $xtest, 2, 9, $type, $detail, 0, 0, 0, 0));
};
for my $step (@plan) {
  my ($s, @v) = @$step;
  if ($s eq 'm') {
    $warp->(@v);
  } elsif ($s eq 'h') {
    my ($cx, $cy) = defined $px ? ($px, $py) : $cursor->();
    $warp->(int(($cx + $v[0]) / 2), int(($cy + $v[1]) / 2));
  } elsif ($s eq 'p' || $s eq 'r') {
    fail('bad_request', 'no such button') unless $v[0] >= 1 && $v[0] <= 7;
    $fake->($s eq 'p' ? 4 : 5, $v[0]);
  } elsif ($s eq 'k' || $s eq 'u') {
    $fake->($s eq 'k' ? 2 : 3, $key{$v[0]});
  } elsif ($s eq 'c') {
    my ($code, $half) = ($key{$v[0]}, $v[1] / 1e6);
    $fake->(2, $shift) if $shifted{$v[0]};
    $fake->(2, $code);
    select(undef, undef, undef, $half) if $half;
    $fake->(3, $shift) if $shifted{$v[0]};
    $fake->(3, $code);
    select(undef, undef, undef, $half) if $half;
  } else {
    select(undef, undef, undef, $v[0] / 1000);
  }
}
my ($cx, $cy) = $cursor->();
my $until = time + X_SETTLE_SEC;
while (defined $px && ($cx != $px || $cy != $py) && time < $until) {
  select(undef, undef, undef, 0.005);
  ($cx, $cy) = $cursor->();
}
out("OK $cx $cy\n");

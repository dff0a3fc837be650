# Shared routines of the write operation.
# Follows a final symlink chain inside the guest, for writes: the content goes to the link's target.
sub follow {
  my $p = shift;
  for (1 .. 40) {
    my $l = readlink($p);
    return $p unless defined $l;
    $l =~ s{(.)/+$}{$1};
    $p = substr($l, 0, 1) eq '/' ? $l : child(dirname($p), $l);
  }
  fail('path_conflict', 'too many levels of symbolic links');
}
sub mkparents {
  my $p = '';
  for my $c (grep { length } split m{/}, shift) {
    $p .= "/$c";
    next if -d $p;
    mkdir($p, 0755) or $! == EEXIST or oserr('cannot create parent directory', 1);
  }
}
# Chunked stdin: calls $sink for each piece; 1 after the commit marker, 0 on EOF before it.
sub receive {
  my $sink = shift;
  my ($ib, $buf) = ('', '');
  for (;;) {
    my $i;
    while (($i = index($ib, "\n")) < 0) {
      return 0 if length($ib) > 20 || !sysread(STDIN, $ib, 65536, length $ib);
    }
    my $n = substr($ib, 0, $i + 1, '');
    return 0 unless $n =~ /^([0-9]{1,12})\n$/;
    $n = $1 + 0;
    return 1 if $n == 0;
    if (length $ib) {
      my $take = length($ib) < $n ? length($ib) : $n;
      $sink->(substr($ib, 0, $take, ''));
      $n -= $take;
    }
    while ($n > 0) {
      # Straight into a reused buffer: no copy of the data on the way to the sink.
      my $got = sysread(STDIN, $buf, $n < 1048576 ? $n : 1048576);
      return 0 unless $got;
      $sink->($buf);
      $n -= $got;
    }
  }
}

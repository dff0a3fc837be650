# status <id> <tail bytes>: a detached process's state and the tails of its output.
my ($id, $n) = ($arg[0], num($arg[1]));
fail('bad_request', 'malformed process id') unless $id =~ $id_re;
my $dir = "$procs/$id";
if (!-d $dir) { out("OK none\n"); exit 0; }
my ($status, $code) = ('lost', '-');
my ($pid, $start) = recorded($id);
if (defined $pid && alive($pid, $start, $dir)) {
  $status = 'running';
} else {
  # Read after the liveness check: the runner renames exit_code into place before it exits.
  my $c = small("$dir/exit_code", 64);
  ($status, $code) = ('exited', $1 + 0) if defined $c && $c =~ /^([0-9]{1,3})\n?$/;
}
sub tail {
  my ($path, $n) = @_;
  sysopen(my $fh, $path, O_RDONLY_NB) or return '';
  return '' if kernel_file($fh) || !-f $fh;
  my $size = -s _;
  sysseek($fh, $size > $n ? $size - $n : 0, 0);
  my $s = ''; 1 while length($s) < $n && sysread($fh, $s, $n - length($s), length $s);
  return $s;
}
my ($o, $e) = (tail("$dir/stdout", $n), tail("$dir/stderr", $n));
out("OK $status $code " . length($o) . ' ' . length($e) . "\n$o$e");

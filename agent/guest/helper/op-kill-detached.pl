# kill-detached: kills every detached process and its tree, before a memory snapshot.
my @leaders;
if (opendir(my $dh, $procs)) {
  for my $id (grep { $_ =~ $id_re } readdir($dh)) {
    my ($pid, $start) = recorded($id);
    push @leaders, $pid if defined $pid && $pid > 1 && alive($pid, $start, "$procs/$id");
  }
}
if (@leaders) {
  # Each runner leads its own session and process group. Its whole tree goes, runner first, so
  # it cannot record an exit code: the process then reads as lost.
  my (%kids, %group);
  opendir(my $pd, '/proc') or oserr('cannot list processes');
  for my $p (grep { /^[0-9]+$/ } readdir($pd)) {
    my $s = small("/proc/$p/stat", 4096, 1);
    next unless defined $s && $s =~ /\) (.*)$/s;
    my @f = split / /, $1;
    push @{$kids{$f[1]}}, $p;
    push @{$group{$f[2]}}, $p;
    push @{$group{$f[3]}}, $p if $f[3] != $f[2];
  }
  my %doomed;
  for my $leader (@leaders) {
    my @queue = ($leader, @{$group{$leader} // []});
    while (@queue) {
      my $p = shift @queue;
      next if $doomed{$p} || $p <= 1;
      $doomed{$p} = 1;
      push @queue, @{$kids{$p} // []};
    }
  }
  kill('KILL', @leaders);
  kill('KILL', keys %doomed);
  # Gone or a zombie before the caller snapshots the guest.
  for (1 .. 200) {
    last unless grep { my $s = small("/proc/$_/stat", 4096, 1); defined $s && $s !~ /\) [ZX] / } keys %doomed;
    select(undef, undef, undef, 0.01);
  }
}
out('OK ' . scalar(@leaders) . "\n");

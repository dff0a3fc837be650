# The pre-forking loop of every warm server (see agent/src/runtime/sandbox/warm-perl.ts), as subs:
# `prefork($title, $idle, $eintr)` never returns in the server and returns in a child that holds
# a connection (as STDIN and STDOUT) whose token checked out.
sub take_from {
  my ($fh, $n) = @_; my $s = '';
  while (length($s) < $n) { sysread($fh, $s, $n - length $s, length $s) or return undef; }
  return $s;
}
sub prefork {
  my ($title, $idle, $eintr) = @_;
  open(my $listen, '<&=', $ARGV[-1]) or exit 1;
  @ARGV = ();
  # F_SETFD FD_CLOEXEC: nothing the server or its children start may hold the socket.
  fcntl($listen, 2, 1);
  my $token = take_from(\*STDIN, TOKEN_LEN);
  exit 0 unless defined $token;
  my $server = $$;
  # PR_SET_PDEATHSIG SIGKILL: the server dies with nsenter, its children with the server.
  syscall(SYS_prctl, 1, 9);
  pipe(my $taken_r, my $taken_w) or exit 1;
  pipe(my $sig_r, my $sig_w) or exit 1;
  $0 = $title;
  # Children waiting in accept(2), by pid: one that exits before it took a connection (the guest
  # may kill it) is replaced like one that took a connection.
  my %idle;
  my $fork = sub {
    my $pid = fork();
    $idle{$pid} = 1 if $pid;
    return 0 if !defined $pid || $pid;
    syscall(SYS_prctl, 1, 9);
    exit 0 if getppid() != $server;
    $SIG{CHLD} = 'DEFAULT';
    close($_) for ($taken_r, $sig_r, $sig_w);
    my $c;
    for (;;) {
      if (!accept($c, $listen)) { next if $! == $eintr; exit 1; }
      # SO_PEERCRED: only root on the host reaches the socket's path; this makes sure of it.
      my $cred = getsockopt($c, 1, 17);
      my (undef, $uid) = defined $cred ? unpack('l L', $cred) : (0, 1);
      last if $uid == 0;
      close($c);
    }
    syswrite($taken_w, "$$\n");
    close($taken_w); close($listen);
    open(STDIN, '<&', $c) or exit 1;
    open(STDOUT, '>&', $c) or exit 1;
    close($c);
    binmode STDIN; binmode STDOUT;
    my $t = take_from(\*STDIN, TOKEN_LEN);
    exit 0 unless defined $t && $t eq $token;
    # The agent waits for this before it sends anything: a server that cannot serve is noticed.
    syswrite(STDOUT, '+') or exit 0;
    return 1;
  };
  for (1 .. $idle) { return if $fork->(); }
  # A child's exit wakes the select below through this pipe. Perl runs the handler between its own
  # steps, so the exit of one that lands just before select(2) is seen at the next wake (a child
  # taken, another exit): an idle child the guest killed is replaced late at worst, and an
  # operation that finds none waiting runs cold and has the server replaced (warm-pool.ts).
  $SIG{CHLD} = sub { syswrite($sig_w, '.'); };
  syswrite(STDOUT, "ready\n");
  for (;;) {
    my $rin = '';
    vec($rin, $_, 1) = 1 for (0, fileno($taken_r), fileno($sig_r));
    my $ready = select(my $rout = $rin, undef, undef, undef);
    my $wanted = 0;
    if ($ready > 0) {
      sysread($sig_r, my $junk, 64) if vec($rout, fileno($sig_r), 1);
      if (vec($rout, 0, 1)) { exit 0 unless sysread(STDIN, my $junk, 64); }
      if (vec($rout, fileno($taken_r), 1)) {
        sysread($taken_r, my $pids, 4096);
        for my $pid ($pids =~ /([0-9]+)\n/g) { $wanted++ if delete $idle{$pid}; }
      }
    }
    while ((my $pid = waitpid(-1, 1)) > 0) { $wanted++ if delete $idle{$pid}; }
    for (1 .. $wanted) { return if $fork->(); }
  }
}

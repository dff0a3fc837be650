# spawn <id>: starts a detached process from the script on stdin (see guest-processes.ts).
my $id = $arg[0];
fail('bad_request', 'malformed process id') unless $id =~ $id_re;
for my $d ('/root/.canto', $procs) { mkdir($d, 0700) or $! == EEXIST or oserr('cannot create process directory', 1); }
my $dir = "$procs/$id";
# A repeated command (the scheduler re-sends after a lost reply) must not start a second copy.
if (-e $dir) { out("OK\n"); exit 0; }
my $script = do { local $/; <STDIN> } // '';
# The directory appears complete (script inside) or not at all.
my $tmp = "$procs/.$id.$$";
mkdir($tmp, 0700) or oserr('cannot create process directory', 1);
my $sf;
sysopen($sf, "$tmp/script", O_WRONLY_CREAT_EXCL, 0600) && put($sf, $script) && close($sf)
  or oserr('cannot write script', 1);
if (!rename($tmp, $dir)) {
  my $err = $!; unlink("$tmp/script"); rmdir($tmp);
  if ($err == EEXIST || $err == ENOTEMPTY) { out("OK\n"); exit 0; }
  $! = $err; oserr('cannot create process directory', 1);
}
pipe(my $r, my $w) or oserr('pipe');
my $pid = fork() // oserr('fork');
if ($pid == 0) {
  close($r);
  $SIG{PIPE} = 'DEFAULT';
  syscall(SYS_setsid);
  open(STDIN, '<', '/dev/null'); open(STDOUT, '>', '/dev/null'); open(STDERR, '>', '/dev/null');
  # pid and start time: a pid reused after a wake or a cold boot is never taken for this process.
  my $stat = small('/proc/self/stat', 4096, 1) // '';
  my @f = $stat =~ /\) (.*)$/s ? split(/ /, $1) : ();
  my $pf;
  my $ok = defined $f[19] && open($pf, '>', "$dir/.pid.tmp") && print($pf "$$ $f[19]\n") && close($pf)
    && rename("$dir/.pid.tmp", "$dir/pid");
  if (!$ok) { syswrite($w, "cannot record the pid: $!"); exit 1; }
  { exec('/bin/sh', '-c', RUNNER, $dir); }
  syswrite($w, "cannot start /bin/sh: $!");
  exit 127;
}
close($w);
# The pipe is close-on-exec: EOF without a message means the runner started.
my $msg = do { local $/; <$r> } // '';
fail('runtime_error', $msg) if length $msg;
out("OK\n");

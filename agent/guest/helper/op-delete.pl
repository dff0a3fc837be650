# delete <path> <recursive 0|1>.
my ($path, $recursive) = @arg;
fail('bad_request', 'cannot delete the root') if $path eq '/';
lstat($path) or oserr('cannot delete');
if (-d _) {
  fail('path_conflict', 'path is a directory; delete it recursively') unless $recursive eq '1';
  # rm walks the tree with openat and never follows a symlink; other mounts inside stay untouched.
  pipe(my $r, my $w) or oserr('pipe');
  my $pid = fork() // oserr('fork');
  if ($pid == 0) {
    $SIG{PIPE} = 'DEFAULT';
    open(STDIN, '<', '/dev/null'); open(STDOUT, '>', '/dev/null'); open(STDERR, '>&', $w);
    exec('/bin/rm', '-rf', '--one-file-system', '--', $path) or exit 127;
  }
  close($w);
  my $msg = do { local $/; <$r> } // '';
  waitpid($pid, 0);
  if ($?) { $msg =~ s/\n.*//s; fail('path_conflict', "could not remove everything: $msg"); }
} else {
  unlink($path) or oserr('cannot delete');
}
out("OK\n");

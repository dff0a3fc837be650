# The CRIU keeper (see agent/src/runtime/sandbox/criu.ts): `perl -e KEEPER -- <criu> <args>...`
# marks itself a child subreaper, runs CRIU, prints `criu-exit N`, then reaps until its children
# are gone.
$SIG{PIPE} = 'IGNORE';
# prctl(PR_SET_CHILD_SUBREAPER = 36, 1)
syscall(SYS_prctl, 36, 1, 0, 0, 0) == 0 or die "prctl(PR_SET_CHILD_SUBREAPER): $!";
my $pid = fork() // die "fork: $!";
if ($pid == 0) { exec @ARGV or exit 127; }
waitpid($pid, 0);
my $code = $? & 127 ? 128 + ($? & 127) : $? >> 8;
print STDOUT "criu-exit $code\n";
close STDOUT;
open STDOUT, '>', '/dev/null';
open STDERR, '>', '/dev/null';
exit $code if $code;
1 while wait() != -1;

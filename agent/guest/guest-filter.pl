# Installs the guest's seccomp filter (agent/native/guest-filter.c) on this process, then runs the
# program its arguments name: the chain of programs into a guest, where the spawner binary is not
# used, passes through here right after nsenter, while it still holds every capability (so no
# no_new_privs is needed, as the spawner's entry needs none).
use strict;
use warnings;

my $filter = pack 'H*', GUEST_FILTER_HEX;
# struct sock_fprog: the count of instructions, padding to the pointer, the pointer.
my $fprog = pack 'S x6 P', length($filter) / 8, $filter;
syscall(SYS_prctl, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, $fprog, 0, 0) == 0
  or die "canto: cannot install the guest's seccomp filter: $!\n";
exec { $ARGV[0] } @ARGV or die "canto: cannot run $ARGV[0]: $!\n";

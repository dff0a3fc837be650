# Shared by the detached-process operations (spawn, status, kill-detached).
my $id_pattern = PROCESS_ID;
my $id_re = qr/^$id_pattern$/;
my $procs = PROCESSES_DIR;
# Reads a small guest file without blocking on a FIFO; undef unless it is a regular file (and, but
# for the /proc files asked for by name with $kernel, not one of the kernel's).
sub small {
  my ($path, $max, $kernel) = @_;
  sysopen(my $fh, $path, O_RDONLY_NB) or return undef;
  return undef if !$kernel && kernel_file($fh);
  return undef unless -f $fh;
  my $s = ''; 1 while length($s) < $max && sysread($fh, $s, $max - length($s), length $s);
  return $s;
}
# A detached process's runner, alive and not a zombie: the recorded pid with the recorded start
# time (field 22 of /proc/PID/stat), or, after a memory snapshot was restored (which gives every
# process a new start time), the recorded pid still running the runner of this very directory,
# whose path is the last word of its command line.
sub alive {
  my ($pid, $start, $dir) = @_;
  my $s = small("/proc/$pid/stat", 4096, 1);
  return 0 unless defined $s && $s =~ /\) (.*)$/s;
  my @f = split / /, $1;
  return 0 if $f[0] eq 'Z' || $f[0] eq 'X' || !defined $f[19];
  return 1 if $f[19] eq $start;
  my $cmd = small("/proc/$pid/cmdline", 65536, 1);
  return defined $cmd && substr($cmd, 0, 8) eq "/bin/sh\0" && substr($cmd, -length($dir) - 2) eq "\0$dir\0";
}
sub recorded { my $s = small("$procs/$_[0]/pid", 256); return defined $s && $s =~ /^([0-9]+) ([0-9]+)\n?$/ ? ($1, $2) : (); }

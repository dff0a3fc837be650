# list <path> <limit>: OK <truncated 0|1>, then per entry `<type> <size> <mtime ms> <name>\0`.
my ($path, $limit) = ($arg[0], num($arg[1]));
my @s = xstat($path, 1) or oserr('cannot list');
fail('path_conflict', 'not a directory') unless $s[0] eq 'directory';
opendir(my $dh, $path) or oserr('cannot list');
# No "use locale": sort compares the raw bytes of the names.
my @names = sort grep { $_ ne '.' && $_ ne '..' } readdir($dh);
my $truncated = @names > $limit ? 1 : 0;
splice(@names, $limit) if $truncated;
my $o = "OK $truncated\n";
for my $name (@names) {
  my @e = xstat(child($path, $name), 0) or next;
  $o .= "$e[0] $e[1] $e[2] $name\0";
}
out($o);

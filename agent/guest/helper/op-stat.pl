# stat <path>: OK <type> <size> <mtime ms> <octal mode>.
my @s = xstat($arg[0], 0) or oserr('cannot stat');
out("OK @s\n");

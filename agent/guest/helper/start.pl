# The guest helper's first lines, cold or warm (see agent/src/runtime/sandbox/guest-helper.ts).
$SIG{PIPE} = 'IGNORE';
umask 022;
binmode STDIN; binmode STDOUT;

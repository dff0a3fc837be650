# shellcheck shell=sh
# Joins a desktop's cgroups, then execs the program, so that it and everything it forks is limited
# from its first instruction (see agent/src/runtime/sandbox/cgroups.ts):
#   sh -c JOIN canto-join <n> <cgroup dir>... <program> <args>...
# Exits 97, with a line the agent recognizes, when a group cannot be joined: nothing runs unlimited.
n=$1
shift
while [ "$n" -gt 0 ]; do
  echo $$ 2>/dev/null >"$1/cgroup.procs" || { echo "canto: cannot join cgroup $1" >&2; exit 97; }
  shift
  n=$((n - 1))
done
exec "$@"

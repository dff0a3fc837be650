# shellcheck shell=sh
# A terminal's program inside the desktop (agent/src/runtime/sandbox/guest-terminal.ts):
#   sh -c TERMINAL canto-terminal [command]
# Applies the env file, then runs the given command or the guest's login shell. A broken env file
# cannot change how the command is parsed: it runs in a fresh `sh -c`.
# shellcheck disable=SC1091
[ -f /root/.canto/env ] && . /root/.canto/env
if [ $# -gt 0 ]; then exec /bin/sh -c "$1"; fi
if [ -x /bin/bash ]; then exec /bin/bash -l; fi
exec /bin/sh -l

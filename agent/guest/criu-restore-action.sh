#!/bin/sh
# CRIU's action script at a restore (agent/src/runtime/sandbox/host/criu.ts), run at every stage.
# - setup-namespaces (once the namespaces exist, before any process or socket is restored in
#   them): restores run with `--empty-ns net`, so CRIU makes the guest's network namespace empty
#   instead of replaying its links, addresses, routes and firewall tables through `ip` and
#   `iptables-restore` (a third of a wake's time here). A guest has no CAP_NET_ADMIN, so its
#   namespace never holds more than loopback: bringing `lo` up gives back 127.0.0.1 and ::1
#   before CRIU restores the sockets bound to them.
# - post-restore (every process restored, none resumed yet): CRIU binds `--root` read-write (and
#   without nosuid and nodev), so the guest's root is made read-only, nosuid and nodev again as a
#   cold boot has it, and the guest gets its own desktop's hostname (the images hold the hostname
#   of the desktop they were dumped from: a fork's or a template's source). Done here, the guest
#   never runs a moment without either.
# Where the agent's process spawner is built, CRIU runs it as the action script instead
# (agent/native/restore-action.c), which does all three stages itself: the first two the same
# way, and the check as the X protocol's connection setup on display :0's abstract socket in the
# guest's network namespace, without a program inside the guest.
# - post-resume (the guest runs again; CRIU waits for this before it exits): the check that the
#   desktop answers, X taking a client, run as a guest command runs (the guest's namespaces,
#   root and capabilities; CRIU is inside the desktop's cgroups already). Success is an empty
#   file at $CANTO_PROBE_FILE on the host, the client's errors go beside it; the agent reads them
#   once CRIU has exited. Here it costs CRIU's small process a fork, where the agent would pay
#   for one of its own large heap and a chain of programs to enter the guest.
case "$CRTOOLS_SCRIPT_ACTION" in
setup-namespaces) exec nsenter -t "$CRTOOLS_INIT_PID" -n ip link set lo up ;;
post-restore)
  # shellcheck disable=SC2016 # $1 is expanded by the shell inside the guest's namespaces
  exec nsenter -t "$CRTOOLS_INIT_PID" -m -u /bin/sh -c 'mount -o remount,bind,ro,nosuid,nodev / && hostname "$1"' canto-post-restore "$CANTO_GUEST_HOSTNAME" ;;
post-resume)
  if timeout -k 2 "$CANTO_PROBE_SECONDS" nsenter -t "$CRTOOLS_INIT_PID" -m -u -i -n -p -T -r --wdns=/root \
    setpriv "$CANTO_GUEST_BOUNDING_SET" /usr/bin/env -i DISPLAY=:0 /usr/bin/xrandr --current >/dev/null 2>"$CANTO_PROBE_FILE.err"; then
    : >"$CANTO_PROBE_FILE"
  fi ;;
esac
exit 0

#!/bin/sh
# CRIU's action script at a restore (agent/src/runtime/sandbox/host/criu.ts). Restores run with
# `--empty-ns net`: CRIU makes the guest's network namespace empty instead of replaying its links,
# addresses, routes and firewall tables through `ip` and `iptables-restore` (a third of a wake's
# time here). A guest has no CAP_NET_ADMIN, so its namespace never holds more than loopback:
# bringing `lo` up gives back 127.0.0.1 and ::1 before CRIU restores the sockets bound to them.
# CRIU runs the script at every stage; setup-namespaces comes once the namespaces exist and
# before any process or socket is restored in them.
[ "$CRTOOLS_SCRIPT_ACTION" = setup-namespaces ] || exit 0
exec nsenter -t "$CRTOOLS_INIT_PID" -n ip link set lo up

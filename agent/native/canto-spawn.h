/*
 * The modes of the canto-spawn binary besides the process spawner itself (canto-spawn.c): a
 * restore's keeper (keeper.c), CRIU's action script at a restore (restore-action.c), a port
 * gateway's relay (port-relay.c), the way into a guest of cold guest calls (guest-enter.c), the
 * guest's seccomp filter (guest-filter.c), the seal of a guest's /proc (proc-seal.c) and an exec
 * that hands on no stray descriptor (clean-fds.c), chosen by modes.c; and the spawner's IPC
 * channel to the agent (handoff.c).
 */
#ifndef CANTO_SPAWN_H
#define CANTO_SPAWN_H

#include <stddef.h>
#include <stdint.h>

/* The mode the command line names, run, and its exit code; -1 when it names none (modes.c). */
int run_mode(int argc, char **argv);

/* `canto-spawn --keep N CGROUP-DIR... -- PROGRAM ARGS...`; argv as main has it. */
int keep(int argc, char **argv);

/* One stage of a restore (CRTOOLS_SCRIPT_ACTION); its exit code. */
int restore_action(const char *stage);

/* `canto-spawn --relay NETNS-FILE PORT CGROUP-DIR...`, fd 1 the client; its exit code. */
int port_relay(int argc, char **argv);

/* `canto-spawn --enter|--exec PID WORKDIR CAPS N CGROUP-DIR... -- PROGRAM ARGS...` (guest-enter.c). */
int guest_enter(int argc, char **argv);
int guest_exec(int argc, char **argv);

/* The guest's seccomp filter (guest-filter.c): installs it on this process, 0 or -1 with errno. */
int install_guest_filter(void);

/* `canto-spawn --guest-filter`: its instructions to stdout, as bwrap's `--seccomp` reads them. */
int print_guest_filter(void);

/* `canto-spawn --seal-proc PID PATH...` (proc-seal.c): those paths of PID's /proc bound read-only; its exit code. */
int seal_proc(int argc, char **argv);

/* Moves this process into each of the `n` cgroup directories; NULL, or the one it could not join. */
const char *join_cgroups(int n, char **dirs);

/* The relay's exit codes besides 0 (agent/src/runtime/sandbox/ports/port-relays.ts reads them). */
#define RELAY_NOT_RUNNING 10
#define RELAY_REFUSED 11
#define RELAY_UNAVAILABLE 12

/* The IPC channel Node opened to this process (NODE_CHANNEL_FD), moved to fd >= 10; -1 if none. */
int handoff_channel(void);

/* Reads the channel; `got` takes each socket handed over with its request id. -1: it closed. */
int handoff_read(int channel, void (*got)(uint32_t id, int sock));

/* Marks every descriptor from `first` up close-on-exec (clean-fds.c). */
void cloexec_from(int first);

/* `canto-spawn --clean FIRST PROGRAM ARGS...`: cloexec_from(FIRST), then exec the program. */
int clean_exec(int argc, char **argv);

/* Removes the spawner's socket and its private directory (spawn-paths.c). */
void leave(const char *path);

/* `file` as execvp would find it on the PATH of `env`, in `buf`; NULL when not found. */
char *resolve(const char *file, char *const env[], char *buf, size_t size);

#endif

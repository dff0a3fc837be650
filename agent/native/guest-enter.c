/*
 * Entering a desktop's guest without a chain of programs. A cold guest call used to be a shell
 * that joins the desktop's cgroups, then nsenter into the guest init's namespaces and root, then
 * setpriv down to the guest's bounding set, then (for an exec) a Perl relay and setsid before the
 * command: five programs to load, and a Perl compile, before the first instruction of the one
 * that matters (about 10 of a cold exec's 15 ms here). These modes do the same steps in one
 * process:
 *
 *   canto-spawn --enter PID WORKDIR CAPS N CGROUP-DIR... -- PROGRAM ARGS...
 *     joins the N cgroups, enters every namespace of PID (ipc, uts, net, pid, mnt, time) and its
 *     root, changes to WORKDIR there, and runs PROGRAM in a child (a new pid namespace takes only
 *     children), keeping the bounding set to CAPS: `all`, or capability names joined by commas,
 *     as setpriv's `--bounding-set=-all,+a,+b` does. It then exits as the child did (re-raising
 *     its signal), as nsenter does. Its stdio are the child's.
 *
 *   canto-spawn --exec PID WORKDIR CAPS N CGROUP-DIR... -- PROGRAM ARGS...
 *     the same, and the exec relay of agent/guest/exec-relay.pl: the child runs in a session of
 *     its own with real pipes for stdio (a background job holding a socketpair the agent made
 *     would stop CRIU from dumping the desktop), fed from this process's stdin (read whole first)
 *     and copied to its stdout and stderr. Once the child has exited the copy goes on for at most
 *     5 more rounds of 20 ms, so a background job keeping the pipes open cannot hold the exec;
 *     the exit code is the child's, or 128 + n for signal n.
 *
 * A cgroup that cannot be joined ends the mode before anything runs, with the shell join's line
 * and exit code (97), which the agent takes for a desktop that stopped. A namespace that cannot be
 * entered ends it with exit code 1, as nsenter's failures do, and a line starting ENTER_FAILED,
 * which the agent takes the same way; a working directory the guest lacks ends it with exit code 1
 * and a plain line, which an exec reports as the command's own failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "canto-spawn.h"

#define JOIN_FAILED_CODE 97
/* How every failure to get into the guest starts (guest-entry.ts ENTER_FAILED): the desktop stopped. */
#define ENTER_FAILED "canto: cannot enter the guest"
/* The relay's rounds once the command has exited (exec-relay.pl). */
#define ROUND_MS 20
#define GRACE_ROUNDS 5

/* The namespaces nsenter -m -u -i -n -p -T enters, in the order it enters them. */
static const struct {
  const char *name;
  int type;
} NAMESPACES[] = {
    {"ipc", CLONE_NEWIPC}, {"uts", CLONE_NEWUTS}, {"net", CLONE_NEWNET}, {"pid", CLONE_NEWPID}, {"mnt", CLONE_NEWNS}, {"time", CLONE_NEWTIME},
};
#define NAMESPACE_COUNT (sizeof NAMESPACES / sizeof NAMESPACES[0])

/* Capability names as setpriv spells them (without `cap_`). */
static const struct {
  const char *name;
  int cap;
} CAPABILITIES[] = {
    {"chown", CAP_CHOWN},
    {"dac_override", CAP_DAC_OVERRIDE},
    {"dac_read_search", CAP_DAC_READ_SEARCH},
    {"fowner", CAP_FOWNER},
    {"fsetid", CAP_FSETID},
    {"kill", CAP_KILL},
    {"setgid", CAP_SETGID},
    {"setuid", CAP_SETUID},
    {"setpcap", CAP_SETPCAP},
    {"linux_immutable", CAP_LINUX_IMMUTABLE},
    {"net_bind_service", CAP_NET_BIND_SERVICE},
    {"net_broadcast", CAP_NET_BROADCAST},
    {"net_admin", CAP_NET_ADMIN},
    {"net_raw", CAP_NET_RAW},
    {"ipc_lock", CAP_IPC_LOCK},
    {"ipc_owner", CAP_IPC_OWNER},
    {"sys_module", CAP_SYS_MODULE},
    {"sys_rawio", CAP_SYS_RAWIO},
    {"sys_chroot", CAP_SYS_CHROOT},
    {"sys_ptrace", CAP_SYS_PTRACE},
    {"sys_pacct", CAP_SYS_PACCT},
    {"sys_admin", CAP_SYS_ADMIN},
    {"sys_boot", CAP_SYS_BOOT},
    {"sys_nice", CAP_SYS_NICE},
    {"sys_resource", CAP_SYS_RESOURCE},
    {"sys_time", CAP_SYS_TIME},
    {"sys_tty_config", CAP_SYS_TTY_CONFIG},
    {"mknod", CAP_MKNOD},
    {"lease", CAP_LEASE},
    {"audit_write", CAP_AUDIT_WRITE},
    {"audit_control", CAP_AUDIT_CONTROL},
    {"setfcap", CAP_SETFCAP},
    {"mac_override", CAP_MAC_OVERRIDE},
    {"mac_admin", CAP_MAC_ADMIN},
    {"syslog", CAP_SYSLOG},
    {"wake_alarm", CAP_WAKE_ALARM},
    {"block_suspend", CAP_BLOCK_SUSPEND},
    {"audit_read", CAP_AUDIT_READ},
};

/* What the command line names. */
struct entry {
  const char *pid;
  const char *workdir;
  int all_caps;
  uint64_t keep; /* the bounding set to keep, unless all_caps */
  int groups;
  char **group_dirs;
  char **program;
};

const char *join_cgroups(int n, char **dirs) {
  char pid[24];
  int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/cgroup.procs", dirs[i]);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    int ok = fd >= 0 && write(fd, pid, (size_t)len) == len;
    if (fd >= 0) close(fd);
    if (!ok) return dirs[i];
  }
  return NULL;
}

static int parse_caps(const char *list, struct entry *e) {
  if (strcmp(list, "all") == 0) {
    e->all_caps = 1;
    return 0;
  }
  char copy[1024];
  if (snprintf(copy, sizeof copy, "%s", list) >= (int)sizeof copy) return -1;
  char *save = NULL;
  for (char *name = strtok_r(copy, ",", &save); name != NULL; name = strtok_r(NULL, ",", &save)) {
    size_t i = 0;
    while (i < sizeof CAPABILITIES / sizeof CAPABILITIES[0] && strcmp(CAPABILITIES[i].name, name) != 0) i++;
    if (i == sizeof CAPABILITIES / sizeof CAPABILITIES[0]) {
      fprintf(stderr, "canto-spawn: unknown capability %s\n", name);
      return -1;
    }
    e->keep |= UINT64_C(1) << CAPABILITIES[i].cap;
  }
  return 0;
}

/* argv from the mode's name on: PID WORKDIR CAPS N CGROUP-DIR... -- PROGRAM ARGS... */
static int parse(int argc, char **argv, struct entry *e) {
  memset(e, 0, sizeof *e);
  if (argc < 7) return -1;
  e->pid = argv[2];
  e->workdir = argv[3];
  if (parse_caps(argv[4], e) != 0) return -1;
  e->groups = atoi(argv[5]);
  if (e->groups < 0 || 7 + e->groups >= argc || strcmp(argv[6 + e->groups], "--") != 0) return -1;
  e->group_dirs = argv + 6;
  e->program = argv + 7 + e->groups;
  return 0;
}

/* This process into PID's namespaces and root, at WORKDIR: every file opened first, as nsenter does. */
static int enter(const struct entry *e) {
  int fds[NAMESPACE_COUNT];
  char path[64];
  for (size_t i = 0; i < NAMESPACE_COUNT; i++) {
    snprintf(path, sizeof path, "/proc/%s/ns/%s", e->pid, NAMESPACES[i].name);
    fds[i] = open(path, O_RDONLY | O_CLOEXEC);
    /* A kernel without time namespaces has no such file, and no guest in one. */
    if (fds[i] < 0 && !(errno == ENOENT && NAMESPACES[i].type == CLONE_NEWTIME && access("/proc/self/ns/time", F_OK) != 0)) {
      fprintf(stderr, "%s: cannot open %s: %s\n", ENTER_FAILED, path, strerror(errno));
      return -1;
    }
  }
  snprintf(path, sizeof path, "/proc/%s/root", e->pid);
  int root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) {
    fprintf(stderr, "%s: cannot open %s: %s\n", ENTER_FAILED, path, strerror(errno));
    return -1;
  }
  for (size_t i = 0; i < NAMESPACE_COUNT; i++) {
    if (fds[i] < 0) continue;
    if (setns(fds[i], NAMESPACES[i].type) != 0) {
      fprintf(stderr, "%s: the %s namespace of %s: %s\n", ENTER_FAILED, NAMESPACES[i].name, e->pid, strerror(errno));
      return -1;
    }
    close(fds[i]);
  }
  /*
   * Joining the mount namespace put this process at its root, which bwrap made the guest's root.
   * The init's root must be that same directory: a guest that chrooted its init elsewhere (it may
   * trace it) would otherwise have us run its own programs there, with what this entry keeps.
   */
  struct stat at_ns_root, at_init_root;
  if (stat("/", &at_ns_root) != 0 || fstat(root, &at_init_root) != 0 ||
      at_ns_root.st_dev != at_init_root.st_dev || at_ns_root.st_ino != at_init_root.st_ino) {
    fprintf(stderr, "%s: the root of %s is not its mount namespace's root\n", ENTER_FAILED, e->pid);
    return -1;
  }
  if (fchdir(root) != 0 || chroot(".") != 0) {
    fprintf(stderr, "%s: the root of %s: %s\n", ENTER_FAILED, e->pid, strerror(errno));
    return -1;
  }
  close(root);
  if (chdir(e->workdir) != 0) {
    /* The guest is there; its owner removed the directory. Said as nsenter says it, not as a stopped desktop. */
    fprintf(stderr, "canto-spawn: cannot change directory to %s: %s\n", e->workdir, strerror(errno));
    return -1;
  }
  return 0;
}

/* In the child, just before its exec: the bounding set cut down to what the entry keeps. */
static int limit_caps(const struct entry *e) {
  if (e->all_caps) return 0;
  for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++) {
    if (cap < 64 && (e->keep & (UINT64_C(1) << cap))) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) return -1;
  }
  return 0;
}

/* Joins, enters and forks; the child's pid to the parent, 0 to the child, -1 (with the exit code in *code) on failure. */
static pid_t start(int argc, char **argv, const char *mode, struct entry *e, int *code, int (*before_fork)(void)) {
  if (parse(argc, argv, e) != 0) {
    fprintf(stderr, "usage: canto-spawn %s PID WORKDIR CAPS N CGROUP-DIR... -- PROGRAM ARGS...\n", mode);
    *code = 2;
    return -1;
  }
  const char *failed = join_cgroups(e->groups, e->group_dirs);
  if (failed != NULL) {
    fprintf(stderr, "canto: cannot join cgroup %s\n", failed);
    *code = JOIN_FAILED_CODE;
    return -1;
  }
  if ((before_fork != NULL && before_fork() != 0) || enter(e) != 0) {
    *code = 1;
    return -1;
  }
  pid_t child = fork();
  if (child < 0) {
    perror("canto-spawn: fork");
    *code = 1;
  }
  return child;
}

static void run(const struct entry *e) {
  if (limit_caps(e) != 0) {
    perror("canto-spawn: cannot limit the bounding set");
    _exit(126);
  }
  /* Last, with every capability still effective (so without no_new_privs, which bwrap's guests have). */
  if (install_guest_filter() != 0) {
    perror("canto-spawn: cannot install the guest's seccomp filter");
    _exit(126);
  }
  execvp(e->program[0], e->program);
  fprintf(stderr, "canto-spawn: cannot run %s: %s\n", e->program[0], strerror(errno));
  _exit(127);
}

static int wait_for(pid_t child, int *status) {
  while (waitpid(child, status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return 0;
}

int guest_enter(int argc, char **argv) {
  struct entry e;
  int code = 0;
  pid_t child = start(argc, argv, "--enter", &e, &code, NULL);
  if (child < 0) return code;
  if (child == 0) run(&e);
  int status = 0;
  if (wait_for(child, &status) != 0) return 1;
  if (WIFSIGNALED(status)) {
    /* Ends as the child did, as nsenter does, so whoever waits for this sees the signal. */
    signal(WTERMSIG(status), SIG_DFL);
    kill(getpid(), WTERMSIG(status));
    return 128 + WTERMSIG(status);
  }
  return WEXITSTATUS(status);
}

/* The exec's input: all of stdin, read before anything starts (the agent sends it and closes). */
static char *input;
static size_t input_len;

static int read_input(void) {
  size_t room = 0;
  for (;;) {
    if (input_len == room) {
      room = room == 0 ? 65536 : room * 2;
      char *grown = realloc(input, room);
      if (grown == NULL) return -1;
      input = grown;
    }
    ssize_t n = read(0, input + input_len, room - input_len);
    if (n == 0) return 0;
    if (n < 0) {
      if (errno == EINTR) continue;
      /* No stdin at all (closed, or /dev/null's cousins): no input. */
      return errno == EBADF ? 0 : -1;
    }
    input_len += (size_t)n;
  }
}

static void write_all(int fd, const char *buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0 && errno == EINTR) continue;
    /* The agent's end is gone: the rest of this chunk is dropped, as the Perl relay drops it. */
    if (n <= 0) return;
    buf += n;
    len -= (size_t)n;
  }
}

int guest_exec(int argc, char **argv) {
  /* A closed reader must not kill the relay; the command gets the default back below. */
  signal(SIGPIPE, SIG_IGN);
  struct entry e;
  int code = 0;
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    perror("canto-spawn: pipe");
    return 1;
  }
  pid_t child = start(argc, argv, "--exec", &e, &code, read_input);
  if (child < 0) return code;
  if (child == 0) {
    signal(SIGPIPE, SIG_DFL);
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0) _exit(126);
    if (setsid() < 0) _exit(126);
    run(&e);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  int in_fd = in[1];
  size_t written = 0;
  if (input_len == 0) {
    close(in_fd);
    in_fd = -1;
  } else {
    fcntl(in_fd, F_SETFL, fcntl(in_fd, F_GETFL) | O_NONBLOCK);
  }
  int from[2] = {out[0], err[0]};
  const int to[2] = {1, 2};
  int status = 0, exited = 0, grace = 0;
  static char buf[65536];
  while (from[0] >= 0 || from[1] >= 0) {
    struct pollfd p[3] = {{.fd = from[0], .events = POLLIN}, {.fd = from[1], .events = POLLIN}, {.fd = in_fd, .events = POLLOUT}};
    int ready = poll(p, 3, ROUND_MS);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; ready > 0 && i < 2; i++) {
      if (from[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(from[i], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(from[i]);
        from[i] = -1;
        continue;
      }
      write_all(to[i], buf, (size_t)n);
    }
    if (in_fd >= 0 && ready > 0 && (p[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n = write(in_fd, input + written, input_len - written);
      if (n > 0) written += (size_t)n;
      if (written == input_len || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close(in_fd);
        in_fd = -1;
      }
    }
    if (!exited && waitpid(child, &status, WNOHANG) == child) {
      exited = 1;
      grace = GRACE_ROUNDS;
    }
    if (exited && grace-- <= 0) break;
  }
  if (!exited && wait_for(child, &status) != 0) return 1;
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

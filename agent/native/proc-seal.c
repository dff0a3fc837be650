/*
 * `canto-spawn --seal-proc PID PATH...`: binds each PATH of /proc (the agent names /proc/sys and
 * the other writable parts of /proc that act on the whole host: host/proc-seal.ts) onto itself,
 * read-only, in PID's mount namespace, as runc and Docker do for every container.
 *
 * Why: guests are root without a user namespace, and the kernel lets uid 0 write a sysctl by its
 * file mode alone (0644), without asking for a capability. A guest could set
 * `kernel.core_pattern` to a pipe into a file of its own disk (whose host path its mountinfo
 * shows), and the kernel runs that file as the host's root at the next crash; or set
 * `fs.inotify.max_user_instances` for the whole host. /proc/sysrq-trigger reboots the host on a
 * `b`, /proc/dynamic_debug/control floods the kernel log, with no capability asked either. bwrap
 * covers sysrq-trigger, irq and bus itself, but covers /proc/sys only when the directory reads as
 * writable, and procfs refuses writes to that directory even to root while letting root write the
 * files in it: bwrap run by root leaves it writable.
 *
 * It works at the mount namespace's root, which bwrap made the guest's root and a guest cannot
 * move (that takes CAP_SYS_ADMIN), never at PID's own root, which a guest that traces its init can
 * point anywhere. A path already read-only is left as it is, so sealing a running guest again
 * adds nothing; a path this kernel lacks needs no seal. Exits 0, or 1 with a line that says what
 * failed. The agent runs it while bwrap waits on its block fd (cold-boot.ts), and for guests
 * already running when it starts (running-seal.ts).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "canto-spawn.h"


static int failed(const char *what, const char *pid, const char *path) {
  fprintf(stderr, "canto: cannot seal /proc of %s: %s %s: %s\n", pid, what, path, strerror(errno));
  return 1;
}

int seal_proc(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: canto-spawn --seal-proc PID PATH...\n");
    return 2;
  }
  for (int i = 3; i < argc; i++) {
    if (strncmp(argv[i], "/proc/", 6) != 0) {
      fprintf(stderr, "canto-spawn: --seal-proc seals paths of /proc only, not %s\n", argv[i]);
      return 2;
    }
  }
  const char *pid = argv[2];
  char path[64];
  snprintf(path, sizeof path, "/proc/%s/ns/mnt", pid);
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0) return failed("open its mount namespace", pid, "");
  /* Joining a mount namespace puts this process at the namespace's root. */
  if (setns(ns, CLONE_NEWNS) != 0) return failed("enter its mount namespace", pid, "");
  if (chdir("/") != 0) return failed("enter its root", pid, "");
  for (int i = 3; i < argc; i++) {
    const char *p = argv[i];
    struct statvfs st;
    if (statvfs(p, &st) != 0) {
      if (errno == ENOENT) continue;
      return failed("look at", pid, p);
    }
    if (st.f_flag & ST_RDONLY) continue;
    if (mount(p, p, NULL, MS_BIND, NULL) != 0) return failed("bind", pid, p);
    if (mount(NULL, p, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) {
      return failed("remount read-only", pid, p);
    }
  }
  return 0;
}

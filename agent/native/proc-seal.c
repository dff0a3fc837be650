/*
 * `canto-spawn --seal-proc PID`: binds /proc/sys and the other writable parts of /proc that act on
 * the whole host onto themselves, read-only, in PID's mount namespace, as runc and Docker do for
 * every container.
 *
 * Why: guests are root without a user namespace, and the kernel lets uid 0 write a sysctl by its
 * file mode alone (0644), without asking for a capability. A guest could set
 * `kernel.core_pattern` to a pipe into a file of its own disk (whose host path its mountinfo
 * shows), and the kernel runs that file as the host's root at the next crash; or set
 * `fs.inotify.max_user_instances` for the whole host. Writing `b` to /proc/sysrq-trigger reboots
 * the host, with no capability asked either. bwrap means to cover some of them, but run by root
 * (0.8 here) it leaves every one writable: a guest's mountinfo shows no mount over them.
 *
 * The agent runs this while bwrap waits on its block fd (cold-boot.ts): the namespace and its
 * /proc are made, the guest's first instruction has not run. It enters the namespace at PID's
 * root, as guest-enter.c does, and exits 0, or 1 with a line that says what failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "canto-spawn.h"

/* Docker's read-only paths of /proc: the sysctls, the magic SysRq keys, IRQ affinities, and what drivers put there. */
static const char *const SEALED[] = {"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs", "/proc/acpi", "/proc/scsi"};

static int failed(const char *what, const char *pid, const char *path) {
  fprintf(stderr, "canto: cannot seal /proc of %s: %s %s: %s\n", pid, what, path, strerror(errno));
  return 1;
}

int seal_proc(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: canto-spawn --seal-proc PID\n");
    return 2;
  }
  const char *pid = argv[2];
  char path[64];
  snprintf(path, sizeof path, "/proc/%s/ns/mnt", pid);
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  if (ns < 0) return failed("open its mount namespace", pid, "");
  snprintf(path, sizeof path, "/proc/%s/root", pid);
  int root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root < 0) return failed("open its root", pid, "");
  if (setns(ns, CLONE_NEWNS) != 0) return failed("enter its mount namespace", pid, "");
  if (fchdir(root) != 0 || chroot(".") != 0 || chdir("/") != 0) return failed("enter its root", pid, "");
  for (size_t i = 0; i < sizeof SEALED / sizeof SEALED[0]; i++) {
    const char *p = SEALED[i];
    /* What this kernel does not have needs no seal (/proc/acpi without ACPI, /proc/scsi without SCSI). */
    if (access(p, F_OK) != 0 && errno == ENOENT) continue;
    if (mount(p, p, NULL, MS_BIND, NULL) != 0) return failed("bind", pid, p);
    if (mount(NULL, p, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0) {
      return failed("remount read-only", pid, p);
    }
  }
  return 0;
}

/*
 * Action mode: a restore gives this binary to CRIU as its action script, which CRIU runs with no
 * arguments and CRTOOLS_SCRIPT_ACTION set at each of its seven stages. Stages with nothing to do
 * end at once; two do their work here (loopback up; root read-only and the hostname); the check
 * after the resume, a guest command, runs agent/guest/criu-restore-action.sh (its path in
 * CANTO_ACTION_SCRIPT), which says what each stage is for. About 15 ms of a restore's processes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "canto-spawn.h"

/*
 * Enters namespaces of the restored init (this process, which then exits). All are opened
 * first, as nsenter does: once in the mount namespace, /proc is the guest's.
 */
static int enter_ns(const char *pid, const char *const names[], int n) {
  int fds[4];
  for (int i = 0; i < n; i++) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%s/ns/%s", pid, names[i]);
    if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
      fprintf(stderr, "canto-spawn: cannot open %s: %s\n", path, strerror(errno));
      return -1;
    }
  }
  for (int i = 0; i < n; i++) {
    if (setns(fds[i], 0) != 0) {
      fprintf(stderr, "canto-spawn: cannot enter the %s namespace of %s: %s\n", names[i], pid, strerror(errno));
      return -1;
    }
    close(fds[i]);
  }
  return 0;
}

/* ip link set lo up, in the current network namespace. */
static int loopback_up(void) {
  int sk = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  int ok = sk >= 0 && ioctl(sk, SIOCGIFFLAGS, &ifr) == 0;
  if (ok) {
    ifr.ifr_flags |= IFF_UP;
    ok = ioctl(sk, SIOCSIFFLAGS, &ifr) == 0;
  }
  if (!ok) fprintf(stderr, "canto-spawn: cannot bring lo up: %s\n", strerror(errno));
  if (sk >= 0) close(sk);
  return ok ? 0 : -1;
}

/*
 * mount -o remount,bind,ro,nosuid,nodev /: the root as a cold boot has it (CRIU's bind of --root
 * has neither nosuid nor nodev), keeping its other flags, as a bind remount sets every per-mount
 * flag and those not named would be cleared.
 */
static int root_read_only(void) {
  struct statvfs st;
  if (statvfs("/", &st) != 0) return -1;
  unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV;
  if (st.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (st.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (st.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  if (st.f_flag & ST_NOATIME) flags |= MS_NOATIME;
  if (st.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
  if (st.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  if (mount(NULL, "/", NULL, flags, NULL) != 0) {
    fprintf(stderr, "canto-spawn: cannot make / read-only: %s\n", strerror(errno));
    return -1;
  }
  return 0;
}

int restore_action(const char *stage) {
  const char *pid = getenv("CRTOOLS_INIT_PID");
  if (strcmp(stage, "setup-namespaces") == 0) {
    static const char *const net[] = {"net"};
    return pid != NULL && enter_ns(pid, net, 1) == 0 && loopback_up() == 0 ? 0 : 1;
  }
  if (strcmp(stage, "post-restore") == 0) {
    const char *name = getenv("CANTO_GUEST_HOSTNAME");
    static const char *const mnt_uts[] = {"mnt", "uts"};
    if (pid == NULL || name == NULL || enter_ns(pid, mnt_uts, 2) != 0 || root_read_only() != 0) return 1;
    if (sethostname(name, strlen(name)) != 0) {
      fprintf(stderr, "canto-spawn: cannot set the hostname: %s\n", strerror(errno));
      return 1;
    }
    return 0;
  }
  if (strcmp(stage, "post-resume") == 0) {
    const char *script = getenv("CANTO_ACTION_SCRIPT");
    if (script == NULL) return 1;
    execl("/bin/sh", "sh", script, (char *)NULL);
    fprintf(stderr, "canto-spawn: cannot run %s: %s\n", script, strerror(errno));
    return 1;
  }
  return 0;
}

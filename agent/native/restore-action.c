/*
 * Action mode: a restore gives this binary to CRIU as its action script, which CRIU runs with no
 * arguments and CRTOOLS_SCRIPT_ACTION set at each of its seven stages. Stages with nothing to do
 * end at once; three do their work here, as agent/guest/criu-restore-action.sh (the action script
 * where this binary is not built) says what each is for: loopback up; root read-only and the
 * hostname; and, once the guest runs again, the check that X takes a client. The script's check
 * is a chain of five programs ending in xrandr, about 7.5 ms of CPU and 9 ms of every wake; here
 * it is one connection, well under a millisecond.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/un.h>
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

static void interrupted(int sig) { (void)sig; }

/* Why a call failed, in words: EINTR is the deadline's alarm. */
static const char *cause(int err) { return err == EINTR ? "timed out" : strerror(err); }

/*
 * Whether X takes a client: the X protocol's connection setup, as any client opens it with no
 * authorization, on display :0's abstract socket in the network namespace this process is in (the
 * guest's). The abstract name needs no path inside the guest, and the guest's answer is only
 * read, so the check needs none of the guest's confinement. 0 when the server answers Success;
 * otherwise -1, with why in `why`.
 */
static int x_takes_client(int seconds, char *why, size_t n) {
  static const char name[] = "/tmp/.X11-unix/X0";
  /* Byte order 'l' (little-endian), protocol 11.0, empty authorization name and data. */
  static const unsigned char setup[12] = {'l', 0, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  int sk = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sk < 0) {
    snprintf(why, n, "cannot open a socket: %s", strerror(errno));
    return -1;
  }
  /*
   * One deadline for the whole check, as `timeout` gave the script's: an alarm whose handler does
   * nothing, set without SA_RESTART, so that whichever call blocks then (connect, on a full
   * backlog; the write; a read) returns EINTR.
   */
  struct sigaction on_alarm;
  memset(&on_alarm, 0, sizeof on_alarm);
  on_alarm.sa_handler = interrupted;
  sigaction(SIGALRM, &on_alarm, NULL);
  alarm((unsigned)seconds);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path + 1, name, sizeof name - 1);
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + sizeof name - 1);
  unsigned char reply[8];
  size_t got = 0;
  int result = -1;
  if (connect(sk, (struct sockaddr *)&addr, len) != 0) {
    snprintf(why, n, "X on :0 takes no client: %s", cause(errno));
  } else if (write(sk, setup, sizeof setup) != (ssize_t)sizeof setup) {
    snprintf(why, n, "X on :0 took no setup: %s", cause(errno));
  } else {
    ssize_t r = 1;
    while (got < sizeof reply && (r = read(sk, reply + got, sizeof reply - got)) > 0) got += (size_t)r;
    if (got < sizeof reply) {
      const char *how = r == 0 ? "it closed the connection" : cause(errno);
      snprintf(why, n, "X on :0 did not answer a client: %s", how);
    } else if (reply[0] == 1) {
      result = 0;
    } else {
      snprintf(why, n, "X on :0 refused a client (%s)", reply[0] == 2 ? "it asks for authorization" : "setup failed");
    }
  }
  alarm(0);
  close(sk);
  return result;
}

/*
 * The post-resume check's report, where the agent reads it once CRIU has exited: an empty file
 * at `probe` when X took a client, else why not at `probe`.err. A failed check is a report, not
 * a failed stage: CRIU has resumed the guest either way, and the agent decides what to do.
 */
static int post_resume(const char *pid) {
  const char *probe = getenv("CANTO_PROBE_FILE");
  const char *seconds = getenv("CANTO_PROBE_SECONDS");
  if (pid == NULL || probe == NULL) return 1;
  static const char *const net[] = {"net"};
  char why[256] = "cannot enter the guest's network namespace";
  int limit = seconds != NULL ? atoi(seconds) : 0;
  /* An alarm of 0 would never ring. */
  if (limit <= 0) limit = 10;
  int ok = enter_ns(pid, net, 1) == 0 && x_takes_client(limit, why, sizeof why) == 0;
  char path[4096];
  if (snprintf(path, sizeof path, "%s%s", probe, ok ? "" : ".err") >= (int)sizeof path) return 1;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    fprintf(stderr, "canto-spawn: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  if (!ok && write(fd, why, strlen(why)) < 0) fprintf(stderr, "canto-spawn: cannot write %s: %s\n", path, strerror(errno));
  close(fd);
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
  if (strcmp(stage, "post-resume") == 0) return post_resume(pid);
  return 0;
}

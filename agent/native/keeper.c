/*
 * Keeper mode, `canto-spawn --keep N CGROUP-DIR... -- PROGRAM ARGS...`, is what a restore runs
 * CRIU under (agent/src/runtime/sandbox/host/criu.ts): it joins the desktop's cgroups, becomes a
 * child subreaper (CRIU hands the restored tree to its parent when it detaches), runs the program,
 * prints `criu-exit CODE` on stdout, and then stays to reap the restored init, detached from the
 * agent so that desktops outlive it. The same as agent/guest/criu-keeper.pl behind
 * agent/guest/cgroup-join.sh, without a shell and a Perl interpreter to start (7 ms here).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "canto-spawn.h"

/* Exit code and stderr line when a cgroup cannot be joined (cgroups.ts JOIN_FAILED). */
#define JOIN_FAILED_CODE 97

int keep(int argc, char **argv) {
  int n = argc > 2 ? atoi(argv[2]) : -1;
  if (n < 0 || 4 + n >= argc || strcmp(argv[3 + n], "--") != 0) {
    fprintf(stderr, "usage: canto-spawn --keep N CGROUP-DIR... -- PROGRAM ARGS...\n");
    return 2;
  }
  const char *failed = join_cgroups(n, argv + 3);
  if (failed != NULL) {
    fprintf(stderr, "canto: cannot join cgroup %s\n", failed);
    return JOIN_FAILED_CODE;
  }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    perror("prctl(PR_SET_CHILD_SUBREAPER)");
    return 2;
  }
  /* Ignored, as the Perl keeper has it: the program inherits that. */
  signal(SIGPIPE, SIG_IGN);
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    return 2;
  }
  if (child == 0) {
    execvp(argv[4 + n], argv + 4 + n);
    _exit(127);
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  printf("criu-exit %d\n", code);
  fflush(stdout);
  int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, 1);
    dup2(null, 2);
  }
  if (code != 0) return code;
  /* The restored tree's init (and whatever else CRIU left to its parent) is reaped here. */
  while (wait(NULL) != -1 || errno == EINTR) {
  }
  return 0;
}

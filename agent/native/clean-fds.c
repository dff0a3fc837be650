/*
 * Descriptors nobody meant to hand on. The agent inherits whatever its parent left open without
 * close-on-exec (a supervisor's pipe, a shell's redirection, V8's log files under --prof or
 * --perf-basic-prof), and fork and exec hand such descriptors to every child, down to a desktop's
 * processes: a guest would hold a host file or pipe, and CRIU refuses to dump a descriptor of a
 * file outside the guest's mounts, so the desktop would hibernate without its memory. Node opens
 * its own descriptors close-on-exec, so what is left open at an exec is inherited, never the
 * agent's own.
 *
 * The spawner marks every such descriptor close-on-exec as it starts (canto-spawn.c), and the
 * programs the agent starts with Node's spawn into a desktop go through
 * `canto-spawn --clean FIRST PROGRAM ARGS...`, which does the same from FIRST up (the descriptors
 * below it are the ones the agent gave the program) and execs the program.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "canto-spawn.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

void cloexec_from(int first) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, (unsigned)first, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
#endif
  /* Kernels before 5.11: one descriptor at a time, as /proc lists them. */
  DIR *dir = opendir("/proc/self/fd");
  if (dir == NULL) return;
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    char *end;
    long fd = strtol(entry->d_name, &end, 10);
    if (*end != '\0' || end == entry->d_name || fd < first || fd == dirfd(dir)) continue;
    int flags = fcntl((int)fd, F_GETFD);
    if (flags >= 0) fcntl((int)fd, F_SETFD, flags | FD_CLOEXEC);
  }
  closedir(dir);
}

int clean_exec(int argc, char **argv) {
  char *end = NULL;
  long first = argc >= 4 ? strtol(argv[2], &end, 10) : -1;
  if (end == NULL || *end != '\0' || first < 3 || first > 1024) {
    fprintf(stderr, "usage: canto-spawn --clean FIRST-FD PROGRAM ARGS...\n");
    return 2;
  }
  cloexec_from((int)first);
  execvp(argv[3], argv + 3);
  fprintf(stderr, "canto-spawn: %s: %s\n", argv[3], strerror(errno));
  return 127;
}

/*
 * Relay mode, `canto-spawn --relay NETNS-FILE PORT CGROUP-DIR...`: one port link of the port
 * gateway (agent/src/ports/gateway.ts) carried into a desktop without the agent in the path.
 *
 * The agent reads and verifies the link's signed line, then hands the client's TCP connection to
 * the spawner (handoff.c), which starts this with it as fd 1; fd 0 is a connection to the agent.
 * The relay joins the desktop's cgroups (so it counts against the desktop's limits, as the Perl
 * forwarder of guest-ports.ts does), enters the guest's network namespace only (the host's mount
 * and pid namespaces stay: the guest cannot see or signal it, and CRIU never dumps it), drops to
 * `nobody` with no capabilities and no_new_privs, and connects to 127.0.0.1:PORT there. It then
 * answers the link as the gateway would, `OK` or `ERR <code>`, and moves bytes both ways with
 * splice(2) through a pipe per direction: no copy through user space, no event loop of the
 * agent's per chunk.
 *
 * Each side's end reaches the other as a half-close, and the relay exits once both directions
 * have ended. A side that fails (a reset) resets the other, so a client reading to the end of the
 * stream cannot take a cut-off answer for a whole one. So does the agent's end of fd 0 closing:
 * the agent ends a desktop's relays that way before a hibernate (and they die with it, as with
 * PR_SET_PDEATHSIG from the spawner).
 *
 * Exit codes, which the agent logs: 0 relayed; RELAY_NOT_RUNNING the desktop's namespace or groups
 * are gone; RELAY_REFUSED nothing listens on the port; RELAY_UNAVAILABLE anything else.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "canto-spawn.h"

#define CLIENT 1
#define CONTROL 0
#define NOBODY 65534
/* How long a connect inside the guest may take (guest-ports.ts CONNECT_MS). */
#define CONNECT_MS 10000

/* One direction: bytes read from `from` wait in the pipe until `to` takes them. */
struct direction {
  int from, to;
  int pipe[2];
  size_t held;
  size_t room; /* the pipe's capacity */
  int ended; /* `from` reached its end */
  int shut;  /* that end was passed on to `to` */
};

static void say(const char *text) {
  size_t left = strlen(text);
  while (left > 0) {
    ssize_t n = write(CLIENT, text, left);
    if (n > 0) {
      text += n;
      left -= (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd p = {.fd = CLIENT, .events = POLLOUT};
      if (poll(&p, 1, CONNECT_MS) <= 0) return;
    } else {
      return;
    }
  }
}

static int refuse(const char *code, int status) {
  say(code);
  shutdown(CLIENT, SHUT_WR);
  return status;
}

/* Closes `fd` with a reset (SO_LINGER 0) rather than an end. */
static void reset(int fd) {
  struct linger hard = {.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  close(fd);
}

static int drop_privileges(void) {
  /* No capability can come back: not from the bounding set, not as an ambient one. */
  for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) return -1;
  prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 || setresuid(NOBODY, NOBODY, NOBODY) != 0) return -1;
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0 ? 0 : -1;
}

/* A connection to 127.0.0.1:port in the current network namespace; -errno on failure. */
static int connect_guest(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS) {
    int err = errno;
    close(fd);
    return -err;
  }
  struct pollfd p[2] = {{.fd = fd, .events = POLLOUT}, {.fd = CONTROL, .events = POLLIN}};
  int ready;
  while ((ready = poll(p, 2, CONNECT_MS)) < 0 && errno == EINTR) {
  }
  int err = ETIMEDOUT;
  socklen_t size = sizeof err;
  if (ready > 0 && p[1].revents != 0) err = ECANCELED; /* the agent let go meanwhile */
  else if (ready > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &size) != 0) err = errno;
  if (ready <= 0 || err != 0) {
    close(fd);
    return -(err != 0 ? err : ETIMEDOUT);
  }
  int on = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  return fd;
}

/* Moves what it can in direction `d`; -1 when a side failed. */
static int step(struct direction *d, short from_events, short to_events) {
  if ((from_events & (POLLIN | POLLHUP | POLLERR)) && !d->ended && d->held < d->room) {
    ssize_t n = splice(d->from, NULL, d->pipe[1], NULL, d->room - d->held, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n > 0) d->held += (size_t)n;
    else if (n == 0) d->ended = 1;
    else if (errno != EAGAIN && errno != EINTR) return -1;
  }
  if ((to_events & (POLLOUT | POLLERR | POLLHUP)) && d->held > 0) {
    ssize_t n = splice(d->pipe[0], NULL, d->to, NULL, d->held, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    if (n > 0) d->held -= (size_t)n;
    else if (n < 0 && errno != EAGAIN && errno != EINTR) return -1;
  }
  if (d->ended && d->held == 0 && !d->shut) {
    shutdown(d->to, SHUT_WR);
    d->shut = 1;
  }
  return 0;
}

/* Asks `poll` for what direction `d` waits on, from the pollfds of its two sockets. */
static void want(const struct direction *d, struct pollfd *from, struct pollfd *to) {
  if (!d->ended && d->held < d->room) from->events |= POLLIN;
  if (d->held > 0) to->events |= POLLOUT;
}

static int relay(int guest) {
  struct direction dirs[2] = {{.from = CLIENT, .to = guest}, {.from = guest, .to = CLIENT}};
  for (int i = 0; i < 2; i++) {
    if (pipe2(dirs[i].pipe, O_CLOEXEC | O_NONBLOCK) != 0) return RELAY_UNAVAILABLE;
    int room = fcntl(dirs[i].pipe[1], F_GETPIPE_SZ);
    dirs[i].room = room > 0 ? (size_t)room : 4096;
  }
  fcntl(CLIENT, F_SETFL, fcntl(CLIENT, F_GETFL) | O_NONBLOCK);
  while (!(dirs[0].shut && dirs[1].shut)) {
    struct pollfd p[3] = {{.fd = CONTROL, .events = POLLIN}, {.fd = CLIENT}, {.fd = guest}};
    want(&dirs[0], &p[1], &p[2]);
    want(&dirs[1], &p[2], &p[1]);
    /* A socket nothing waits on is left out: its hang-up would otherwise wake the loop for ever. */
    for (int i = 1; i < 3; i++)
      if (p[i].events == 0) p[i].fd = -1;
    if (poll(p, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[0].revents != 0) break; /* the agent let go (or died): reset both */
    short client = p[1].revents, guest_events = p[2].revents;
    if ((client | guest_events) & POLLERR) break;
    if (step(&dirs[0], client, guest_events) != 0 || step(&dirs[1], guest_events, client) != 0) break;
  }
  if (dirs[0].shut && dirs[1].shut) {
    close(guest);
    close(CLIENT);
    return 0;
  }
  reset(guest);
  reset(CLIENT);
  return 0;
}

int port_relay(int argc, char **argv) {
  char *end = NULL;
  long port = argc >= 4 ? strtol(argv[3], &end, 10) : 0;
  if (end == NULL || *end != '\0' || port < 1 || port > 65535) {
    fprintf(stderr, "usage: canto-spawn --relay NETNS-FILE PORT CGROUP-DIR...\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  pid_t parent = getppid();
  if (join_cgroups(argc - 4, argv + 4) != NULL) return refuse("ERR not_running\n", RELAY_NOT_RUNNING);
  int ns = open(argv[2], O_RDONLY | O_CLOEXEC);
  if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) return refuse("ERR not_running\n", RELAY_NOT_RUNNING);
  close(ns);
  if (drop_privileges() != 0) return refuse("ERR unavailable\n", RELAY_UNAVAILABLE);
  /* Set after the change of user, which clears it; dies with the spawner, hence with the agent. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != parent) return RELAY_UNAVAILABLE;
  int guest = connect_guest((int)port);
  if (guest == -ECANCELED) {
    reset(CLIENT);
    return RELAY_UNAVAILABLE;
  }
  if (guest == -ECONNREFUSED) return refuse("ERR refused\n", RELAY_REFUSED);
  if (guest < 0) return refuse("ERR unavailable\n", RELAY_UNAVAILABLE);
  say("OK\n");
  return relay(guest);
}

/*
 * canto-spawn: starts processes for the agent with posix_spawn.
 *
 * The agent's Node starts children with fork and exec (libuv), and fork copies the page tables
 * of the agent's whole resident memory: on a VM that costs the agent's event loop 4-25 ms per
 * child at 100-250 MB. This helper uses posix_spawn (glibc's clone with CLONE_VFORK), which
 * copies no page tables: a child costs it a fraction of a millisecond. The same binary has other
 * modes (canto-spawn.h), each in a file of its own.
 *
 * Protocol. The agent starts the helper once, with its stdin a pipe the helper only watches
 * (end of file: the agent is gone, the helper exits; its children live on, as the agent's would)
 * and its stdout the pipe of events. The helper listens on the unix socket at argv[1], in a
 * directory only the agent can enter, and accepts connections only from its parent
 * (SO_PEERCRED). A child's stdio streams are such connections: the first carries the request,
 * each further one an attach frame naming the request and its index. Once every connection (and
 * socket) a request names has arrived, the child is spawned with them as its fds 0-2, and the
 * helper closes its copies: the agent then holds the only other end of each, as of a pipe.
 *
 * Frames (little-endian, as the agent and helper share a host):
 *   request:  u32 length, u32 id, u32 flags, u8 mode[3], u8 conns, u32 argc, u32 envc,
 *             then NUL-terminated strings: file, cwd ("" for none), argv[argc], env[envc]
 *   attach:   u32 length (8), u32 id, u32 index | 0x80000000
 *   event:    u32 id, u32 type, i32 a, i32 b  (16 bytes on stdout)
 *     'R' ready (id 0); 'S' spawned, a = pid; 'E' not spawned, a = errno;
 *     'X' exited, a = exit code or -1, b = signal or 0
 * mode: 0 /dev/null, 1 the helper's own fd (the agent's stdout or stderr), 2 the socket the agent
 * handed over for the request on Node's IPC channel (handoff.c), 0x10 + k connection k.
 * flags: bit 0 new session (setsid); bit 1 the child waits for a handed-over socket.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "canto-spawn.h"

#define MAX_FRAME (1u << 20)
#define MAX_OPEN 1024 /* connections whose frame has not come; then the backlog holds them */
#define ATTACH_BIT 0x80000000u
#define FLAG_SETSID 1u
#define FLAG_HANDLE 2u
#define MODE_NULL 0
#define MODE_OWN 1
#define MODE_HANDLE 2
#define HAVE_HANDLE 8 /* `have` bit of the handed-over socket */
#define MODE_CONN 0x10

/* A request whose connections have not all arrived, or an attach whose request has not. */
struct pending {
  uint32_t id;
  int conns[3];
  int have; /* bit k: connection k is here; HAVE_HANDLE: the handed-over socket */
  int handle; /* the handed-over socket, or -1 */
  char *req; /* the request frame's body, once it is here */
  uint32_t req_len;
  struct pending *next;
};

/* A spawned child, until it is reaped. */
struct child { pid_t pid; uint32_t id; struct child *next; };

static int events_fd;
static const char *socket_path;
static struct pending *pendings;
static struct child *children;
static int open_conns[MAX_OPEN]; /* accepted connections whose frame has not been read */
static int n_open;

static void emit(uint32_t id, uint32_t type, int32_t a, int32_t b) {
  uint32_t frame[4] = {id, type, (uint32_t)a, (uint32_t)b};
  const char *p = (const char *)frame;
  size_t left = sizeof frame;
  while (left > 0) {
    ssize_t n = write(events_fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) { /* the agent is gone */
      leave(socket_path);
      exit(0);
    }
    p += n;
    left -= (size_t)n;
  }
}

static struct pending *pending_for(uint32_t id) {
  for (struct pending *p = pendings; p != NULL; p = p->next)
    if (p->id == id) return p;
  struct pending *p = calloc(1, sizeof *p);
  if (p == NULL) abort();
  p->id = id;
  for (int k = 0; k < 3; k++) p->conns[k] = -1;
  p->handle = -1;
  p->next = pendings;
  pendings = p;
  return p;
}

static void drop_pending(struct pending *gone) {
  for (struct pending **pp = &pendings; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == gone) {
      *pp = gone->next;
      break;
    }
  }
  for (int k = 0; k < 3; k++)
    if (gone->conns[k] >= 0) close(gone->conns[k]);
  if (gone->handle >= 0) close(gone->handle);
  free(gone->req);
  free(gone);
}

/* The next NUL-terminated string of a request body, or NULL when the body ends first. */
static char *next_string(char **cursor, char *end) {
  char *s = *cursor;
  char *nul = memchr(s, '\0', (size_t)(end - s));
  if (nul == NULL) return NULL;
  *cursor = nul + 1;
  return s;
}

static int spawn_child(struct pending *p, pid_t *pid) {
  /* Layout checked when the frame was read: 20 bytes of header, then the strings. */
  uint32_t flags, argc, envc;
  uint8_t mode[3];
  memcpy(&flags, p->req + 4, 4);
  memcpy(mode, p->req + 8, 3);
  memcpy(&argc, p->req + 12, 4);
  memcpy(&envc, p->req + 16, 4);
  if (argc == 0 || argc > 65536 || envc > 65536) return EINVAL;
  char *cursor = p->req + 20, *end = p->req + p->req_len;
  char *file = next_string(&cursor, end);
  char *cwd = next_string(&cursor, end);
  char **argv = calloc(argc + 1, sizeof *argv);
  char **env = calloc(envc + 1, sizeof *env);
  if (argv == NULL || env == NULL) abort();
  int err = 0;
  for (uint32_t i = 0; i < argc && err == 0; i++)
    if ((argv[i] = next_string(&cursor, end)) == NULL) err = EINVAL;
  for (uint32_t i = 0; i < envc && err == 0; i++)
    if ((env[i] = next_string(&cursor, end)) == NULL) err = EINVAL;
  if (file == NULL || cwd == NULL || (err == 0 && cursor != end)) err = EINVAL; /* a string past the counts: a NUL shifted them */

  char found[4096];
  char *path = err == 0 ? resolve(file, env, found, sizeof found) : NULL;
  if (err == 0 && path == NULL) err = ENOENT;

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  for (int fd = 0; fd < 3 && err == 0; fd++) {
    if (mode[fd] == MODE_NULL) {
      err = posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", O_RDWR, 0);
    } else if (mode[fd] >= MODE_CONN && mode[fd] < MODE_CONN + 3 && p->conns[mode[fd] - MODE_CONN] >= 0) {
      err = posix_spawn_file_actions_adddup2(&actions, p->conns[mode[fd] - MODE_CONN], fd);
    } else if (mode[fd] == MODE_HANDLE && p->handle >= 0) {
      err = posix_spawn_file_actions_adddup2(&actions, p->handle, fd);
    } else if (mode[fd] != MODE_OWN || fd == 0) {
      err = EINVAL; /* the helper's own stdin is the agent's lifeline, never a child's */
    }
  }
  if (err == 0 && cwd[0] != '\0') err = posix_spawn_file_actions_addchdir_np(&actions, cwd);
  /* The child starts with default dispositions and no blocked signals, as after exec from Node. */
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  short attr_flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  if (flags & FLAG_SETSID) attr_flags |= POSIX_SPAWN_SETSID;
  posix_spawnattr_setflags(&attr, attr_flags);
  if (err == 0) err = posix_spawn(pid, path, &actions, &attr, argv, env);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  free(argv);
  free(env);
  return err;
}

/* Spawns the request's child once every connection it names has arrived. */
static void maybe_spawn(struct pending *p) {
  if (p->req == NULL) return;
  uint8_t conns = (uint8_t)p->req[11];
  uint32_t flags;
  memcpy(&flags, p->req + 4, 4);
  int need = ((1 << conns) - 1) | (flags & FLAG_HANDLE ? HAVE_HANDLE : 0);
  if ((p->have & need) != need) return;
  pid_t pid = 0;
  int err = conns > 3 ? EINVAL : spawn_child(p, &pid);
  if (err == 0) {
    struct child *c = malloc(sizeof *c);
    if (c == NULL) abort();
    c->pid = pid;
    c->id = p->id;
    c->next = children;
    children = c;
    emit(p->id, 'S', pid, 0);
  } else {
    emit(p->id, 'E', err, 0);
  }
  drop_pending(p); /* closes the helper's copies of the connections */
}

/* Reads a connection's frame once all of it is here; returns 0 while it is still arriving. */
static int read_frame(int fd) {
  uint32_t len;
  ssize_t n = recv(fd, &len, 4, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return -1;
  if (n < 4) return 0;
  if (len < 8 || len > MAX_FRAME) return -1;
  char *frame = malloc(len + 4);
  if (frame == NULL) abort();
  n = recv(fd, frame, len + 4, MSG_PEEK | MSG_DONTWAIT);
  if (n < (ssize_t)(len + 4)) {
    free(frame);
    return n < 0 && errno != EAGAIN && errno != EINTR ? -1 : 0;
  }
  /* Exactly the frame: what follows it is the child's stdin. */
  if (recv(fd, frame, len + 4, MSG_DONTWAIT) != (ssize_t)(len + 4)) {
    free(frame);
    return -1;
  }
  uint32_t id, word;
  memcpy(&id, frame + 4, 4);
  memcpy(&word, frame + 8, 4);
  struct pending *p;
  if (len == 8 && (word & ATTACH_BIT)) {
    uint32_t k = word & ~ATTACH_BIT;
    free(frame);
    if (k < 1 || k > 2) return -1;
    p = pending_for(id);
    if (p->conns[k] >= 0) return -1;
    p->conns[k] = fd;
    p->have |= 1 << k;
  } else {
    if (len < 20) {
      free(frame);
      return -1;
    }
    p = pending_for(id);
    if (p->req != NULL) {
      free(frame);
      return -1;
    }
    /* Keep the body from the id on, so that offsets match the layout in spawn_child. */
    p->req = frame;
    memmove(frame, frame + 4, len);
    p->req_len = len;
    p->conns[0] = fd;
    p->have |= 1;
  }
  maybe_spawn(p);
  return 1;
}

/* A socket handed over for request `id` (handoff.c); one request takes one. */
static void got_handle(uint32_t id, int sock) {
  struct pending *p = pending_for(id);
  if (p->handle >= 0) {
    close(sock);
    return;
  }
  p->handle = sock;
  p->have |= HAVE_HANDLE;
  maybe_spawn(p);
}

static void reap(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (struct child **cc = &children; *cc != NULL; cc = &(*cc)->next) {
      struct child *c = *cc;
      if (c->pid != pid) continue;
      if (WIFEXITED(status)) emit(c->id, 'X', WEXITSTATUS(status), 0);
      else emit(c->id, 'X', -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
      *cc = c->next;
      free(c);
      break;
    }
  }
}

static int listen_on(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  size_t len = strlen(path);
  if (len == 0 || len >= sizeof addr.sun_path) return -1;
  memcpy(addr.sun_path, path, len);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  /*
   * A burst of starts connects up to three times each before this loop accepts one, and a
   * connection the backlog cannot hold is refused (EAGAIN), not queued. Not SOMAXCONN: musl's
   * is 128, glibc's 4096; the kernel caps either at net.core.somaxconn.
   */
  if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 4096) < 0) return -1;
  return fd;
}

int main(int argc, char **argv) {
  int code = run_mode(argc, argv);
  if (code >= 0) return code;
  if (argc != 2) {
    fprintf(stderr, "usage: canto-spawn SOCKET-PATH (started by the canto agent)\n");
    return 2;
  }
  /* fd 0 is the lifeline, fd 1 the events, fd 3 the agent's stdout (for children that keep it). */
  int channel = handoff_channel();
  int lifeline = fcntl(0, F_DUPFD_CLOEXEC, 10);
  events_fd = fcntl(1, F_DUPFD_CLOEXEC, 10);
  if (lifeline < 0 || events_fd < 0) return 2;
  int null = open("/dev/null", O_RDWR);
  if (null < 0 || dup2(null, 0) < 0) return 2;
  if (dup2(fcntl(3, F_GETFD) >= 0 ? 3 : null, 1) < 0) return 2;
  if (null > 2) close(null);
  close(3);
  cloexec_from(3); /* what the agent inherited reaches no child (clean-fds.c) */
  signal(SIGPIPE, SIG_IGN);

  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sig_fd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  socket_path = argv[1];
  int listen_fd = listen_on(socket_path);
  if (sig_fd < 0 || listen_fd < 0) {
    perror("canto-spawn");
    return 2;
  }
  pid_t agent = getppid();
  emit(0, 'R', getpid(), 0);

  struct pollfd fds[4 + MAX_OPEN];
  for (;;) {
    fds[0] = (struct pollfd){.fd = lifeline, .events = POLLIN};
    fds[1] = (struct pollfd){.fd = sig_fd, .events = POLLIN};
    fds[2] = (struct pollfd){.fd = listen_fd, .events = n_open < MAX_OPEN ? POLLIN : 0};
    fds[3] = (struct pollfd){.fd = channel, .events = POLLIN};
    for (int i = 0; i < n_open; i++) fds[4 + i] = (struct pollfd){.fd = open_conns[i], .events = POLLIN};
    int ready = poll(fds, (nfds_t)(4 + n_open), -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return 2;
    }
    if (fds[0].revents) { /* the agent closed the lifeline or died */
      leave(argv[1]);
      return 0;
    }
    if (fds[1].revents) {
      struct signalfd_siginfo info;
      while (read(sig_fd, &info, sizeof info) == sizeof info) {
      }
      reap();
    }
    /* Handles before frames: a request whose socket came in the same turn starts in it. */
    if (fds[3].revents && handoff_read(channel, got_handle) < 0) {
      close(channel);
      channel = -1;
    }
    /* Frames first: a connection whose frame completes leaves the open list. */
    for (int i = n_open - 1; i >= 0; i--) {
      if (fds[4 + i].revents == 0) continue;
      int fd = open_conns[i];
      int got = read_frame(fd);
      if (got == 0) continue;
      if (got < 0) close(fd);
      open_conns[i] = open_conns[--n_open];
    }
    if (fds[2].revents) {
      /* Frames come after connections: a full list takes no more, and never drops one. */
      while (n_open < MAX_OPEN) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        struct ucred cred;
        socklen_t size = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &size) < 0 || cred.pid != agent) {
          close(fd);
          continue;
        }
        /* The child's end must block, as a pipe from Node's spawn would. */
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        int got = read_frame(fd);
        if (got == 0) open_conns[n_open++] = fd;
        else if (got < 0) close(fd);
      }
    }
  }
}

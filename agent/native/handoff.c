/*
 * Sockets handed to the spawner over Node's IPC channel, so that a child can be given a
 * connection the agent accepted (the port gateway's, agent/src/ports/gateway.ts) and the agent
 * can leave the data path.
 *
 * Node passes a descriptor between processes only over the channel `child_process.spawn` opens
 * with an `ipc` stdio entry: the child finds it in NODE_CHANNEL_FD. Node's protocol on it, as the
 * agent uses it (JSON serialization): each message is one line of JSON. A handle rides SCM_RIGHTS
 * on the first byte of a line `{"cmd":"NODE_HANDLE","type":"net.Socket","msg":{"id":N},...}`,
 * and the receiver answers `{"cmd":"NODE_HANDLE_ACK"}` before Node sends the next handle. A socket
 * a `net.Server` accepted also names its server (`"key"`): Node then asks, when that server closes,
 * how many of its connections the receiver still holds (`NODE_SOCKET_NOTIFY_CLOSE`), and waits for
 * `NODE_SOCKET_ALL_CLOSED` with the same key. The spawner keeps none (its children do), so it says
 * so at once. Every other line is ignored.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "canto-spawn.h"

#define MAX_LINE 4096
#define MAX_QUEUED 64

static char line[MAX_LINE];
static size_t line_len;
static int discarding; /* the current line outgrew the buffer: skipped to its newline */
/* Descriptors received and not yet matched with their line, in arrival order. */
static int queued[MAX_QUEUED];
static int n_queued;

int handoff_channel(void) {
  const char *value = getenv("NODE_CHANNEL_FD");
  if (value == NULL) return -1;
  char *end;
  long fd = strtol(value, &end, 10);
  if (*end != '\0' || fd < 0 || fd > 1024 || fcntl((int)fd, F_GETFD) < 0) return -1;
  int moved = fcntl((int)fd, F_DUPFD_CLOEXEC, 10);
  close((int)fd);
  unsetenv("NODE_CHANNEL_FD");
  unsetenv("NODE_CHANNEL_SERIALIZATION_MODE");
  return moved;
}

static void answer(int channel, const char *text) {
  size_t left = strlen(text);
  while (left > 0) {
    ssize_t n = write(channel, text, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return; /* the agent is gone; the lifeline says so too */
    text += n;
    left -= (size_t)n;
  }
}

/* The string value of `"name":"…"` in `text`, copied into `out`; 0 when absent or too long. */
static int string_field(const char *text, const char *name, char *out, size_t size) {
  const char *at = strstr(text, name);
  if (at == NULL) return 0;
  at += strlen(name);
  const char *close = strchr(at, '"');
  if (close == NULL || (size_t)(close - at) >= size) return 0;
  memcpy(out, at, (size_t)(close - at));
  out[close - at] = '\0';
  return 1;
}

static void take_line(int channel, void (*got)(uint32_t id, int sock)) {
  if (strstr(line, "\"cmd\":\"NODE_HANDLE\"") != NULL) {
    int sock = -1;
    if (n_queued > 0) {
      sock = queued[0];
      memmove(queued, queued + 1, (size_t)--n_queued * sizeof *queued);
    }
    const char *id = strstr(line, "\"msg\":{\"id\":");
    char *end = NULL;
    unsigned long value = id == NULL ? 0 : strtoul(id + 12, &end, 10);
    if (sock < 0) {
      /* The descriptor did not come (too many open files here): Node sends it again. */
      answer(channel, "{\"cmd\":\"NODE_HANDLE_NACK\"}\n");
      return;
    }
    answer(channel, "{\"cmd\":\"NODE_HANDLE_ACK\"}\n");
    if (end == NULL || end == id + 12 || value == 0 || value > UINT32_MAX) {
      close(sock);
      return;
    }
    got((uint32_t)value, sock);
  } else if (strstr(line, "\"cmd\":\"NODE_SOCKET_NOTIFY_CLOSE\"") != NULL) {
    char key[256], reply[320];
    if (!string_field(line, "\"key\":\"", key, sizeof key)) return;
    snprintf(reply, sizeof reply, "{\"cmd\":\"NODE_SOCKET_ALL_CLOSED\",\"key\":\"%s\"}\n", key);
    answer(channel, reply);
  } else if (strstr(line, "\"cmd\":\"NODE_SOCKET_GET_COUNT\"") != NULL) {
    char key[256], reply[320];
    if (!string_field(line, "\"key\":\"", key, sizeof key)) return;
    snprintf(reply, sizeof reply, "{\"cmd\":\"NODE_SOCKET_COUNT\",\"key\":\"%s\",\"count\":0}\n", key);
    answer(channel, reply);
  }
}

int handoff_read(int channel, void (*got)(uint32_t id, int sock)) {
  char buf[8192];
  union {
    struct cmsghdr align;
    char space[CMSG_SPACE(sizeof(int) * 8)];
  } control;
  struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space, .msg_controllen = sizeof control.space};
  ssize_t n = recvmsg(channel, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return errno == EAGAIN || errno == EINTR ? 0 : -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (n_queued < MAX_QUEUED) queued[n_queued++] = fd;
      else close(fd);
    }
  }
  if (n == 0) return -1;
  for (ssize_t i = 0; i < n; i++) {
    if (buf[i] != '\n') {
      if (line_len + 1 < MAX_LINE) line[line_len++] = buf[i];
      else discarding = 1;
      continue;
    }
    line[line_len] = '\0';
    if (!discarding) take_line(channel, got);
    line_len = 0;
    discarding = 0;
  }
  return 0;
}

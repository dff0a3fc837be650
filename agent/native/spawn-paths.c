/*
 * Paths of the spawner (canto-spawn.c): a program looked up on its child's PATH, and the socket
 * (with its private directory) it removes as it exits.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "canto-spawn.h"

/* Removes the socket and its private directory (the agent made both for this helper). */
void leave(const char *path) {
  unlink(path);
  char dir[sizeof ((struct sockaddr_un *)0)->sun_path];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash != NULL && slash != dir) {
    *slash = '\0';
    rmdir(dir);
  }
}

/* Finds `file` on the PATH of the child's environment, as execvp would; NULL when not found. */
char *resolve(const char *file, char *const env[], char *buf, size_t size) {
  if (strchr(file, '/') != NULL) return (char *)file;
  const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (char *const *e = env; *e != NULL; e++)
    if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
  for (const char *dir = path; *dir != '\0';) {
    const char *colon = strchr(dir, ':');
    size_t len = colon == NULL ? strlen(dir) : (size_t)(colon - dir);
    if (snprintf(buf, size, "%.*s/%s", (int)len, len == 0 ? "." : dir, file) < (int)size &&
        access(buf, X_OK) == 0)
      return buf;
    if (colon == NULL) break;
    dir = colon + 1;
  }
  return NULL;
}

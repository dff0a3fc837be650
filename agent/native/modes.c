/*
 * Which of the binary's modes besides the process spawner itself (canto-spawn.h) a command line
 * names: CRIU's action script by its environment, the others by their first argument.
 */
#include <stdlib.h>
#include <string.h>

#include "canto-spawn.h"

int run_mode(int argc, char **argv) {
  const char *stage = getenv("CRTOOLS_SCRIPT_ACTION");
  if (argc == 1 && stage != NULL) return restore_action(stage);
  if (argc < 2) return -1;
  const char *mode = argv[1];
  if (strcmp(mode, "--keep") == 0) return keep(argc, argv);
  if (strcmp(mode, "--relay") == 0) return port_relay(argc, argv);
  if (strcmp(mode, "--enter") == 0) return guest_enter(argc, argv);
  if (strcmp(mode, "--exec") == 0) return guest_exec(argc, argv);
  if (strcmp(mode, "--clean") == 0) return clean_exec(argc, argv);
  if (strcmp(mode, "--seal-proc") == 0) return seal_proc(argc, argv);
  if (argc == 2 && strcmp(mode, "--guest-filter") == 0) return print_guest_filter();
  return -1;
}

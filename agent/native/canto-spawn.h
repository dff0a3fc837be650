/*
 * The modes of the canto-spawn binary besides the process spawner itself (canto-spawn.c): a
 * restore's keeper (keeper.c) and CRIU's action script at a restore (restore-action.c).
 */
#ifndef CANTO_SPAWN_H
#define CANTO_SPAWN_H

/* `canto-spawn --keep N CGROUP-DIR... -- PROGRAM ARGS...`; argv as main has it. */
int keep(int argc, char **argv);

/* One stage of a restore (CRTOOLS_SCRIPT_ACTION); its exit code. */
int restore_action(const char *stage);

#endif

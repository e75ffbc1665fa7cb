/*
 * cli_registry.h — where the running instances of this user are: one
 * symbolic link per instance, <registry>/<name> -> its run directory,
 * made by `strata up` and removed by `strata down`, so that `down`,
 * `status` and `restart` find an instance by name whatever run directory
 * it was started in (--run-dir, a config's run_dir) and `strata ps` lists
 * them all.  <registry>: $STRATA_REGISTRY_DIR, else /run/strata/instances
 * (root), $XDG_RUNTIME_DIR/strata/instances, or
 * /tmp/strata-<uid>/instances.
 */
#ifndef CLI_REGISTRY_H
#define CLI_REGISTRY_H

#include <stddef.h>

/* The registry directory into buf.  0 or -ENAMETOOLONG. */
int cli_registry_dir(char *buf, size_t len);

/* Records that instance `name` runs in run_dir (replacing an older
 * entry).  0 or a negative errno-style code. */
int cli_registry_add(const char *name, const char *run_dir);

/* The run directory recorded for `name` into ret (cap bytes).  0, or
 * -ENOENT when none is recorded. */
int cli_registry_lookup(const char *name, char *ret, size_t cap);

/* Removes the entry of `name` when it points at run_dir. */
void cli_registry_remove(const char *name, const char *run_dir);

#endif

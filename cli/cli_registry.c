/* cli_registry.c — see cli_registry.h. */
#include "cli_registry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_util.h"

int cli_registry_dir(char *buf, size_t len)
{
	const char *e = getenv("STRATA_REGISTRY_DIR");
	int n;

	if (e && *e)
		n = snprintf(buf, len, "%s", e);
	else if (geteuid() == 0)
		n = snprintf(buf, len, "/run/strata/instances");
	else if ((e = getenv("XDG_RUNTIME_DIR")) && *e)
		n = snprintf(buf, len, "%s/strata/instances", e);
	else
		n = snprintf(buf, len, "/tmp/strata-%u/instances",
			     (unsigned)getuid());
	return n >= (int)len ? -ENAMETOOLONG : 0;
}

/* <registry>/<name> into buf. */
static int entry_path(const char *name, char *buf, size_t len)
{
	char dir[4096];
	int r = cli_registry_dir(dir, sizeof(dir));

	if (r < 0)
		return r;
	return snprintf(buf, len, "%s/%s", dir, name) >= (int)len ?
		       -ENAMETOOLONG : 0;
}

int cli_registry_add(const char *name, const char *run_dir)
{
	char dir[4096], path[4400], tmp[4500], abs[4096];
	int r = cli_registry_dir(dir, sizeof(dir));

	if (r < 0 || (r = entry_path(name, path, sizeof(path))) < 0)
		return r;
	r = st_mkdir_p(dir, 0700);
	if (r < 0)
		return r;
	/* an absolute target: the link is read from anywhere */
	if (!realpath(run_dir, abs))
		return -errno;
	snprintf(tmp, sizeof(tmp), "%s.tmp-%d", path, (int)getpid());
	unlink(tmp);
	if (symlink(abs, tmp) < 0)
		return -errno;
	if (rename(tmp, path) < 0) {
		r = -errno;
		unlink(tmp);
		return r;
	}
	return 0;
}

int cli_registry_lookup(const char *name, char *ret, size_t cap)
{
	char path[4400];
	ssize_t n;

	if (entry_path(name, path, sizeof(path)) < 0)
		return -ENOENT;
	n = readlink(path, ret, cap - 1);
	if (n <= 0)
		return -ENOENT;
	ret[n] = 0;
	return 0;
}

void cli_registry_remove(const char *name, const char *run_dir)
{
	char path[4400], cur[4096], abs[4096];

	if (cli_registry_lookup(name, cur, sizeof(cur)) < 0 ||
	    entry_path(name, path, sizeof(path)) < 0)
		return;
	if (!realpath(run_dir, abs))
		snprintf(abs, sizeof(abs), "%s", run_dir);
	if (!strcmp(cur, abs))
		unlink(path);
}

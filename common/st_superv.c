/* st_superv.c — see st_superv.h. */
#include "st_superv.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_daemon.h"
#include "st_error.h"
#include "st_util.h"

int st_superv_state_write(const char *run_dir, const struct st_superv_state *s)
{
	char path[4200], tmp[4300], txt[1024];
	size_t n = 0;
	int r;

	if (st_run_path(run_dir, "supervisor", "state", path, sizeof(path)) < 0)
		return -ENAMETOOLONG;
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	for (int i = 0; i < ST_SUPERV_DAEMONS; i++)
		n += (size_t)snprintf(txt + n, sizeof(txt) - n, "%s %d %u %s %s\n",
				      s->d[i].name, s->d[i].pid,
				      s->d[i].restarts,
				      s->d[i].state[0] ? s->d[i].state : "running",
				      s->d[i].last_exit[0] ? s->d[i].last_exit : "-");
	r = st_write_file(tmp, txt, n);
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0)
		unlink(tmp);
	return r;
}

int st_superv_state_read(const char *run_dir, struct st_superv_state *ret)
{
	char path[4200], *txt = NULL, *line, *save = NULL;
	int i = 0, r = 0;

	memset(ret, 0, sizeof(*ret));
	if (st_run_path(run_dir, "supervisor", "state", path, sizeof(path)) < 0)
		return -ENAMETOOLONG;
	r = st_read_file(path, &txt, NULL);
	if (r < 0)
		return r;
	for (line = strtok_r(txt, "\n", &save); line && i < ST_SUPERV_DAEMONS;
	     line = strtok_r(NULL, "\n", &save), i++) {
		struct st_superv_daemon *d = &ret->d[i];

		if (sscanf(line, "%15s %d %u %15s %31s", d->name, &d->pid,
			   &d->restarts, d->state, d->last_exit) != 5) {
			r = -ST_E_FORMAT;
			break;
		}
	}
	if (r == 0 && i != ST_SUPERV_DAEMONS)
		r = -ST_E_FORMAT;
	free(txt);
	return r;
}

/* cmd_ps.c — `strata ps`: the instances `strata up` started (the
 * registry, cli_registry.h), one line each: name, state, model, URL,
 * pids and resident memory of the supervisor and the daemons. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_cmds.h"
#include "cli_instance.h"
#include "cli_registry.h"
#include "cli_superv.h"
#include "st_daemon.h"
#include "st_util.h"

/* Resident memory of pid now (VmRSS), in bytes; 0 when unknown. */
static uint64_t rss_bytes(int pid)
{
	char path[64], *txt = NULL, *p;
	uint64_t kib = 0;

	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	if (pid <= 0 || st_read_file(path, &txt, NULL) < 0)
		return 0;
	p = strstr(txt, "VmRSS:");
	if (p)
		kib = strtoull(p + 6, NULL, 10);
	free(txt);
	return kib * 1024;
}

/* The model id computed serves (--model-name, else its store's name). */
static void model_of(const char *run_dir, char *ret, size_t cap)
{
	char path[4200], *txt = NULL, *store = NULL;
	size_t n = 0;

	snprintf(ret, cap, "-");
	st_run_path(run_dir, "computed", "args", path, sizeof(path));
	if (st_read_file(path, &txt, &n) < 0)
		return;
	for (size_t off = 0; off < n;) {
		char *a = txt + off, *next;

		off += strnlen(a, n - off) + 1;
		next = off < n ? txt + off : NULL;
		if (next && !strcmp(a, "--model-name")) {
			snprintf(ret, cap, "%s", next);
			store = NULL;
			break;
		}
		if (next && !strcmp(a, "--store"))
			store = next;
	}
	if (store)
		cli_model_name_of(store, ret, cap);
	free(txt);
}

int cli_cmd_ps(int argc, char **argv)
{
	static const char *const names[3] = { "expertd", "kvd", "computed" };
	char dir[4096];
	struct dirent *de;
	DIR *d;
	int n = 0, n_dead = 0;
	struct {
		int pid;
		char name[sizeof(((struct cli_instance *)0)->name)];
	} dead[16];

	if (argc > 1) {
		int help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");

		fprintf(help ? stdout : stderr, "Usage: strata ps\n"
			"Lists the instances strata up started (and strata "
			"down has not stopped):\nname, state, model, URL, and "
			"pid and resident memory of the supervisor and\neach "
			"daemon.  The registry: $STRATA_REGISTRY_DIR, "
			"/run/strata/instances (root)\nor "
			"$XDG_RUNTIME_DIR/strata/instances.\n");
		return help ? 0 : 2;
	}
	if (cli_registry_dir(dir, sizeof(dir)) < 0 || !(d = opendir(dir))) {
		printf("no instances\n");
		return 0;
	}
	printf("%-16s %-8s %-20s %-28s %s\n", "NAME", "STATE", "MODEL", "URL",
	       "PIDS (RSS)");
	while ((de = readdir(d))) {
		struct cli_instance inst;
		char url[160], model[256], procs[512], a[32];
		size_t pl = 0;
		int up, dead_sv;

		if (de->d_name[0] == '.' || strstr(de->d_name, ".tmp-") ||
		    strlen(de->d_name) >= sizeof(inst.name))
			continue;
		memset(&inst, 0, sizeof(inst));
		memcpy(inst.name, de->d_name, strlen(de->d_name) + 1);
		if (cli_registry_lookup(inst.name, inst.run_dir,
					sizeof(inst.run_dir)) < 0)
			continue;
		up = cli_instance_state(&inst);
		if (cli_instance_url(inst.run_dir, url, sizeof(url)) < 0)
			snprintf(url, sizeof(url), "-");
		model_of(inst.run_dir, model, sizeof(model));
		procs[0] = 0;
		{
			int sv = cli_superv_pid(inst.run_dir);

			if (sv)
				pl += (size_t)snprintf(procs + pl, sizeof(procs) - pl,
						       "supervisor %d (%s) ", sv,
						       st_format_bytes(rss_bytes(sv),
								       a, sizeof(a)));
		}
		for (int i = 0; i < 3; i++) {
			int pid = st_pidfile_read(inst.run_dir, names[i]);

			if (pid > 0 && st_pid_alive(pid) && pl < sizeof(procs))
				pl += (size_t)snprintf(procs + pl, sizeof(procs) - pl,
						       "%s %d (%s) ", names[i], pid,
						       st_format_bytes(rss_bytes(pid),
								       a, sizeof(a)));
		}
		/* a dead supervisor took the public port (its front) along:
		 * said after the table */
		dead_sv = cli_superv_dead_pid(inst.run_dir);
		if (dead_sv && n_dead < (int)ST_ARRAY_SIZE(dead)) {
			dead[n_dead].pid = dead_sv;
			memcpy(dead[n_dead++].name, inst.name,
			       sizeof(inst.name));
		}
		printf("%-16s %-8s %-20s %-28s %s\n", inst.name,
		       dead_sv ? "sv-dead" : up == 3 ? "running" :
		       up ? "partial" : "stopped", model,
		       url, procs[0] ? procs : "-");
		n++;
	}
	closedir(d);
	if (!n)
		printf("(none)\n");
	for (int i = 0; i < n_dead; i++) {
		printf("%s: ", dead[i].name);
		cli_superv_dead_hint(stdout, "  ", dead[i].name, dead[i].pid);
	}
	return 0;
}

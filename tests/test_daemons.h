/*
 * test_daemons.h — starting real expertd / kvd / computed processes from a
 * test on a private instance and run directory, and stopping them.
 */
#ifndef ST_TEST_DAEMONS_H
#define ST_TEST_DAEMONS_H

#include <stddef.h>

struct st_test_inst {
	char name[64];
	char run_dir[4096];
	int pid_expertd, pid_kvd, pid_computed;
};

/* Fills name (st_test_instance(tag)) and a fresh temp run_dir. */
void st_test_inst_init(struct st_test_inst *t, const char *tag);

/*
 * Starts build/<daemon>/<daemon> with the given extra arguments (NULL
 * terminated; --instance and --run-dir are added), output to
 * <run_dir>/<daemon>.log, and waits until it answers PING (timeout_s).
 * Returns the pid, or -1 after printing the daemon's log to stderr.
 */
int st_test_daemon_start(struct st_test_inst *t, const char *daemon,
			 const char *const *args, int timeout_s);

/* Runs build/<daemon>/<daemon> with args and returns its exit status
 * (waits for it), output appended to <run_dir>/<daemon>.log; out_log, if
 * non-NULL, gets the log's text (malloc'd). */
int st_test_daemon_run(struct st_test_inst *t, const char *daemon,
		       const char *const *args, char **out_log);

/* SIGTERM then wait (SIGKILL after 10 s) for each started daemon. */
void st_test_inst_stop(struct st_test_inst *t);

/* Number of /dev/shm entries starting with strata.<name>. */
int st_test_count_segments(const char *instance);

#endif

/*
 * st_procstat.h — a process's page faults and CPU time from
 * /proc/PID/stat (proc(5): fields 10 minflt, 12 majflt, 14 utime,
 * 15 stime), for the step timeline of issue 25: the faults and CPU every
 * daemon takes per decoded token.
 */
#ifndef ST_PROCSTAT_H
#define ST_PROCSTAT_H

#include <stdint.h>

struct st_procstat {
	uint64_t minflt;   /* minor faults (no I/O: page tables, zeroing) */
	uint64_t majflt;   /* major faults (a read from a file) */
	uint64_t cpu_ns;   /* utime + stime, ns (clock-tick resolution) */
};

/*
 * Reads the counters of process pid (0: this process) into *ret.
 * Returns 0, or a negative errno (-ENOENT: no such process, -EPROTO: a
 * line proc(5) does not describe); *ret is zeroed on error.
 */
int st_procstat_read(int pid, struct st_procstat *ret);

#endif

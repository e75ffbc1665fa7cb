/*
 * st_procstat.c — /proc/PID/stat's fault and CPU counters (st_procstat.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_procstat.h"

int st_procstat_read(int pid, struct st_procstat *ret)
{
	char path[64], line[1024], *p;
	unsigned long long v[13];
	long tck = sysconf(_SC_CLK_TCK);
	FILE *f;
	int n;

	memset(ret, 0, sizeof(*ret));
	if (pid > 0)
		snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/stat");
	f = fopen(path, "re");
	if (!f)
		return -errno;
	p = fgets(line, sizeof(line), f);
	fclose(f);
	if (!p)
		return -EPROTO;
	/* comm (field 2) may hold spaces and parentheses: fields 3.. follow
	 * the last ')' */
	p = strrchr(line, ')');
	if (!p || tck <= 0)
		return -EPROTO;
	/* fields 3 (state) .. 15 (stime) */
	n = sscanf(p + 1, " %*c %llu %llu %llu %llu %llu %llu %llu %llu %llu "
		   "%llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
		   &v[6], &v[7], &v[8], &v[9], &v[10], &v[11]);
	if (n != 12)
		return -EPROTO;
	/* v[0] ppid (4) ... v[6] minflt (10), v[8] majflt (12),
	 * v[10] utime (14), v[11] stime (15) */
	ret->minflt = v[6];
	ret->majflt = v[8];
	ret->cpu_ns = (v[10] + v[11]) * (1000000000ull / (unsigned long long)tck);
	return 0;
}

/* st_log.c — see st_log.h. */
#include "st_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Process-wide, written once at start-up (see header). */
static char g_log_name[32] = "strata";
static int g_log_threshold = -1;
static pthread_once_t g_log_once = PTHREAD_ONCE_INIT;

static void log_init_threshold(void)
{
	const char *e = getenv("STRATA_LOG");

	g_log_threshold = ST_LOG_INFO;
	if (!e)
		return;
	if (!strcmp(e, "error"))
		g_log_threshold = ST_LOG_ERROR;
	else if (!strcmp(e, "warn"))
		g_log_threshold = ST_LOG_WARN;
	else if (!strcmp(e, "debug"))
		g_log_threshold = ST_LOG_DEBUG;
	else if (strcmp(e, "info"))
		/* once per process; st_log itself is not usable here */
		fprintf(stderr, "strata: STRATA_LOG '%s' is not error, warn, "
			"info or debug; logging at info\n", e);
}

void st_log_set_name(const char *name)
{
	snprintf(g_log_name, sizeof(g_log_name), "%s", name);
}

void st_log(enum st_log_level level, const char *fmt, ...)
{
	static const char *names[] = { "error", "warn", "info", "debug" };
	char line[2048];
	struct timeval tv;
	struct tm tm;
	va_list ap;
	int n;

	pthread_once(&g_log_once, log_init_threshold);
	if ((int)level > g_log_threshold)
		return;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = snprintf(line, sizeof(line),
		     "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s[%d] %s: ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		     tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000), g_log_name,
		     (int)getpid(), names[level]);
	va_start(ap, fmt);
	if (n > 0 && n < (int)sizeof(line))
		vsnprintf(line + n, sizeof(line) - n, fmt, ap);
	va_end(ap);
	/* one write per line so lines from several processes do not interleave */
	n = (int)strlen(line);
	if (n < (int)sizeof(line) - 1) {
		line[n++] = '\n';
		line[n] = 0;
	}
	fwrite(line, 1, n, stderr);
}

int st_env_u64(const char *name, uint64_t min, uint64_t max, uint64_t *val)
{
	const char *e = getenv(name);
	char *end;
	unsigned long long v;

	if (!e || !*e)
		return 0;
	errno = 0;
	v = strtoull(e, &end, 10);
	if (errno || end == e || *end || e[0] == '-' || v < min || v > max) {
		st_warn("%s=%s is not a whole number from %llu to %llu; using "
			"the default %llu", name, e, (unsigned long long)min,
			(unsigned long long)max, (unsigned long long)*val);
		return 0;
	}
	*val = v;
	return 1;
}

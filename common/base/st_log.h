/*
 * st_log.h — leveled logging to stderr.
 *
 * Lines look like "2026-11-29T09:30:00.123Z expertd[1234] error: message".
 * The threshold comes from the environment variable STRATA_LOG
 * (error|warn|info|debug; default info), read once per process; the program
 * name is set with st_log_set_name() at the top of main().  These two are the
 * only process-wide settings in the code base and never change after start-up.
 */
#ifndef ST_LOG_H
#define ST_LOG_H

#include <stdint.h>

enum st_log_level { ST_LOG_ERROR = 0, ST_LOG_WARN, ST_LOG_INFO, ST_LOG_DEBUG };

/* Sets the name printed in front of every line (copied; at most 31 chars). */
void st_log_set_name(const char *name);

/* Prints one line at `level` if it passes the threshold.  printf format. */
void st_log(enum st_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/*
 * A whole-number setting from the environment variable `name`: *val is
 * set when it holds a number from min to max (decimal, nothing after it);
 * unset or empty leaves *val (its default); anything else (abc, -5, out of
 * range) is a warning naming the variable, its value, the range and the
 * default kept, and leaves *val.  Returns 1 when set, else 0.
 */
int st_env_u64(const char *name, uint64_t min, uint64_t max, uint64_t *val);

#define st_err(...) st_log(ST_LOG_ERROR, __VA_ARGS__)
#define st_warn(...) st_log(ST_LOG_WARN, __VA_ARGS__)
#define st_info(...) st_log(ST_LOG_INFO, __VA_ARGS__)
#define st_debug(...) st_log(ST_LOG_DEBUG, __VA_ARGS__)

#endif

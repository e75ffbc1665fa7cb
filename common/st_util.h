/*
 * st_util.h — small helpers used everywhere: clocks, byte-size parsing, whole
 * file reading, directories, checksums (xxHash XXH3-64, the one hash of the
 * project).
 */
#ifndef ST_UTIL_H
#define ST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define ST_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define ST_ALIGN_UP(x, a) ((((x) + (a) - 1) / (a)) * (a))
#define ST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ST_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC). */
uint64_t st_now_ns(void);

/* Sleeps for `ns` nanoseconds (restarts after signals). */
void st_sleep_ns(uint64_t ns);

/*
 * Parses a byte size such as "1048576", "64MiB", "8GiB", "1.5G", "512k"
 * (k/M/G/T and KiB/MiB/GiB/TiB are powers of 1024; kB/MB/GB/TB powers of 1000).
 * Returns 0 and *ret_bytes, or -EINVAL on anything else.
 */
int st_parse_size(const char *text, uint64_t *ret_bytes);

/*
 * Parses a budget that is either a byte size (as st_parse_size) or a
 * percentage "25%".  On success exactly one of *ret_bytes / *ret_percent is
 * non-zero.  Returns 0 or -EINVAL.
 */
int st_parse_budget(const char *text, uint64_t *ret_bytes, double *ret_percent);

/* Formats `bytes` as "1.50 GiB" into buf (size len).  Returns buf. */
char *st_format_bytes(uint64_t bytes, char *buf, size_t len);

/*
 * Reads a whole file into a newly allocated, NUL-terminated buffer.
 * On success *ret_buf is owned by the caller (free()), *ret_len excludes the
 * terminating NUL.  Returns 0 or a negative errno.
 */
int st_read_file(const char *path, char **ret_buf, size_t *ret_len);

/* Writes `len` bytes to `path` (created 0644, truncated).  0 or -errno. */
int st_write_file(const char *path, const void *buf, size_t len);

/* mkdir -p with the given mode for directories it creates.  0 or -errno. */
int st_mkdir_p(const char *path, unsigned mode);

/* Removes a directory tree (like rm -rf).  0 or -errno of the first failure. */
int st_rm_rf(const char *path);

/* True if the path exists. */
int st_path_exists(const char *path);

/* XXH3-64 of a buffer (seed 0): the checksum of every strata record. */
uint64_t st_xxh3(const void *buf, size_t len);

/* Peak resident set size of this process in bytes (VmHWM), or 0. */
uint64_t st_peak_rss_bytes(void);

/* Peak RSS of another process by pid (VmHWM from /proc/PID/status), or 0. */
uint64_t st_pid_peak_rss_bytes(int pid);

/* Current resident set of a process by pid (VmRSS), or 0. pid 0 = self. */
uint64_t st_pid_rss_bytes(int pid);

/* True if process `pid` is alive: kill(pid, 0) succeeds (or fails with
 * EPERM) and it is not a zombie. */
int st_pid_alive(int pid);

#endif

/*
 * st_util.h — small helpers used everywhere: clocks, byte-size parsing, whole
 * file reading, directories, checksums (xxHash XXH3-64, the one hash of the
 * project).
 */
#ifndef ST_UTIL_H
#define ST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

#define ST_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define ST_ALIGN_UP(x, a) ((((x) + (a) - 1) / (a)) * (a))
#define ST_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ST_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC). */
uint64_t st_now_ns(void);

/* Sleeps for `ns` nanoseconds (restarts after signals). */
void st_sleep_ns(uint64_t ns);

/*
 * Parses a byte size such as "1048576", "64MiB", "8GiB", "1.5G", "512k",
 * "1PiB" (k/M/G/T/P and KiB/MiB/GiB/TiB/PiB are powers of 1024;
 * kB/MB/GB/TB/PB powers of 1000; case is ignored; up to 1.8e19 bytes).
 * Returns 0 and *ret_bytes, or -EINVAL on anything else.
 */
int st_parse_size(const char *text, uint64_t *ret_bytes);

/* The suffixes st_parse_size accepts, for messages: "not a size: give
 * ST_SIZE_WORDS". */
#define ST_SIZE_WORDS "a number of bytes with an optional suffix: K, M, G, " \
	"T, P or KiB ... PiB (powers of 1024), kB, MB, GB, TB, PB (powers " \
	"of 1000), e.g. 512MiB or 24GiB"

/*
 * Parses a budget that is either a byte size (as st_parse_size) or a
 * percentage "25%".  On success exactly one of *ret_bytes / *ret_percent is
 * non-zero.  Returns 0 or -EINVAL.
 */
int st_parse_budget(const char *text, uint64_t *ret_bytes, double *ret_percent);

/* The words st_parse_bool accepts, for messages: "must be ST_BOOL_WORDS". */
#define ST_BOOL_WORDS "on or off (also true/false, yes/no, 1/0)"

/*
 * Parses a boolean the way the instance config file does (st_iconf.h) and
 * every on|off flag should: on, true, yes, 1 -> 1; off, false, no, 0 -> 0
 * (lower case, exactly); anything else (ON, bogus, "") -> -EINVAL.
 */
int st_parse_bool(const char *text);

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

/*
 * Replaces path with len bytes of buf so that a crash leaves either the
 * old file or the new one, whole: writes a temporary file of a unique name
 * beside it (mkstemp: two writers never share one), fsyncs it, renames it
 * over path and fsyncs the directory (else the rename itself may be lost).
 * mode: of the new file.  0 or a negative errno code (the temporary file
 * is removed).
 */
int st_write_file_durable(const char *path, const void *buf, size_t len,
			  unsigned mode);

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
 * EPERM), it is not a zombie and it is not already exiting (PF_EXITING in
 * /proc/PID/stat's flags: a killed process whose sockets may already have
 * closed). */
int st_pid_alive(int pid);

/*
 * Start time of process `pid` as the kernel records it: field 22 of
 * /proc/<pid>/stat, in clock ticks since boot (proc(5)).  A pid number
 * reused by a later process has a later start time, so (pid, start) names
 * one process for the life of the machine.  0 with *ret_ticks set, or
 * -ESRCH (no such process visible from here), -EIO (unparsable).
 */
int st_pid_start_ticks(int pid, uint64_t *ret_ticks);

/* st_pid_alive(pid), and when start_ticks != 0 also that the process with
 * that pid started at start_ticks (it is not a later reuse of the pid). */
int st_pid_alive_since(int pid, uint64_t start_ticks);

/*
 * A fresh identifier: random bits from getrandom(2) (the clock and pid
 * mixed in should it fail), in [1, 2^63) so it stays positive as a JSON
 * integer.  Names one creation of a pool: two creations never share one
 * (in practice: 2^-63 per pair).
 */
uint64_t st_random_id(void);

/*
 * For a daemon answering HELLO: checks that `pid`, as a client sent it,
 * names that client here.  nanomsg does not tell who is at the other end
 * of a connection, so the client also sends its own start time
 * (claimed_ticks, 0 = unknown): a pid this process cannot see, or one
 * whose start time differs, is another process (the client runs in
 * another pid namespace, e.g. a container), and watching it would release
 * a live client's pins or keep a dead one's.  0 with *ret_ticks = the
 * start time to record beside the pid, or -ESRCH with a message naming
 * daemon and the remedy.
 */
int st_peer_check(int32_t pid, uint64_t claimed_ticks, const char *daemon,
		  uint64_t *ret_ticks, struct st_diag *diag);

#endif

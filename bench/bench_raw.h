/*
 * bench_raw.h — what the tier benchmark (strata-bench-dsv, every
 * DeepSeek-V4 revision) measures the store's NVMe tier against: the raw
 * O_DIRECT read bandwidth of the expert files, and making the store's
 * files cold between runs.
 */
#ifndef BENCH_RAW_H
#define BENCH_RAW_H

#include <stdint.h>

#include "st_store.h"

/*
 * Aggregate read bandwidth in GB/s (bytes per ns) of `streams` (1..64)
 * threads each reading with O_DIRECT and one request of one expert record
 * (rounded up to 4 KiB) at a time, over the store's expert files: stream i
 * reads layer file i mod n_layers, from a different offset for each
 * stream on the same file; at most max_bytes in all.  The files should be
 * cold (bench_make_cold) so the figure is the device's.  Returns the
 * bandwidth, or a negative errno when a file cannot be opened or read.
 */
double bench_raw_bandwidth(const struct st_store *s, int streams,
			   uint64_t max_bytes);

/*
 * Drops the store's expert files (and engram.bin when `engram` is set and
 * the file exists) from the page cache: fdatasync + POSIX_FADV_DONTNEED on
 * each; with `drop` also sync and /proc/sys/vm/drop_caches (root only; a
 * message on stderr where refused, the fadvise still done).  Best effort:
 * files that cannot be opened are skipped.
 */
void bench_make_cold(const struct st_store *s, int engram, int drop);

#endif

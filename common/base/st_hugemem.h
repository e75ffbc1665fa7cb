/*
 * st_hugemem.h — large, read-mostly buffers of private anonymous memory in
 * transparent huge pages (weights the CPU kernels stream every token).
 *
 * Why: a kernel that streams weights out of cache is limited by how fast
 * the hardware prefetchers can follow it, and they stop at every 4 KiB
 * page boundary.  Measured on the issue-19 machine (2-vCPU Xeon VM,
 * docs/BENCHMARKS.md "Dense weights in huge pages"): one thread summing
 * 1 GiB read 15.0-15.5 GB/s in 2 MiB pages and 11.7 GB/s in 4 KiB pages;
 * the FP8 E4M3 matvec over 256 MiB 12.96 against 9.28 GB/s.  A file
 * mapped from the page cache is in 4 KiB pages, so weights are copied
 * into memory given these pages instead.
 *
 * A buffer of ST_HUGEMEM_MIN bytes or more is its own mapping, starting on
 * a 2 MiB boundary and advised MADV_HUGEPAGE (the kernel gives huge pages
 * where /sys/kernel/mm/transparent_hugepage/enabled is "always" or
 * "madvise", else 4 KiB pages: the buffer works either way); a smaller one
 * comes from malloc.  STRATA_HUGE_PAGES=0 in the environment advises
 * MADV_NOHUGEPAGE instead (same allocation, for before/after figures).
 *
 * Ownership: the caller owns the buffer and gives it back with
 * st_hugemem_free(p, bytes), passing the size it asked for.
 */
#ifndef ST_HUGEMEM_H
#define ST_HUGEMEM_H

#include <stddef.h>

#include "st_error.h"

/* Huge-page size the mappings are aligned to (x86-64 and arm64 with 4 KiB
 * base pages), bytes. */
#define ST_HUGEMEM_ALIGN ((size_t)2 << 20)
/* Buffers below this many bytes come from malloc. */
#define ST_HUGEMEM_MIN ST_HUGEMEM_ALIGN

/*
 * Allocates bytes (> 0) of zeroed memory, huge-page advised when bytes >=
 * ST_HUGEMEM_MIN.  Returns 0 with *ret set, -EINVAL for bytes 0, or
 * -ENOMEM.
 */
int st_hugemem_alloc(size_t bytes, void **ret);

/* Gives back a buffer of st_hugemem_alloc or st_hugemem_read_file; bytes is
 * the size it was made with.  p NULL does nothing. */
void st_hugemem_free(void *p, size_t bytes);

/*
 * Reads the whole file at path, which must be exactly bytes long (> 0),
 * into a new buffer of st_hugemem_alloc.  Returns 0 with *ret set, or a
 * negative errno with diag naming the file: -errno of open/read, -EIO for
 * a size that is not bytes ("re-run strata convert"), -ENOMEM.
 */
int st_hugemem_read_file(const char *path, size_t bytes, void **ret,
			 struct st_diag *diag);

/*
 * Why a buffer of st_hugemem_alloc of bytes is not huge-page advised: a
 * static string ("under 2 MiB: heap memory" below ST_HUGEMEM_MIN,
 * "STRATA_HUGE_PAGES=0" where the environment turns the advice off), or
 * NULL when it is advised.  For log lines that say why 4 KiB pages.
 */
const char *st_hugemem_why_not(size_t bytes);

/*
 * Reads p's mapping in /proc/self/smaps once: *advised 1 when its VmFlags
 * hold "hg" (MADV_HUGEPAGE), else 0; *huge its AnonHugePages in bytes.
 * Returns 0, or negative errno when smaps cannot be read or holds no
 * mapping of p.  st_hugemem_advised and st_hugemem_huge_bytes are its two
 * halves.
 */
int st_hugemem_state(const void *p, int *advised, long long *huge);

/*
 * 1 if the mapping holding p is advised MADV_HUGEPAGE ("hg" in its
 * /proc/self/smaps VmFlags), 0 if not, negative errno if smaps cannot be
 * read or holds no mapping of p.  For tests and `status`.
 */
int st_hugemem_advised(const void *p);

/*
 * Bytes of p's mapping backed by transparent huge pages right now
 * (AnonHugePages of /proc/self/smaps; 0 where the kernel gave none), or a
 * negative errno as st_hugemem_advised.
 */
long long st_hugemem_huge_bytes(const void *p);

/*
 * Whether POSIX shared memory (the tmpfs at /dev/shm, where expertd's
 * expert pool and kvd's pages live) gives huge pages to mappings advised
 * MADV_HUGEPAGE: its mount option huge= (tmpfs(5)), not
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled (that one governs
 * SysV and anonymous shared memory).  mounts: a file in /proc/mounts
 * format, NULL for /proc/self/mounts.  Returns 1 for huge=advise, always
 * or within_size; 0 for huge=never or no huge= option (the tmpfs
 * default); -ENOENT when no /dev/shm mount is listed, or -errno of
 * reading mounts.  Remedy where 0: `mount -o remount,huge=advise
 * /dev/shm` (as root; an fstab option to keep it).
 */
int st_hugemem_shm_policy(const char *mounts);

#endif

/*
 * st_membw.h — host memory read-bandwidth probe.
 *
 * strata sizes its expert tiers and predicts the cost of computing an expert
 * on the CPU from the host's streaming read bandwidth.  This probe measures
 * it: a buffer is filled (first touch by the thread that will read it, so
 * pages land on that thread's NUMA node), then threads pinned to distinct
 * cores sum their slice of it with vector loads, and the best of several
 * passes is reported.
 *
 * The sum kernels (generic GCC vector extensions, AVX2, AVX-512F) are chosen
 * at run time with __builtin_cpu_supports.  Every pass's sums are checked
 * against the known fill pattern, so the loads cannot be optimised away and a
 * kernel that skips data is caught.
 */
#ifndef ST_MEMBW_H
#define ST_MEMBW_H

#include <stddef.h>
#include <stdint.h>

enum st_membw_kernel {
	ST_MEMBW_AUTO = 0, /* the best kernel this CPU supports */
	ST_MEMBW_GENERIC,  /* GCC vector extensions, baseline x86-64 (SSE2) */
	ST_MEMBW_AVX2,
	ST_MEMBW_AVX512,   /* AVX-512F */
	ST_MEMBW_KERNEL_MAX
};

/* Returns the best kernel this CPU (and OS) supports; never ST_MEMBW_AUTO. */
enum st_membw_kernel st_membw_kernel_best(void);

/* Returns 1 if `kernel` can run here (ST_MEMBW_AUTO always can), else 0. */
int st_membw_kernel_supported(enum st_membw_kernel kernel);

/* Returns a static name ("auto", "generic", "avx2", "avx512"); "?" for an
 * out-of-range value.  Never NULL. */
const char *st_membw_kernel_name(enum st_membw_kernel kernel);

/*
 * Sums the little-endian 64-bit words of buf[0, n_bytes) with wrap-around
 * (mod 2^64) using `kernel`.  buf needs no particular alignment.
 * Returns 0 and *ret_sum; -EINVAL if n_bytes is not a multiple of 8, buf is
 * NULL with n_bytes > 0, ret_sum is NULL or kernel is out of range;
 * -ST_E_UNSUPPORTED if the CPU lacks the kernel's instructions.
 */
int st_membw_sum(enum st_membw_kernel kernel, const void *buf, size_t n_bytes,
		 uint64_t *ret_sum);

/*
 * Measures host read bandwidth.
 *
 * n_threads  reader threads, 1..1024; pinned to distinct physical cores of
 *            the process's allowed CPU set while there are enough, then to
 *            the remaining hardware threads, then wrapped (unpinned if the
 *            set cannot be read).  Pinning failures are not errors.
 * bytes      buffer size; at least 64 KiB per thread (callers should use
 *            1 GiB or more, far beyond the last-level cache, or the figure
 *            is cache bandwidth).  Split into equal slices of a multiple of
 *            256 bytes; the few bytes left over are not read.
 * passes     1..1000; the best (shortest) pass is reported.  A pass's time
 *            runs from the first thread's start to the last thread's end.
 * ret_gbps   read bandwidth in GB/s (1e9 bytes per second) of the best pass.
 *
 * Allocates (st_hugemem_alloc: huge pages advised unless
 * STRATA_HUGE_PAGES=0) and frees the buffer itself; blocks for roughly one fill plus `passes` reads.
 * Returns 0; -EINVAL for arguments out of range; -ENOMEM if the buffer
 * cannot be mapped; -EAGAIN (or another negative errno) if threads cannot be
 * created; -EIO if a slice's sum differs from the fill pattern's (a kernel
 * bug, never expected).
 */
int st_membw_measure(int n_threads, uint64_t bytes, int passes,
		     double *ret_gbps);

/* As st_membw_measure, with a given kernel (ST_MEMBW_AUTO: the best);
 * -ST_E_UNSUPPORTED if the CPU lacks it. */
int st_membw_measure_kernel(enum st_membw_kernel kernel, int n_threads,
			    uint64_t bytes, int passes, double *ret_gbps);

#endif

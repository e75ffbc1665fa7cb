/*
 * st_membw.c — host memory read-bandwidth probe (see st_membw.h).
 *
 * Structure: a run owns one buffer and n worker threads.  The main thread
 * drives phases (FILL once, then READ per pass, then QUIT) through a
 * generation counter under a mutex; each worker pins itself, then for each
 * phase works on its own slice and stamps its start and end times.  A pass
 * lasts from the earliest start to the latest end, so the wake-up latency of
 * the condition variable is not counted.
 *
 * Fill pattern: 64-bit word j of the buffer (counted from the buffer start)
 * holds j * ST_MEMBW_FILL_MUL.  The wrapped sum of a slice [a, a + n) is then
 * ST_MEMBW_FILL_MUL * (n * a + n (n - 1) / 2) mod 2^64, which every pass
 * checks: the loads cannot be dropped by the compiler, and a kernel that
 * skips or repeats data fails.
 */
#include "st_membw.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ST_MEMBW_X86 1
#else
#define ST_MEMBW_X86 0
#endif

#include "st_error.h"
#include "st_hugemem.h"
#include "st_util.h"

#define ST_MEMBW_FILL_MUL 0x9E3779B97F4A7C15ull /* odd: every word differs */
#define ST_MEMBW_SLICE_ALIGN 256u                /* bytes; 4 x 64-byte loads */
#define ST_MEMBW_MIN_SLICE (64u << 10)
#define ST_MEMBW_MAX_THREADS 1024
#define ST_MEMBW_MAX_PASSES 1000

typedef uint64_t (*membw_sum_fn)(const void *buf, size_t n_words);

/* ---- kernels ------------------------------------------------------------ */

/* Unaligned, aliasing-safe 32-byte vector of four words. */
typedef uint64_t membw_v4 __attribute__((vector_size(32), aligned(1),
					 __may_alias__));

static uint64_t membw_tail(const unsigned char *p, size_t n_words)
{
	uint64_t s = 0, w;
	size_t i;

	for (i = 0; i < n_words; i++) {
		memcpy(&w, p + 8 * i, 8);
		s += w;
	}
	return s;
}

/* Baseline: GCC vector extensions (two SSE2 paddq per 32-byte vector). */
static uint64_t membw_sum_generic(const void *buf, size_t n_words)
{
	const unsigned char *p = buf;
	membw_v4 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
	size_t i, n_blocks = n_words / 16; /* 128 bytes per iteration */
	uint64_t s = 0;
	int k;

	for (i = 0; i < n_blocks; i++, p += 128) {
		a0 += *(const membw_v4 *)(p + 0);
		a1 += *(const membw_v4 *)(p + 32);
		a2 += *(const membw_v4 *)(p + 64);
		a3 += *(const membw_v4 *)(p + 96);
	}
	a0 += a1 + a2 + a3;
	for (k = 0; k < 4; k++)
		s += a0[k];
	return s + membw_tail(p, n_words % 16);
}

#if ST_MEMBW_X86
__attribute__((target("avx2")))
static uint64_t membw_sum_avx2(const void *buf, size_t n_words)
{
	const unsigned char *p = buf;
	__m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
	size_t i, n_blocks = n_words / 16; /* 128 bytes per iteration */
	uint64_t lanes[4];

	for (i = 0; i < n_blocks; i++, p += 128) {
		a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(p + 0)));
		a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(p + 32)));
		a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(p + 64)));
		a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(p + 96)));
	}
	a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
	_mm256_storeu_si256((__m256i *)lanes, a0);
	return lanes[0] + lanes[1] + lanes[2] + lanes[3] +
	       membw_tail(p, n_words % 16);
}

__attribute__((target("avx512f")))
static uint64_t membw_sum_avx512(const void *buf, size_t n_words)
{
	const unsigned char *p = buf;
	__m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
	size_t i, n_blocks = n_words / 32; /* 256 bytes per iteration */
	uint64_t lanes[8], s = 0;
	int k;

	for (i = 0; i < n_blocks; i++, p += 256) {
		a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + 0));
		a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + 64));
		a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + 128));
		a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + 192));
	}
	a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
	/* Lanes summed as uint64_t (wrapping, like the fill pattern's sum):
	 * _mm512_reduce_add_epi64 adds them as signed long long, which
	 * overflows (undefined behaviour, a UBSan report) on these words. */
	_mm512_storeu_si512(lanes, a0);
	for (k = 0; k < 8; k++)
		s += lanes[k];
	return s + membw_tail(p, n_words % 32);
}
#endif

int st_membw_kernel_supported(enum st_membw_kernel kernel)
{
	switch (kernel) {
	case ST_MEMBW_AUTO:
	case ST_MEMBW_GENERIC:
		return 1;
#if ST_MEMBW_X86
	/* libgcc's CPU model also checks that the OS saves the YMM / ZMM
	 * state (XGETBV), so a "supported" kernel cannot fault. */
	case ST_MEMBW_AVX2:
		return __builtin_cpu_supports("avx2") ? 1 : 0;
	case ST_MEMBW_AVX512:
		return __builtin_cpu_supports("avx512f") ? 1 : 0;
#endif
	default:
		return 0;
	}
}

enum st_membw_kernel st_membw_kernel_best(void)
{
	if (st_membw_kernel_supported(ST_MEMBW_AVX512))
		return ST_MEMBW_AVX512;
	if (st_membw_kernel_supported(ST_MEMBW_AVX2))
		return ST_MEMBW_AVX2;
	return ST_MEMBW_GENERIC;
}

const char *st_membw_kernel_name(enum st_membw_kernel kernel)
{
	static const char *const names[ST_MEMBW_KERNEL_MAX] = {
		[ST_MEMBW_AUTO] = "auto",
		[ST_MEMBW_GENERIC] = "generic",
		[ST_MEMBW_AVX2] = "avx2",
		[ST_MEMBW_AVX512] = "avx512",
	};

	if ((unsigned)kernel >= ST_MEMBW_KERNEL_MAX)
		return "?";
	return names[kernel];
}

/* Resolves `kernel` to a function; -EINVAL / -ST_E_UNSUPPORTED. */
static int membw_kernel_fn(enum st_membw_kernel kernel, membw_sum_fn *ret_fn)
{
	if ((unsigned)kernel >= ST_MEMBW_KERNEL_MAX)
		return -EINVAL;
	if (kernel == ST_MEMBW_AUTO)
		kernel = st_membw_kernel_best();
	if (!st_membw_kernel_supported(kernel))
		return -ST_E_UNSUPPORTED;
	switch (kernel) {
#if ST_MEMBW_X86
	case ST_MEMBW_AVX2:
		*ret_fn = membw_sum_avx2;
		return 0;
	case ST_MEMBW_AVX512:
		*ret_fn = membw_sum_avx512;
		return 0;
#endif
	default:
		*ret_fn = membw_sum_generic;
		return 0;
	}
}

int st_membw_sum(enum st_membw_kernel kernel, const void *buf, size_t n_bytes,
		 uint64_t *ret_sum)
{
	membw_sum_fn fn;
	int r;

	if (!ret_sum || n_bytes % 8 || (!buf && n_bytes))
		return -EINVAL;
	r = membw_kernel_fn(kernel, &fn);
	if (r < 0)
		return r;
	*ret_sum = n_bytes ? fn(buf, n_bytes / 8) : 0;
	return 0;
}

/* ---- CPU choice ----------------------------------------------------------- */

static int membw_read_int(const char *path, int *ret)
{
	FILE *f = fopen(path, "r");
	int ok;

	if (!f)
		return -errno;
	ok = fscanf(f, "%d", ret) == 1;
	fclose(f);
	return ok ? 0 : -EINVAL;
}

/*
 * Fills order[] with the allowed CPUs: first one hardware thread of each
 * distinct (package, core), then the remaining siblings.  Returns the count
 * (0 if the affinity set cannot be read).  order has CPU_SETSIZE entries.
 */
static int membw_cpu_order(int *order)
{
	cpu_set_t set;
	int *pkg, *core, n = 0, n_first = 0, cpu, i;
	unsigned char *taken;

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return 0;
	pkg = calloc(CPU_SETSIZE, sizeof(*pkg));
	core = calloc(CPU_SETSIZE, sizeof(*core));
	taken = calloc(CPU_SETSIZE, 1);
	if (!pkg || !core || !taken) {
		free(pkg);
		free(core);
		free(taken);
		return 0;
	}
	for (cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		char path[128];

		if (!CPU_ISSET(cpu, &set))
			continue;
		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
			 cpu);
		if (membw_read_int(path, &pkg[cpu]) < 0)
			pkg[cpu] = -1;
		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
		/* Without topology every CPU counts as its own core. */
		if (membw_read_int(path, &core[cpu]) < 0) {
			pkg[cpu] = -1;
			core[cpu] = -1 - cpu;
		}
	}
	/* First pass: the lowest-numbered allowed thread of each core. */
	for (cpu = 0; cpu < CPU_SETSIZE; cpu++) {
		int dup = 0;

		if (!CPU_ISSET(cpu, &set))
			continue;
		for (i = 0; i < n_first && !dup; i++)
			dup = pkg[order[i]] == pkg[cpu] &&
			      core[order[i]] == core[cpu];
		if (!dup) {
			order[n_first++] = cpu;
			taken[cpu] = 1;
		}
	}
	n = n_first;
	for (cpu = 0; cpu < CPU_SETSIZE; cpu++)
		if (CPU_ISSET(cpu, &set) && !taken[cpu])
			order[n++] = cpu;
	free(pkg);
	free(core);
	free(taken);
	return n;
}

/* ---- the run ---------------------------------------------------------------- */

enum membw_phase { MEMBW_FILL, MEMBW_READ, MEMBW_QUIT };

struct membw_run;

/* One per thread; cache-line aligned so the stamps do not false-share. */
struct membw_worker {
	struct membw_run *run;
	pthread_t tid;
	int cpu;                 /* -1: not pinned */
	unsigned char *slice;
	size_t n_words;
	uint64_t first_word;     /* index of slice[0] in the buffer, in words */
	uint64_t sum;
	uint64_t start_ns, end_ns;
} __attribute__((aligned(64)));

struct membw_run {
	pthread_mutex_t lock;
	pthread_cond_t go, done;
	unsigned gen;            /* bumped once per phase */
	enum membw_phase phase;
	int n_done, n_threads;
	membw_sum_fn sum;
};

static void membw_fill(struct membw_worker *w)
{
	uint64_t *p = (uint64_t *)(void *)w->slice;
	uint64_t v = w->first_word * ST_MEMBW_FILL_MUL;
	size_t i;

	for (i = 0; i < w->n_words; i++, v += ST_MEMBW_FILL_MUL)
		p[i] = v;
}

/* The wrapped sum the fill pattern gives for this worker's slice. */
static uint64_t membw_expected(const struct membw_worker *w)
{
	uint64_t n = w->n_words, a = w->first_word;
	uint64_t tri = n % 2 == 0 ? (n / 2) * (n - 1) : n * ((n - 1) / 2);

	return ST_MEMBW_FILL_MUL * (n * a + tri);
}

static void *membw_worker_main(void *arg)
{
	struct membw_worker *w = arg;
	struct membw_run *run = w->run;
	unsigned seen = 0;
	enum membw_phase phase;

	if (w->cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(w->cpu, &set);
		if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set))
			w->cpu = -1; /* runs unpinned; not an error */
	}
	pthread_mutex_lock(&run->lock);
	for (;;) {
		while (run->gen == seen)
			pthread_cond_wait(&run->go, &run->lock);
		seen = run->gen;
		phase = run->phase;
		pthread_mutex_unlock(&run->lock);
		if (phase == MEMBW_QUIT)
			return NULL;

		w->start_ns = st_now_ns();
		if (phase == MEMBW_FILL)
			membw_fill(w);
		else
			w->sum = run->sum(w->slice, w->n_words);
		w->end_ns = st_now_ns();

		pthread_mutex_lock(&run->lock);
		if (++run->n_done == run->n_threads)
			pthread_cond_signal(&run->done);
	}
}

/* Starts `phase` on every worker and waits until all have finished it. */
static void membw_phase_run(struct membw_run *run, enum membw_phase phase)
{
	pthread_mutex_lock(&run->lock);
	run->phase = phase;
	run->n_done = 0;
	run->gen++;
	pthread_cond_broadcast(&run->go);
	if (phase != MEMBW_QUIT)
		while (run->n_done < run->n_threads)
			pthread_cond_wait(&run->done, &run->lock);
	pthread_mutex_unlock(&run->lock);
}

int st_membw_measure_kernel(enum st_membw_kernel kernel, int n_threads,
			    uint64_t bytes, int passes, double *ret_gbps)
{
	struct membw_run run = { 0 };
	struct membw_worker *w = NULL;
	unsigned char *buf = NULL;
	int *order = NULL, n_order, n_started = 0, i, p, r;
	uint64_t slice_bytes, best_ns = UINT64_MAX;

	if (n_threads < 1 || n_threads > ST_MEMBW_MAX_THREADS || passes < 1 ||
	    passes > ST_MEMBW_MAX_PASSES || !ret_gbps ||
	    bytes / (uint64_t)n_threads < ST_MEMBW_MIN_SLICE ||
	    bytes > (uint64_t)SIZE_MAX / 2)
		return -EINVAL;
	r = membw_kernel_fn(kernel, &run.sum);
	if (r < 0)
		return r;
	slice_bytes = bytes / (uint64_t)n_threads / ST_MEMBW_SLICE_ALIGN *
		      ST_MEMBW_SLICE_ALIGN;

	/* in huge pages, as computed keeps the weights it streams (4 KiB
	 * pages would lower the figure by about a quarter on some machines;
	 * STRATA_HUGE_PAGES=0 measures that) */
	if (st_hugemem_alloc((size_t)bytes, (void **)&buf) < 0)
		return -ENOMEM;

	order = calloc(CPU_SETSIZE, sizeof(*order));
	w = calloc((size_t)n_threads, sizeof(*w));
	if (!order || !w) {
		r = -ENOMEM;
		goto out;
	}
	n_order = membw_cpu_order(order);

	pthread_mutex_init(&run.lock, NULL);
	pthread_cond_init(&run.go, NULL);
	pthread_cond_init(&run.done, NULL);
	run.n_threads = n_threads;
	for (i = 0; i < n_threads; i++) {
		w[i].run = &run;
		w[i].cpu = n_order > 0 ? order[i % n_order] : -1;
		w[i].slice = buf + (uint64_t)i * slice_bytes;
		w[i].n_words = slice_bytes / 8;
		w[i].first_word = (uint64_t)i * slice_bytes / 8;
		r = -pthread_create(&w[i].tid, NULL, membw_worker_main, &w[i]);
		if (r < 0)
			break;
		n_started++;
	}
	if (n_started < n_threads) {
		/* Workers only wait for a generation; QUIT releases them. */
		membw_phase_run(&run, MEMBW_QUIT);
		goto join;
	}

	membw_phase_run(&run, MEMBW_FILL);
	for (p = 0; p < passes && r == 0; p++) {
		uint64_t t0 = UINT64_MAX, t1 = 0;

		membw_phase_run(&run, MEMBW_READ);
		for (i = 0; i < n_threads; i++) {
			if (w[i].sum != membw_expected(&w[i]))
				r = -EIO; /* kernel bug: data skipped */
			t0 = ST_MIN(t0, w[i].start_ns);
			t1 = ST_MAX(t1, w[i].end_ns);
		}
		if (t1 > t0)
			best_ns = ST_MIN(best_ns, t1 - t0);
	}
	membw_phase_run(&run, MEMBW_QUIT);
	if (r == 0) {
		/* A pass shorter than the clock's resolution cannot happen for
		 * >= 64 KiB per thread, but never divide by zero. */
		if (best_ns == UINT64_MAX || best_ns == 0)
			best_ns = 1;
		*ret_gbps = (double)(slice_bytes * (uint64_t)n_threads) /
			    (double)best_ns;
	}
join:
	for (i = 0; i < n_started; i++)
		pthread_join(w[i].tid, NULL);
	pthread_cond_destroy(&run.done);
	pthread_cond_destroy(&run.go);
	pthread_mutex_destroy(&run.lock);
out:
	free(w);
	free(order);
	st_hugemem_free(buf, (size_t)bytes);
	return r;
}

int st_membw_measure(int n_threads, uint64_t bytes, int passes,
		     double *ret_gbps)
{
	return st_membw_measure_kernel(ST_MEMBW_AUTO, n_threads, bytes, passes,
				       ret_gbps);
}

/*
 * test_membw.c — the memory-bandwidth probe (common/st_membw.c): every sum
 * kernel this CPU runs agrees with a plain scalar loop on lengths around the
 * kernels' block sizes and on unaligned buffers; arguments out of range are
 * refused; a small real measurement returns a plausible positive figure
 * (never a timing assertion: only that it is finite and positive).
 *
 * Lives in tests/gen with the other benchmark-tooling tests.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_error.h"
#include "st_membw.h"

static int n_fail;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                      \
			fputc('\n', stderr);                               \
			n_fail++;                                          \
		}                                                          \
	} while (0)

/* xorshift64: a deterministic pattern with every bit busy, so a carry or a
 * dropped lane changes the sum. */
static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t scalar_sum(const unsigned char *p, size_t n_words)
{
	uint64_t s = 0, w;
	size_t i;

	for (i = 0; i < n_words; i++) {
		memcpy(&w, p + 8 * i, 8);
		s += w;
	}
	return s;
}

static void test_kernels(void)
{
	/* Block sizes are 128 B (generic, avx2) and 256 B (avx512): test
	 * around them, plus a large odd length. */
	static const size_t words[] = { 0, 1, 3, 15, 16, 17, 31, 32, 33, 63, 64,
					65, 1000, 4099, 65536 + 13 };
	size_t max_bytes = 8 * (65536 + 13) + 64, i, w, off;
	unsigned char *buf = malloc(max_bytes);
	uint64_t seed = 0x1234567887654321ull, sum;
	int k, n_run = 0;

	if (!buf) {
		CHECK(0, "malloc");
		return;
	}
	for (i = 0; i + 8 <= max_bytes; i += 8) {
		uint64_t r = next_rand(&seed);

		memcpy(buf + i, &r, 8);
	}
	for (k = ST_MEMBW_AUTO; k < ST_MEMBW_KERNEL_MAX; k++) {
		if (!st_membw_kernel_supported(k)) {
			CHECK(st_membw_sum(k, buf, 64, &sum) == -ST_E_UNSUPPORTED,
			      "unsupported kernel %s not refused",
			      st_membw_kernel_name(k));
			printf("kernel %s: not supported here\n",
			       st_membw_kernel_name(k));
			continue;
		}
		n_run++;
		for (off = 0; off < 24; off += 8) /* +8, +16: unaligned */
			for (w = 0; w < sizeof(words) / sizeof(words[0]); w++) {
				int r = st_membw_sum(k, buf + off, 8 * words[w], &sum);

				CHECK(r == 0, "%s: rc %d", st_membw_kernel_name(k), r);
				CHECK(sum == scalar_sum(buf + off, words[w]),
				      "%s: %zu words at +%zu: sum %llx, expected %llx",
				      st_membw_kernel_name(k), words[w], off,
				      (unsigned long long)sum,
				      (unsigned long long)scalar_sum(buf + off, words[w]));
			}
		printf("kernel %s: sums agree with the scalar loop\n",
		       st_membw_kernel_name(k));
	}
	/* auto and generic always run. */
	CHECK(n_run >= 2, "only %d kernels ran", n_run);
	CHECK(st_membw_kernel_best() != ST_MEMBW_AUTO &&
	      st_membw_kernel_supported(st_membw_kernel_best()),
	      "best kernel %d not a supported concrete kernel",
	      st_membw_kernel_best());
	CHECK(st_membw_sum(ST_MEMBW_GENERIC, buf, 12, &sum) == -EINVAL,
	      "12 bytes (not a multiple of 8) accepted");
	CHECK(st_membw_sum(ST_MEMBW_GENERIC, NULL, 8, &sum) == -EINVAL,
	      "NULL buffer accepted");
	CHECK(st_membw_sum(ST_MEMBW_GENERIC, buf, 8, NULL) == -EINVAL,
	      "NULL ret_sum accepted");
	CHECK(st_membw_sum(ST_MEMBW_KERNEL_MAX, buf, 8, &sum) == -EINVAL,
	      "kernel out of range accepted");
	free(buf);
}

static void test_names(void)
{
	CHECK(!strcmp(st_membw_kernel_name(ST_MEMBW_AUTO), "auto"), "auto");
	CHECK(!strcmp(st_membw_kernel_name(ST_MEMBW_GENERIC), "generic"), "generic");
	CHECK(!strcmp(st_membw_kernel_name(ST_MEMBW_AVX2), "avx2"), "avx2");
	CHECK(!strcmp(st_membw_kernel_name(ST_MEMBW_AVX512), "avx512"), "avx512");
	CHECK(!strcmp(st_membw_kernel_name(ST_MEMBW_KERNEL_MAX), "?"), "out of range");
}

static void test_measure(void)
{
	double gbps = -1;
	int r, k;

	CHECK(st_membw_measure(0, 1 << 24, 1, &gbps) == -EINVAL, "0 threads");
	CHECK(st_membw_measure(1025, 1ull << 30, 1, &gbps) == -EINVAL, "1025 threads");
	CHECK(st_membw_measure(1, 1 << 24, 0, &gbps) == -EINVAL, "0 passes");
	CHECK(st_membw_measure(1, 1 << 24, 1001, &gbps) == -EINVAL, "1001 passes");
	CHECK(st_membw_measure(4, 128 << 10, 1, &gbps) == -EINVAL,
	      "32 KiB per thread accepted");
	CHECK(st_membw_measure(1, 1 << 24, 1, NULL) == -EINVAL, "NULL ret_gbps");
	CHECK(gbps == -1, "ret_gbps written on error");

	/* 3 threads on any machine (wraps onto fewer CPUs), an odd size so
	 * slices are rounded: the per-pass checksum inside must still hold. */
	for (k = ST_MEMBW_AUTO; k < ST_MEMBW_KERNEL_MAX; k++) {
		if (!st_membw_kernel_supported(k))
			continue;
		gbps = -1;
		r = st_membw_measure_kernel(k, 3, (16u << 20) + 1000, 2, &gbps);
		CHECK(r == 0, "measure %s: %s", st_membw_kernel_name(k),
		      st_strerror(r));
		CHECK(isfinite(gbps) && gbps > 0, "measure %s: %g GB/s",
		      st_membw_kernel_name(k), gbps);
		printf("kernel %s: %.1f GB/s over 16 MiB (cache-resident; not "
		       "a bandwidth figure)\n", st_membw_kernel_name(k), gbps);
	}
	r = st_membw_measure(1, 1 << 20, 1, &gbps);
	CHECK(r == 0 && gbps > 0, "st_membw_measure: %s", st_strerror(r));
}

int main(void)
{
	test_names();
	test_kernels();
	test_measure();
	if (n_fail)
		fprintf(stderr, "%d checks failed\n", n_fail);
	return n_fail ? 1 : 0;
}

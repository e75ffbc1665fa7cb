/*
 * strata-membw — prints the host's memory read bandwidth (st_membw.h).
 *
 *   strata-membw [--threads N] [--bytes SIZE] [--passes P] [--kernel K]
 *
 * The figure feeds tier sizing and CPU-expert cost estimates; run it on an
 * idle machine.  Prints one result line:
 *   read bandwidth: X GB/s (N threads, best of P passes over B bytes)
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_error.h"
#include "st_membw.h"
#include "st_util.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: strata-membw [--threads N] [--bytes SIZE] [--passes P] [--kernel K]\n"
		"Measures host memory read bandwidth: N pinned threads sum a SIZE buffer\n"
		"with vector loads; the best of P passes is reported in GB/s (1e9 B/s).\n"
		"  --threads N   reader threads (default: every CPU this process may use)\n"
		"  --bytes SIZE  buffer size, e.g. 1GiB, 4G, 512MiB (default 1GiB; keep it\n"
		"                far above the last-level cache)\n"
		"  --passes P    passes, best one reported (default 5)\n"
		"  --kernel K    auto|generic|avx2|avx512 (default auto: the best this CPU has)\n");
}

static int parse_int(const char *s, int lo, int hi, int *ret)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*ret = (int)v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "threads", required_argument, NULL, 't' },
		{ "bytes", required_argument, NULL, 'b' },
		{ "passes", required_argument, NULL, 'p' },
		{ "kernel", required_argument, NULL, 'k' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	enum st_membw_kernel kernel = ST_MEMBW_AUTO;
	uint64_t bytes = 1ull << 30;
	int n_threads = 0, passes = 5, c, r;
	double gbps;
	cpu_set_t set;

	while ((c = getopt_long(argc, argv, "t:b:p:k:h", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			if (parse_int(optarg, 1, 1024, &n_threads) < 0) {
				fprintf(stderr, "strata-membw: --threads %s: want 1..1024\n", optarg);
				return 2;
			}
			break;
		case 'b':
			if (st_parse_size(optarg, &bytes) < 0 || bytes == 0) {
				fprintf(stderr, "strata-membw: --bytes %s: not a size\n", optarg);
				return 2;
			}
			break;
		case 'p':
			if (parse_int(optarg, 1, 1000, &passes) < 0) {
				fprintf(stderr, "strata-membw: --passes %s: want 1..1000\n", optarg);
				return 2;
			}
			break;
		case 'k':
			for (kernel = 0; kernel < ST_MEMBW_KERNEL_MAX; kernel++)
				if (!strcmp(optarg, st_membw_kernel_name(kernel)))
					break;
			if (kernel == ST_MEMBW_KERNEL_MAX) {
				fprintf(stderr, "strata-membw: --kernel %s: want auto, generic, avx2 or avx512\n",
					optarg);
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "strata-membw: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	if (n_threads == 0) {
		n_threads = 1;
		if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
			n_threads = ST_MIN(CPU_COUNT(&set), 1024);
	}
	if (kernel == ST_MEMBW_AUTO)
		kernel = st_membw_kernel_best();

	r = st_membw_measure_kernel(kernel, n_threads, bytes, passes, &gbps);
	if (r < 0) {
		if (r == -EINVAL)
			fprintf(stderr, "strata-membw: --bytes must give each of the %d threads at least 64 KiB\n",
				n_threads);
		else
			fprintf(stderr, "strata-membw: %s kernel, %d threads, %llu bytes: %s\n",
				st_membw_kernel_name(kernel), n_threads,
				(unsigned long long)bytes, st_strerror(r));
		return 1;
	}
	printf("kernel: %s\n", st_membw_kernel_name(kernel));
	printf("read bandwidth: %.1f GB/s (%d threads, best of %d passes over %llu bytes)\n",
	       gbps, n_threads, passes, (unsigned long long)bytes);
	return 0;
}

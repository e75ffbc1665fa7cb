/* cli_device.c — see cli_device.h. */
#include "cli_device.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "st_cuda.h"
#include "st_util.h"

int cli_check_device(const char *device_budget, const char *device_kv_budget,
		     const char *who)
{
	const int has_b = device_budget && device_budget[0];
	const int has_kv = device_kv_budget && device_kv_budget[0];
	uint64_t bytes = 0, kv_bytes = 0;
	double pct = 0;
	char reason[300];

	if (has_b && strcmp(device_budget, "0") &&
	    (st_parse_budget(device_budget, &bytes, &pct) < 0 ||
	     pct > 100.0 || (!bytes && !(pct > 0)))) {
		fprintf(stderr, "%s: --device-budget '%s': give a share of "
			"all experts (25%%), bytes (40GiB), or 0 for the CPU\n",
			who, device_budget);
		return 1;
	}
	if (has_kv && st_parse_size(device_kv_budget, &kv_bytes) < 0) {
		fprintf(stderr, "%s: --device-kv-budget '%s': give bytes "
			"(256MiB), or 0 for no device KV pool\n", who,
			device_kv_budget);
		return 1;
	}
	if (has_b && !strcmp(device_budget, "0")) {
		if (kv_bytes)
			fprintf(stderr, "%s: --device-kv-budget %s ignored: "
				"--device-budget 0 computes on the CPU\n", who,
				device_kv_budget);
		return 0;
	}
	if (!has_b && !kv_bytes)
		return 0;
	if (!st_cuda_built()) {
		fprintf(stderr, "%s: --device-%sbudget: this strata was built "
			"without CUDA (nvcc and cuBLAS were not found at meson "
			"setup); rebuild on a machine with the CUDA toolkit "
			"(scripts/gpu-check --bundle), or leave the "
			"--device-* options out to compute on the CPU\n", who,
			has_b ? "" : "kv-");
		return 1;
	}
	if (st_cuda_device_count(reason, sizeof(reason)) == 0) {
		fprintf(stderr, "%s: --device-%sbudget: no CUDA device: %s; "
			"check the NVIDIA driver (nvidia-smi), or pass "
			"--device-budget 0 (or leave the --device-* options "
			"out) to compute on the CPU\n", who,
			has_b ? "" : "kv-", reason);
		return 1;
	}
	return 0;
}

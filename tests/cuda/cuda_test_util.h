/*
 * cuda_test_util.h — what the GPU tests (suite cuda) share: the CPU
 * attention they compare the device's against, and opening the CUDA
 * module of computed (skip without a device).
 */
#ifndef CUDA_TEST_UTIL_H
#define CUDA_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>

#include "cw_cu.h"
#include "cw_cuda_experts.h"
#include "cw_kvrow.h"
#include "st_error.h"

/*
 * The CPU attention of one query head over n_rows KV rows (the steps of
 * cw_model.c attend(): float32 dot products scaled by 1/sqrt(head_dim),
 * float32 exps with a double sum, p_j V_j summed in float32): qh is the
 * head's head_dim floats, kvh the KV head it reads (GQA), rows in f's
 * layout, sc scratch of n_rows floats, oh the head_dim outputs.
 * head_dim at most 512.
 */
void cudat_attend_head(const struct cw_kvrow_fmt *f,
		       const uint8_t *const *rows, int n_rows,
		       const float *qh, int kvh, float *sc, float *oh);

/*
 * Checks one query head's outputs, gh (the device's) and ch (the CPU's),
 * head_dim floats each, against the exact attention computed here in
 * double (softmax(q.k / sqrt(head_dim)) V over the n_rows rows of f's
 * layout; kvh the KV head), each within twice cw_cu.h's error bound for a
 * float32 attention ((hd + 8) |q||k| / sqrt(hd) + 4 |s| ulps on a score,
 * propagated through exp and the weighted sum).  Returns 0, or -1 with
 * the first element outside the bound described in msg[cap].
 */
int cudat_check_head(const struct cw_kvrow_fmt *f,
		     const uint8_t *const *rows, int n_rows, const float *qh,
		     int kvh, const float *gh, const float *ch, char *msg,
		     size_t cap);

/*
 * Opens computed's CUDA module into *h when a device is present, printing
 * the device.  Returns 0 (opened: cw_cuda_module_close it), 77 with a
 * "SKIP: no CUDA device" line, or 1 with a FAIL line (the module did not
 * open): the test's exit status.  Inline, so a test that does not use the
 * module (test_cuda_kernels, which scripts/gpu-check's standalone way
 * links without it) does not need its loader.
 */
static inline int cudat_module_open(struct cw_cuda_module_handle *h)
{
	struct st_diag d = { "" };
	char reason[256], desc[256];

	if (cw_cu_device_count(reason, sizeof(reason)) == 0) {
		printf("SKIP: no CUDA device: %s\n", reason);
		return 77;
	}
	if (cw_cu_device_describe(desc, sizeof(desc), &d) == 0)
		printf("device: %s\n", desc);
	if (cw_cuda_module_open(h, &d) < 0) {
		printf("FAIL: %s\n", d.msg);
		return 1;
	}
	return 0;
}

#endif

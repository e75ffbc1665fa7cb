/*
 * test_devpool_budget.c — computed's device pool sizing and its behaviour
 * without a GPU (cw_devpool.h): --device-budget as a share of all experts
 * or as bytes, slots rounded to the 256-byte slot alignment, refusals of
 * budgets below top-k and of text that is not a budget, and
 * cw_devpool_open answering -ST_E_UNSUPPORTED with a reason (not a crash,
 * not a hang) where there is no CUDA device or no CUDA in the build: the
 * cue for computed to say so once and stay on the CPU; and the CUDA module
 * computed dlopens loads (every symbol resolves) in a CUDA build.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cw_cuda_experts.h"
#include "cw_devpool.h"
#include "st_cuda.h"
#include "st_error.h"
#include "test_util.h"

static int failures;

#define CHECK(c) ST_TEST_CHECK(c)

int main(void)
{
	/* kjv-moe-like: 6 layers x 16 experts, top-2, 40960-byte records */
	struct cw_devpool_geom g = { 6, 16, 2, 40960, 0 };
	struct cw_devpool_opts o = { 0 };
	struct cw_devpool *p = NULL;
	struct st_diag diag = { "" };
	uint64_t sb = 0;
	uint32_t n = 0;
	int r;

	CHECK(cw_devpool_slots(&g, "25%", &n, &sb, &diag) == 0);
	CHECK(n == 24 && sb == 40960);
	CHECK(cw_devpool_slots(&g, "100%", &n, &sb, &diag) == 0 && n == 96);
	/* more than every expert is capped at every expert */
	CHECK(cw_devpool_slots(&g, "1GiB", &n, &sb, &diag) == 0 && n == 96);
	CHECK(cw_devpool_slots(&g, "409600", &n, &sb, &diag) == 0 && n == 10);
	/* a record that is not a multiple of 256 gets a rounded slot */
	g.record_bytes = 1000;
	CHECK(cw_devpool_slots(&g, "10240", &n, &sb, &diag) == 0);
	CHECK(sb == 1024 && n == 10);
	g.record_bytes = 40960;
	/* below top-k: refused, naming the minimum */
	r = cw_devpool_slots(&g, "40960", &n, &sb, &diag);
	CHECK(r == -ST_E_BUDGET && strstr(diag.msg, "81920"));
	r = cw_devpool_slots(&g, "1%", &n, &sb, &diag);
	CHECK(r == -ST_E_BUDGET);
	CHECK(cw_devpool_slots(&g, "lots", &n, &sb, &diag) == -EINVAL);
	CHECK(cw_devpool_slots(&g, NULL, &n, &sb, &diag) == -EINVAL);
	/* no GPU here (or no CUDA in the build): a reason, not a failure */
	o.budget = "25%";
	o.run_dir = "/nonexistent-run-dir";
	o.instance = "devpool-test";
	o.timeout_ms = 200;
	r = cw_devpool_open(&p, &g, &o, &diag);
	if (r == 0) {
		printf("SKIP: a CUDA device is present; the no-device path "
		       "is not exercised here\n");
		cw_devpool_close(p, 100);
	} else {
		CHECK(r == -ST_E_UNSUPPORTED);
		CHECK(p == NULL);
		CHECK(diag.msg[0] != 0);
		printf("no device: %s\n", diag.msg);
	}
	/* the CUDA module: loadable in a CUDA build (no device needed to
	 * load it: it links cudart and cuBLAS, which must resolve), refused
	 * with a reason in a build without CUDA */
	{
		struct cw_cuda_module_handle h;

		r = cw_cuda_module_open(&h, &diag);
		if (st_cuda_built()) {
			if (r != 0)
				printf("module: %s\n", diag.msg);
			CHECK(r == 0);
			CHECK(r != 0 || (h.ops && h.ops->create && h.ops->fn &&
					 h.ops->sync &&
					 h.pool.pin == cw_devpool_pin));
			cw_cuda_module_close(&h);
		} else {
			CHECK(r == -ST_E_UNSUPPORTED && h.dl == NULL);
		}
	}
	/* a bad budget is reported before any device probe */
	o.budget = "0.5 experts";
	CHECK(cw_devpool_open(&p, &g, &o, &diag) == -EINVAL);
	if (failures)
		printf("%d failures\n", failures);
	return failures ? 1 : 0;
}

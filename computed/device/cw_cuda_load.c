/*
 * cw_cuda_load.c — computed's loader of the CUDA module
 * (cw_cuda_experts.h): dlopen, the one entry point, and the device pool
 * functions the module borrows.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_cuda_experts.h"
#include "st_cuda.h"

#ifndef ST_CW_CUDA_MODULE_BUILD
#define ST_CW_CUDA_MODULE_BUILD ""
#endif
#ifndef ST_CW_CUDA_MODULE_INSTALL
#define ST_CW_CUDA_MODULE_INSTALL ""
#endif

int cw_cuda_module_open(struct cw_cuda_module_handle *h,
			struct st_diag *diag)
{
	const char *paths[3] = { getenv("STRATA_CUDA_MODULE"),
				 ST_CW_CUDA_MODULE_BUILD,
				 ST_CW_CUDA_MODULE_INSTALL };
	const struct cw_cuda_module_ops *(*entry)(void);
	char why[600] = "not found";

	memset(h, 0, sizeof(*h));
	if (!st_cuda_built())
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "this computed "
				   "was built without CUDA");
	for (int i = 0; i < 3 && !h->dl; i++) {
		if (!paths[i] || !paths[i][0])
			continue;
		h->dl = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
		if (!h->dl)
			snprintf(why, sizeof(why), "%s", dlerror());
	}
	if (!h->dl)
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "the CUDA module "
				   "libstrata_cw_cuda.so cannot be loaded (%s); "
				   "set STRATA_CUDA_MODULE to its path", why);
	*(void **)&entry = dlsym(h->dl, "cw_cuda_module");
	if (!entry || !(h->ops = entry())) {
		dlclose(h->dl);
		h->dl = NULL;
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "the CUDA module "
				   "has no cw_cuda_module entry");
	}
	h->pool.pin = cw_devpool_pin;
	h->pool.unpin = cw_devpool_unpin;
	return 0;
}

void cw_cuda_module_close(struct cw_cuda_module_handle *h)
{
	if (h->dl)
		dlclose(h->dl);
	memset(h, 0, sizeof(*h));
}

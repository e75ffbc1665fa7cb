/*
 * st_cuda_stub.c — st_cuda.h in a build without CUDA (meson -Dcuda=disabled
 * or no nvcc/cudart): every call fails with -ST_E_UNSUPPORTED and says so,
 * so expertd, kvd and computed need no #ifdef.
 */
#include <stdio.h>
#include <string.h>

#include "st_cuda.h"

#define NO_CUDA "this strata was built without CUDA (meson setup -Dcuda=enabled on a machine with nvcc and cudart)"

static int no_cuda(struct st_diag *diag)
{
	return st_diag_set(diag, -ST_E_UNSUPPORTED, "%s", NO_CUDA);
}

int st_cuda_built(void) { return 0; }
int st_cuda_is_fake(void) { return 0; }

int st_cuda_device_count(char *reason, size_t n)
{
	if (reason && n)
		snprintf(reason, n, "%s", NO_CUDA);
	return 0;
}

int st_cuda_mem_info(uint64_t *f, uint64_t *t, struct st_diag *diag)
{
	*f = *t = 0;
	return no_cuda(diag);
}

int st_cuda_export_create(struct st_cuda_export **ret, uint64_t pool_bytes,
			  uint32_t n_events, struct st_diag *diag)
{
	*ret = NULL;
	return no_cuda(diag);
}

void *st_cuda_export_base(const struct st_cuda_export *x) { return NULL; }

int st_cuda_export_describe(const struct st_cuda_export *x,
			    struct st_devpool_export *e, struct st_diag *diag)
{
	return no_cuda(diag);
}

int st_cuda_export_wait(const struct st_cuda_export *x, uint32_t event,
			void *stream, struct st_diag *diag)
{
	return no_cuda(diag);
}

void st_cuda_export_destroy(struct st_cuda_export *x) { }

int st_cuda_import_open(struct st_cuda_import **ret,
			const struct st_devpool_export *e,
			struct st_diag *diag)
{
	*ret = NULL;
	return no_cuda(diag);
}

void *st_cuda_import_base(const struct st_cuda_import *m) { return NULL; }
uint32_t st_cuda_import_handles(const struct st_cuda_import *m) { return 0; }

int st_cuda_import_h2d(struct st_cuda_import *m, uint64_t dst_off,
		       const void *src, uint64_t bytes, uint32_t event,
		       struct st_diag *diag)
{
	return no_cuda(diag);
}

int st_cuda_import_d2h(struct st_cuda_import *m, void *dst, uint64_t src_off,
		       uint64_t bytes, uint32_t event, struct st_diag *diag)
{
	return no_cuda(diag);
}

int st_cuda_import_idle(struct st_cuda_import *m, struct st_diag *diag)
{
	return 1;
}

int st_cuda_import_drain(struct st_cuda_import *m, struct st_diag *diag)
{
	return 0;
}

int st_cuda_import_close(struct st_cuda_import *m, struct st_diag *diag)
{
	return 0;
}

int st_cuda_host_register(void *p, uint64_t bytes, struct st_diag *diag)
{
	return no_cuda(diag);
}

void st_cuda_host_unregister(void *p) { }

int st_cuda_stream_create(void **ret, struct st_diag *diag)
{
	*ret = NULL;
	return no_cuda(diag);
}

void st_cuda_stream_destroy(void *stream) { }

int st_cuda_stream_sync(void *stream, struct st_diag *diag)
{
	return no_cuda(diag);
}

int st_cuda_context_check(struct st_diag *diag)
{
	return no_cuda(diag);
}

int st_cuda_stream_wait(void *stream, int timeout_ms, struct st_diag *diag)
{
	return no_cuda(diag);
}

int st_cuda_memcpy_async(void *dst, const void *src, uint64_t bytes,
			 void *stream, struct st_diag *diag)
{
	return no_cuda(diag);
}

/*
 * st_cuda.h — the one door of strata's daemons to the CUDA runtime for the
 * device pools (issue 10; STYLE.md "each external library is reached
 * through one file in common/"): probing a device, exporting a device
 * allocation and inter-process events (computed), importing them in
 * another process and copying on its own stream (expertd, kvd), and
 * registering shared host pools as pinned memory.
 *
 * st_cuda.c is plain C over the CUDA runtime's C API (cuda_runtime_api.h,
 * linked with cudart), compiled only with the meson `cuda` feature; without
 * it st_cuda_stub.c gives the same functions, each failing with
 * -ST_E_UNSUPPORTED ("this strata was built without CUDA"), so callers have
 * no #ifdef.  No CUDA type crosses this header: streams are void *, handles
 * are the ST_DEVPOOL_HANDLE_BYTES bytes of st_devpool.h.
 *
 * Errors: 0 or a negative code (-ST_E_CUDA with the runtime's message in
 * diag, -ENOMEM, -EINVAL, -ST_E_UNSUPPORTED).
 */
#ifndef ST_CUDA_H
#define ST_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "st_devpool.h"
#include "st_error.h"

/* 1 when this build has the CUDA runtime (st_cuda.c), 0 with the stub. */
int st_cuda_built(void);

/*
 * 1 when STRATA_CUDA_FAKE=1 selected the fake device (CUDA builds, for
 * tests on machines without a GPU): device memory is host shared memory
 * whose name travels in the IPC handle, copies are memcpy (done on
 * return; events and streams are no-ops).  Every process of an instance
 * must agree.  0 otherwise and in builds without CUDA.
 */
int st_cuda_is_fake(void);

/*
 * Number of usable CUDA devices, or 0 with a one-line reason in reason[n]
 * (no driver, no device, a build without CUDA).  Never fails otherwise.
 */
int st_cuda_device_count(char *reason, size_t n);

/* Bytes of device memory free and total on the current device. */
int st_cuda_mem_info(uint64_t *ret_free, uint64_t *ret_total,
		     struct st_diag *diag);

/* --- exporter (computed) --- */

struct st_cuda_export;

/*
 * cudaMallocs pool_bytes on the current device (zeroed) and creates
 * n_events inter-process events (cudaEventInterprocess |
 * cudaEventDisableTiming), and their IPC handles.  *ret owned by the
 * caller (st_cuda_export_destroy).  n_events in 1 .. ST_DEVPOOL_MAX_EVENTS.
 */
int st_cuda_export_create(struct st_cuda_export **ret, uint64_t pool_bytes,
			  uint32_t n_events, struct st_diag *diag);
/* The pool's device address (for kernels). */
void *st_cuda_export_base(const struct st_cuda_export *x);
/*
 * Fills the CUDA part of an EXPORT: bus_id, pool_bytes, mem_handle,
 * n_events and events (pointing into x: valid while x lives).  The caller
 * sets pid, kind, epoch, slot_bytes and n_slots.
 */
int st_cuda_export_describe(const struct st_cuda_export *x,
			    struct st_devpool_export *e, struct st_diag *diag);
/* Makes stream (NULL: the legacy default stream) wait for the latest
 * record of event lane `event` (recorded by an importer). */
int st_cuda_export_wait(const struct st_cuda_export *x, uint32_t event,
			void *stream, struct st_diag *diag);
/*
 * Frees the allocation and the events.  The caller must have established
 * with st_devlease_may_free that no importer still maps it (PITFALLS
 * P18).  NULL is a no-op.
 */
void st_cuda_export_destroy(struct st_cuda_export *x);

/* --- importer (expertd, kvd) --- */

struct st_cuda_import;

/*
 * Opens what an EXPORT describes: selects the device by its bus id,
 * cudaIpcOpenMemHandle (lazy peer access), cudaIpcOpenEventHandle for each
 * event, and creates this process's own non-blocking copy stream.
 * Handles opened count 1 + n_events.  *ret owned by the caller
 * (st_cuda_import_close).
 */
int st_cuda_import_open(struct st_cuda_import **ret,
			const struct st_devpool_export *e,
			struct st_diag *diag);
/* The imported pool's device address in this process. */
void *st_cuda_import_base(const struct st_cuda_import *m);
/* Memory and event handles open (1 + n_events), 0 after close. */
uint32_t st_cuda_import_handles(const struct st_cuda_import *m);
/*
 * Enqueues on the import's stream a copy of bytes from host src (pinned:
 * st_cuda_host_register, else the copy is staged by the driver) to the
 * pool at byte offset dst_off, then records event lane `event`.  Returns
 * without waiting.  -EINVAL when [dst_off, dst_off + bytes) leaves the
 * pool or event is out of range.
 */
int st_cuda_import_h2d(struct st_cuda_import *m, uint64_t dst_off,
		       const void *src, uint64_t bytes, uint32_t event,
		       struct st_diag *diag);
/* The reverse (spill of a device KV page to host), same rules. */
int st_cuda_import_d2h(struct st_cuda_import *m, void *dst, uint64_t src_off,
		       uint64_t bytes, uint32_t event, struct st_diag *diag);
/* 1 when every copy enqueued so far has completed, 0 when some run, or
 * negative on an error of one of them. */
int st_cuda_import_idle(struct st_cuda_import *m, struct st_diag *diag);
/* Waits for every copy enqueued so far. */
int st_cuda_import_drain(struct st_cuda_import *m, struct st_diag *diag);
/*
 * Drains the stream, closes the events and the memory handle, destroys the
 * stream, frees m.  Returns the handles closed (>= 0; errors of the drain
 * are reported in diag but the handles are closed regardless: the peer may
 * be gone).  NULL: 0.
 */
int st_cuda_import_close(struct st_cuda_import *m, struct st_diag *diag);

/* --- host memory --- */

/* cudaHostRegister(portable) of [p, p + bytes): the shared host pool
 * becomes pinned for this process's DMA.  Page-aligned p. */
int st_cuda_host_register(void *p, uint64_t bytes, struct st_diag *diag);
/* cudaHostUnregister; p NULL is a no-op. */
void st_cuda_host_unregister(void *p);

/* --- streams (benchmarks and tests) --- */
int st_cuda_stream_create(void **ret, struct st_diag *diag);
void st_cuda_stream_destroy(void *stream);
int st_cuda_stream_sync(void *stream, struct st_diag *diag);
/*
 * Waits for everything queued on stream, at most timeout_ms (issue 27):
 * a stream that waits on an inter-process event whose recording process
 * died may never finish, and a blocking sync would hang the caller.
 * Polls cudaStreamQuery (yielding the first 20 ms, then every ms).
 * 0; -ST_E_TIMEOUT when the stream is still busy (its work may still run
 * later: keep its buffers and the slots it reads); -ST_E_CUDA on an
 * error of the queued work.  The fake device: 0 at once.
 */
int st_cuda_stream_wait(void *stream, int timeout_ms, struct st_diag *diag);
/*
 * 0 while this process's CUDA context works; -ST_E_CUDA with the error
 * when a sticky error broke it (every later call fails the same way: an
 * importer that used a dead exporter's memory or events, which the CUDA
 * documentation leaves undefined; issue 27).  Only a new process has a
 * context again.  The fake device: 0.
 */
int st_cuda_context_check(struct st_diag *diag);

/* How long computed waits for a stream of its device path (a layer's
 * experts or attention, a step's KV pages) before it gives that path up
 * and computes on the CPU. */
#define ST_CUDA_STREAM_TIMEOUT_MS 10000
/* cudaMemcpyAsync of bytes on stream, direction from the addresses
 * (unified addressing: host or device either side). */
int st_cuda_memcpy_async(void *dst, const void *src, uint64_t bytes,
			 void *stream, struct st_diag *diag);

#endif

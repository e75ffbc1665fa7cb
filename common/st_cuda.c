/*
 * st_cuda.c — device pools over the CUDA runtime's C API (st_cuda.h).
 * Built only with the meson `cuda` feature (st_cuda_stub.c otherwise).
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "st_cuda.h"
#include "st_util.h"

/*
 * The CUDA runtime, loaded with dlopen at the first call that needs it:
 * daemons linked with this file do not map libcudart (nor pay its memory)
 * unless a device pool is used, and a machine without an NVIDIA driver is
 * recognised without loading it at all.  The table is process-wide by
 * nature (one runtime per process), written once under pthread_once and
 * read-only afterwards: the one exception to "no global mutable state".
 */
static struct {
	__typeof__(cudaDeviceGetByPCIBusId) *DeviceGetByPCIBusId;
	__typeof__(cudaDeviceGetPCIBusId) *DeviceGetPCIBusId;
	__typeof__(cudaDeviceSynchronize) *DeviceSynchronize;
	__typeof__(cudaEventCreateWithFlags) *EventCreateWithFlags;
	__typeof__(cudaEventDestroy) *EventDestroy;
	__typeof__(cudaEventRecord) *EventRecord;
	__typeof__(cudaFree) *Free;
	__typeof__(cudaGetDevice) *GetDevice;
	__typeof__(cudaGetDeviceCount) *GetDeviceCount;
	__typeof__(cudaGetErrorName) *GetErrorName;
	__typeof__(cudaGetErrorString) *GetErrorString;
	__typeof__(cudaHostRegister) *HostRegister;
	__typeof__(cudaHostUnregister) *HostUnregister;
	__typeof__(cudaIpcCloseMemHandle) *IpcCloseMemHandle;
	__typeof__(cudaIpcGetEventHandle) *IpcGetEventHandle;
	__typeof__(cudaIpcGetMemHandle) *IpcGetMemHandle;
	__typeof__(cudaIpcOpenEventHandle) *IpcOpenEventHandle;
	__typeof__(cudaIpcOpenMemHandle) *IpcOpenMemHandle;
	__typeof__(cudaMalloc) *Malloc;
	__typeof__(cudaMemGetInfo) *MemGetInfo;
	__typeof__(cudaMemcpyAsync) *MemcpyAsync;
	__typeof__(cudaMemset) *Memset;
	__typeof__(cudaSetDevice) *SetDevice;
	__typeof__(cudaStreamCreateWithFlags) *StreamCreateWithFlags;
	__typeof__(cudaStreamDestroy) *StreamDestroy;
	__typeof__(cudaStreamQuery) *StreamQuery;
	__typeof__(cudaStreamSynchronize) *StreamSynchronize;
	__typeof__(cudaStreamWaitEvent) *StreamWaitEvent;
	void *dl;
	int fake;        /* STRATA_CUDA_FAKE=1: host memory (tests) */
	char why[300];   /* why loading failed ("" when loaded) */
} cu;
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

#ifndef ST_CUDA_LIBDIR
#define ST_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

static void cu_load(void)
{
	static const char *const libs[] = {
		"libcudart.so.13", "libcudart.so.12", "libcudart.so",
		ST_CUDA_LIBDIR "/libcudart.so",
	};
	static const char *const drv[] = {
		"/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia",
		"/dev/dxg",
	};
	size_t i;
	int have_drv = 0;

	if (getenv("STRATA_CUDA_FAKE") &&
	    !strcmp(getenv("STRATA_CUDA_FAKE"), "1")) {
		cu.fake = 1;
		return;
	}
	for (i = 0; i < sizeof(drv) / sizeof(drv[0]); i++)
		if (access(drv[i], F_OK) == 0)
			have_drv = 1;
	if (!have_drv && !getenv("STRATA_CUDA_FORCE")) {
		snprintf(cu.why, sizeof(cu.why), "no NVIDIA driver (no "
			 "/dev/nvidiactl, /dev/nvidia0, /proc/driver/nvidia)");
		return;
	}
	for (i = 0; i < sizeof(libs) / sizeof(libs[0]) && !cu.dl; i++)
		cu.dl = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
	if (!cu.dl) {
		snprintf(cu.why, sizeof(cu.why), "cannot load the CUDA "
			 "runtime: %s", dlerror());
		return;
	}
#define LOAD(n) if (!(*(void **)&cu.n = dlsym(cu.dl, "cuda" #n))) goto missing
	LOAD(DeviceGetByPCIBusId);
	LOAD(DeviceGetPCIBusId);
	LOAD(DeviceSynchronize);
	LOAD(EventCreateWithFlags);
	LOAD(EventDestroy);
	LOAD(EventRecord);
	LOAD(Free);
	LOAD(GetDevice);
	LOAD(GetDeviceCount);
	LOAD(GetErrorName);
	LOAD(GetErrorString);
	LOAD(HostRegister);
	LOAD(HostUnregister);
	LOAD(IpcCloseMemHandle);
	LOAD(IpcGetEventHandle);
	LOAD(IpcGetMemHandle);
	LOAD(IpcOpenEventHandle);
	LOAD(IpcOpenMemHandle);
	LOAD(Malloc);
	LOAD(MemGetInfo);
	LOAD(MemcpyAsync);
	LOAD(Memset);
	LOAD(SetDevice);
	LOAD(StreamCreateWithFlags);
	LOAD(StreamDestroy);
	LOAD(StreamQuery);
	LOAD(StreamSynchronize);
	LOAD(StreamWaitEvent);
#undef LOAD
	return;
missing:
	snprintf(cu.why, sizeof(cu.why), "the CUDA runtime lacks a function "
		 "strata needs: %s", dlerror());
	dlclose(cu.dl);
	cu.dl = NULL;
}

/* 0 when the runtime is usable, else -ST_E_UNSUPPORTED with the reason. */
static int cu_ready(struct st_diag *diag)
{
	pthread_once(&cu_once, cu_load);
	if (cu.dl || cu.fake)
		return 0;
	return st_diag_set(diag, -ST_E_UNSUPPORTED, "%s", cu.why);
}

_Static_assert(sizeof(cudaIpcMemHandle_t) == ST_DEVPOOL_HANDLE_BYTES,
	       "cudaIpcMemHandle_t size");
_Static_assert(sizeof(cudaIpcEventHandle_t) == ST_DEVPOOL_HANDLE_BYTES,
	       "cudaIpcEventHandle_t size");

static int cu_err(struct st_diag *diag, cudaError_t e, const char *what)
{
	return st_diag_set(diag, -ST_E_CUDA, "%s: %s (%s)", what,
			   cu.GetErrorString(e), cu.GetErrorName(e));
}

/*
 * The fake device (STRATA_CUDA_FAKE=1, tests on machines without a GPU):
 * "device memory" is a POSIX shared-memory object whose name travels in
 * the 64-byte memory handle, copies are memcpy (complete on return, so
 * events and streams are no-ops), one fake device.  It runs the whole
 * protocol (export, import, copies, slot table, leases, epochs) across real
 * processes; no kernel runs on it (computed computes device-slot experts
 * with its CPU backend then, cw_devpool.h).
 */
int st_cuda_is_fake(void)
{
	pthread_once(&cu_once, cu_load);
	return cu.fake;
}

static void *fake_map(const char *name, uint64_t bytes, int create,
		      struct st_diag *diag)
{
	int fd = shm_open(name, create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR,
			  0600);
	void *p;

	if (fd < 0) {
		st_diag_set(diag, -ST_E_CUDA, "fake device memory %s: %s", name,
			    strerror(errno));
		return NULL;
	}
	if (create && ftruncate(fd, (off_t)bytes) < 0) {
		st_diag_set(diag, -ST_E_CUDA, "fake device memory: %s",
			    strerror(errno));
		close(fd);
		shm_unlink(name);
		return NULL;
	}
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		st_diag_set(diag, -ST_E_CUDA, "fake device memory: %s",
			    strerror(errno));
		if (create)
			shm_unlink(name);
		return NULL;
	}
	return p;
}

int st_cuda_built(void)
{
	return 1;
}

int st_cuda_device_count(char *reason, size_t n)
{
	int count = 0;
	cudaError_t e;

	if (cu_ready(NULL) < 0) {
		if (reason && n)
			snprintf(reason, n, "%s", cu.why);
		return 0;
	}
	if (cu.fake)
		return 1;
	e = cu.GetDeviceCount(&count);

	if (e != cudaSuccess) {
		if (reason && n)
			snprintf(reason, n, "cudaGetDeviceCount: %s (%s)",
				 cu.GetErrorString(e), cu.GetErrorName(e));
		return 0;
	}
	if (count <= 0 && reason && n)
		snprintf(reason, n, "cudaGetDeviceCount found 0 devices");
	return count > 0 ? count : 0;
}

int st_cuda_mem_info(uint64_t *ret_free, uint64_t *ret_total,
		     struct st_diag *diag)
{
	size_t f = 0, t = 0;
	cudaError_t e;

	if (cu_ready(diag) < 0)
		return cu_ready(diag);
	if (cu.fake) {
		*ret_free = *ret_total = 64ull << 30;
		return 0;
	}
	e = cu.MemGetInfo(&f, &t);

	if (e != cudaSuccess)
		return cu_err(diag, e, "cudaMemGetInfo");
	*ret_free = f;
	*ret_total = t;
	return 0;
}

struct st_cuda_export {
	void *base;
	uint64_t bytes;
	uint32_t n_events;
	cudaEvent_t *ev;
	uint8_t *ev_handles; /* n_events x 64 */
	cudaIpcMemHandle_t mem;
	char bus_id[ST_DEVPOOL_BUSID_BYTES + 1];
};

void st_cuda_export_destroy(struct st_cuda_export *x)
{
	uint32_t i;

	if (!x)
		return;
	if (cu.fake) {
		if (x->base) {
			munmap(x->base, x->bytes);
			shm_unlink((const char *)&x->mem);
		}
	} else {
		if (x->ev)
			for (i = 0; i < x->n_events; i++)
				if (x->ev[i])
					cu.EventDestroy(x->ev[i]);
		if (x->base)
			cu.Free(x->base);
	}
	free(x->ev);
	free(x->ev_handles);
	free(x);
}

int st_cuda_export_create(struct st_cuda_export **ret, uint64_t pool_bytes,
			  uint32_t n_events, struct st_diag *diag)
{
	struct st_cuda_export *x;
	cudaError_t e;
	uint32_t i;
	int dev = 0, rc;

	*ret = NULL;
	if ((rc = cu_ready(diag)) < 0)
		return rc;
	if (!pool_bytes || !n_events || n_events > ST_DEVPOOL_MAX_EVENTS)
		return st_diag_set(diag, -EINVAL,
				   "device pool: %llu bytes, %u events",
				   (unsigned long long)pool_bytes, n_events);
	x = calloc(1, sizeof(*x));
	if (x) {
		x->ev = calloc(n_events, sizeof(*x->ev));
		x->ev_handles = calloc(n_events, ST_DEVPOOL_HANDLE_BYTES);
	}
	if (!x || !x->ev || !x->ev_handles) {
		st_cuda_export_destroy(x);
		return st_diag_set(diag, -ENOMEM, "device pool: out of memory");
	}
	x->n_events = n_events;
	x->bytes = pool_bytes;
	if (cu.fake) {
		/* the handle is the name; events are never waited on */
		snprintf((char *)&x->mem, sizeof(x->mem), "/stfake.%d.%llu",
			 (int)getpid(),
			 (unsigned long long)st_devpool_epoch_new());
		snprintf(x->bus_id, sizeof(x->bus_id), "fake:0");
		memset(x->ev_handles, 0xfe,
		       (size_t)n_events * ST_DEVPOOL_HANDLE_BYTES);
		x->base = fake_map((const char *)&x->mem, pool_bytes, 1, diag);
		if (!x->base) {
			st_cuda_export_destroy(x);
			return -ST_E_CUDA;
		}
		*ret = x;
		return 0;
	}
	if ((e = cu.GetDevice(&dev)) != cudaSuccess ||
	    (e = cu.DeviceGetPCIBusId(x->bus_id, sizeof(x->bus_id), dev)) !=
		    cudaSuccess) {
		rc = cu_err(diag, e, "cudaDeviceGetPCIBusId");
		goto fail;
	}
	if ((e = cu.Malloc(&x->base, pool_bytes)) != cudaSuccess) {
		x->base = NULL;
		rc = cu_err(diag, e, "cudaMalloc of the device pool");
		goto fail;
	}
	if ((e = cu.Memset(x->base, 0, pool_bytes)) != cudaSuccess ||
	    (e = cu.IpcGetMemHandle(&x->mem, x->base)) != cudaSuccess) {
		rc = cu_err(diag, e, "cudaIpcGetMemHandle");
		goto fail;
	}
	for (i = 0; i < n_events; i++) {
		cudaIpcEventHandle_t h;

		e = cu.EventCreateWithFlags(&x->ev[i], cudaEventInterprocess |
						       cudaEventDisableTiming);
		if (e != cudaSuccess) {
			x->ev[i] = NULL;
			rc = cu_err(diag, e, "cudaEventCreateWithFlags");
			goto fail;
		}
		if ((e = cu.IpcGetEventHandle(&h, x->ev[i])) != cudaSuccess) {
			rc = cu_err(diag, e, "cudaIpcGetEventHandle");
			goto fail;
		}
		memcpy(x->ev_handles + (size_t)i * ST_DEVPOOL_HANDLE_BYTES, &h,
		       ST_DEVPOOL_HANDLE_BYTES);
	}
	if ((e = cu.DeviceSynchronize()) != cudaSuccess) {
		rc = cu_err(diag, e, "cudaDeviceSynchronize");
		goto fail;
	}
	*ret = x;
	return 0;
fail:
	st_cuda_export_destroy(x);
	return rc;
}

void *st_cuda_export_base(const struct st_cuda_export *x)
{
	return x->base;
}

int st_cuda_export_describe(const struct st_cuda_export *x,
			    struct st_devpool_export *e, struct st_diag *diag)
{
	(void)diag;
	memset(e->bus_id, 0, sizeof(e->bus_id));
	snprintf(e->bus_id, sizeof(e->bus_id), "%s", x->bus_id);
	e->pool_bytes = x->bytes;
	memcpy(e->mem_handle, &x->mem, ST_DEVPOOL_HANDLE_BYTES);
	e->n_events = x->n_events;
	e->events = x->ev_handles;
	return 0;
}

int st_cuda_export_wait(const struct st_cuda_export *x, uint32_t event,
			void *stream, struct st_diag *diag)
{
	cudaError_t e;

	if (event >= x->n_events)
		return st_diag_set(diag, -EINVAL, "event lane %u of %u", event,
				   x->n_events);
	if (cu.fake)
		return 0; /* fake copies are complete when published */
	e = cu.StreamWaitEvent((cudaStream_t)stream, x->ev[event], 0);
	return e == cudaSuccess ? 0 : cu_err(diag, e, "cudaStreamWaitEvent");
}

struct st_cuda_import {
	void *base;
	uint64_t bytes;
	uint32_t n_events;
	uint32_t handles;
	int32_t exporter_pid;                    /* fake device */
	char fake_name[ST_DEVPOOL_HANDLE_BYTES + 1];
	cudaEvent_t *ev;
	cudaStream_t stream;
};

int st_cuda_import_close(struct st_cuda_import *m, struct st_diag *diag)
{
	uint32_t i;
	int n = 0;

	if (!m)
		return 0;
	if (cu.fake) {
		n = m->base ? (int)m->handles : 0;
		if (m->base)
			munmap(m->base, m->bytes);
		/* the driver frees a dead exporter's memory with the last
		 * mapping; the fake's name would outlive it */
		if (m->base && !st_pid_alive(m->exporter_pid))
			shm_unlink(m->fake_name);
		free(m->ev);
		free(m);
		return n;
	}
	if (m->stream) {
		cudaError_t e = cu.StreamSynchronize(m->stream);

		if (e != cudaSuccess)
			cu_err(diag, e, "draining the copy stream");
		cu.StreamDestroy(m->stream);
	}
	if (m->ev)
		for (i = 0; i < m->n_events; i++)
			if (m->ev[i]) {
				cu.EventDestroy(m->ev[i]);
				n++;
			}
	if (m->base) {
		cu.IpcCloseMemHandle(m->base);
		n++;
	}
	free(m->ev);
	free(m);
	return n;
}

int st_cuda_import_open(struct st_cuda_import **ret,
			const struct st_devpool_export *e,
			struct st_diag *diag)
{
	struct st_cuda_import *m;
	cudaIpcMemHandle_t mh;
	cudaError_t ce;
	uint32_t i;
	int dev = 0, rc;

	*ret = NULL;
	if ((rc = cu_ready(diag)) < 0)
		return rc;
	m = calloc(1, sizeof(*m));
	if (m)
		m->ev = calloc(e->n_events, sizeof(*m->ev));
	if (!m || !m->ev) {
		st_cuda_import_close(m, NULL);
		return st_diag_set(diag, -ENOMEM, "device pool import: out "
				   "of memory");
	}
	m->n_events = e->n_events;
	m->bytes = e->pool_bytes;
	if (cu.fake) {
		char name[ST_DEVPOOL_HANDLE_BYTES + 1];

		memcpy(name, e->mem_handle, ST_DEVPOOL_HANDLE_BYTES);
		name[ST_DEVPOOL_HANDLE_BYTES] = 0;
		memcpy(m->fake_name, name, sizeof(name));
		m->exporter_pid = (int32_t)e->pid;
		m->base = fake_map(name, m->bytes, 0, diag);
		if (!m->base) {
			st_cuda_import_close(m, NULL);
			return -ST_E_CUDA;
		}
		m->handles = 1 + e->n_events;
		*ret = m;
		return 0;
	}
	if ((ce = cu.DeviceGetByPCIBusId(&dev, e->bus_id)) != cudaSuccess) {
		rc = st_diag_set(diag, -ST_E_CUDA,
				 "the exporter's device %s is not visible here "
				 "(CUDA_VISIBLE_DEVICES?): %s", e->bus_id,
				 cu.GetErrorString(ce));
		goto fail;
	}
	if ((ce = cu.SetDevice(dev)) != cudaSuccess) {
		rc = cu_err(diag, ce, "cudaSetDevice");
		goto fail;
	}
	memcpy(&mh, e->mem_handle, sizeof(mh));
	ce = cu.IpcOpenMemHandle(&m->base, mh,
				  cudaIpcMemLazyEnablePeerAccess);
	if (ce != cudaSuccess) {
		m->base = NULL;
		rc = cu_err(diag, ce, "cudaIpcOpenMemHandle (is CUDA IPC "
			    "allowed between these processes?)");
		goto fail;
	}
	m->handles++;
	for (i = 0; i < e->n_events; i++) {
		cudaIpcEventHandle_t eh;

		memcpy(&eh, e->events + (size_t)i * ST_DEVPOOL_HANDLE_BYTES,
		       sizeof(eh));
		if ((ce = cu.IpcOpenEventHandle(&m->ev[i], eh)) !=
		    cudaSuccess) {
			m->ev[i] = NULL;
			rc = cu_err(diag, ce, "cudaIpcOpenEventHandle");
			goto fail;
		}
		m->handles++;
	}
	if ((ce = cu.StreamCreateWithFlags(&m->stream,
					    cudaStreamNonBlocking)) !=
	    cudaSuccess) {
		m->stream = NULL;
		rc = cu_err(diag, ce, "cudaStreamCreateWithFlags");
		goto fail;
	}
	*ret = m;
	return 0;
fail:
	st_cuda_import_close(m, NULL);
	return rc;
}

void *st_cuda_import_base(const struct st_cuda_import *m)
{
	return m->base;
}

uint32_t st_cuda_import_handles(const struct st_cuda_import *m)
{
	return m ? m->handles : 0;
}

static int copy(struct st_cuda_import *m, void *dst, const void *src,
		uint64_t off, uint64_t bytes, uint32_t event,
		enum cudaMemcpyKind kind, struct st_diag *diag)
{
	cudaError_t e;

	if (event >= m->n_events || off > m->bytes || bytes > m->bytes - off)
		return st_diag_set(diag, -EINVAL,
				   "device pool copy of %llu bytes at %llu "
				   "(pool %llu bytes), event %u of %u",
				   (unsigned long long)bytes,
				   (unsigned long long)off,
				   (unsigned long long)m->bytes, event,
				   m->n_events);
	if (cu.fake) {
		memcpy(dst, src, bytes);
		return 0;
	}
	e = cu.MemcpyAsync(dst, src, bytes, kind, m->stream);
	if (e != cudaSuccess)
		return cu_err(diag, e, "cudaMemcpyAsync");
	e = cu.EventRecord(m->ev[event], m->stream);
	return e == cudaSuccess ? 0 : cu_err(diag, e, "cudaEventRecord");
}

int st_cuda_import_h2d(struct st_cuda_import *m, uint64_t dst_off,
		       const void *src, uint64_t bytes, uint32_t event,
		       struct st_diag *diag)
{
	return copy(m, (uint8_t *)m->base + dst_off, src, dst_off, bytes,
		    event, cudaMemcpyHostToDevice, diag);
}

int st_cuda_import_d2h(struct st_cuda_import *m, void *dst, uint64_t src_off,
		       uint64_t bytes, uint32_t event, struct st_diag *diag)
{
	return copy(m, dst, (const uint8_t *)m->base + src_off, src_off,
		    bytes, event, cudaMemcpyDeviceToHost, diag);
}

int st_cuda_import_idle(struct st_cuda_import *m, struct st_diag *diag)
{
	cudaError_t e;

	if (cu.fake)
		return 1;
	e = cu.StreamQuery(m->stream);

	if (e == cudaSuccess)
		return 1;
	if (e == cudaErrorNotReady)
		return 0;
	return cu_err(diag, e, "a device pool copy");
}

int st_cuda_import_drain(struct st_cuda_import *m, struct st_diag *diag)
{
	cudaError_t e;

	if (cu.fake)
		return 0;
	e = cu.StreamSynchronize(m->stream);

	return e == cudaSuccess ? 0 : cu_err(diag, e, "cudaStreamSynchronize");
}

int st_cuda_host_register(void *p, uint64_t bytes, struct st_diag *diag)
{
	cudaError_t e;

	if (cu_ready(diag) < 0)
		return cu_ready(diag);
	if (cu.fake) {
		/* STRATA_CUDA_FAKE_PIN_MS: how long pinning takes (tests of
		 * a slow registration of a large pool) */
		const char *ms = getenv("STRATA_CUDA_FAKE_PIN_MS");

		if (ms && atoi(ms) > 0)
			st_sleep_ns((uint64_t)atoi(ms) * 1000000ull);
		return 0;
	}
	e = cu.HostRegister(p, bytes, cudaHostRegisterPortable);

	return e == cudaSuccess ? 0 : cu_err(diag, e, "cudaHostRegister");
}

void st_cuda_host_unregister(void *p)
{
	if (p && cu.dl && !cu.fake)
		cu.HostUnregister(p);
}

int st_cuda_stream_create(void **ret, struct st_diag *diag)
{
	cudaStream_t s;
	cudaError_t e;

	*ret = NULL;
	if (cu_ready(diag) < 0)
		return cu_ready(diag);
	if (cu.fake) {
		*ret = (void *)&cu; /* a non-NULL token */
		return 0;
	}
	e = cu.StreamCreateWithFlags(&s, cudaStreamNonBlocking);

	if (e != cudaSuccess) {
		*ret = NULL;
		return cu_err(diag, e, "cudaStreamCreateWithFlags");
	}
	*ret = s;
	return 0;
}

void st_cuda_stream_destroy(void *stream)
{
	if (stream && cu.dl && !cu.fake)
		cu.StreamDestroy((cudaStream_t)stream);
}

int st_cuda_stream_sync(void *stream, struct st_diag *diag)
{
	cudaError_t e;

	if (cu_ready(diag) < 0)
		return cu_ready(diag);
	if (cu.fake)
		return 0;
	e = cu.StreamSynchronize((cudaStream_t)stream);

	return e == cudaSuccess ? 0 : cu_err(diag, e, "cudaStreamSynchronize");
}

int st_cuda_context_check(struct st_diag *diag)
{
	size_t fr = 0, tot = 0;
	cudaError_t e;

	if (cu_ready(diag) < 0)
		return cu_ready(diag);
	if (cu.fake)
		return 0;
	e = cu.MemGetInfo(&fr, &tot);
	return e == cudaSuccess ? 0 : cu_err(diag, e, "the CUDA context");
}

int st_cuda_stream_wait(void *stream, int timeout_ms, struct st_diag *diag)
{
	const uint64_t t0 = st_now_ns();
	uint64_t now;
	cudaError_t e;

	if (cu_ready(diag) < 0)
		return cu_ready(diag);
	if (cu.fake)
		return 0;
	for (;;) {
		e = cu.StreamQuery((cudaStream_t)stream);
		if (e != cudaErrorNotReady)
			break;
		now = st_now_ns();
		if (now - t0 >= (uint64_t)timeout_ms * 1000000ull)
			return st_diag_set(diag, -ST_E_TIMEOUT, "the device "
					   "stream did not finish within %d "
					   "ms (a copy event of a process "
					   "that died?)", timeout_ms);
		/* spin the first 20 ms (a decode layer's work), then
		 * poll every millisecond */
		if (now - t0 < 20000000ull)
			sched_yield();
		else
			st_sleep_ns(1000000);
	}
	return e == cudaSuccess ? 0 : cu_err(diag, e, "cudaStreamQuery");
}

int st_cuda_memcpy_async(void *dst, const void *src, uint64_t bytes,
			 void *stream, struct st_diag *diag)
{
	cudaError_t e;

	if (cu_ready(diag) < 0)
		return cu_ready(diag);
	if (cu.fake) {
		memcpy(dst, src, bytes);
		return 0;
	}
	e = cu.MemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
			   (cudaStream_t)stream);

	return e == cudaSuccess ? 0 : cu_err(diag, e, "cudaMemcpyAsync");
}

/*
 * test_cuda_experts.c — the layer-batched device expert path
 * (computed/device/cw_cuda_experts.c, loaded as computed loads it:
 * cw_cuda_module_open) on a GPU, with a mock device pool in place of
 * cw_devpool: expert records in one cudaMalloc, each slot with guard bytes
 * either side, uploaded on a second stream ("expertd") that records one
 * event per slot, which the mock pin makes the module's stream wait on.
 *
 * For layers of decode (GEMV path), prefill (grouped BF16 GEMM, >= 8
 * tokens an expert), a batch past the module's 1024 queued pairs (synced
 * early inside fn), and the production shapes H = 7168 / I = 2048 and
 * H = 4096 / I = 14336, every expert of the layer is given to fn (some not
 * "on the device": fn must refuse them and write nothing), then sync once;
 * checked:
 *   - every output equals the exact (double) FFN of the same dequantized
 *     weights within the bound below;
 *   - output rows carry guard floats either side, unchanged; the refused
 *     experts' rows still hold their sentinel;
 *   - the device pool (records and guards) is byte-identical afterwards
 *     (the module never writes a slot);
 *   - pins: every pin is released, and only once the module's stream was
 *     idle (cudaStreamQuery at unpin: "unpin after the stream passed the
 *     reads"); counts() says how many ran on the device and the CPU;
 *   - a failing expert (a dtype the GEMV refuses) makes sync fail, releases
 *     its pin, and later experts are left to the CPU.
 *
 * Tolerance, first order, per output row r (cw_cu.h's bounds), with
 * g, u the gate and up rows, Sg_j = sum_c |Wg_jc x_c| (Su likewise),
 * a_j = silu(g_j) u_j, S_r = sum_j |Wd_rj a_j|:
 *  - GEMV path (< 8 tokens an expert), against the exact FFN: with
 *    P_r = sum_j |Wd_rj| (e1 (|silu'(g_j) u_j| Sg_j + |silu(g_j)| Su_j) +
 *    2^-20 |a_j|), |y_r - exact| <= 2 (P_r + e2 S_r), e1 / e2 the GEMV
 *    bound (ceil(C / 128) + 64) 2^-24 of the gate-up / down product;
 *  - grouped GEMM (>= 8 tokens), against a reference that rounds x and a
 *    to BF16 exactly as the device does (MXFP4 and BF16 weights are exact
 *    in BF16): the device's float32 sums differ by (C + 64) 2^-24 S each,
 *    and where its a_j lies within that error (da_j) of a BF16 midpoint it
 *    may round to the other neighbour, one BF16 step away: |y_r - ref| <=
 *    2 (sum_{j near a midpoint} |Wd_rj| (step_j + da_j) + (I + 64) 2^-24
 *    S_r).
 * The factor 2 covers the second order terms.
 *
 * Without a CUDA device it prints "SKIP: no CUDA device: <reason>" and
 * exits 77.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_test_util.h"
#include "cw_backend.h"
#include "cw_cu.h"
#include "cw_cuda_experts.h"
#include "st_error.h"
#include "st_formats.h"

#define GUARD 256          /* guard bytes either side of a slot */
#define GUARD_BYTE 0xa5
#define ROW_GUARD 16       /* guard floats either side of an output row */
#define SENTINEL -12345.5f
#define MAX_E 64

static int failures;
static unsigned long long rng_state = 0x2545f4914f6cdd1dull;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;

	if (++failures > 20)
		return;
	va_start(ap, fmt);
	printf("FAIL: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
}

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ull;
}

static float frand(void) /* [-1, 1) */
{
	return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void *xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p) {
		printf("FAIL: out of memory\n");
		exit(1);
	}
	return p;
}

static void cu_check(cudaError_t e, const char *what)
{
	if (e != cudaSuccess) {
		printf("FAIL: %s: %s\n", what, cudaGetErrorString(e));
		exit(1);
	}
}

/* --- the mock device pool (struct cw_devpool for the module) --- */

struct mock {
	uint8_t *pool_d;        /* n slots of stride bytes */
	size_t stride;
	cudaStream_t copy;      /* the "expertd" upload stream */
	cudaEvent_t ev[MAX_E];
	int on_dev[MAX_E];
	int pins[MAX_E];
	int early_unpins, bad_unpins;
	cudaStream_t stream;    /* the module's, seen at pin */
};

static int mock_pin(struct cw_devpool *p, uint32_t layer, uint32_t expert,
		    void *stream, const void **ret_ptr, uint32_t *ret_slot)
{
	struct mock *m = (struct mock *)(void *)p;

	(void)layer;
	if (expert >= MAX_E || !m->on_dev[expert])
		return 0;
	cu_check(cudaStreamWaitEvent((cudaStream_t)stream, m->ev[expert], 0),
		 "cudaStreamWaitEvent");
	m->pins[expert]++;
	m->stream = (cudaStream_t)stream;
	*ret_ptr = m->pool_d + expert * m->stride + GUARD;
	*ret_slot = expert;
	return 1;
}

static void mock_unpin(struct cw_devpool *p, uint32_t slot)
{
	struct mock *m = (struct mock *)(void *)p;

	if (slot >= MAX_E || m->pins[slot] <= 0) {
		m->bad_unpins++;
		return;
	}
	if (m->stream && cudaStreamQuery(m->stream) != cudaSuccess)
		m->early_unpins++;
	m->pins[slot]--;
}

/* --- expert records --- */

struct expert {
	uint8_t *rec;              /* host record */
	size_t rec_bytes;
	struct cw_wview w[3];      /* gate [I, H], up [I, H], down [H, I] */
};

static size_t mat_bytes(enum st_dtype dt, int64_t R, int64_t C,
			size_t *ret_scales)
{
	*ret_scales = dt == ST_DTYPE_MXFP4 ? (size_t)(R * (C / 32)) : 0;
	return dt == ST_DTYPE_MXFP4 ? (size_t)(R * C / 2) :
	       dt == ST_DTYPE_BF16 ? (size_t)(R * C * 2) : (size_t)(R * C * 2);
}

static size_t up256(size_t n)
{
	return (n + 255) / 256 * 256;
}

/* A random expert of dtype dt (MXFP4, BF16, or F16 which the device path
 * refuses). */
static void expert_make(struct expert *x, enum st_dtype dt, int H, int I)
{
	const int64_t rows[3] = { I, I, H }, cols[3] = { H, H, I };
	size_t off = 0, db[3], sb[3];

	for (int k = 0; k < 3; k++) {
		db[k] = mat_bytes(dt, rows[k], cols[k], &sb[k]);
		off += up256(db[k]) + up256(sb[k]);
	}
	x->rec_bytes = off;
	x->rec = xmalloc(off);
	off = 0;
	for (int k = 0; k < 3; k++) {
		struct cw_wview *w = &x->w[k];
		uint8_t *d = x->rec + off, *s = d + up256(db[k]);

		memset(w, 0, sizeof(*w));
		w->dtype = dt;
		w->rows = rows[k];
		w->cols = cols[k];
		w->data = d;
		w->scales = sb[k] ? s : NULL;
		w->global_scale = 1.0f;
		if (dt == ST_DTYPE_MXFP4) {
			w->group = 32;
			for (size_t i = 0; i < db[k]; i++)
				d[i] = (uint8_t)rnd();
			/* 2^-9 .. 2^-4: outputs of order one */
			for (size_t i = 0; i < sb[k]; i++)
				s[i] = (uint8_t)(118 + rnd() % 6);
		} else {
			uint16_t *h = (uint16_t *)(void *)d;

			for (size_t i = 0; i < db[k] / 2; i++)
				h[i] = st_f32_to_bf16(frand() / 16.0f);
		}
		off += up256(db[k]) + up256(sb[k]);
	}
}

static void dq_row(const struct cw_wview *w, int64_t r, float *out)
{
	const int64_t C = w->cols;

	if (w->dtype == ST_DTYPE_MXFP4)
		st_mxfp4_dequantize_row((const uint8_t *)w->data + r * C / 2,
					w->scales + r * (C / 32), C,
					ST_FP4_LAYOUT_OCP, out);
	else
		for (int64_t c = 0; c < C; c++)
			out[c] = st_bf16_to_f32(
				((const uint16_t *)w->data)[r * C + c]);
}

static double silu(double z)
{
	return z / (1.0 + exp(-z));
}

static double dsilu(double z)
{
	const double s = 1.0 / (1.0 + exp(-z));

	return s * (1.0 + z * (1.0 - s));
}

static double gemv_eps(int64_t C)
{
	return ((double)((C + 127) / 128) + 64.0) * 0x1p-24;
}

static float bf16_round(float f)
{
	return st_bf16_to_f32(st_f32_to_bf16(f));
}

/*
 * For a (double): its round-to-nearest-even BF16 value (through float, as
 * the device rounds its float a), the larger spacing of the BF16 values
 * around it and its distance to the nearest rounding midpoint (the one
 * between the two BF16 values around it, or the one below the lower).
 */
static double bf16_near(double a, double *ret_step, double *ret_dist)
{
	const float af = (float)a;
	uint32_t u, v;
	float lo, hi, below;
	double d1, d2 = INFINITY;

	memcpy(&u, &af, 4);
	u &= 0xffff0000u;                 /* toward zero */
	memcpy(&lo, &u, 4);
	v = u + 0x10000u;                 /* next away from zero */
	memcpy(&hi, &v, 4);
	d1 = fabs(fabs(a) - ((double)fabsf(lo) + fabsf(hi)) / 2);
	*ret_step = fabs((double)hi - lo);
	if (u & 0x7fff0000u) {            /* lo != 0: the one below it */
		v = u - 0x10000u;
		memcpy(&below, &v, 4);
		d2 = fabs(fabs(a) - ((double)fabsf(lo) + fabsf(below)) / 2);
		if (fabs((double)lo - below) > *ret_step)
			*ret_step = fabs((double)lo - below);
	}
	*ret_dist = d1 < d2 ? d1 : d2;
	return bf16_round(af);
}

/*
 * Checks out[t] (H floats) against the FFN of expert x for tokens xs[t],
 * t < n, as the device computes it (header comment):
 *  - GEMV path (n < 8): the exact FFN, bound 2 (e1 P + (e2 + 2^-20) S);
 *  - grouped GEMM (n >= 8): x rounded to BF16 exactly as the device does
 *    (round to nearest even), g and u exact from it, a = silu(g) u rounded
 *    to BF16, y exact from that; the device differs by its float32 sums,
 *    (C + 64) 2^-24 S each, and where its a may round to the other BF16
 *    neighbour (a within its error of a midpoint) by one BF16 step of a:
 *    bound 2 (sum_j |Wd_rj| (flip_j ? step_j + da_j : 0) + (I + 64)
 *    2^-24 S_r) with da_j the first-order error of a_j.
 */
static void check_expert(const char *name, int e, const struct expert *x,
			 int n, const float *const *xs, float *const *out)
{
	const int64_t I = x->w[0].rows, H = x->w[0].cols;
	const int gemm = n >= 8;
	const double e1 = gemv_eps(H), e2 = gemv_eps(I);
	double *g = xmalloc(sizeof(double) * n * I * 4);
	double *u = g + n * I, *sg = u + n * I, *su = sg + n * I;
	float *row = xmalloc(sizeof(float) * (H > I ? H : I));
	float *xb = xmalloc(sizeof(float) * n * H);
	int bad = 0, flips = 0;

	for (int t = 0; t < n; t++)
		for (int64_t c = 0; c < H; c++)
			xb[t * H + c] = gemm ? bf16_round(xs[t][c]) : xs[t][c];
	for (int64_t j = 0; j < I; j++)
		for (int k = 0; k < 2; k++) {
			dq_row(&x->w[k], j, row);
			for (int t = 0; t < n; t++) {
				double s = 0, a = 0;

				for (int64_t c = 0; c < H; c++) {
					const double p = (double)row[c] *
							 xb[t * H + c];

					s += p;
					a += fabs(p);
				}
				(k ? u : g)[t * I + j] = s;
				(k ? su : sg)[t * I + j] = a;
			}
		}
	for (int64_t r = 0; r < H; r++) {
		dq_row(&x->w[2], r, row);
		for (int t = 0; t < n; t++) {
			double y = 0, S = 0, P = 0, tol;

			for (int64_t j = 0; j < I; j++) {
				const double gj = g[t * I + j], uj = u[t * I + j];
				const double wd = row[j];
				double a = silu(gj) * uj;

				if (gemm) {
					/* the device's a: tensor-core float
					 * sums of (H + 64) 2^-22 S (cw_cu.h),
					 * swiglu 2^-20 */
					const double eg = ((double)H + 64) *
							  0x1p-22;
					const double da = eg *
						(fabs(dsilu(gj) * uj) *
						 sg[t * I + j] + fabs(silu(gj)) *
						 su[t * I + j]) +
						0x1p-20 * fabs(a) + 0x1p-100;
					double step, dist;

					a = bf16_near(a, &step, &dist);
					if (dist <= da) {
						P += fabs(wd) * (step + da);
						flips += r == 0;
					}
				} else {
					P += fabs(wd) * (e1 * (fabs(dsilu(gj) *
						uj) * sg[t * I + j] +
						fabs(silu(gj)) * su[t * I + j]) +
						0x1p-20 * fabs(a));
				}
				y += wd * a;
				S += fabs(wd * a);
			}
			tol = 2.0 * (P + (gemm ? ((double)I + 64) * 0x1p-22 :
					      e2) * S) + 0x1p-100;
			if (!(fabs(out[t][r] - y) <= tol) && bad++ < 3)
				fail("%s: expert %d token %d row %lld: %.9g, "
				     "%s %.9g, bound %.3g", name, e, t,
				     (long long)r, out[t][r],
				     gemm ? "BF16 reference" : "exact", y, tol);
		}
	}
	(void)flips;
	free(g);
	free(row);
	free(xb);
}

/* --- one layer --- */

struct layer_case {
	const char *name;
	enum st_dtype dt;
	int H, I, E, n_tok, K, n_off;  /* n_off experts not on the device */
};

static void run_layer(const struct cw_cuda_module_ops *ops,
		      const struct layer_case *lc)
{
	const int H = lc->H, E = lc->E, n = lc->n_tok, K = lc->K;
	const size_t rowf = (size_t)H + 2 * ROW_GUARD;
	struct expert *ex = xmalloc(sizeof(*ex) * E);
	struct mock m;
	struct cw_cuda_pool_ops pool = { mock_pin, mock_unpin };
	struct cw_cuda_experts *c = NULL;
	struct st_diag d = { "" };
	float *xs = xmalloc(sizeof(float) * n * H);
	float *outb = xmalloc(sizeof(float) * n * K * rowf);
	int *route = xmalloc(sizeof(int) * n * K);
	uint8_t *pool_h, *pool_back;
	size_t pool_bytes;
	uint64_t nd = 0, nc = 0, want_dev = 0, want_cpu = 0;
	int r;

	memset(&m, 0, sizeof(m));
	for (int e = 0; e < E; e++) {
		expert_make(&ex[e], lc->dt, H, lc->I);
		m.on_dev[e] = e >= lc->n_off;
	}
	m.stride = up256(ex[0].rec_bytes) + 2 * GUARD;
	pool_bytes = m.stride * E;
	pool_h = xmalloc(pool_bytes);
	pool_back = xmalloc(pool_bytes);
	memset(pool_h, GUARD_BYTE, pool_bytes);
	for (int e = 0; e < E; e++)
		memcpy(pool_h + e * m.stride + GUARD, ex[e].rec,
		       ex[e].rec_bytes);
	cu_check(cudaMalloc((void **)&m.pool_d, pool_bytes), "cudaMalloc pool");
	cu_check(cudaStreamCreateWithFlags(&m.copy, cudaStreamNonBlocking),
		 "cudaStreamCreate");
	/* the uploads, one event per slot, not waited for here */
	for (int e = 0; e < E; e++) {
		cu_check(cudaEventCreateWithFlags(&m.ev[e],
						  cudaEventDisableTiming),
			 "cudaEventCreate");
		cu_check(cudaMemcpyAsync(m.pool_d + e * m.stride,
					 pool_h + e * m.stride, m.stride,
					 cudaMemcpyHostToDevice, m.copy),
			 "upload");
		cu_check(cudaEventRecord(m.ev[e], m.copy), "cudaEventRecord");
	}
	for (size_t i = 0; i < (size_t)n * H; i++)
		xs[i] = frand();
	for (size_t i = 0; i < (size_t)n * K * rowf; i++)
		outb[i] = SENTINEL;
	/* routing: K distinct experts a token, in random order */
	for (int t = 0; t < n; t++)
		for (int k = 0; k < K; k++) {
			int e, dup;

			do {
				e = (int)(rnd() % (uint64_t)E);
				dup = 0;
				for (int q = 0; q < k; q++)
					dup |= route[t * K + q] == e;
			} while (dup);
			route[t * K + k] = e;
		}
	r = ops->create(&c, (struct cw_devpool *)(void *)&m, &pool, H, lc->I,
			&d);
	if (r < 0) {
		printf("FAIL: %s: create: %s\n", lc->name, d.msg);
		exit(1);
	}
	/* the layer: every routed expert to fn, in expert order like
	 * cw_model's moe_layer, then one sync */
	for (int e = 0; e < E; e++) {
		const float *xp[1024];
		float *op[1024];
		int cnt = 0, got;

		for (int p = 0; p < n * K; p++)
			if (route[p] == e) {
				xp[cnt] = xs + (size_t)(p / K) * H;
				op[cnt++] = outb + (size_t)p * rowf + ROW_GUARD;
			}
		if (!cnt)
			continue;
		got = ops->fn(c, 0, e, ex[e].rec, ex[e].w, cnt, xp, op);
		if (got != m.on_dev[e])
			fail("%s: expert %d: fn returned %d, on the device %d",
			     lc->name, e, got, m.on_dev[e]);
		want_dev += got == 1;
		want_cpu += got == 0;
	}
	/* the model's "group complete" call (cw_model.h) in half of the
	 * cases; in the others sync starts the queued work itself */
	if (lc->n_off % 2 == 0 &&
	    ops->fn(c, 0, -1, NULL, NULL, 0, NULL, NULL) != 0)
		fail("%s: fn(expert -1) did not return 0", lc->name);
	r = ops->sync(c);
	if (r < 0)
		fail("%s: sync: %s", lc->name, st_strerror(r));
	ops->counts(c, &nd, &nc);
	if (nd != want_dev || nc != want_cpu)
		fail("%s: counts device %llu cpu %llu, want %llu %llu",
		     lc->name, (unsigned long long)nd, (unsigned long long)nc,
		     (unsigned long long)want_dev,
		     (unsigned long long)want_cpu);
	for (int e = 0; e < E; e++)
		if (m.pins[e])
			fail("%s: slot %d still pinned %d times", lc->name, e,
			     m.pins[e]);
	if (m.early_unpins || m.bad_unpins)
		fail("%s: %d unpins before the stream was idle, %d of "
		     "unpinned slots", lc->name, m.early_unpins, m.bad_unpins);
	/* outputs, guards, sentinels */
	for (int e = 0; e < E; e++) {
		const float *xp[1024];
		float *op[1024];
		int cnt = 0;

		for (int p = 0; p < n * K; p++) {
			float *row = outb + (size_t)p * rowf;

			if (route[p] != e)
				continue;
			for (int i = 0; i < ROW_GUARD; i++)
				if (row[i] != SENTINEL ||
				    row[ROW_GUARD + H + i] != SENTINEL) {
					fail("%s: guard of pair %d overwritten",
					     lc->name, p);
					break;
				}
			if (!m.on_dev[e]) {
				for (int i = 0; i < H; i++)
					if (row[ROW_GUARD + i] != SENTINEL) {
						fail("%s: refused expert %d "
						     "wrote its output", lc->name,
						     e);
						break;
					}
				continue;
			}
			xp[cnt] = xs + (size_t)(p / K) * H;
			op[cnt++] = row + ROW_GUARD;
		}
		if (cnt)
			check_expert(lc->name, e, &ex[e], cnt, xp, op);
	}
	cu_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	cu_check(cudaMemcpy(pool_back, m.pool_d, pool_bytes,
			    cudaMemcpyDeviceToHost), "pool readback");
	if (memcmp(pool_back, pool_h, pool_bytes) != 0)
		fail("%s: the device pool changed (a slot or its guard was "
		     "written)", lc->name);
	ops->destroy(c);
	for (int e = 0; e < E; e++) {
		cudaEventDestroy(m.ev[e]);
		free(ex[e].rec);
	}
	cudaStreamDestroy(m.copy);
	cudaFree(m.pool_d);
	printf("%s: H %d, I %d, %d tokens x top-%d of %d experts (%d off the "
	       "device): %llu on the device, %llu refused, %s\n", lc->name, H,
	       lc->I, n, K, E, lc->n_off, (unsigned long long)nd,
	       (unsigned long long)nc, failures ? "FAILURES so far" : "ok");
	free(ex); free(xs); free(outb); free(route); free(pool_h);
	free(pool_back);
}

/* A failing expert: sync reports it, its pin is released, and the module
 * refuses every expert afterwards. */
static void run_failure(const struct cw_cuda_module_ops *ops)
{
	const int H = 64, I = 128;
	struct expert x;
	struct mock m;
	struct cw_cuda_pool_ops pool = { mock_pin, mock_unpin };
	struct cw_cuda_experts *c = NULL;
	struct st_diag d = { "" };
	float xs[64] = { 0 }, ys[64];
	const float *xp[1] = { xs };
	float *op[1] = { ys };
	uint64_t nd, nc;
	int r;

	memset(&m, 0, sizeof(m));
	expert_make(&x, ST_DTYPE_BF16, H, I);
	for (int k = 0; k < 3; k++)
		x.w[k].dtype = ST_DTYPE_F16; /* refused by cw_cu_matvec */
	m.stride = up256(x.rec_bytes) + 2 * GUARD;
	cu_check(cudaMalloc((void **)&m.pool_d, m.stride), "cudaMalloc");
	cu_check(cudaMemcpy(m.pool_d + GUARD, x.rec, x.rec_bytes,
			    cudaMemcpyHostToDevice), "h2d");
	cu_check(cudaEventCreateWithFlags(&m.ev[0], cudaEventDisableTiming),
		 "cudaEventCreate");
	cu_check(cudaEventRecord(m.ev[0], 0), "cudaEventRecord");
	m.on_dev[0] = 1;
	r = ops->create(&c, (struct cw_devpool *)(void *)&m, &pool, H, I, &d);
	if (r < 0) {
		printf("FAIL: failure case: create: %s\n", d.msg);
		exit(1);
	}
	if (ops->fn(c, 0, 0, x.rec, x.w, 1, xp, op) != 1)
		fail("failure case: fn did not take the expert");
	if (ops->sync(c) >= 0)
		fail("failure case: sync did not report the failed expert");
	if (m.pins[0] != 0)
		fail("failure case: the failed expert's slot stays pinned");
	x.w[0].dtype = x.w[1].dtype = x.w[2].dtype = ST_DTYPE_BF16;
	if (ops->fn(c, 0, 0, x.rec, x.w, 1, xp, op) != 0)
		fail("failure case: the module took an expert after a failure");
	ops->counts(c, &nd, &nc);
	if (nd != 0 || nc != 2)
		fail("failure case: counts device %llu cpu %llu, want 0 2",
		     (unsigned long long)nd, (unsigned long long)nc);
	ops->destroy(c);
	cudaEventDestroy(m.ev[0]);
	cudaFree(m.pool_d);
	free(x.rec);
	printf("failure: sync reports it, the pin is released, later experts "
	       "go to the CPU\n");
}

int main(void)
{
	static const struct layer_case cases[] = {
		/* decode: 1-2 tokens an expert, GEMVs */
		{ "decode", ST_DTYPE_MXFP4, 256, 512, 16, 4, 4, 3 },
		/* prefill: ~16 tokens an expert, the grouped GEMM */
		{ "prefill", ST_DTYPE_BF16, 256, 512, 8, 64, 2, 2 },
		{ "prefill-mxfp4", ST_DTYPE_MXFP4, 256, 512, 8, 64, 2, 1 },
		/* 400 pairs, GEMV and GEMM experts mixed: the batched
		 * GEMVs in chunks of at most 256 pairs */
		{ "decode-chunks", ST_DTYPE_MXFP4, 256, 512, 64, 100, 4, 6 },
		/* 1600 pairs: an early sync inside fn */
		{ "overflow", ST_DTYPE_MXFP4, 128, 256, 16, 200, 8, 2 },
		/* production shapes */
		{ "dsv3-decode", ST_DTYPE_MXFP4, 7168, 2048, 16, 2, 8, 2 },
		{ "h4096-i14336-prefill", ST_DTYPE_MXFP4, 4096, 14336, 1, 8, 1,
		  0 },
	};
	struct cw_cuda_module_handle h;
	int rc;

	if ((rc = cudat_module_open(&h)) != 0)
		return rc;
	if (!h.ops->sync) {
		printf("FAIL: the module has no sync\n");
		return 1;
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_layer(h.ops, &cases[i]);
	run_failure(h.ops);
	cw_cuda_module_close(&h);
	if (failures)
		printf("%d failures\n", failures);
	return failures ? 1 : 0;
}

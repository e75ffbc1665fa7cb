/*
 * cw_cu_gemv.cu — dequant-GEMV for decode (cw_cu.h), one kernel for a
 * single matrix (cw_cu_matvec) and for a batch of same-shaped matrices in
 * one launch (cw_cu_matvec_batch: a layer's experts and tokens).
 *
 * Layout of the work (issue 27):
 *   - a block of GEMV_WARPS warps owns GEMV_ROWS_PER_BLOCK consecutive rows
 *     of one job (blockIdx.y); each warp owns GEMV_WARP_ROWS rows and reads
 *     them side by side, so every x value it takes from shared memory
 *     serves GEMV_WARP_ROWS rows;
 *   - x is staged once per block into shared memory, in tiles of
 *     GEMV_TILE floats, in a swizzled order: lane l's 16-byte step of
 *     weights (32 FP4, 16 FP8, 8 BF16 or 4 F32 elements) finds its x as
 *     float4 number k * 32 + l of the step, so the 8 lanes of each
 *     shared-memory wavefront read 128 contiguous bytes (no bank conflict);
 *   - codes are decoded in registers: an E2M1 nibble placed as the bits
 *     of a float32 (sign to bit 31, its 3 magnitude bits to bits 22..24)
 *     is its value times 2^-126 exactly (code 1 lands on the subnormal
 *     2^-127 = 0.5 * 2^-126), an E4M3 byte placed the same way (bits
 *     20..26) its value times 2^-120, so one multiply by a power of two
 *     gives the exact value without a table;
 *   - the group size is a template constant for MXFP4 (32), NVFP4 (16)
 *     and FP8 groups of 128, so a scale index is a shift; E2M1_F16 and
 *     other FP8 groups take one division per 16 elements.
 * Every weight is still the exact float of st_formats' *_dequantize_row
 * (the code value times its scale, rounded once as on the CPU), then one
 * fused multiply-add with x into one of 4 float32 accumulators per row
 * (one per 4-byte word of the 16-byte step); the 4 are added in a fixed
 * order, then the warp's 32 lanes by shuffle.  So each accumulator sums
 * at most ceil(cols / 128) products in order (cw_cu.h's bound).
 *
 * Unaligned or oddly sized matrices take a per-element path (x from
 * global memory, the same 4-accumulator order per lane).
 *
 * Reviewed and compiled; not yet run on a GPU (the cuda suite checks it
 * against the CPU reference there).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cw_cu_int.h"

#define GEMV_WARPS 8
#define GEMV_THREADS (GEMV_WARPS * 32)
#define GEMV_WARP_ROWS 2
#define GEMV_ROWS_PER_BLOCK (GEMV_WARPS * GEMV_WARP_ROWS)
/* floats of x per shared-memory tile (32 KiB; a multiple of every step
 * of 32 lanes x 32 elements) */
#define GEMV_TILE 8192

/* The formats the kernels are instantiated for. */
enum { F_MXFP4, F_NVFP4, F_E2M1F16, F_FP8, F_BF16, F_F32 };

/* What a launch shares: the shape and format of every job's matrix. */
struct gemv_args {
	const struct cw_cu_gemv_job *jobs; /* device array, or NULL: one */
	struct cw_cu_gemv_job one;
	int64_t rows, cols;
	int64_t row_bytes;     /* bytes of data per row */
	int64_t ngroups;       /* scales per row */
	int group;             /* elements per scale (run-time copy) */
};

/* Elements of one lane's 16-byte step. */
template <int F>
__host__ __device__ constexpr int per_lane()
{
	return (F == F_MXFP4 || F == F_NVFP4 || F == F_E2M1F16) ? 32 :
	       F == F_FP8 ? 16 : F == F_BF16 ? 8 : 4;
}

/* Index of the group holding column c: a shift when G is a compile-time
 * power of two, else a division by the run-time group. */
template <int G>
__device__ __forceinline__ int64_t group_of(const gemv_args &a, int64_t c)
{
	return G ? c / G : c / a.group;
}

/* Scale of group i of row r, as the float the CPU multiplies by. */
template <int F>
__device__ __forceinline__ float scale_load(const gemv_args &a,
					    const cw_cu_gemv_job &j,
					    int64_t r, int64_t i)
{
	const int64_t k = r * a.ngroups + i;

	if (F == F_MXFP4)
		return cw_cu_e8m0(j.scales[k]);
	if (F == F_NVFP4)
		return cw_cu_e4m3(j.scales[k]);
	if (F == F_E2M1F16)
		return __half2float(__ushort_as_half(
			((const unsigned short *)j.scales)[k]));
	/* F_FP8 */
	return j.scales ? ((const float *)j.scales)[k] : 1.0f;
}

/* E2M1 nibble (low 4 bits of t) as its value times 2^-126, exactly. */
__device__ __forceinline__ float e2m1_raw(unsigned t)
{
	return __uint_as_float(((t & 8u) << 28) | ((t & 7u) << 22));
}

/* 16 FP4 elements of one row (two 4-byte words of codes, low nibble
 * first) times 16 x values (4 float4 of the swizzled tile), into acc[0]
 * (word 0) and acc[1] (word 1).  Weight = (v * s) [* gscale], the CPU's
 * float: v * s is exact (v has 2 significant bits and s is a power of two
 * or has at most 11), so computing it as raw * (2^126 * s) when that
 * constant is finite and normal (MXFP4 scale bytes <= 128, the fast
 * case) gives the same bits as raw * 2^126 * s. */
template <int F>
__device__ __forceinline__ void fp4_half(unsigned w0, unsigned w1, float s,
					 unsigned sbyte, float gscale,
					 const float4 *xv, float acc[2])
{
	const unsigned w[2] = { w0, w1 };

	if (F == F_MXFP4 && sbyte <= 128u) {
		const float m = s * 0x1p126f; /* 2^(sbyte - 1), exact */

#pragma unroll
		for (int k = 0; k < 2; k++) {
			const float4 xa = xv[2 * k], xb = xv[2 * k + 1];
			const unsigned b = w[k];

			acc[k] = fmaf(e2m1_raw(b) * m, xa.x, acc[k]);
			acc[k] = fmaf(e2m1_raw(b >> 4) * m, xa.y, acc[k]);
			acc[k] = fmaf(e2m1_raw(b >> 8) * m, xa.z, acc[k]);
			acc[k] = fmaf(e2m1_raw(b >> 12) * m, xa.w, acc[k]);
			acc[k] = fmaf(e2m1_raw(b >> 16) * m, xb.x, acc[k]);
			acc[k] = fmaf(e2m1_raw(b >> 20) * m, xb.y, acc[k]);
			acc[k] = fmaf(e2m1_raw(b >> 24) * m, xb.z, acc[k]);
			acc[k] = fmaf(e2m1_raw(b >> 28) * m, xb.w, acc[k]);
		}
		return;
	}
#pragma unroll
	for (int k = 0; k < 2; k++) {
		const float4 xa = xv[2 * k], xb = xv[2 * k + 1];
		const unsigned b = w[k];
		float v[8];

#pragma unroll
		for (int n = 0; n < 8; n++) {
			v[n] = (e2m1_raw(b >> (4 * n)) * 0x1p126f) * s;
			if (F == F_NVFP4)
				v[n] *= gscale;
		}
		acc[k] = fmaf(v[0], xa.x, acc[k]);
		acc[k] = fmaf(v[1], xa.y, acc[k]);
		acc[k] = fmaf(v[2], xa.z, acc[k]);
		acc[k] = fmaf(v[3], xa.w, acc[k]);
		acc[k] = fmaf(v[4], xb.x, acc[k]);
		acc[k] = fmaf(v[5], xb.y, acc[k]);
		acc[k] = fmaf(v[6], xb.z, acc[k]);
		acc[k] = fmaf(v[7], xb.w, acc[k]);
	}
}

/* FP8 E4M3 byte as the CPU's e4m3 * s: the byte's bits placed in a float
 * (value * 2^-120, exact; subnormal codes land on float subnormals) times
 * m = s * 2^120 when that is finite (|s| < 2^8: the product v * s is then
 * the same single rounding), else times 2^120 then s; S.1111.111 is NaN. */
__device__ __forceinline__ float e4m3_times(unsigned b, float m, float s,
					    bool fast)
{
	const float raw = __uint_as_float(((b & 0x80u) << 24) |
					  ((b & 0x7fu) << 20));
	const float v = fast ? raw * m : (raw * 0x1p120f) * s;

	return (b & 0x7fu) == 0x7fu ? __uint_as_float(0x7fc00000u) : v;
}

/* One lane's 16-byte step of row r at column c (tile-local x at xv, the
 * lane's swizzled float4s: xv[k * 32]). */
template <int F, int G>
__device__ __forceinline__ void step_row(const gemv_args &a,
					 const cw_cu_gemv_job &j, int64_t r,
					 int64_t c, const uint4 q,
					 const float4 *xs4, int lane,
					 float acc[4])
{
	const unsigned w[4] = { q.x, q.y, q.z, q.w };

	if (F == F_MXFP4 || F == F_NVFP4 || F == F_E2M1F16) {
		float4 xv[8];

#pragma unroll
		for (int k = 0; k < 8; k++)
			xv[k] = xs4[k * 32 + lane];
		/* elements [c, c+16) share a scale, and [c+16, c+32) */
		const int64_t i0 = group_of<G>(a, c), i1 = group_of<G>(a, c + 16);
		const float s0 = scale_load<F>(a, j, r, i0);
		const float s1 = i1 == i0 ? s0 : scale_load<F>(a, j, r, i1);
		const unsigned b0 = F == F_MXFP4 ? j.scales[r * a.ngroups + i0] : 0u;
		const unsigned b1 = F == F_MXFP4 ? j.scales[r * a.ngroups + i1] : 0u;

		fp4_half<F>(w[0], w[1], s0, b0, j.gscale, xv, acc);
		fp4_half<F>(w[2], w[3], s1, b1, j.gscale, xv + 4, acc + 2);
	} else if (F == F_FP8) {
		const float s = scale_load<F>(a, j, r, group_of<G>(a, c));
		const bool fast = fabsf(s) < 0x1p8f || s != s;
		const float m = s * 0x1p120f;

#pragma unroll
		for (int k = 0; k < 4; k++) {
			const float4 xv = xs4[k * 32 + lane];

			acc[k] = fmaf(e4m3_times(w[k] & 255u, m, s, fast), xv.x, acc[k]);
			acc[k] = fmaf(e4m3_times((w[k] >> 8) & 255u, m, s, fast), xv.y, acc[k]);
			acc[k] = fmaf(e4m3_times((w[k] >> 16) & 255u, m, s, fast), xv.z, acc[k]);
			acc[k] = fmaf(e4m3_times(w[k] >> 24, m, s, fast), xv.w, acc[k]);
		}
	} else if (F == F_BF16) {
#pragma unroll
		for (int k = 0; k < 2; k++) {
			const float4 xv = xs4[k * 32 + lane];

			acc[2 * k] = fmaf(__uint_as_float(w[2 * k] << 16), xv.x, acc[2 * k]);
			acc[2 * k] = fmaf(__uint_as_float(w[2 * k] & 0xffff0000u), xv.y, acc[2 * k]);
			acc[2 * k + 1] = fmaf(__uint_as_float(w[2 * k + 1] << 16), xv.z, acc[2 * k + 1]);
			acc[2 * k + 1] = fmaf(__uint_as_float(w[2 * k + 1] & 0xffff0000u), xv.w, acc[2 * k + 1]);
		}
	} else {
		const float4 xv = xs4[lane];

		acc[0] = fmaf(__uint_as_float(w[0]), xv.x, acc[0]);
		acc[1] = fmaf(__uint_as_float(w[1]), xv.y, acc[1]);
		acc[2] = fmaf(__uint_as_float(w[2]), xv.z, acc[2]);
		acc[3] = fmaf(__uint_as_float(w[3]), xv.w, acc[3]);
	}
}

/* One element of any format (the per-element path). */
template <int F, int G>
__device__ __forceinline__ float elem(const gemv_args &a,
				      const cw_cu_gemv_job &j, int64_t r,
				      int64_t c)
{
	const uint8_t *row = j.data + r * a.row_bytes;

	if (F == F_MXFP4 || F == F_NVFP4 || F == F_E2M1F16) {
		const unsigned b = row[c / 2];
		const float v = cw_cu_e2m1_const((c & 1) ? b >> 4 : b & 15);
		const float s = scale_load<F>(a, j, r, group_of<G>(a, c));

		return F == F_NVFP4 ? (v * s) * j.gscale : v * s;
	}
	if (F == F_FP8)
		return cw_cu_e4m3(row[c]) *
		       scale_load<F>(a, j, r, group_of<G>(a, c));
	if (F == F_BF16)
		return __uint_as_float((unsigned)((const unsigned short *)row)[c]
				       << 16);
	return ((const float *)row)[c];
}

/* Position of tile-local element i in the swizzled tile of format F:
 * float4 number (step, k, lane) -> step * 8P + k * 32 + lane. */
template <int F>
__device__ __forceinline__ int swizzle(int i)
{
	const int P = per_lane<F>(), step = i / (32 * P), w = i % (32 * P);
	const int lane = w / P, j = w % P;

	return (step * 8 * P + (j / 4) * 32 + lane) * 4 + (j & 3);
}

/*
 * rows [blockIdx.x * GEMV_ROWS_PER_BLOCK, +GEMV_ROWS_PER_BLOCK) of job
 * blockIdx.y; VEC: the 16-byte path (alignment and sizes checked by the
 * host), else per element.
 */
template <int F, int G, int VEC>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(gemv_args a)
{
	__shared__ __align__(16) float xs[GEMV_TILE];
	const cw_cu_gemv_job j = a.jobs ? a.jobs[blockIdx.y] : a.one;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int64_t r0 = (int64_t)blockIdx.x * GEMV_ROWS_PER_BLOCK +
			   warp * GEMV_WARP_ROWS;
	constexpr int P = per_lane<F>();
	float acc[GEMV_WARP_ROWS][4];

	/* uniform over the block: no barrier below is skipped by a part */
	if ((int64_t)blockIdx.x * GEMV_ROWS_PER_BLOCK >= a.rows)
		return;
#pragma unroll
	for (int k = 0; k < GEMV_WARP_ROWS; k++)
		acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = 0.0f;
	for (int64_t t0 = 0; t0 < a.cols; t0 += GEMV_TILE) {
		const int n = (int)min((int64_t)GEMV_TILE, a.cols - t0);

		__syncthreads(); /* the previous tile is consumed */
		if (VEC) {
			/* n % 4 == 0 and x 16-byte aligned (host checks) */
			const float4 *x4 = (const float4 *)(j.x + t0);

			for (int i = threadIdx.x; i < n / 4; i += GEMV_THREADS)
				*(float4 *)&xs[swizzle<F>(4 * i)] = x4[i];
		} else {
			for (int i = threadIdx.x; i < n; i += GEMV_THREADS)
				xs[i] = j.x[t0 + i];
		}
		__syncthreads();
		if (VEC) {
			for (int cb = 0; cb < n; cb += 32 * P) {
				const int64_t c = t0 + cb + lane * P;
				const float4 *xs4 = (const float4 *)xs + cb / 4;
				uint4 q[GEMV_WARP_ROWS];

				if (cb + lane * P >= n)
					break; /* cols % P == 0: whole steps */
				/* every row's 16 bytes in flight first */
#pragma unroll
				for (int k = 0; k < GEMV_WARP_ROWS; k++)
					if (r0 + k < a.rows)
						q[k] = *(const uint4 *)(j.data +
							(r0 + k) * a.row_bytes +
							c * 16 / P);
#pragma unroll
				for (int k = 0; k < GEMV_WARP_ROWS; k++)
					if (r0 + k < a.rows)
						step_row<F, G>(a, j, r0 + k, c,
							       q[k], xs4, lane,
							       acc[k]);
			}
		} else {
			/* accumulator q takes columns lane + 32 q
			 * (mod 128), in order */
			for (int i0 = lane; i0 < n; i0 += 128)
#pragma unroll
				for (int q = 0; q < 4; q++) {
					const int i = i0 + 32 * q;

					if (i >= n)
						break;
#pragma unroll
					for (int k = 0; k < GEMV_WARP_ROWS; k++)
						if (r0 + k < a.rows)
							acc[k][q] = fmaf(
								elem<F, G>(a, j,
									r0 + k,
									t0 + i),
								xs[i], acc[k][q]);
				}
		}
	}
#pragma unroll
	for (int k = 0; k < GEMV_WARP_ROWS; k++) {
		float s = (acc[k][0] + acc[k][1]) + (acc[k][2] + acc[k][3]);

		for (int o = 16; o > 0; o >>= 1)
			s += __shfl_down_sync(0xffffffffu, s, o);
		if (lane == 0 && r0 + k < a.rows)
			j.y[r0 + k] = s;
	}
}

static int is_aligned(const void *p, size_t n)
{
	return ((uintptr_t)p % n) == 0;
}

uint64_t cw_cu_matvec_weight_bytes(const struct cw_wview *w)
{
	const uint64_t R = (uint64_t)w->rows, C = (uint64_t)w->cols;

	switch (w->dtype) {
	case ST_DTYPE_F32: return R * C * 4;
	case ST_DTYPE_BF16: return R * C * 2;
	case ST_DTYPE_MXFP4: return R * C / 2 + R * (C / 32);
	case ST_DTYPE_NVFP4: return R * C / 2 + R * (C / 16);
	case ST_DTYPE_E2M1_F16:
		return R * C / 2 + R * ((C + w->group - 1) / w->group) * 2;
	case ST_DTYPE_F8_E4M3: {
		const uint64_t g = w->group ? w->group : C;

		return R * C + (w->scales ? R * ((C + g - 1) / g) * 4 : 0);
	}
	default: return 0;
	}
}

/* What a launch needs from the first view: format f, the shared
 * arguments, whether the 16-byte path applies to this view and x.  0,
 * -EINVAL or -ST_E_UNSUPPORTED. */
static int plan(const struct cw_wview *w, const float *x_d, int *ret_f,
		gemv_args *a, int *ret_vec, struct st_diag *diag)
{
	const int64_t C = w->cols;
	int f, vec;

	if (w->rows < 0 || C < 0 || w->rows > 0x7fffffff)
		return st_diag_set(diag, -EINVAL, "cw_cu_matvec: bad shape "
				   "%lld x %lld", (long long)w->rows,
				   (long long)C);
	a->rows = w->rows;
	a->cols = C;
	a->group = 1;
	a->ngroups = 0;
	switch (w->dtype) {
	case ST_DTYPE_MXFP4:
	case ST_DTYPE_NVFP4:
	case ST_DTYPE_E2M1_F16:
		f = w->dtype == ST_DTYPE_MXFP4 ? F_MXFP4 :
		    w->dtype == ST_DTYPE_NVFP4 ? F_NVFP4 : F_E2M1F16;
		a->group = f == F_MXFP4 ? 32 : f == F_NVFP4 ? 16 : (int)w->group;
		if (a->group < 2 || a->group % 2 || C % 2 ||
		    (C % a->group && f != F_E2M1F16))
			return st_diag_set(diag, -EINVAL, "cw_cu_matvec: dtype %d "
					   "needs an even group dividing the "
					   "columns (cols %lld, group %d)",
					   (int)w->dtype,
					   (long long)C, a->group);
		if (!w->scales || (f == F_E2M1F16 && !is_aligned(w->scales, 2)))
			return st_diag_set(diag, -EINVAL, "cw_cu_matvec: missing "
					   "or misaligned scales");
		a->row_bytes = C / 2;
		a->ngroups = (C + a->group - 1) / a->group;
		vec = C % 32 == 0 && a->group % 16 == 0;
		break;
	case ST_DTYPE_F8_E4M3:
		f = F_FP8;
		a->group = w->group ? (int)w->group : (int)(C ? C : 1);
		if (w->scales && !is_aligned(w->scales, 4))
			return st_diag_set(diag, -EINVAL, "cw_cu_matvec: "
					   "misaligned FP8 scales");
		a->row_bytes = C;
		a->ngroups = (C + a->group - 1) / a->group;
		vec = C % 16 == 0 && (a->group % 16 == 0 || !w->scales);
		break;
	case ST_DTYPE_BF16:
		f = F_BF16;
		a->row_bytes = C * 2;
		vec = C % 8 == 0;
		break;
	case ST_DTYPE_F32:
		f = F_F32;
		a->row_bytes = C * 4;
		vec = C % 4 == 0;
		break;
	default:
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "cw_cu_matvec: "
				   "dtype %d not supported", (int)w->dtype);
	}
	/* rows start 16-byte aligned when the base is and row_bytes % 16 */
	*ret_vec = vec && a->row_bytes % 16 == 0 && is_aligned(w->data, 16) &&
		   is_aligned(x_d, 16);
	*ret_f = f;
	return 0;
}

template <int F, int G>
static void launch_fg(const gemv_args &a, int vec, dim3 grid, cudaStream_t st)
{
	if (vec)
		gemv_kernel<F, G, 1><<<grid, GEMV_THREADS, 0, st>>>(a);
	else
		gemv_kernel<F, G, 0><<<grid, GEMV_THREADS, 0, st>>>(a);
}

static int launch(const gemv_args &a, int f, int vec, unsigned n_jobs,
		  cudaStream_t st, struct st_diag *diag)
{
	const dim3 grid((unsigned)((a.rows + GEMV_ROWS_PER_BLOCK - 1) /
				   GEMV_ROWS_PER_BLOCK), n_jobs);

	if (!a.rows || !n_jobs)
		return 0;
	if (n_jobs > 65535)
		return st_diag_set(diag, -EINVAL, "cw_cu_matvec_batch: %u jobs "
				   "(at most 65535 per launch)", n_jobs);
	switch (f) {
	case F_MXFP4: launch_fg<F_MXFP4, 32>(a, vec, grid, st); break;
	case F_NVFP4: launch_fg<F_NVFP4, 16>(a, vec, grid, st); break;
	case F_E2M1F16: launch_fg<F_E2M1F16, 0>(a, vec, grid, st); break;
	case F_FP8:
		if (a.group == 128)
			launch_fg<F_FP8, 128>(a, vec, grid, st);
		else
			launch_fg<F_FP8, 0>(a, vec, grid, st);
		break;
	case F_BF16: launch_fg<F_BF16, 0>(a, vec, grid, st); break;
	default: launch_fg<F_F32, 0>(a, vec, grid, st); break;
	}
	return cw_cu_launched(diag, "cw_cu_matvec launch");
}

int cw_cu_matvec(const struct cw_wview *w, const float *x_d, float *y_d,
		 void *stream, struct st_diag *diag)
{
	gemv_args a;
	int f = 0, vec = 0, r;

	r = plan(w, x_d, &f, &a, &vec, diag);
	if (r < 0 || !w->rows)
		return r;
	a.jobs = NULL;
	a.one.data = (const uint8_t *)w->data;
	a.one.scales = w->scales;
	a.one.x = x_d;
	a.one.y = y_d;
	a.one.gscale = w->global_scale;
	return launch(a, f, vec, 1, (cudaStream_t)stream, diag);
}

int cw_cu_matvec_batch(const struct cw_wview *const *w,
		       const float *const *x_d, float *const *y_d, int n,
		       struct cw_cu_gemv_job *jobs_h,
		       struct cw_cu_gemv_job *jobs_d, void *stream,
		       struct st_diag *diag)
{
	cudaStream_t st = (cudaStream_t)stream;
	cudaError_t e;
	gemv_args a, b;
	int f = 0, vec = 0, r;

	if (n < 0)
		return st_diag_set(diag, -EINVAL, "cw_cu_matvec_batch: "
				   "%d jobs", n);
	if (!n)
		return 0;
	r = plan(w[0], x_d[0], &f, &a, &vec, diag);
	if (r < 0)
		return r;
	for (int i = 0; i < n; i++) {
		int fi = 0, vi = 0;

		r = plan(w[i], x_d[i], &fi, &b, &vi, diag);
		if (r < 0)
			return r;
		if (fi != f || b.rows != a.rows || b.cols != a.cols ||
		    b.group != a.group || (w[i]->scales == NULL) !=
		    (w[0]->scales == NULL))
			return st_diag_set(diag, -EINVAL, "cw_cu_matvec_batch: "
					   "job %d is %lld x %lld dtype %d "
					   "group %d, job 0 %lld x %lld dtype "
					   "%d group %d (one shape per launch)",
					   i, (long long)b.rows,
					   (long long)b.cols, (int)w[i]->dtype,
					   b.group, (long long)a.rows,
					   (long long)a.cols, (int)w[0]->dtype,
					   a.group);
		vec &= vi;
		jobs_h[i].data = (const uint8_t *)w[i]->data;
		jobs_h[i].scales = w[i]->scales;
		jobs_h[i].x = x_d[i];
		jobs_h[i].y = y_d[i];
		jobs_h[i].gscale = w[i]->global_scale;
	}
	if (!a.rows)
		return 0;
	e = cudaMemcpyAsync(jobs_d, jobs_h, (size_t)n * sizeof(*jobs_h),
			    cudaMemcpyHostToDevice, st);
	if (e != cudaSuccess)
		return cw_cu_err(diag, e, "cw_cu_matvec_batch: job table");
	a.jobs = jobs_d;
	return launch(a, f, vec, (unsigned)n, st, diag);
}

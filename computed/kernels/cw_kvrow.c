/* cw_kvrow.c — see cw_kvrow.h. */
#include "cw_kvrow.h"

#include <errno.h>
#include <math.h>
#include <string.h>

int cw_kvrow_init(struct cw_kvrow_fmt *fmt, enum st_dtype dtype,
		  int n_kv_heads, int head_dim)
{
	if (n_kv_heads <= 0 || head_dim <= 0 ||
	    (dtype != ST_DTYPE_F32 && dtype != ST_DTYPE_F16 &&
	     dtype != ST_DTYPE_BF16 && dtype != ST_DTYPE_F8_E4M3))
		return -EINVAL;
	fmt->dtype = dtype;
	fmt->n_kv_heads = n_kv_heads;
	fmt->head_dim = head_dim;
	for (int b = 0; b < 256; b++)
		fmt->e4m3[b] = st_e4m3_to_f32((uint8_t)b);
	return 0;
}

size_t cw_kvrow_bytes(const struct cw_kvrow_fmt *fmt)
{
	size_t n = (size_t)fmt->n_kv_heads * fmt->head_dim;

	switch (fmt->dtype) {
	case ST_DTYPE_F32: return 2 * n * 4;
	case ST_DTYPE_F16:
	case ST_DTYPE_BF16: return 2 * n * 2;
	default: return 2 * n + 2 * (size_t)fmt->n_kv_heads * 4;
	}
}

static void write_fp8(const struct cw_kvrow_fmt *fmt, uint8_t *codes,
		      float *scales, const float *x)
{
	const int hd = fmt->head_dim;

	for (int h = 0; h < fmt->n_kv_heads; h++) {
		const float *xh = x + (size_t)h * hd;
		float amax = 0.0f, s, inv;

		for (int i = 0; i < hd; i++)
			if (fabsf(xh[i]) > amax)
				amax = fabsf(xh[i]);
		/* amax / 448 maps the largest value to the top code; an
		 * all-zero (or non-finite) head keeps scale 1 */
		s = amax > 0.0f && isfinite(amax) ? amax / 448.0f : 1.0f;
		inv = 1.0f / s;
		for (int i = 0; i < hd; i++)
			codes[(size_t)h * hd + i] = st_f32_to_e4m3_sat(xh[i] * inv);
		memcpy(scales + h, &s, sizeof(float));
	}
}

void cw_kvrow_write(const struct cw_kvrow_fmt *fmt, uint8_t *row,
		    const float *k, const float *v)
{
	const size_t n = (size_t)fmt->n_kv_heads * fmt->head_dim;

	switch (fmt->dtype) {
	case ST_DTYPE_F32:
		memcpy(row, k, n * 4);
		memcpy(row + n * 4, v, n * 4);
		break;
	case ST_DTYPE_F16:
	case ST_DTYPE_BF16: {
		uint16_t *d = (uint16_t *)row;

		for (size_t i = 0; i < n; i++) {
			d[i] = fmt->dtype == ST_DTYPE_F16 ? st_f32_to_f16(k[i]) :
							    st_f32_to_bf16(k[i]);
			d[n + i] = fmt->dtype == ST_DTYPE_F16 ?
					   st_f32_to_f16(v[i]) :
					   st_f32_to_bf16(v[i]);
		}
		break;
	}
	default: {
		float scales[2][256];

		write_fp8(fmt, row, scales[0], k);
		write_fp8(fmt, row + n, scales[1], v);
		memcpy(row + 2 * n, scales[0], (size_t)fmt->n_kv_heads * 4);
		memcpy(row + 2 * n + (size_t)fmt->n_kv_heads * 4, scales[1],
		       (size_t)fmt->n_kv_heads * 4);
		break;
	}
	}
}

void cw_kvrow_read_head(const struct cw_kvrow_fmt *fmt, const uint8_t *row,
			int which, int head, float *out)
{
	const size_t n = (size_t)fmt->n_kv_heads * fmt->head_dim;
	const int hd = fmt->head_dim;
	const size_t off = (size_t)which * n + (size_t)head * hd;

	switch (fmt->dtype) {
	case ST_DTYPE_F32:
		memcpy(out, row + off * 4, (size_t)hd * 4);
		break;
	case ST_DTYPE_F16:
		for (int i = 0; i < hd; i++) {
			uint16_t h;

			memcpy(&h, row + (off + i) * 2, 2);
			out[i] = st_f16_to_f32(h);
		}
		break;
	case ST_DTYPE_BF16:
		for (int i = 0; i < hd; i++) {
			uint16_t h;

			memcpy(&h, row + (off + i) * 2, 2);
			out[i] = st_bf16_to_f32(h);
		}
		break;
	default: {
		float s;

		memcpy(&s, row + 2 * n + ((size_t)which * fmt->n_kv_heads + head) * 4,
		       4);
		for (int i = 0; i < hd; i++)
			out[i] = fmt->e4m3[row[off + i]] * s;
		break;
	}
	}
}

int cw_kvrow_parse_dtype(const char *name, enum st_dtype *ret)
{
	if (!strcmp(name, "f32"))
		*ret = ST_DTYPE_F32;
	else if (!strcmp(name, "f16"))
		*ret = ST_DTYPE_F16;
	else if (!strcmp(name, "bf16"))
		*ret = ST_DTYPE_BF16;
	else if (!strcmp(name, "fp8"))
		*ret = ST_DTYPE_F8_E4M3;
	else
		return -EINVAL;
	return 0;
}

const char *cw_kvrow_dtype_name(enum st_dtype dt)
{
	switch (dt) {
	case ST_DTYPE_F32: return "f32";
	case ST_DTYPE_F16: return "f16";
	case ST_DTYPE_BF16: return "bf16";
	case ST_DTYPE_F8_E4M3: return "fp8";
	default: return "?";
	}
}

/*
 * cw_kvrow.h — how computed lays out one token's K and V in a KV row (the
 * bytes kvd stores; kvd never looks inside, DESIGN.md 3a).
 *
 * For F32 (reference mode), F16 and BF16 rows:
 *   [K: n_kv_heads x head_dim elements][V: the same]
 * For FP8 E4M3 rows (OFP8; saturating at +-448, never NaN, PITFALLS P9):
 *   [K codes: n_kv_heads x head_dim bytes][V codes: the same]
 *   [K scales: n_kv_heads float32][V scales: n_kv_heads float32]
 * with one scale per (row, KV head) = amax / 448 of that head's values, so
 * the largest value maps to the top of the E4M3 range.  Why per row and
 * head: rows are written one token at a time in decode, so a coarser
 * (per-page) scale would have to be chosen before the page's other rows
 * exist, and heads differ in magnitude by orders of magnitude; the 8 bytes
 * of scales per head are 1/8 of a 64-wide head's codes.
 */
#ifndef CW_KVROW_H
#define CW_KVROW_H

#include <stddef.h>
#include <stdint.h>

#include "st_formats.h"

struct cw_kvrow_fmt {
	enum st_dtype dtype;   /* F32, F16, BF16 or F8_E4M3 */
	int n_kv_heads;
	int head_dim;
	float e4m3[256];       /* decode table for FP8 rows */
};

/* Fills fmt; -EINVAL for another dtype or non-positive sizes. */
int cw_kvrow_init(struct cw_kvrow_fmt *fmt, enum st_dtype dtype,
		  int n_kv_heads, int head_dim);

/* Bytes of one row (K and V of every KV head, with scales for FP8). */
size_t cw_kvrow_bytes(const struct cw_kvrow_fmt *fmt);

/* Encodes k and v (each n_kv_heads * head_dim floats) into row. */
void cw_kvrow_write(const struct cw_kvrow_fmt *fmt, uint8_t *row,
		    const float *k, const float *v);

/* Decodes head `head` of K (which = 0) or V (which = 1) into out
 * (head_dim floats). */
void cw_kvrow_read_head(const struct cw_kvrow_fmt *fmt, const uint8_t *row,
			int which, int head, float *out);

/* Parses "f32", "f16", "bf16", "fp8" into a dtype; -EINVAL otherwise. */
int cw_kvrow_parse_dtype(const char *name, enum st_dtype *ret);
/* The name of a KV dtype as cw_kvrow_parse_dtype spells it. */
const char *cw_kvrow_dtype_name(enum st_dtype dt);

#endif

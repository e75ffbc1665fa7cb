/*
 * st_engram_file.c — the engram.bin block format (see st_engram_file.h).
 */
#include "st_engram_file.h"

#include <errno.h>
#include <string.h>

#include <xxhash.h>

#include "st_formats.h"

#define HDR_MAGIC "STENGRAM"
#define HDR_FIXED 24   /* magic, version, n_layers, block_bytes, scale_block */
#define HDR_ENTRY 40   /* per layer */

_Static_assert(HDR_FIXED + ST_ENGRAM_MAX_LAYERS * HDR_ENTRY <=
	       ST_ENGRAM_BLOCK_BYTES - ST_ENGRAM_SUM_BYTES,
	       "the header fits one block");

int st_engram_layout_init(int layer, int dim, int64_t rows,
			  uint64_t first_block, struct st_engram_layout *ret,
			  struct st_diag *diag)
{
	memset(ret, 0, sizeof(*ret));
	if (dim < ST_ENGRAM_SCALE_BLOCK || dim % ST_ENGRAM_SCALE_BLOCK ||
	    dim + dim / ST_ENGRAM_SCALE_BLOCK >
	    ST_ENGRAM_BLOCK_BYTES - ST_ENGRAM_SUM_BYTES)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "Engram layer %d: row width %d is not a multiple of %d that fits a %d-byte block",
				   layer, dim, ST_ENGRAM_SCALE_BLOCK,
				   ST_ENGRAM_BLOCK_BYTES);
	if (rows < 1)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "Engram layer %d: %lld rows", layer,
				   (long long)rows);
	ret->layer = layer;
	ret->dim = dim;
	ret->row_bytes = (uint32_t)(dim + dim / ST_ENGRAM_SCALE_BLOCK);
	ret->rows_per_block = (ST_ENGRAM_BLOCK_BYTES - ST_ENGRAM_SUM_BYTES) /
			      ret->row_bytes;
	ret->rows = rows;
	ret->first_block = first_block;
	ret->n_blocks = ((uint64_t)rows + ret->rows_per_block - 1) /
			ret->rows_per_block;
	return 0;
}

static uint64_t block_sum(const void *block, uint64_t index)
{
	return XXH3_64bits_withSeed(block, ST_ENGRAM_BLOCK_BYTES -
				    ST_ENGRAM_SUM_BYTES, index);
}

void st_engram_block_seal(void *block, uint64_t index)
{
	uint64_t s = block_sum(block, index);

	memcpy((uint8_t *)block + ST_ENGRAM_BLOCK_BYTES - ST_ENGRAM_SUM_BYTES,
	       &s, 8);
}

int st_engram_block_check(const void *block, uint64_t index)
{
	uint64_t s;

	memcpy(&s, (const uint8_t *)block + ST_ENGRAM_BLOCK_BYTES -
	       ST_ENGRAM_SUM_BYTES, 8);
	return s == block_sum(block, index) ? 0 : -ST_E_CHECKSUM;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

int st_engram_header_encode(const struct st_engram_layout *l, int n,
			    void *block)
{
	uint8_t *b = block;

	if (n < 1 || n > ST_ENGRAM_MAX_LAYERS)
		return -EINVAL;
	memset(b, 0, ST_ENGRAM_BLOCK_BYTES);
	memcpy(b, HDR_MAGIC, 8);
	put32(b + 8, ST_ENGRAM_VERSION);
	put32(b + 12, (uint32_t)n);
	put32(b + 16, ST_ENGRAM_BLOCK_BYTES);
	put32(b + 20, ST_ENGRAM_SCALE_BLOCK);
	for (int i = 0; i < n; i++) {
		uint8_t *e = b + HDR_FIXED + i * HDR_ENTRY;

		put32(e, (uint32_t)l[i].layer);
		put32(e + 4, (uint32_t)l[i].dim);
		put32(e + 8, l[i].row_bytes);
		put32(e + 12, l[i].rows_per_block);
		put64(e + 16, (uint64_t)l[i].rows);
		put64(e + 24, l[i].first_block);
		put64(e + 32, l[i].n_blocks);
	}
	st_engram_block_seal(b, 0);
	return 0;
}

int st_engram_header_decode(const void *block, const char *src,
			    struct st_engram_layout *ret, int max, int *ret_n,
			    struct st_diag *diag)
{
	const uint8_t *b = block;
	uint64_t next = 1;
	uint32_t n;

	if (st_engram_block_check(b, 0))
		return st_diag_set(diag, -ST_E_CHECKSUM,
				   "%s: header block checksum mismatch (file damaged); re-run strata convert",
				   src);
	if (memcmp(b, HDR_MAGIC, 8))
		return st_diag_set(diag, -ST_E_BADMAGIC,
				   "%s: not a strata Engram table file; re-run strata convert",
				   src);
	if (get32(b + 8) != ST_ENGRAM_VERSION)
		return st_diag_set(diag, -ST_E_VERSION,
				   "%s: Engram file version %u, this strata reads %d; re-run strata convert",
				   src, get32(b + 8), ST_ENGRAM_VERSION);
	n = get32(b + 12);
	if (n < 1 || n > (uint32_t)max || n > ST_ENGRAM_MAX_LAYERS ||
	    get32(b + 16) != ST_ENGRAM_BLOCK_BYTES ||
	    get32(b + 20) != ST_ENGRAM_SCALE_BLOCK)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: header: %u layers, block %u, scale block %u not understood; re-run strata convert",
				   src, n, get32(b + 16), get32(b + 20));
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = b + HDR_FIXED + i * HDR_ENTRY;
		struct st_engram_layout want;
		struct st_diag d = { { 0 } };
		int64_t rows = (int64_t)get64(e + 16);

		if (get32(e + 4) > ST_ENGRAM_BLOCK_BYTES ||
		    st_engram_layout_init((int32_t)get32(e), (int)get32(e + 4),
					  rows, next, &want, &d))
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: header layer %u: %s; re-run strata convert",
					   src, i, d.msg[0] ? d.msg : "bad layout");
		if (get32(e + 8) != want.row_bytes ||
		    get32(e + 12) != want.rows_per_block ||
		    get64(e + 24) != want.first_block ||
		    get64(e + 32) != want.n_blocks)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: header layer %u: layout fields inconsistent; re-run strata convert",
					   src, i);
		ret[i] = want;
		next += want.n_blocks;
	}
	*ret_n = (int)n;
	return 0;
}

void st_engram_row_decode(const uint8_t *row, int dim, float *out)
{
	const uint8_t *sc = row + dim;

	for (int g = 0; g < dim / ST_ENGRAM_SCALE_BLOCK; g++) {
		float s = st_e8m0_to_f32(sc[g]);

		for (int j = 0; j < ST_ENGRAM_SCALE_BLOCK; j++) {
			int k = g * ST_ENGRAM_SCALE_BLOCK + j;

			out[k] = st_e4m3_to_f32(row[k]) * s;
		}
	}
}

/*
 * st_engram_file.h — the Engram table file of a DeepSeek-V4.1 store
 * (engram.bin), laid out so that one row lookup is one aligned 4 KiB read.
 *
 * A V4.1 Engram row is head_dim E4M3 bytes plus head_dim/32 E8M0 scales
 * (one per 32 columns of that row, value = e4m3 * 2^(s-127);
 * MODEL_FAMILY_DEEPSEEK_V4.md 3.2/3.5): 264 B for V4.1-Flash, 66 B for the
 * tiny fixture.  Rows are a few hundred bytes and looked up at random, 48
 * per token, so the file packs whole rows into 4 KiB blocks and never lets
 * a row straddle two blocks: a lookup is exactly one O_DIRECT read of one
 * aligned block (a row-granular layout would need 4 KiB reads anyway, and
 * straddling rows two of them).  Cost: floor(4088 / 264) = 15 rows per
 * block, 3960 of 4096 bytes used (3.3 % over the 202.8 GB of V4.1-Flash).
 *
 * File:
 *   block 0       header: magic "STENGRAM", u32 version, u32 n_layers,
 *                 u32 block_bytes (4096), u32 scale_block (32), then per
 *                 layer {i32 layer, u32 dim, u32 row_bytes,
 *                 u32 rows_per_block, i64 rows, u64 first_block}
 *   blocks 1..    each layer's table, layer after layer; row r of a layer
 *                 is in block first_block + r / rows_per_block at byte
 *                 (r % rows_per_block) * row_bytes: dim E4M3 bytes, then
 *                 dim/32 E8M0 bytes
 * Every block (the header too) ends with 8 bytes: XXH3-64 of its first
 * 4088 bytes seeded with its block index, so a reader checks each block it
 * reads (and a block read from the wrong offset fails).  Unused bytes are
 * zero.  The store manifest's "engram" section repeats the layouts and an
 * XXH3-64 per layer (of that layer's blocks) for strata verify.
 */
#ifndef ST_ENGRAM_FILE_H
#define ST_ENGRAM_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

#define ST_ENGRAM_FILE "engram.bin"
#define ST_ENGRAM_BLOCK_BYTES 4096
#define ST_ENGRAM_SUM_BYTES 8
#define ST_ENGRAM_SCALE_BLOCK 32
#define ST_ENGRAM_VERSION 1
#define ST_ENGRAM_MAX_LAYERS 16

/* Where one Engram layer's table lives in engram.bin. */
struct st_engram_layout {
	int layer;                /* model layer id */
	int dim;                  /* columns of a row (engram_head_dim) */
	uint32_t row_bytes;       /* dim + dim / 32 */
	uint32_t rows_per_block;  /* floor((4096 - 8) / row_bytes) */
	int64_t rows;             /* table rows (engram_num_embeddings) */
	uint64_t first_block;     /* block index of row 0 */
	uint64_t n_blocks;        /* ceil(rows / rows_per_block) */
	uint64_t xxh3;            /* of the layer's blocks (manifest) */
};

/*
 * Fills the layout of a table of `rows` rows of `dim` columns starting at
 * block `first_block`.  Returns 0 or -ST_E_UNSUPPORTED (dim not a positive
 * multiple of 32, or a row larger than a block), -ST_E_CONFIG (rows < 1).
 */
int st_engram_layout_init(int layer, int dim, int64_t rows,
			  uint64_t first_block, struct st_engram_layout *ret,
			  struct st_diag *diag);

/* Block index (in the file) and byte offset in that block of row `row`
 * (0 <= row < l->rows, not checked). */
static inline uint64_t st_engram_row_block(const struct st_engram_layout *l,
					   int64_t row)
{
	return l->first_block + (uint64_t)row / l->rows_per_block;
}

static inline uint32_t st_engram_row_offset(const struct st_engram_layout *l,
					    int64_t row)
{
	return (uint32_t)((uint64_t)row % l->rows_per_block) * l->row_bytes;
}

/* Writes the checksum of 4 KiB block `block` (file block index `index`)
 * into its last 8 bytes. */
void st_engram_block_seal(void *block, uint64_t index);

/* 0 if block's checksum matches for file block index `index`, else
 * -ST_E_CHECKSUM. */
int st_engram_block_check(const void *block, uint64_t index);

/* Encodes the header block (n layouts) into block[4096], sealed.
 * Returns 0 or -EINVAL (n out of range). */
int st_engram_header_encode(const struct st_engram_layout *l, int n,
			    void *block);

/*
 * Decodes and validates a header block: checksum, magic, version, block
 * and scale sizes, each layout consistent with st_engram_layout_init and
 * the layers placed one after the other from block 1.  `src` names the
 * file in messages.  Writes up to `max` layouts (xxh3 left 0) and their
 * number.  Returns 0, -ST_E_CHECKSUM, -ST_E_BADMAGIC, -ST_E_VERSION,
 * -ST_E_FORMAT, each with diag saying to re-run strata convert.
 */
int st_engram_header_decode(const void *block, const char *src,
			    struct st_engram_layout *ret, int max, int *ret_n,
			    struct st_diag *diag);

/* Dequantizes one row (dim E4M3 bytes then dim/32 E8M0 bytes) into
 * out[dim] floats: e4m3 * 2^(s - 127), exact in float32. */
void st_engram_row_decode(const uint8_t *row, int dim, float *out);

#endif

/*
 * st_store.h — the strata store: what `strata convert` writes and expertd /
 * computed read (DESIGN.md section 7).
 *
 * A store is a directory:
 *   manifest.json   format "strata-store", version 1; the model config
 *                   (config.json embedded verbatim under "config"), the
 *                   source files with sizes, the dense tensor table and the
 *                   expert record layout, every checksum (XXH3-64, hex)
 *   dense.bin       every non-expert tensor, each 4096-aligned, in F32 or BF16
 *   experts-LLL.bin one file per MoE layer; expert e's record is at byte
 *                   e * record_bytes; record_bytes is a multiple of 4096
 *   tokenizer.json, tokenizer_config.json, generation_config.json (copies;
 *                   the last only if the checkpoint has one), config.json
 *
 * An expert record holds gate, up, down (st_expert_mat order), each matrix
 * [rows, cols] row-major as in the checkpoint ([out, in]):
 *   MXFP4: codes (rows*cols/2 bytes, OCP nibble layout, 32-element blocks
 *          along cols) then scales (rows*cols/32 E8M0 bytes), each section
 *          starting at a 64-byte aligned offset in the record;
 *   BF16 / F32: the elements.
 * The rest of the record up to record_bytes is zero.  The checksum of a
 * record covers all record_bytes bytes.
 * Converting the same checkpoint with the same options twice gives
 * byte-identical stores (no time stamps, no absolute paths).
 */
#ifndef ST_STORE_H
#define ST_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "st_config.h"
#include "st_error.h"
#include "st_formats.h"

#define ST_STORE_FORMAT "strata-store"
#define ST_STORE_VERSION 1
#define ST_STORE_RECORD_ALIGN 4096
#define ST_STORE_DENSE_ALIGN 4096

/* Where one matrix of an expert record lives (offsets within the record). */
struct st_store_matrix {
	int64_t rows, cols;
	uint64_t data_offset, data_bytes;
	uint64_t scale_offset, scale_bytes; /* 0 for BF16/F32 */
};

struct st_store_tensor {
	char *name;            /* owned */
	enum st_dtype dtype;   /* F32 or BF16 */
	int n_dims;
	int64_t shape[4];
	uint64_t offset;       /* in dense.bin */
	uint64_t n_bytes;
	uint64_t xxh3;
};

struct st_store {
	char *dir;                     /* owned */
	char *config_json;             /* owned, verbatim config.json */
	struct st_model_config cfg;
	/* experts */
	enum st_dtype expert_dtype;    /* ST_DTYPE_MXFP4, BF16 or F32 */
	enum st_fp4_layout fp4_layout; /* ST_FP4_LAYOUT_OCP */
	int n_layers, n_experts;
	uint64_t record_bytes;
	struct st_store_matrix mat[3]; /* by enum st_expert_mat */
	char **expert_files;           /* owned, n_layers base names */
	uint64_t *expert_xxh3;         /* owned, [n_layers * n_experts] */
	/* dense */
	char *dense_file;              /* owned base name */
	uint64_t dense_bytes;
	int n_dense;
	struct st_store_tensor *dense; /* owned */
};

/*
 * Opens a store: reads and validates manifest.json (format, version, sizes
 * consistent with the config, files present with the expected sizes).
 * Does not read weights.  *ret owned by the caller (st_store_close).
 * Errors: -ENOENT, -ST_E_FORMAT, -ST_E_VERSION, with diag.
 */
int st_store_open(const char *dir, struct st_store **ret, struct st_diag *diag);
void st_store_close(struct st_store *s);

/* Finds a dense tensor by name, or NULL. */
const struct st_store_tensor *st_store_find_dense(const struct st_store *s,
						  const char *name);

/* Full path of a file of the store into buf.  0 or -ENAMETOOLONG. */
int st_store_path(const struct st_store *s, const char *base, char *buf,
		  size_t len);

/*
 * Reads expert (layer, expert)'s record from an open expert file descriptor
 * `fd` (of experts-LLL.bin for that layer) into buf (record_bytes bytes) and
 * verifies its checksum.  Returns 0, -EIO/-errno, or -ST_E_CHECKSUM with
 * diag naming file and record.
 */
int st_store_read_record(const struct st_store *s, int fd, int layer,
			 int expert, void *buf, struct st_diag *diag);

/*
 * Re-checks every checksum of a store (dense tensors and expert records)
 * and every file size.  progress(done, total, arg) is called now and then
 * when non-NULL.  Returns 0, or the first error (-ST_E_CHECKSUM, ...) with
 * diag; counts problems in *ret_n_bad when non-NULL.
 */
int st_store_verify(const char *dir,
		    void (*progress)(uint64_t done, uint64_t total, void *arg),
		    void *arg, int *ret_n_bad, struct st_diag *diag);

#endif

/*
 * st_store.h — the strata store: what `strata convert` writes and expertd /
 * computed read (DESIGN.md section 7).
 *
 * A store is a directory:
 *   manifest.json   format "strata-store", version 1 (schema below); written
 *                   last, so a directory without one is no store
 *   dense.bin       every non-expert tensor, each 4096-aligned, in F32 or BF16
 *   experts-LLL.bin one file per MoE layer (LLL: layer, 3 digits or more);
 *                   expert e's record is at byte e * record_bytes;
 *                   record_bytes is a multiple of 4096
 *   tokenizer.json, tokenizer_config.json, generation_config.json (copies;
 *                   the last only if the checkpoint has one), config.json
 *
 * An expert record holds gate, up, down (st_expert_mat order), each matrix
 * [rows, cols] row-major as in the checkpoint ([out, in]):
 *   MXFP4: codes (rows*cols/2 bytes, OCP nibble layout, 32-element blocks
 *          along cols, i.e. along each row) then scales (rows*cols/32 E8M0
 *          bytes, row-major by (row, block)), each section starting at a
 *          64-byte aligned offset in the record (st_store_layout);
 *          quantized by st_mxfp4_quantize_row (OCP MX v1.0: scale
 *          2^(floor(log2 amax) - 2), nearest-even E2M1, saturating at +-6);
 *   BF16 / F32: the elements (BF16 copied bit-exactly from a BF16
 *          checkpoint).
 * The rest of the record up to record_bytes is zero.  The checksum of a
 * record covers all record_bytes bytes.  Padding in dense.bin is zero too.
 * Converting the same checkpoint with the same options twice gives
 * byte-identical stores (no time stamps, no absolute paths).
 *
 * manifest.json, version 1 (keys in this order; numbers are integers,
 * checksums XXH3-64 as 16 lower-case hex digits):
 *   "format": "strata-store", "version": 1, "writer": "strata <version>",
 *   "config": the text of config.json, verbatim (a JSON string),
 *   "source": {"files": [{"name", "bytes"}]}           checkpoint files
 *   "files": [{"name", "bytes", "xxh3"}]                copied small files
 *   "dense": {"file": "dense.bin", "bytes", "align": 4096,
 *             "tensors": [{"name", "dtype": "F32"|"BF16", "shape": [..],
 *                          "offset", "bytes", "xxh3", "source_dtype"}]}
 *   "experts": {"format": "mxfp4"|"bf16"|"f32", "n_layers", "n_experts",
 *               "record_bytes", "record_align": 4096, "section_align": 64,
 *               "matrices": [{"name": "gate"|"up"|"down", "rows", "cols",
 *                             "format", "data_offset", "data_bytes",
 *                             mxfp4 only: "block": 32, "scale": "e8m0",
 *                             "layout": "ocp", "rounding": "nearest-even,
 *                             saturate ±6", "scale_offset", "scale_bytes"}],
 *               "files": [{"layer", "name", "bytes", "xxh3": [n_experts]}]}
 * Later formats (NVFP4, E2M1 with FP16 group scales) add their own
 * "format" / "block" / "scale" values per matrix.
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
#define ST_STORE_SECTION_ALIGN 64
#define ST_STORE_MANIFEST "manifest.json"
#define ST_STORE_DENSE_FILE "dense.bin"

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

/* A small file copied into the store (config.json, tokenizer files). */
struct st_store_file {
	char *name;            /* owned base name */
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
	struct st_store_tensor *dense; /* owned, sorted by name */
	/* copied files */
	int n_files;
	struct st_store_file *files;   /* owned */
};

/*
 * The record layout of one expert in format `dt` (ST_DTYPE_MXFP4, BF16 or
 * F32) for the model `cfg`: ret_mat[3] by enum st_expert_mat, shapes from
 * st_expert_tensor_shape; sections packed in order gate codes, gate scales,
 * up codes, ..., each at the next 64-byte boundary; *ret_record_bytes the
 * total rounded up to 4096.  Used by the writer and checked by the reader.
 * Returns 0, -EINVAL (dtype), -ST_E_UNSUPPORTED (MXFP4 with cols not a
 * multiple of 32) or -ST_E_LIMIT (sizes overflow), with diag.
 */
int st_store_layout(const struct st_model_config *cfg, enum st_dtype dt,
		    struct st_store_matrix ret_mat[3],
		    uint64_t *ret_record_bytes, struct st_diag *diag);

/* Base name of layer `layer`'s expert file ("experts-007.bin").  0 or
 * -ENAMETOOLONG. */
int st_store_expert_file_name(int layer, char *buf, size_t len);

/* Manifest spelling of an expert format: "mxfp4", "bf16", "f32"; NULL for
 * other dtypes. */
const char *st_store_format_name(enum st_dtype dt);

/*
 * Opens a store: reads and validates manifest.json (format, version, every
 * field range-checked, the embedded config re-parsed and the geometry and
 * record layout consistent with it, the dense tensors of every role present
 * with the shapes the config implies and not overlapping, files present
 * with the expected sizes, config.json identical to the embedded config).
 * Does not read weights.  *ret owned by the caller (st_store_close).
 * Errors: -ENOENT (no manifest: not a store), -ST_E_FORMAT,
 * -ST_E_VERSION, the config's codes (-ST_E_UNSUPPORTED, -ST_E_CONFIG),
 * -ENOMEM, -errno; every one with diag naming the store, file and field.
 */
int st_store_open(const char *dir, struct st_store **ret, struct st_diag *diag);

/* Frees everything; NULL is fine. */
void st_store_close(struct st_store *s);

/* Finds a dense tensor by name (binary search), or NULL. */
const struct st_store_tensor *st_store_find_dense(const struct st_store *s,
						  const char *name);

/* Full path of a file of the store into buf.  0 or -ENAMETOOLONG. */
int st_store_path(const struct st_store *s, const char *base, char *buf,
		  size_t len);

/*
 * Reads expert (layer, expert)'s record from an open expert file descriptor
 * `fd` (of experts-LLL.bin for that layer) into buf (record_bytes bytes) and
 * verifies its checksum.  Returns 0, -EINVAL (layer/expert out of range),
 * -EIO (file shorter than the record) / -errno, or -ST_E_CHECKSUM with diag
 * naming file and record and saying to re-run strata convert.
 */
int st_store_read_record(const struct st_store *s, int fd, int layer,
			 int expert, void *buf, struct st_diag *diag);

/*
 * Re-checks every checksum of a store (dense tensors, expert records and
 * the copied files) and every file size.  progress(done, total, arg) is
 * called when non-NULL at the start (0, total), after each tensor, record
 * and file, and at the end (total, total); units are bytes read.
 * Returns 0, or the first error (-ST_E_CHECKSUM, or st_store_open's when
 * the manifest or a file size is wrong) with diag naming the file and
 * tensor / record; counts problems in *ret_n_bad when non-NULL (a store
 * that does not open counts as 1).
 */
int st_store_verify(const char *dir,
		    void (*progress)(uint64_t done, uint64_t total, void *arg),
		    void *arg, int *ret_n_bad, struct st_diag *diag);

#endif

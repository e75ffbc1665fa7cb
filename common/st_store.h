/*
 * st_store.h — the strata store: what `strata convert` writes and expertd /
 * computed read (DESIGN.md section 7).
 *
 * A store is a directory:
 *   manifest.json   format "strata-store", version 2 (schema below); written
 *                   last, so a directory without one is no store
 *   dense.bin       every non-expert tensor, each 4096-aligned, in F32 or BF16;
 *                   with `convert --dense fp8` the attention projections
 *                   and the LM head in F8_E4M3, each with a NAME.scale
 *                   tensor (F32 [rows, ceil(cols / 128)], one scale per
 *                   row and block of 128 columns)
 *   experts-LLL.bin one file per MoE layer (LLL: layer, 3 digits or more);
 *                   expert e's record is at byte e * record_bytes of that
 *                   layer; record_bytes is a multiple of 4096 and the same
 *                   for every record of one file, but layers may differ
 *                   (mixed precision: e.g. the first and last layers in
 *                   FP8, the others in NVFP4)
 *   tokenizer.json, tokenizer_config.json, generation_config.json (copies;
 *                   the last only if the checkpoint has one), config.json
 *
 * An expert record holds gate, up, down (st_expert_mat order), each matrix
 * [rows, cols] row-major as in the checkpoint ([out, in]), each in its own
 * format (struct st_wformat; st_formats.h has the codecs and their
 * sources).  Every section starts at a 64-byte aligned offset in the
 * record, in the order gate data, gate scales, gate tensor scale, up data,
 * ... (st_store_layout):
 *   data    codes or elements, row-major: E2M1 codes two per byte in OCP
 *           nibble order (low nibble = even element), E4M3 bytes, BF16 or
 *           F32 elements (BF16 copied bit-exactly from a BF16 checkpoint);
 *   scales  row-major by (row, group), groups of `block` elements along
 *           each row (the last group of a row shorter when block does not
 *           divide cols): E8M0 bytes (MXFP4), E4M3 bytes (NVFP4), binary16
 *           (E2M1 FP16-scaled), float32 (FP8);
 *   tensor scale  NVFP4 only: one float32 per matrix, the multiplying
 *           form (value = e2m1 * e4m3(block) * tensor_scale; PITFALLS P8).
 * The rest of the record up to record_bytes is zero.  The checksum of a
 * record covers all its record_bytes bytes.  Padding in dense.bin is zero
 * too.  Converting the same checkpoint with the same options twice gives
 * byte-identical stores (no time stamps, no absolute paths).
 *
 * manifest.json, version 2 (keys in this order; numbers are integers,
 * checksums XXH3-64 as 16 lower-case hex digits):
 *   "format": "strata-store", "version": 2, "writer": "strata <version>",
 *   "config": the text of config.json, verbatim (a JSON string),
 *   "source": {"files": [{"name", "bytes"}]}           checkpoint files
 *   "files": [{"name", "bytes", "xxh3"}]                copied small files
 *   "dense": {"file": "dense.bin", "bytes", "align": 4096,
 *             "tensors": [{"name", "dtype": "F32"|"BF16"|"F8_E4M3",
 *                          "shape": [..],
 *                          "offset", "bytes", "xxh3", "source_dtype"}]}
 *   "experts": {"n_layers"        the config's layers; a DeepSeek-V4
 *                                store that kept the checkpoint's MTP
 *                                block one more (its experts: the last
 *                                layer; its other tensors mtp.0.* in
 *                                dense.bin),
 *               "n_experts",
 *               "record_bytes"   the largest record of any layer (the
 *                                slot size of expertd's pool),
 *               "record_align": 4096, "section_align": 64,
 *               "policy": {"default": "<format>", "keep": "<rules>"}
 *                                what the convert was asked for (keep
 *                                rules as es_convert_parse_keep reads
 *                                them, "" for none); informational, the
 *                                layers below are authoritative,
 *               "layers": [{"layer", "record_bytes",
 *                 "matrices": [{"name": "gate"|"up"|"down", "rows", "cols",
 *                   "format": "<format>" (st_wformat_parse spelling),
 *                   "layout": "ocp" (4-bit codes) | "ocp-r16" (MXFP4
 *                     rows interleaved by 16 per 32-column block,
 *                     st_mxfp4il.h; what strata convert writes for MXFP4
 *                     since version 3) | "row-major",
 *                   quantized formats: "block" (elements per scale),
 *                     "scale": "e8m0"|"e4m3"|"f16"|"f32", "rounding",
 *                   "data_offset", "data_bytes",
 *                   quantized formats: "scale_offset", "scale_bytes",
 *                   nvfp4: "tensor_scale": "f32", "tensor_scale_use":
 *                     "multiply", "tensor_scale_offset",
 *                     "tensor_scale_bytes": 4}],
 *                 "file": "experts-LLL.bin", "bytes",
 *                 "xxh3": [n_experts]}]}
 * Version 1 stores (one format for all layers) are refused with "re-run
 * strata convert".
 *
 * DeepSeek-V4 stores (config model_type "deepseek_v4", written by
 * es_convert's V4 path): the routed experts are the checkpoint's own
 * MXFP4 (w1 = gate, w3 = up, w2 = down; E2M1 code bytes and E8M0 scale
 * bytes copied byte for byte, no re-quantization); dense.bin holds every
 * other non-MTP tensor under its checkpoint name, in its checkpoint
 * dtype, byte for byte: BF16, F32, F8_E4M3 weights PREFIX.weight with
 * their scales PREFIX.scale in F8_E8M0 ([ceil(out/bo), ceil(in/bi)],
 * quantization_config.weight_block_size), and the hash-routing
 * tables layers.N.ffn.gate.tid2eid in I64.  The mtp.* block is not
 * stored.  experts.policy.default is "mxfp4", keep "", source "lossless".
 *
 * DeepSeek-V4.1 stores (config model_type "deepseek_v41", composite with
 * text_config; st_config_dsv41.h): as V4 (lossless MXFP4 experts, dense
 * tensors byte for byte, FP8 with its E8M0 block scales), except that
 * the Engram tables layers.N.engram.embed.{weight,scale} are not in
 * dense.bin but in engram.bin (st_engram_file.h: rows packed into
 * checksummed 4 KiB blocks, one block read per row), described by the
 * manifest section
 *   "engram": {"file": "engram.bin", "bytes", "block_bytes": 4096,
 *              "row_format", "hash_file": "engram_hash.bin",
 *              "layers": [{"layer", "rows", "dim", "row_bytes",
 *                          "rows_per_block", "first_block", "blocks",
 *                          "xxh3"}]}
 * and the frozen Engram hash inputs are engram_hash.bin (st_engram_hash.h,
 * made from the checkpoint's engram_hash.json, listed in "files").  The
 * DSpark draft layers (mtp.*) and the vision tower (vision.*, aligner.*,
 * image_start / image_end / image_newline) are not stored; the manifest's
 * "skipped" list names them with their tensor counts.
 */
#ifndef ST_STORE_H
#define ST_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "st_config.h"
#include "st_config_dsv_family.h"
#include "st_config_dsv41.h"
#include "st_engram_file.h"
#include "st_error.h"
#include "st_formats.h"
#include "st_mxfp4il.h"

#define ST_STORE_FORMAT "strata-store"
/* 3: MXFP4 experts of converted (non-lossless) stores are row-interleaved
 * ("ocp-r16", st_mxfp4il.h); 2 is refused with the command that
 * re-converts (st_store_open). */
#define ST_STORE_VERSION 3
#define ST_STORE_RECORD_ALIGN 4096
#define ST_STORE_DENSE_ALIGN 4096
#define ST_STORE_SECTION_ALIGN 64
#define ST_STORE_MANIFEST "manifest.json"
#define ST_STORE_DENSE_FILE "dense.bin"

/* Where one matrix of an expert record lives (offsets within the record)
 * and in which format. */
struct st_store_matrix {
	int64_t rows, cols;
	struct st_wformat fmt;
	uint64_t data_offset, data_bytes;
	uint64_t scale_offset, scale_bytes;     /* 0 for BF16/F32 */
	uint64_t tscale_offset, tscale_bytes;   /* NVFP4: 4 (FP32), else 0 */
	int il_rows; /* MXFP4 "ocp-r16": ST_MXFP4IL_ROWS (rows interleaved,
		      * st_mxfp4il.h); 0: row-major ("ocp", "row-major").
		      * Set from the manifest, not by st_store_layout. */
};

/* The record layout of one layer's expert file. */
struct st_store_layer {
	uint64_t record_bytes;         /* multiple of 4096 */
	struct st_store_matrix mat[3]; /* by enum st_expert_mat */
};

struct st_store_tensor {
	char *name;            /* owned */
	enum st_dtype dtype;   /* F32, BF16 or F8_E4M3 (with NAME.scale);
				* V4 stores also F8_E8M0 (the scales) and
				* I64 (tid2eid) */
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
	struct st_model_config cfg;    /* V4: st_dsv_expert_config */
	int is_dsv4;                   /* 1: a DeepSeek-V4 store */
	struct st_dsv_config dsv4;     /* is_dsv4: the parsed config */
	/* experts (4-bit codes in OCP nibble order; MXFP4 rows interleaved
	 * where st_store_matrix.il_rows says so) */
	int n_layers, n_experts;       /* expert layers (n_mtp included) */
	int n_mtp;                     /* V4: expert layers of the MTP block
					* after the config's layers (0, 1) */
	uint64_t record_bytes;         /* largest layer record: slot size */
	struct st_store_layer *layers; /* owned, [n_layers] */
	char *policy_default;          /* owned, manifest experts.policy */
	char *policy_keep;             /* owned, "" when nothing was kept */
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
	/* DeepSeek-V4.1 (config model_type "deepseek_v41"): is_dsv4 is 0 */
	int is_dsv41;
	struct st_dsv_config dsv41;    /* is_dsv41: the embedded config, parsed */
	int n_engram;                  /* Engram layers (engram.bin) */
	struct st_engram_layout *engram; /* owned, [n_engram], with xxh3 */
	uint64_t engram_bytes;         /* size of engram.bin */
	struct st_engram_hash *engram_hash; /* owned, from engram_hash.bin */
};

/*
 * The record layout of one expert for the model `cfg` with matrix m in
 * format fmt[m] (by enum st_expert_mat; pass the same format three times
 * for a uniform layer): ret_mat[3], shapes from st_expert_tensor_shape;
 * sections in order gate data, gate scales, gate tensor scale, up data,
 * ..., each at the next 64-byte boundary (empty ones take no space);
 * *ret_record_bytes the total rounded up to 4096.  Used by the writer and
 * checked by the reader.
 * Returns 0, -EINVAL (invalid format), -ST_E_UNSUPPORTED (cols not a
 * multiple of the MXFP4 / NVFP4 block, or odd for E2M1) or -ST_E_LIMIT
 * (sizes overflow), with diag naming the matrix.
 */
int st_store_layout(const struct st_model_config *cfg,
		    const struct st_wformat fmt[3],
		    struct st_store_matrix ret_mat[3],
		    uint64_t *ret_record_bytes, struct st_diag *diag);

/* Base name of layer `layer`'s expert file ("experts-007.bin").  0 or
 * -ENAMETOOLONG. */
int st_store_expert_file_name(int layer, char *buf, size_t len);

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
 * `fd` (of experts-LLL.bin for that layer) into buf, which holds
 * s->record_bytes bytes (the largest record): the layer's record
 * (s->layers[layer].record_bytes bytes) then zeros up to s->record_bytes,
 * so a slot's contents never depend on what it held before.  Verifies the
 * record's checksum.  Returns 0, -EINVAL (layer/expert out of range),
 * -EIO (file shorter than the record) / -errno, or -ST_E_CHECKSUM with diag
 * naming file and record and saying to re-run strata convert.
 */
int st_store_read_record(const struct st_store *s, int fd, int layer,
			 int expert, void *buf, struct st_diag *diag);
/* st_store_read_record, adding the wall ns spent verifying the checksum
 * to *sum_ns when sum_ns is not NULL (expertd's step-timeline counters). */
int st_store_read_record_timed(const struct st_store *s, int fd, int layer,
			       int expert, void *buf, uint64_t *sum_ns,
			       struct st_diag *diag);

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

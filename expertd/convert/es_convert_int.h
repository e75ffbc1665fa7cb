/*
 * es_convert_int.h — what the store writer's files (expertd/convert/)
 * share: the writer's state (struct conv, one per convert call, owned by
 * es_convert / es_convert_check) and the functions one phase file calls in
 * another.  Not a public interface: es_convert.h is.
 */
#ifndef ES_CONVERT_INT_H
#define ES_CONVERT_INT_H

#include <stdint.h>

#include <jansson.h>
#include <xxhash.h>

#include "es_convert.h"
#include "es_convert_engram.h"
#include "st_build_config.h"
#include "st_calib.h"
#include "st_config.h"
#include "st_config_dsv_family.h"
#include "st_safetensors.h"
#include "st_store.h"
#include "st_tokenizer.h"
#include "st_util.h"

/* The store files are little-endian, written from host memory as is. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "the store writer assumes a little-endian host");

/* Elements converted per step for large dense tensors. */
#define CHUNK_ELEMS ((size_t)1 << 20)

/* The names of an expert's three matrices, in record order. */
extern const char *const es_cv_mat_names[3];

/* A file copied into the store as it is (es_convert_out.c). */
struct es_cv_copied {
	const char *name;
	int required;
};

/* Copied into the store: required ones first, then optional. */
#define ES_CV_N_COPIED 4
extern const struct es_cv_copied es_cv_copied_files[ES_CV_N_COPIED];

struct conv {
	const char *model_dir;
	char out[4096];           /* out_dir without trailing slashes */
	char parent[4096];        /* its directory */
	const char *base;         /* its last component (inside out) */
	char tmp[4200];           /* out.tmp-<pid> */
	struct es_convert_opts o;
	struct st_diag *diag;

	struct st_model_config cfg;
	char *config_text;
	size_t config_len;
	struct st_checkpoint *ck;
	const struct st_tensor_info **experts; /* [(l * E + e) * 3 + m] */
	uint8_t *is_expert;                    /* per checkpoint tensor */
	uint8_t *is_attn;                      /* q/k/v/o, per tensor */
	uint8_t *is_shexp;                     /* shared-expert gate/up/down */
	enum st_dtype dense_dtype;
	struct st_wformat def_fmt;          /* opts' default format */
	struct st_store_layer *layers;      /* [n_layers] record layouts */
	uint64_t record_bytes;              /* the largest layer record */
	int have_copied[ES_CV_N_COPIED];

	/* calibrated scale search (opts.calib_path) */
	struct st_calib cal;
	uint64_t cal_file_xxh3;
	float *cal_w;             /* per-column weights of one matrix */
	float *gptq_w;            /* GPTQ: one matrix in float32 */
	double *gptq_h;           /* GPTQ: its input's second moment */
	uint64_t cal_fallback;    /* (layer, expert)s with too few tokens */

	/* DeepSeek-V4 (config model_type "deepseek_v4"): lossless store */
	int dsv4;
	struct st_dsv_config v4;
	/* V4 with an MTP block (mtp.0.*) kept: its routed experts are the
	 * store's expert layer v4.n_layers (cfg.n_layers counts it), its
	 * other tensors go to dense.bin by name; 0: none (or skipped) */
	int v4_mtp;
	const struct st_tensor_info **v4_scales; /* like experts: E8M0 */
	/* DeepSeek-V4.1 (model_type "deepseek_v41"): the V4 path plus the
	 * Engram tables (es_convert_engram.c); dsv4 is set too */
	int dsv41;
	struct st_dsv_config v41;
	struct es_engram_plan engram;
	int skipped[ES_V41_N_SKIP];         /* tensors per skipped group */

	uint64_t done, total;     /* progress, bytes read */
	XXH3_state_t *xs;
	json_t *manifest;
};

#define ES_CV_FORMAT_SPELLINGS "mxfp4, nvfp4, e2m1-g32, e2m1-g128 (e2m1-g<N>, N " \
	"even), fp8 (block 128; fp8-b<N>), bf16, f32"

/*
 * Every function below that takes a struct conv reports a failure as a
 * negative errno-style code with c->diag set (what failed and what to do);
 * the others say how they fail.
 */

/* --- es_convert.c: the driver ------------------------------------------ */

/* Adds `bytes` (checkpoint bytes read) to the progress and reports it
 * through opts.progress; -ECANCELED when the caller asked to stop
 * (opts.cancel), so the writer unwinds and removes its temporary dir. */
int es_cv_progress(struct conv *c, uint64_t bytes);

/* Checks tensor t against the expected [rows, cols] (cols 0: a vector);
 * -ST_E_FORMAT naming the tensor and both shapes when they differ. */
int es_cv_check_shape(struct conv *c, const struct st_tensor_info *t,
		      int64_t rows, int64_t cols);

/* 1 if dt is a float dtype the writer converts (F32, F16, BF16), else 0. */
int es_cv_float_dtype(enum st_dtype dt);

/* Resolves every layer's format (opts, --keep-layers) and record layout
 * into c->layers and c->record_bytes. */
int es_cv_plan_layers(struct conv *c);

/* --- es_convert_opts.c ------------------------------------------------- */

/* The default format of opts into *ret, its group filled in when 0;
 * -EINVAL for a dtype / group pair that is no format. */
int es_cv_default_format(const struct es_convert_opts *o,
			 struct st_wformat *ret);

/*
 * The scale search a matrix of format dt really gets: the 4-bit formats
 * search (measured on kjv-moe valid-small it removes 35-68 % of their
 * perplexity cost); FP8 keeps the plain amax/448 scale, because there the
 * search lowers the weight RMS error but raised perplexity (25.5850 ->
 * 25.6527): with 3 mantissa bits FP8's relative precision hardly depends on
 * the scale, so the search only clips the largest weights.
 */
enum st_scale_search es_cv_effective_search(enum st_dtype dt,
					    enum st_scale_search ss);

/* --- es_convert_check.c: phase 1, Hugging Face families ---------------- */

/* Finds gate / up / down of every (layer, expert) in the checkpoint
 * (c->experts, c->is_expert) and checks their shapes and dtypes. */
int es_cv_check_experts(struct conv *c);

/* Finds every dense role the family needs (embedding, norms, attention,
 * router, LM head, shared experts) and checks shapes and dtypes; marks the
 * attention and shared-expert tensors (c->is_attn, c->is_shexp). */
int es_cv_check_dense(struct conv *c);

/* The files es_cv_copied_files names: required ones present and regular
 * (c->have_copied says which optional ones are). */
int es_cv_check_copied_files(struct conv *c);

/* The tokenizer must load as computed will load it: a broken one is
 * refused here, not met by the first request.  Ids beyond the
 * embedding's vocab_size rows only warn: small test models keep a large
 * model's tokenizer, and computed refuses such an id in a prompt. */
int es_cv_check_tokenizer(struct conv *c);

/* Every float tensor of the checkpoint holds finite values: a NaN or an
 * infinity (a damaged download or export) would make every token's
 * logits NaN, so the tensor, its file and the element are named. */
int es_cv_check_finite(struct conv *c);

/* --- es_convert_dsv.c: phase 1, the DeepSeek-V4 family ----------------- */

/* Phase 1 for a DeepSeek-V4-family checkpoint (config text already in
 * c->config_text): V4 (v41 0), or V4.1 (v41 1: the V4 lossless path with
 * the V4.1 geometry, plus the Engram tables and hash,
 * es_convert_engram.c). */
int es_cv_check_all_dsv(struct conv *c, int v41);

/* Checkpoint bytes of the Engram tables (for progress; 0 without). */
uint64_t es_cv_engram_bytes(const struct conv *c);

/* The manifest's "skipped" list: the groups of checkpoint tensors a V4.1
 * store leaves out, with their counts; -ENOMEM only. */
int es_cv_skipped_json(struct conv *c);

/* --- es_convert_dense.c: phase 2, dense.bin ---------------------------- */

/* The dtype checkpoint tensor i is written in: as the checkpoint has it
 * for V4; --attention for q/k/v/o and --shared-experts bf16|f32 when set;
 * else the store's dense dtype. */
enum st_dtype es_cv_dense_out_dtype(const struct conv *c, int i);

/* 1 if checkpoint tensor `name` is a matrix stored as FP8 with
 * --dense fp8 (attention projections and LM head) or --shared-experts fp8
 * (the shared experts' matrices), with its shape in *ret_rows, *ret_cols
 * (elements); else 0. */
int es_cv_dense_fp8_matrix(struct conv *c, const char *name, int64_t *ret_rows,
			   int64_t *ret_cols);

/* Writes dense.bin into the temporary directory and its manifest entry. */
int es_cv_write_dense(struct conv *c);

/* --- es_convert_experts.c: phase 2, experts-LLL.bin -------------------- */

/* Writes every layer's experts-LLL.bin and the manifest's "experts". */
int es_cv_write_experts(struct conv *c);

/* --- es_convert_out.c: files, manifest, publish ------------------------ */

/* Resolves OUT (c->out, c->parent, c->base), removes what dead converts
 * left beside it, refuses an existing OUT without opts.force (or one that
 * is not a store nor empty) and creates the temporary directory c->tmp;
 * *ret_exists: OUT exists and will be replaced at publish. */
int es_cv_prepare_out(struct conv *c, const char *out_dir, int *ret_exists);

/* pwrite of all len bytes at byte offset off (retried on EINTR and short
 * writes); 0 or -errno. */
int es_cv_pwrite_full(int fd, const void *buf, size_t len, uint64_t off);

/* Creates c->tmp/name (exclusive) for writing into *ret_fd (the caller
 * closes it with es_cv_finish_out_file). */
int es_cv_create_out_file(struct conv *c, const char *name, int *ret_fd);

/* fsync + close, reporting either failure (a write error may only show at
 * fsync time on some file systems). */
int es_cv_finish_out_file(struct conv *c, int fd, const char *name);

/* Sets c->diag for write error r (negative errno) on c->tmp/name;
 * returns r. */
int es_cv_write_error(struct conv *c, int r, const char *name);

/* x as 16 lowercase hex digits into buf; returns buf. */
char *es_cv_hex64(uint64_t x, char buf[17]);

/* json_object_set_new / json_array_append_new that take ownership of v
 * and report allocation failure (of v, or of the set) as -ENOMEM. */
int es_cv_jset(json_t *o, const char *key, json_t *v);
int es_cv_jappend(json_t *a, json_t *v);
/* o[key] = x as a 16-digit hex string / as an integer; 0 or -ENOMEM. */
int es_cv_jset_hex(json_t *o, const char *key, uint64_t x);
int es_cv_jset_int(json_t *o, const char *key, uint64_t x);

/* Copies the es_cv_copied_files present into c->tmp, each with an entry
 * (name, size, XXH3) appended to arr. */
int es_cv_copy_files(struct conv *c, json_t *arr);

/* The manifest's head (format, version, writer, config, source files)
 * into c->manifest; -ENOMEM without a message (the caller sets it), or
 * -ST_E_FORMAT with c->diag set when config.json is not valid UTF-8. */
int es_cv_manifest_head(struct conv *c);

/* Writes c->manifest as c->tmp/manifest.json (fixed key order). */
int es_cv_write_manifest(struct conv *c);

/* fsync of directory dir. */
int es_cv_fsync_dir(struct conv *c, const char *dir);

/* Phase 3: renames c->tmp to OUT (an atomic exchange with the old store
 * when exists) and fsyncs the parent. */
int es_cv_publish(struct conv *c, int exists);

#endif

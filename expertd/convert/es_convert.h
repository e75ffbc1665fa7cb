/*
 * es_convert.h — the store writer behind `strata convert`: turns a Hugging
 * Face checkpoint (config.json + safetensors) into a strata store
 * (format: common/st_store.h).
 *
 * The conversion checks everything before it writes anything (config,
 * every expected tensor with its shape and dtype, tokenizer files), writes
 * into a private temporary directory next to the output
 * (OUT.tmp-<pid>), fsyncs every file and the directory, and only then
 * renames it to OUT.  So an interrupted convert never leaves a half store
 * under OUT, an existing store is never touched unless `force` is set (and
 * then replaced atomically), and the temporary directory of a convert that
 * was killed is removed by the next convert into the same OUT.
 */
#ifndef ES_CONVERT_H
#define ES_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_formats.h"

/*
 * Progress of a conversion: `done_bytes` of `total_bytes` processed, where
 * the bytes are those of the checkpoint tensors and copied files read so
 * far (total_bytes is fixed for the whole run; done_bytes only grows).
 * Called with (0, total) at the start, after every dense tensor, every
 * expert record and every copied file, and with (total, total) at the end,
 * from the converting thread.
 */
typedef void (*es_convert_progress_fn)(uint64_t done_bytes,
				       uint64_t total_bytes, void *arg);

/* A per-layer override of the expert format ("--keep first,last=fp8"):
 * layers lo..hi (inclusive) get fmt.  lo and hi are layer numbers, or both
 * ES_KEEP_FIRST (layer 0) or both ES_KEEP_LAST (the model's last layer). */
#define ES_KEEP_FIRST (-1)
#define ES_KEEP_LAST (-2)
#define ES_CONVERT_MAX_KEEP 64

struct es_keep_rule {
	int lo, hi;
	struct st_wformat fmt;
};

struct es_convert_opts {
	/* Expert format of every layer no keep rule names: its dtype
	 * (ST_DTYPE_MXFP4 (default), ST_DTYPE_NVFP4, ST_DTYPE_E2M1_F16,
	 * ST_DTYPE_F8_E4M3 (FP8 with FP32 block scales), ST_DTYPE_BF16,
	 * ST_DTYPE_F32) and its group / block size along a row (0: the
	 * format's own or default one: MXFP4 32, NVFP4 16, E2M1 32, FP8 128).
	 * Note ST_DTYPE_F32 is 0: start from es_convert_opts_init() (or
	 * ES_CONVERT_OPTS_DEFAULT), not from a zeroed struct, to get the
	 * default.  es_convert_parse_experts() sets both from a spelling. */
	enum st_dtype expert_dtype;
	uint32_t expert_group;
	/* Per-layer overrides, applied in order (a later rule wins);
	 * es_convert_parse_keep() appends them from a spec. */
	int n_keep;
	struct es_keep_rule keep[ES_CONVERT_MAX_KEEP];
	/* 0: dense tensors in BF16 if every dense tensor of the checkpoint is
	 * BF16, else F32.  1: always F32. */
	int dense_f32;
	/* How block / group scales of the expert formats are chosen:
	 * ST_SCALE_SEARCH_NONE (default): the plain amax scale;
	 * ST_SCALE_SEARCH_MSE: per block, the scale with the lowest squared
	 * reconstruction error (st_*_quantize_row_mse in st_formats.h).
	 * Recorded per matrix in the manifest ("scale_search") and in
	 * experts.policy.  es_convert_parse_scale_search() sets it. */
	enum st_scale_search scale_search;
	/* ST_SCALE_SEARCH_CALIBRATED only (and required there): the
	 * activation statistics file (st_calib.h) of this checkpoint, made
	 * by `strata calibrate`.  Each expert matrix's search weights its
	 * errors by E[a_c^2] of its input channels; an expert with fewer
	 * than ST_CALIB_MIN_TOKENS calibration tokens gets the plain MSE
	 * search.  The manifest records experts.policy.calibration
	 * {stats_xxh3, model_id, text_xxh3, tokens, min_tokens,
	 * fallback_experts}.  Statistics of another model are refused. */
	const char *calib_path;
	/* Precision of the attention projections (q, k, v, o of every
	 * layer): ST_DTYPE_COUNT (default) as the other dense tensors,
	 * ST_DTYPE_BF16 or ST_DTYPE_F32 (es_convert_parse_attention).
	 * Recorded as experts.policy.attention (the dtype written). */
	enum st_dtype attention_dtype;
	/* Format asked for shared experts (--shared-experts), or
	 * shared_experts_set 0 (they follow the other dense tensors).
	 * Shared experts (Qwen2-MoE) are dense tensors in dense.bin:
	 * bf16, f32 or fp8 (block 128, with a NAME.scale tensor as
	 * --dense fp8); other formats are refused (-ST_E_UNSUPPORTED), and
	 * so is the option for models without shared experts (Mixtral,
	 * Qwen3-MoE) rather than ignored.  The manifest records
	 * experts.policy.shared_experts: "bf16", "f32", "fp8", or "none
	 * (the model has none)". */
	int shared_experts_set;
	struct st_wformat shared_experts;
	/* 1: replace an existing store at out_dir (only a directory holding a
	 * manifest.json, or an empty one); 0: refuse with -EEXIST. */
	int force;
	es_convert_progress_fn progress; /* may be NULL */
	void *progress_arg;
	/* When non-NULL and *cancel becomes non-zero (e.g. set from the
	 * progress callback on Ctrl-C), the conversion stops at the next
	 * record with -ECANCELED and removes its temporary directory. */
	const volatile int *cancel;
	/* ES_DENSE_FP8_ALL: the attention projections (q, k, v, o) and the
	 * LM head stored as FP8 E4M3 with one FP32 scale per row and block of
	 * ST_FP8_DEFAULT_BLOCK columns: tensor NAME holds the codes [rows,
	 * cols] (dtype F8_E4M3), tensor NAME.scale the scales [rows,
	 * ceil(cols / 128)] (F32), both in dense.bin (`strata convert
	 * --dense fp8`).  ES_DENSE_FP8_ATTENTION: q, k, v, o only (`strata
	 * convert --attention fp8`).  ES_DENSE_FP8_NONE: as dense_f32 says. */
	int dense_fp8;
};

enum { ES_DENSE_FP8_NONE = 0, ES_DENSE_FP8_ALL = 1, ES_DENSE_FP8_ATTENTION = 2 };

#define ES_CONVERT_OPTS_DEFAULT                                                \
	{ .expert_dtype = ST_DTYPE_MXFP4, .expert_group = 0, .n_keep = 0,      \
	  .dense_f32 = 0, .scale_search = ST_SCALE_SEARCH_NONE,                \
	  .calib_path = NULL, .attention_dtype = ST_DTYPE_COUNT,               \
	  .shared_experts_set = 0, .shared_experts = { ST_DTYPE_BF16, 0 },     \
	  .force = 0, .progress = NULL, .progress_arg = NULL,                  \
	  .cancel = NULL }

/* Fills *opts with the defaults (MXFP4 experts in every layer, automatic
 * dense dtype, no force, no progress). */
void es_convert_opts_init(struct es_convert_opts *opts);

/*
 * Sets the default expert format from its spelling (`strata convert
 * --experts NAME`): "mxfp4", "nvfp4", "e2m1-g32", "e2m1-g128" (any even
 * group "e2m1-g<N>"), "fp8" (block 128) or "fp8-b<N>", "bf16", "f32"
 * (st_wformat_parse).  Returns 0, or -EINVAL with diag listing the
 * spellings.
 */
int es_convert_parse_experts(const char *name, struct es_convert_opts *opts,
			     struct st_diag *diag);

/*
 * Sets opts->scale_search from its spelling (`strata convert
 * --scale-search none|mse`): "none" (plain amax scales) or "mse" (search
 * per block for the lowest squared error).  Returns 0, or -EINVAL with
 * diag listing the spellings (opts untouched).
 */
int es_convert_parse_scale_search(const char *name,
				  struct es_convert_opts *opts,
				  struct st_diag *diag);

/*
 * Sets opts->attention_dtype from `strata convert --attention NAME`:
 * "bf16", "f32", or "auto" (as the other dense tensors).  "fp8" is
 * refused with -ST_E_UNSUPPORTED: a store's dense.bin holds F32 / BF16
 * tensors only and computed has no FP8 dense kernels.  Other names:
 * -EINVAL.  diag says which spellings exist.
 */
int es_convert_parse_attention(const char *name, struct es_convert_opts *opts,
			       struct st_diag *diag);

/*
 * Sets the shared-expert format from `strata convert --shared-experts FMT`
 * (an expert format spelling).  Returns 0 or -EINVAL; es_convert refuses
 * it for models without shared experts and formats other than bf16, f32
 * and fp8 (block 128).
 */
int es_convert_parse_shared_experts(const char *name,
				    struct es_convert_opts *opts,
				    struct st_diag *diag);

/*
 * Appends the per-layer overrides of a keep spec (`strata convert --keep
 * SPEC`; may be called once per --keep, later rules win):
 *   SPEC   := GROUP [';' GROUP]...
 *   GROUP  := LAYERS '=' FORMAT
 *   LAYERS := ITEM [',' ITEM]...    ITEM := "first" | "last" | N | N-M
 * with layer numbers N <= M in decimal and FORMAT any spelling
 * es_convert_parse_experts takes (usually fp8, bf16 or f32: layers kept at
 * higher precision).  Example: "first,last=fp8", "0,5=bf16;3=fp8-b64".
 * Layer numbers are checked against the model by es_convert (-EINVAL
 * there).  Returns the number of rules appended, or -EINVAL (syntax, with
 * diag naming the offending part; nothing is appended) or -ST_E_LIMIT
 * (more than ES_CONVERT_MAX_KEEP rules in all).
 */
int es_convert_parse_keep(const char *spec, struct es_convert_opts *opts,
			  struct st_diag *diag);

/*
 * Whether a later keep rule overrides an earlier one with another format
 * for some layer of a model with n_layers layers (first / last resolved;
 * n_layers < 0: only explicit layer numbers compared).  Returns 0, or 1
 * with diag saying which layer, which rules and that the later wins
 * (strata convert prints it, so a repeated --keep-layers never wins
 * silently).
 */
int es_convert_keep_overrides(const struct es_convert_opts *opts,
			      int n_layers, struct st_diag *diag);

/*
 * Writes the keep rules of opts in canonical form (what the manifest
 * records as experts.policy.keep, readable by es_convert_parse_keep):
 * consecutive rules with the same format share one "=FORMAT", e.g.
 * "first,last=fp8;3=bf16"; "" when there are none.  Returns 0,
 * -ENAMETOOLONG (buf too small) or -EINVAL (an invalid rule), leaving ""
 * in buf on error.
 */
int es_convert_keep_str(const struct es_convert_opts *opts, char *buf,
			size_t len);

/*
 * The expert format of layer `layer` of a model with n_layers layers under
 * opts: the default, replaced by every keep rule that names the layer, in
 * order.  Returns 0, or -EINVAL (invalid default format or rule, a rule
 * naming a layer >= n_layers, layer out of range).
 */
int es_convert_layer_format(const struct es_convert_opts *opts, int n_layers,
			    int layer, struct st_wformat *ret);

/*
 * Runs every check of es_convert (options, config, keep rules against the
 * model's layers, tensors, calibration statistics against the checkpoint)
 * without writing anything, so a command can refuse bad options before it
 * starts converting.  Returns 0 or es_convert's error codes with diag.
 */
int es_convert_check(const char *model_dir, const struct es_convert_opts *opts,
		     struct st_diag *diag);

/*
 * Converts the checkpoint in model_dir into a store at out_dir.
 * opts may be NULL (defaults).  Returns 0, or a negative code with diag
 * naming the file / tensor / problem:
 *   the codes of st_config_load and st_checkpoint_open (config.json
 *   missing or unsupported: -ENOENT, -ST_E_UNSUPPORTED naming the
 *   architecture, -ST_E_CONFIG, -ST_E_FORMAT),
 *   -ST_E_NOTFOUND  an expected tensor (named) is missing, or
 *                   tokenizer.json / tokenizer_config.json is absent,
 *   -ST_E_FORMAT    a tensor's shape differs from what config.json implies
 *                   (shape found vs expected), or an expert-like tensor the
 *                   config does not account for,
 *   -ST_E_UNSUPPORTED a tensor dtype other than F32/F16/BF16, a format
 *                   the matrix widths do not fit (MXFP4 / NVFP4: a
 *                   multiple of 32 / 16; E2M1: even),
 *   -EEXIST         out_dir exists and force is 0 (or it is not a store),
 *   -EINVAL         bad options (an invalid format, a keep rule naming a
 *                   layer the model does not have),
 *   -errno          creating, writing, syncing or renaming files (EACCES,
 *                   ENOSPC, EROFS, ...), naming the path.
 * On failure out_dir is as it was before the call and the temporary
 * directory is removed.
 * A DeepSeek-V4 checkpoint (config model_type "deepseek_v4") takes its own
 * path: stored losslessly (st_store.h: MXFP4 expert records byte for byte,
 * dense tensors in their checkpoint dtypes F8_E4M3 / F8_E8M0 / BF16 / F32
 * / I64, mtp.* skipped); options that would change a format (--experts
 * other than mxfp4, --keep, --scale-search, --calibrate, --attention,
 * --dense, --shared-experts) give -ST_E_UNSUPPORTED.
 */
int es_convert(const char *model_dir, const char *out_dir,
	       const struct es_convert_opts *opts, struct st_diag *diag);

#endif

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

struct es_convert_opts {
	/* Expert record format: ST_DTYPE_MXFP4 (default), ST_DTYPE_BF16 or
	 * ST_DTYPE_F32.  Note ST_DTYPE_F32 is 0: start from
	 * es_convert_opts_init() (or ES_CONVERT_OPTS_DEFAULT), not from a
	 * zeroed struct, to get the default. */
	enum st_dtype expert_dtype;
	/* 0: dense tensors in BF16 if every dense tensor of the checkpoint is
	 * BF16, else F32.  1: always F32. */
	int dense_f32;
	/* 1: replace an existing store at out_dir (only a directory holding a
	 * manifest.json, or an empty one); 0: refuse with -EEXIST. */
	int force;
	es_convert_progress_fn progress; /* may be NULL */
	void *progress_arg;
	/* When non-NULL and *cancel becomes non-zero (e.g. set from the
	 * progress callback on Ctrl-C), the conversion stops at the next
	 * record with -ECANCELED and removes its temporary directory. */
	const volatile int *cancel;
};

#define ES_CONVERT_OPTS_DEFAULT                                                \
	{ .expert_dtype = ST_DTYPE_MXFP4, .dense_f32 = 0, .force = 0,          \
	  .progress = NULL, .progress_arg = NULL, .cancel = NULL }

/* Fills *opts with the defaults (MXFP4 experts, automatic dense dtype, no
 * force, no progress). */
void es_convert_opts_init(struct es_convert_opts *opts);

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
 *   -ST_E_UNSUPPORTED a tensor dtype other than F32/F16/BF16, MXFP4 with
 *                   a width not a multiple of 32,
 *   -EEXIST         out_dir exists and force is 0 (or it is not a store),
 *   -EINVAL         bad options,
 *   -errno          creating, writing, syncing or renaming files (EACCES,
 *                   ENOSPC, EROFS, ...), naming the path.
 * On failure out_dir is as it was before the call and the temporary
 * directory is removed.
 */
int es_convert(const char *model_dir, const char *out_dir,
	       const struct es_convert_opts *opts, struct st_diag *diag);

#endif

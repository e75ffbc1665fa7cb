/*
 * es_convert.c — the store writer: checkpoint -> strata store (see
 * es_convert.h for the contract, common/st_store.h for the format).
 *
 * Three phases:
 *  1. check: config, every expert matrix and every dense role with its
 *     shape and dtype, tokenizer files (loaded as computed loads them),
 *     every float weight finite; nothing is written before all pass;
 *  2. write into OUT.tmp-<pid>: dense.bin, experts-LLL.bin, the copied
 *     files, manifest.json last; every file fsynced, then the directory;
 *  3. publish: rename the temporary directory to OUT (atomic exchange with
 *     an existing store under force), fsync the parent.
 * The output depends only on the checkpoint and the options: tensors in the
 * checkpoint's (name-sorted) order, zero padding, a manifest with a fixed
 * key order and no times or absolute paths.
 *
 * This file is the driver (the phases in order, progress, shape checks);
 * the work of each phase lives beside it: es_convert_opts.c (options and
 * per-layer formats), es_convert_check.c (phase 1 for the Hugging Face
 * families), es_convert_dsv.c (phase 1 for the DeepSeek-V4 family),
 * es_convert_dense.c and es_convert_experts.c (phase 2's data files),
 * es_convert_out.c (the output directory, copied files, manifest and
 * phase 3), es_convert_engram.c (V4.1's Engram tables).
 */
#include "es_convert_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_gptq.h"
#include "st_log.h"

const char *const es_cv_mat_names[3] = { "gate", "up", "down" };

const struct es_cv_copied es_cv_copied_files[ES_CV_N_COPIED] = {
	{ "config.json", 1 },
	{ "generation_config.json", 0 },
	{ "tokenizer.json", 1 },
	{ "tokenizer_config.json", 1 },
};

int es_cv_progress(struct conv *c, uint64_t bytes)
{
	c->done += bytes;
	if (c->o.progress)
		c->o.progress(c->done, c->total, c->o.progress_arg);
	if (c->o.cancel && *c->o.cancel)
		return st_diag_set(c->diag, -ECANCELED, "convert interrupted; "
				   "nothing was written to the output");
	return 0;
}

/* "[a, b, c]" */
static const char *shape_str(int n_dims, const int64_t *shape, char *buf,
			     size_t len)
{
	size_t at = 0;

	at += (size_t)snprintf(buf, len, "[");
	for (int d = 0; d < n_dims && at < len; d++)
		at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64,
				       d ? ", " : "", shape[d]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
	return buf;
}

int es_cv_check_shape(struct conv *c, const struct st_tensor_info *t,
		       int64_t rows, int64_t cols)
{
	int64_t want[2] = { rows, cols };
	int want_dims = cols ? 2 : 1;
	char got_s[128], want_s[64];

	if (t->n_dims == want_dims && t->shape[0] == rows &&
	    (want_dims == 1 || t->shape[1] == cols))
		return 0;
	return st_diag_set(c->diag, -ST_E_FORMAT,
			   "checkpoint %s: tensor %s has shape %s, config.json "
			   "implies %s", c->model_dir, t->name,
			   shape_str(t->n_dims, t->shape, got_s, sizeof(got_s)),
			   shape_str(want_dims, want, want_s, sizeof(want_s)));
}

int es_cv_float_dtype(enum st_dtype dt)
{
	return dt == ST_DTYPE_F32 || dt == ST_DTYPE_F16 || dt == ST_DTYPE_BF16;
}

/* --- entry --------------------------------------------------------------- */

int es_cv_plan_layers(struct conv *c)
{
	const int L = c->cfg.n_layers;
	char keep[4096];
	int r;

	if (es_convert_keep_str(&c->o, keep, sizeof(keep)))
		return st_diag_set(c->diag, -EINVAL, "keep rules: invalid or "
				   "too long");
	c->layers = calloc((size_t)L, sizeof(*c->layers));
	if (!c->layers)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	for (int l = 0; l < L; l++) {
		struct st_wformat f, fm[3];
		char name[ST_WFORMAT_NAME_MAX];
		struct st_diag d = { { 0 } };

		if (es_convert_layer_format(&c->o, L, l, &f))
			return st_diag_set(c->diag, -EINVAL, "--keep %s: a rule "
					   "names a layer the model does not have "
					   "(%d layers: 0-%d)", keep, L, L - 1);
		fm[0] = fm[1] = fm[2] = f;
		r = st_store_layout(&c->cfg, fm, c->layers[l].mat,
				    &c->layers[l].record_bytes, &d);
		if (r) {
			st_wformat_name(&f, name, sizeof(name));
			return st_diag_set(c->diag, r, "layer %d (%s): %s", l,
					   name, d.msg);
		}
		/* MXFP4 is written row-interleaved (st_mxfp4il.h) where the
		 * rows allow it; lossless V4 records keep the checkpoint's
		 * row-major bytes */
		for (int m = 0; m < 3; m++) {
			struct st_store_matrix *x = &c->layers[l].mat[m];

			if (!c->dsv4 && x->fmt.dtype == ST_DTYPE_MXFP4 &&
			    x->cols % 32 == 0)
				x->il_rows = ST_MXFP4IL_ROWS;
		}
		c->record_bytes = ST_MAX(c->record_bytes,
					 c->layers[l].record_bytes);
	}
	return 0;
}

/* A scale search only applies to the 4-bit formats (effective_search):
 * asking for one when no layer has such a format changes nothing, so it
 * is refused rather than recorded. */
static int check_search_applies(struct conv *c)
{
	if (c->o.scale_search == ST_SCALE_SEARCH_NONE)
		return 0;
	for (int l = 0; l < c->cfg.n_layers; l++)
		if (es_cv_effective_search(c->layers[l].mat[0].fmt.dtype,
				     c->o.scale_search) != ST_SCALE_SEARCH_NONE)
			return 0;
	return st_diag_set(c->diag, -EINVAL, "--scale-search %s changes "
			   "nothing here: only the 4-bit expert formats (mxfp4, "
			   "nvfp4, e2m1-g<N>) search their scales, and no layer "
			   "has one; drop the option",
			   st_scale_search_name(c->o.scale_search));
}

/* Reads opts.calib_path and checks it belongs to this checkpoint. */
static int load_calibration(struct conv *c)
{
	const struct st_model_config *m = &c->cfg;
	uint64_t id;
	int r = st_calib_read(c->o.calib_path, &c->cal, &c->cal_file_xxh3,
			      c->diag);

	if (r)
		return r;
	if (c->cal.n_layers != (uint32_t)m->n_layers ||
	    c->cal.n_experts != (uint32_t)m->n_experts ||
	    c->cal.hidden != (uint32_t)m->hidden_size ||
	    c->cal.inter != (uint32_t)m->expert_inter)
		return st_diag_set(c->diag, -EINVAL, "%s: statistics of a model "
				   "with %u layers, %u experts, hidden %u, expert "
				   "width %u; this one has %d, %d, %d, %d: "
				   "run strata calibrate for this model",
				   c->o.calib_path, c->cal.n_layers,
				   c->cal.n_experts, c->cal.hidden, c->cal.inter,
				   m->n_layers, m->n_experts, m->hidden_size,
				   m->expert_inter);
	id = st_calib_model_id(c->ck, c->config_text, c->config_len);
	if (id != c->cal.model_id)
		return st_diag_set(c->diag, -EINVAL, "%s: statistics of another "
				   "model (model id %016llx, this checkpoint "
				   "%016llx: other config or router weights): "
				   "run strata calibrate --model %s",
				   c->o.calib_path,
				   (unsigned long long)c->cal.model_id,
				   (unsigned long long)id, c->model_dir);
	if (c->o.scale_search == ST_SCALE_SEARCH_GPTQ && !c->cal.sum_xx)
		return st_diag_set(c->diag, -EINVAL, "%s: statistics without the "
				   "second-moment matrices GPTQ needs: run "
				   "strata calibrate --covariance",
				   c->o.calib_path);
	c->cal_w = malloc(sizeof(float) *
			  (size_t)ST_MAX(m->hidden_size, m->expert_inter));
	if (!c->cal_w)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if (c->o.scale_search == ST_SCALE_SEARCH_GPTQ) {
		size_t big = (size_t)ST_MAX(m->hidden_size, m->expert_inter);

		c->gptq_w = malloc(sizeof(float) * (size_t)m->hidden_size *
				   (size_t)m->expert_inter);
		c->gptq_h = malloc(sizeof(double) * big * big);
		if (!c->gptq_w || !c->gptq_h)
			return st_diag_set(c->diag, -ENOMEM, "out of memory "
					   "for GPTQ");
	}
	for (uint32_t i = 0; i < c->cal.n_layers * c->cal.n_experts; i++)
		if (c->cal.count[i] < ST_CALIB_MIN_TOKENS)
			c->cal_fallback++;
	return 0;
}

static int check_all(struct conv *c)
{
	char path[4200];
	int r;

	if (!st_scale_search_name(c->o.scale_search))
		return st_diag_set(c->diag, -EINVAL, "scale search %d: not "
				   "none (0), mse (1) or calibrated (2)",
				   (int)c->o.scale_search);
	if ((c->o.scale_search == ST_SCALE_SEARCH_CALIBRATED ||
	     c->o.scale_search == ST_SCALE_SEARCH_GPTQ) !=
	    (c->o.calib_path != NULL))
		return st_diag_set(c->diag, -EINVAL, c->o.calib_path ?
				   "--calibrate STATS goes with the calibrated "
				   "or gptq scale search, not with "
				   "--scale-search %s" :
				   "the %s scale search needs activation "
				   "statistics: --calibrate STATS (made by "
				   "strata calibrate)",
				   st_scale_search_name(c->o.scale_search));
	if (es_cv_default_format(&c->o, &c->def_fmt))
		return st_diag_set(c->diag, -EINVAL, "expert format (dtype %d, "
				   "group %u) is not one of " ES_CV_FORMAT_SPELLINGS,
				   (int)c->o.expert_dtype, c->o.expert_group);
	snprintf(path, sizeof(path), "%s/config.json", c->model_dir);
	if ((r = st_read_file(path, &c->config_text, &c->config_len)))
		return st_diag_set(c->diag, r, "%s: %s", path, strerror(-r));
	if (st_dsv_config_detect(c->config_text) == ST_DSV_REV_V41)
		return es_cv_check_all_dsv(c, 1);
	if (st_dsv_config_detect(c->config_text) == ST_DSV_REV_V4)
		return es_cv_check_all_dsv(c, 0);
	if ((r = st_config_load(c->model_dir, &c->cfg, c->diag)))
		return r;
	if (c->o.shared_experts_set && !c->cfg.shared_inter)
		return st_diag_set(c->diag, -ST_E_UNSUPPORTED, "--shared-experts: "
				   "this model (%s) has no shared experts; the "
				   "option is for models that have them "
				   "(Qwen2-MoE): drop it",
				   st_arch_name(c->cfg.arch));
	if (c->o.shared_experts_set &&
	    c->o.shared_experts.dtype != ST_DTYPE_BF16 &&
	    c->o.shared_experts.dtype != ST_DTYPE_F32 &&
	    !(c->o.shared_experts.dtype == ST_DTYPE_F8_E4M3 &&
	      c->o.shared_experts.group == ST_FP8_DEFAULT_BLOCK))
		return st_diag_set(c->diag, -ST_E_UNSUPPORTED, "--shared-experts: "
				   "shared experts are dense tensors (dense.bin, "
				   "read by every token), which computed "
				   "reads in bf16, f32 or fp8 (block 128) only; "
				   "use one of those");
	if (c->o.attention_dtype != ST_DTYPE_COUNT &&
	    c->o.attention_dtype != ST_DTYPE_BF16 &&
	    c->o.attention_dtype != ST_DTYPE_F32)
		return st_diag_set(c->diag, -EINVAL, "attention dtype %d: not "
				   "BF16 or F32", (int)c->o.attention_dtype);
	if ((r = es_cv_plan_layers(c)))
		return r;
	if ((r = check_search_applies(c)))
		return r;
	if ((r = st_checkpoint_open(c->model_dir, &c->ck, c->diag)))
		return r;
	if (c->o.calib_path && (r = load_calibration(c)))
		return r;
	c->is_expert = calloc((size_t)c->ck->n_tensors + 1, 1);
	c->is_attn = calloc((size_t)c->ck->n_tensors + 1, 1);
	c->is_shexp = calloc((size_t)c->ck->n_tensors + 1, 1);
	if (!c->is_expert || !c->is_attn || !c->is_shexp)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if ((r = es_cv_check_experts(c)) || (r = es_cv_check_dense(c)) ||
	    (r = es_cv_check_copied_files(c)) || (r = es_cv_check_tokenizer(c)) ||
	    (r = es_cv_check_finite(c)))
		return r;
	for (int i = 0; i < c->ck->n_tensors; i++)
		c->total += c->ck->tensors[i].n_bytes;
	return 0;
}

static int write_all(struct conv *c)
{
	json_t *files;
	int r;

	c->manifest = json_object();
	c->xs = XXH3_createState();
	if (!c->manifest || !c->xs)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if ((r = es_cv_manifest_head(c)))
		return r == -ENOMEM ? st_diag_set(c->diag, r, "out of memory") : r;
	files = json_object_get(c->manifest, "files");
	if ((r = es_cv_copy_files(c, files)) || (r = es_cv_write_dense(c)) ||
	    (r = es_cv_write_experts(c)))
		return r;
	if (c->dsv41 &&
	    ((r = es_engram_write(&c->engram, c->ck, c->tmp, c->manifest, files,
				  c->diag)) ||
	     (r = es_cv_progress(c, es_cv_engram_bytes(c))) || (r = es_cv_skipped_json(c))))
		return r == -ENOMEM ? st_diag_set(c->diag, r, "out of memory") : r;
	if ((r = es_cv_write_manifest(c)) ||
	    (r = es_cv_fsync_dir(c, c->tmp)))
		return r;
	return 0;
}

static void conv_free(struct conv *c)
{
	json_decref(c->manifest);
	XXH3_freeState(c->xs);
	free(c->experts);
	free(c->v4_scales);
	es_engram_plan_fini(&c->engram);
	free(c->layers);
	free(c->is_expert);
	free(c->is_attn);
	free(c->is_shexp);
	free(c->config_text);
	free(c->cal_w);
	free(c->gptq_w);
	free(c->gptq_h);
	st_calib_free(&c->cal);
	st_checkpoint_close(c->ck);
}

int es_convert_check(const char *model_dir, const struct es_convert_opts *opts,
		     struct st_diag *diag)
{
	struct conv c = { .model_dir = model_dir, .diag = diag };
	int r;

	if (!model_dir)
		return st_diag_set(diag, -EINVAL, "convert: no model directory");
	if (opts)
		c.o = *opts;
	else
		es_convert_opts_init(&c.o);
	r = check_all(&c);
	conv_free(&c);
	return r;
}

int es_convert(const char *model_dir, const char *out_dir,
	       const struct es_convert_opts *opts, struct st_diag *diag)
{
	struct conv c = { .model_dir = model_dir, .diag = diag };
	int r, exists = 0, made_tmp = 0;

	if (!model_dir || !out_dir)
		return st_diag_set(diag, -EINVAL, "convert: no model or output "
				   "directory");
	if (opts)
		c.o = *opts;
	else
		es_convert_opts_init(&c.o);
	r = check_all(&c);
	if (!r)
		r = es_cv_prepare_out(&c, out_dir, &exists);
	if (!r) {
		made_tmp = 1;
		if (c.o.progress)
			c.o.progress(0, c.total, c.o.progress_arg);
		r = write_all(&c);
	}
	if (!r)
		r = es_cv_publish(&c, exists);
	if (made_tmp)
		st_rm_rf(c.tmp); /* on success: gone, or the replaced store */
	if (!r && c.o.progress)
		c.o.progress(c.total, c.total, c.o.progress_arg);
	conv_free(&c);
	return r;
}

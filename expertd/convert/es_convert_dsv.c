/*
 * es_convert_dsv.c — phase 1 of the store writer for the DeepSeek-V4
 * family (V4, and V4.1 as V4 plus its Engram tables and skipped groups):
 * the store is lossless, the checkpoint's own formats (FP8 E4M3 dense with
 * E8M0 block scales, MXFP4 experts), so the options that pick formats are
 * refused, and every tensor is checked against the official layout.
 */
#include "es_convert_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_log.h"

/* --- DeepSeek-V4: a lossless store of the official layout --------------- */

/* The V4 store keeps the checkpoint's own formats; options that would
 * change them are refused rather than ignored. */
static int check_opts_dsv4(struct conv *c)
{
	const char *what = NULL;

	if (c->def_fmt.dtype != ST_DTYPE_MXFP4)
		what = "--experts (the checkpoint's experts are MXFP4 "
		       "already and are kept as they are)";
	else if (c->o.n_keep)
		what = "--keep";
	else if (c->o.scale_search != ST_SCALE_SEARCH_NONE || c->o.calib_path)
		what = "--scale-search / --calibrate (nothing is quantized)";
	else if (c->o.attention_dtype != ST_DTYPE_COUNT || c->o.dense_f32 ||
		 c->o.dense_fp8)
		what = "--attention / --dense (dense tensors keep the "
		       "checkpoint's FP8, BF16 and F32)";
	else if (c->o.shared_experts_set)
		what = "--shared-experts (the shared expert stays FP8 in "
		       "dense.bin)";
	if (what)
		return st_diag_set(c->diag, -ST_E_UNSUPPORTED, "%s: a "
				   "DeepSeek-%s checkpoint is stored losslessly "
				   "in its own formats; drop %s", c->model_dir,
				   c->dsv41 ? "V4.1" : "V4", what);
	return 0;
}

/* Finds a V4 tensor and checks its dtype and 2-D shape. */
static int find_dsv4(struct conv *c, const char *name, enum st_dtype dt,
		     int64_t rows, int64_t cols,
		     const struct st_tensor_info **ret)
{
	const struct st_tensor_info *t = st_checkpoint_find(c->ck, name);

	if (!t)
		return st_diag_set(c->diag, -ST_E_NOTFOUND, "checkpoint %s: "
				   "tensor %s is missing", c->model_dir, name);
	if (t->dtype != dt)
		return st_diag_set(c->diag, -ST_E_FORMAT, "checkpoint %s: "
				   "tensor %s: dtype %s, expected %s",
				   c->model_dir, name,
				   st_dtype_traits(t->dtype)->name,
				   st_dtype_traits(dt)->name);
	*ret = t;
	return es_cv_check_shape(c, t, rows, cols);
}

/* Every routed expert: w1 / w3 / w2 as I8 [rows, cols / 2] packed E2M1
 * plus .scale F8_E8M0 [rows, cols / 32]; marks them as expert tensors.
 * The expert layers are the decoder layers' and, with c->v4_mtp, the MTP
 * block's (layer v4.n_layers, named mtp.0.ffn.experts.E.*). */
static int check_experts_dsv4(struct conv *c)
{
	static const char *const wname[3] = { "w1", "w3", "w2" };
	const int L = c->cfg.n_layers, E = c->cfg.n_experts;
	size_t n = (size_t)L * E * 3;

	c->experts = calloc(n, sizeof(*c->experts));
	c->v4_scales = calloc(n, sizeof(*c->v4_scales));
	if (!c->experts || !c->v4_scales)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	for (int l = 0; l < L; l++)
		for (int e = 0; e < E; e++)
			for (int m = 0; m < 3; m++) {
				const struct st_store_matrix *x =
					&c->layers[l].mat[m];
				size_t k = ((size_t)l * E + e) * 3 + m;
				char nm[300];
				int r;

				char pfx[32];

				if (l < c->v4.n_layers || c->dsv41)
					snprintf(pfx, sizeof(pfx), "layers.%d", l);
				else
					snprintf(pfx, sizeof(pfx), "mtp.%d",
						 l - c->v4.n_layers);
				snprintf(nm, sizeof(nm), "%s.ffn.experts."
					 "%d.%s.weight", pfx, e, wname[m]);
				if ((r = find_dsv4(c, nm, ST_DTYPE_I8, x->rows,
						   x->cols / 2, &c->experts[k])))
					return r;
				snprintf(nm, sizeof(nm), "%s.ffn.experts."
					 "%d.%s.scale", pfx, e, wname[m]);
				if ((r = find_dsv4(c, nm, ST_DTYPE_F8_E8M0,
						   x->rows, x->cols /
						   ST_MXFP4_BLOCK,
						   &c->v4_scales[k])))
					return r;
				c->is_expert[c->experts[k] - c->ck->tensors] = 1;
				c->is_expert[c->v4_scales[k] - c->ck->tensors] = 1;
				c->total += c->experts[k]->n_bytes;
			}
	return 0;
}

/* Dense tensors: V4's MTP block (mtp.*) kept with c->v4_mtp, else
 * skipped (marked like an expert tensor, so write_dense passes over it);
 * the rest must be BF16, F32, I64 or F8_E4M3 with a NAME.scale F8_E8M0
 * [ceil(rows / bo), ceil(cols / bi)] (bo, bi:
 * quantization_config.weight_block_size). */
static int check_dense_dsv4(struct conv *c)
{
	const int bo = c->v4.fp8_block[0], bi = c->v4.fp8_block[1];

	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i], *ts;
		char nm[600];
		size_t len = strlen(t->name);
		int r;

		if (c->is_expert[i])
			continue;
		if (c->dsv41) {
			const char *why;
			int grp;

			switch (es_v41_classify(t->name, c->cfg.n_layers, &grp,
						&why)) {
			case ES_V41_SKIP:
				c->is_expert[i] = 2;
				c->skipped[grp]++;
				continue;
			case ES_V41_REFUSE:
				return st_diag_set(c->diag, -ST_E_FORMAT,
						   "checkpoint %s: tensor %s: %s; "
						   "strata does not convert it",
						   c->model_dir, t->name, why);
			default:
				break;
			}
		}
		if (!strncmp(t->name, "mtp.", 4) &&
		    (!c->v4_mtp || strncmp(t->name, "mtp.0.", 6))) {
			c->is_expert[i] = 2;
			continue;
		}
		if (strstr(t->name, ".experts."))
			return st_diag_set(c->diag, -ST_E_FORMAT, "checkpoint %s: "
					   "tensor %s looks like an expert matrix, "
					   "but config.json has %d layers of %d "
					   "experts", c->model_dir, t->name,
					   c->cfg.n_layers, c->cfg.n_experts);
		if (t->n_dims > 4)
			return st_diag_set(c->diag, -ST_E_UNSUPPORTED,
					   "checkpoint %s: tensor %s has %d "
					   "dimensions (at most 4)", c->model_dir,
					   t->name, t->n_dims);
		c->total += t->n_bytes;
		switch (t->dtype) {
		case ST_DTYPE_BF16: case ST_DTYPE_F32: case ST_DTYPE_I64:
			continue;
		case ST_DTYPE_F8_E8M0: /* checked with its weight */
			if (len > 6 && !strcmp(t->name + len - 6, ".scale"))
				continue;
			break;
		case ST_DTYPE_F8_E4M3:
			if (t->n_dims != 2 || len < 7 ||
			    strcmp(t->name + len - 7, ".weight"))
				break;
			snprintf(nm, sizeof(nm), "%.*s.scale", (int)(len - 7),
				 t->name);
			if ((r = find_dsv4(c, nm, ST_DTYPE_F8_E8M0,
					   (t->shape[0] + bo - 1) / bo,
					   (t->shape[1] + bi - 1) / bi, &ts)))
				return r;
			continue;
		default:
			break;
		}
		return st_diag_set(c->diag, -ST_E_UNSUPPORTED, "checkpoint %s: "
				   "tensor %s: dtype %s where a DeepSeek-V4 "
				   "checkpoint has BF16, F32, I64 or FP8 (E4M3 "
				   ".weight with an E8M0 .scale)", c->model_dir,
				   t->name, st_dtype_traits(t->dtype)->name);
	}
	return 0;
}

/* Parses the config of revision V4 (v41 0) or V4.1 (v41 1) into c->v4 /
 * c->v41 and c->cfg (the expert geometry plan_layers reads). */
static int parse_config_dsv(struct conv *c, int v41)
{
	char path[4200];
	int r;

	snprintf(path, sizeof(path), "%s/config.json", c->model_dir);
	c->dsv4 = 1;
	c->dsv41 = v41;
	if (!v41) {
		if ((r = st_dsv_config_parse(c->config_text, path,
					     ST_DSV_REV_V4, &c->v4,
					      c->diag)))
			return r;
		st_dsv_expert_config(&c->v4, &c->cfg);
		return 0;
	}
	if ((r = st_dsv_config_parse(c->config_text, path,
				     ST_DSV_REV_V41, &c->v41,
				       c->diag)) ||
	    (r = st_dsv41_config_check_store(&c->v41, path, c->diag)))
		return r;
	st_dsv_expert_config(&c->v41, &c->cfg);
	/* the dense checks read the FP8 block from the V4 config */
	c->v4.fp8_block[0] = c->v41.fp8_block[0];
	c->v4.fp8_block[1] = c->v41.fp8_block[1];
	return 0;
}

uint64_t es_cv_engram_bytes(const struct conv *c)
{
	uint64_t n = 0;

	for (int i = 0; i < c->engram.n; i++)
		n += c->engram.weight[i]->n_bytes + c->engram.scale[i]->n_bytes;
	return n;
}

int es_cv_check_all_dsv(struct conv *c, int v41)
{
	int r;

	if ((r = parse_config_dsv(c, v41)) || (r = check_opts_dsv4(c)) ||
	    (r = st_checkpoint_open(c->model_dir, &c->ck, c->diag)))
		return r;
	/* V4's MTP block (the first, window-only one, as released): its
	 * experts become one more expert layer */
	if (!v41 && c->v4.n_nextn > 0 && c->v4.nextn_ratio == 0 &&
	    st_checkpoint_find(c->ck, "mtp.0.e_proj.weight")) {
		c->v4_mtp = 1;
		c->cfg.n_layers = c->v4.n_layers + 1;
	} else if (!v41) {
		/* mtp.* tensors but no usable block: said, not silent */
		for (int i = 0; i < c->ck->n_tensors; i++)
			if (!strncmp(c->ck->tensors[i].name, "mtp.", 4)) {
				st_warn("%s: the MTP block is not kept (%s); the store drafts without it (--speculate mtp refused)",
					c->model_dir,
					c->v4.n_nextn < 1 ?
						"config.json has num_nextn_predict_layers 0" :
					c->v4.nextn_ratio != 0 ?
						"its compress ratio is not 0" :
						"mtp.0.e_proj.weight is missing");
				break;
			}
	}
	if ((r = es_cv_plan_layers(c)))
		return r;
	c->is_expert = calloc((size_t)c->ck->n_tensors + 1, 1);
	c->is_attn = calloc((size_t)c->ck->n_tensors + 1, 1);
	if (!c->is_expert || !c->is_attn)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if ((r = check_experts_dsv4(c)))
		return r;
	/* V4.1: the Engram tables, found before the dense checks so that
	 * they do not take them for unknown tensors */
	if (v41 && (r = es_engram_check(c->ck, &c->v41, c->model_dir,
					c->is_expert, &c->engram, c->diag)))
		return r;
	if ((r = check_dense_dsv4(c)))
		return r;
	c->total += es_cv_engram_bytes(c);
	if ((r = es_cv_check_copied_files(c)) || (r = es_cv_check_tokenizer(c)))
		return r;
	return es_cv_check_finite(c);
}

int es_cv_skipped_json(struct conv *c)
{
	json_t *arr = json_array();
	int r = es_cv_jset(c->manifest, "skipped", arr);

	for (int g = 0; g < ES_V41_N_SKIP && !r; g++) {
		json_t *o = json_object();

		if (!(r = es_cv_jappend(arr, o)) &&
		    !(r = es_cv_jset(o, "tensors", json_string(es_v41_skip_name(g)))) &&
		    !(r = es_cv_jset_int(o, "count", (uint64_t)c->skipped[g])))
			r = es_cv_jset(o, "why", json_string(es_v41_skip_why(g)));
	}
	return r;
}

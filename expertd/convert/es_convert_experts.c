/*
 * es_convert_experts.c — phase 2 of the store writer: experts-LLL.bin,
 * one 4 KiB-aligned record per (layer, expert) holding gate, up and down
 * in the layer's format (quantized row by row, with the scale search the
 * options ask for; MXFP4 rewritten row-interleaved), and the manifest's
 * "experts" object.
 */
#include "es_convert_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_gptq.h"

/* --- phase 2: expert files ----------------------------------------------- */

/* Largest finite |x| of checkpoint tensor t (rows x cols), for the NVFP4
 * per-tensor scale. */
static int tensor_amax(const struct st_tensor_info *t, const uint8_t *src,
		       int64_t rows, size_t cols, float *row, float *ret)
{
	size_t es = st_dtype_traits(t->dtype)->block_bytes;
	float amax = 0.0f;

	for (int64_t i = 0; i < rows; i++) {
		int r = st_convert_to_f32(t->dtype, src + (size_t)i * cols * es,
					  cols, row);

		if (r)
			return r;
		for (size_t j = 0; j < cols; j++)
			if (isfinite(row[j]) && fabsf(row[j]) > amax)
				amax = fabsf(row[j]);
	}
	*ret = amax;
	return 0;
}

/* Quantizes / converts row i of a matrix (row[] in float32) into its
 * place in the record. */
static int fill_row(const struct st_store_matrix *x, const float *row,
		    int64_t i, float global, int mse, const float *w,
		    uint8_t *rec)
{
	const size_t cols = (size_t)x->cols;
	const size_t n_groups = x->fmt.group ?
				(cols + x->fmt.group - 1) / x->fmt.group : 0;
	uint8_t *data = rec + x->data_offset, *sc = rec + x->scale_offset;

	switch (x->fmt.dtype) {
	case ST_DTYPE_MXFP4:
		if (w)
			return st_mxfp4_quantize_row_wmse(
				row, w, cols, data + (size_t)i * cols / 2,
				sc + (size_t)i * n_groups);
		return (mse ? st_mxfp4_quantize_row_mse :
			      st_mxfp4_quantize_row)(row, cols,
					     data + (size_t)i * cols / 2,
					     sc + (size_t)i * n_groups);
	case ST_DTYPE_NVFP4:
		if (w)
			return st_nvfp4_quantize_row_wmse(
				row, w, cols, global,
				data + (size_t)i * cols / 2,
				sc + (size_t)i * n_groups);
		return (mse ? st_nvfp4_quantize_row_mse :
			      st_nvfp4_quantize_row)(row, cols, global,
					     data + (size_t)i * cols / 2,
					     sc + (size_t)i * n_groups);
	case ST_DTYPE_E2M1_F16:
		if (w)
			return st_e2m1f16_quantize_row_wmse(
				row, w, cols, x->fmt.group,
				data + (size_t)i * cols / 2,
				(uint16_t *)(void *)(sc + (size_t)i * n_groups * 2));
		return (mse ? st_e2m1f16_quantize_row_mse :
			      st_e2m1f16_quantize_row)(
			row, cols, x->fmt.group, data + (size_t)i * cols / 2,
			(uint16_t *)(void *)(sc + (size_t)i * n_groups * 2));
	case ST_DTYPE_F8_E4M3:
		return (mse ? st_fp8_quantize_row_mse :
			      st_fp8_quantize_row)(
			row, cols, x->fmt.group, data + (size_t)i * cols,
			(float *)(void *)(sc + (size_t)i * n_groups * 4));
	case ST_DTYPE_BF16:
		for (size_t j = 0; j < cols; j++) {
			uint16_t h = st_f32_to_bf16(row[j]);

			memcpy(data + ((size_t)i * cols + j) * 2, &h, 2);
		}
		return 0;
	case ST_DTYPE_F32:
		memcpy(data + (size_t)i * cols * 4, row, cols * 4);
		return 0;
	default:
		return -EINVAL;
	}
}

/* V4: matrix m of expert (layer, expert) is the checkpoint's MXFP4 as
 * is: t's E2M1 code bytes (I8 [rows, cols / 2], OCP nibble order) into
 * the data section, its .scale E8M0 bytes ([rows, cols / 32]) into the
 * scale section, both byte for byte. */
static int fill_matrix_dsv4(struct conv *c, const struct st_tensor_info *t,
			    const struct st_store_matrix *x, int layer,
			    int expert, int m, uint8_t *rec)
{
	const struct st_tensor_info *ts =
		c->v4_scales[((size_t)layer * c->cfg.n_experts + expert) * 3 +
			     m];

	if (t->n_bytes != x->data_bytes || ts->n_bytes != x->scale_bytes)
		return st_diag_set(c->diag, -ST_E_FORMAT, "tensor %s: %" PRIu64
				   " + %" PRIu64 " bytes, the MXFP4 record "
				   "section holds %" PRIu64 " + %" PRIu64,
				   t->name, t->n_bytes, ts->n_bytes,
				   x->data_bytes, x->scale_bytes);
	memcpy(rec + x->data_offset, st_checkpoint_data(c->ck, t),
	       x->data_bytes);
	memcpy(rec + x->scale_offset, st_checkpoint_data(c->ck, ts),
	       x->scale_bytes);
	return 0;
}

/* Fills matrix x of a record from checkpoint tensor t.  Sections are
 * 64-byte aligned in a 4096-aligned record, so the scale arrays are
 * aligned for their element type. */
static int fill_matrix(struct conv *c, const struct st_tensor_info *t,
		       const struct st_store_matrix *x, int layer, int expert,
		       int m, uint8_t *rec, float *row)
{
	const uint8_t *src = st_checkpoint_data(c->ck, t);
	size_t es = st_dtype_traits(t->dtype)->block_bytes;
	size_t cols = (size_t)x->cols;
	enum st_scale_search ss = es_cv_effective_search(x->fmt.dtype,
						   c->o.scale_search);
	const float *w = NULL;
	float global = 1.0f;
	int r = 0;

	if (c->dsv4)
		return fill_matrix_dsv4(c, t, x, layer, expert, m, rec);
	/* calibrated: weights from the statistics, or the plain MSE search
	 * for an expert that saw too few calibration tokens */
	if ((ss == ST_SCALE_SEARCH_CALIBRATED || ss == ST_SCALE_SEARCH_GPTQ) &&
	    st_calib_weights(&c->cal, layer, expert, m, ST_CALIB_MIN_TOKENS,
			     c->cal_w) == 1)
		w = c->cal_w;

	if (x->fmt.dtype == ST_DTYPE_BF16 && t->dtype == ST_DTYPE_BF16) {
		memcpy(rec + x->data_offset, src, x->data_bytes);
		return 0;
	}
	if (x->fmt.dtype == ST_DTYPE_NVFP4) {
		float amax = 0.0f;

		r = tensor_amax(t, src, x->rows, cols, row, &amax);
		global = st_nvfp4_global_scale(amax);
		memcpy(rec + x->tscale_offset, &global, 4);
	}
	if (!r && ss == ST_SCALE_SEARCH_GPTQ &&
	    st_calib_second_moment(&c->cal, layer, expert, m,
				   ST_CALIB_MIN_TOKENS, c->gptq_h) == 1) {
		for (int64_t i = 0; !r && i < x->rows; i++)
			r = st_convert_to_f32(t->dtype, src + (size_t)i * cols * es,
					      cols, c->gptq_w + (size_t)i * cols);
		if (!r)
			r = st_gptq_quantize(&x->fmt, c->gptq_w, (size_t)x->rows,
					     cols, c->gptq_h, global,
					     rec + x->data_offset,
					     rec + x->scale_offset);
		if (r)
			return st_diag_set(c->diag, r, "tensor %s: GPTQ failed: "
					   "%s", t->name, st_strerror(r));
		return 0;
	}
	for (int64_t i = 0; !r && i < x->rows; i++) {
		r = st_convert_to_f32(t->dtype, src + (size_t)i * cols * es, cols,
				      row);
		if (!r)
			r = fill_row(x, row, i, global,
				     ss != ST_SCALE_SEARCH_NONE, w, rec);
		if (r)
			return st_diag_set(c->diag, r, "tensor %s: row %" PRId64
					   ": conversion failed: %s", t->name, i,
					   st_strerror(r));
	}
	if (r)
		return st_diag_set(c->diag, r, "tensor %s: conversion failed: %s",
				   t->name, st_strerror(r));
	return 0;
}

/* How each format rounds and picks its scales (manifest "rounding"). */
static const char *rounding_text(enum st_dtype dt, enum st_scale_search ss)
{
	int mse = ss != ST_SCALE_SEARCH_NONE;

	if (ss == ST_SCALE_SEARCH_GPTQ)
		switch (dt) {
		case ST_DTYPE_MXFP4:
		case ST_DTYPE_NVFP4:
		case ST_DTYPE_E2M1_F16:
			return "GPTQ (arXiv:2210.17323): columns in order, "
			       "each rounded to nearest-even (saturate "
			       "\u00b16) and its error compensated in the "
			       "later columns through the Cholesky factor of "
			       "the inverse calibration second moment (damp "
			       "0.01 mean diagonal); each group's scale by "
			       "the activation-weighted search when reached";
		default:
			break;
		}
	if (ss == ST_SCALE_SEARCH_CALIBRATED)
		switch (dt) {
		case ST_DTYPE_MXFP4:
			return "nearest-even, saturate \u00b16; scale byte of "
			       "least activation-weighted squared error (sum "
			       "E[a_c^2] (w_c - q_c)^2) among e-1, e, e+1, e = "
			       "2^(floor(log2 amax) - 2)";
		case ST_DTYPE_NVFP4:
			return "nearest-even, saturate \u00b16; block scale of "
			       "least activation-weighted squared error (sum "
			       "E[a_c^2] (w_c - q_c)^2) among e4m3(amax / 6 / "
			       "tensor_scale * k/100), k = 80..110, tensor "
			       "scale amax_tensor / 2688";
		case ST_DTYPE_E2M1_F16:
			return "nearest-even, saturate \u00b16; scale of least "
			       "activation-weighted squared error (sum "
			       "E[a_c^2] (w_c - q_c)^2) among f16(amax / 6 * "
			       "k/100), k = 80..110";
		default:
			break;
		}

	switch (dt) {
	case ST_DTYPE_MXFP4:
		return mse ? "nearest-even, saturate \u00b16; scale byte of "
			     "least squared error among e-1, e, e+1, e = "
			     "2^(floor(log2 amax) - 2)" :
			     "nearest-even, saturate \u00b16; scale "
			     "2^(floor(log2 amax) - 2)";
	case ST_DTYPE_NVFP4:
		return mse ? "nearest-even, saturate \u00b16; block scale of "
			     "least squared error among e4m3(amax / 6 / "
			     "tensor_scale * k/100), k = 80..110, tensor "
			     "scale amax_tensor / 2688" :
			     "nearest-even, saturate \u00b16; block scale "
			     "e4m3(amax / 6 / tensor_scale), tensor scale "
			     "amax_tensor / 2688";
	case ST_DTYPE_E2M1_F16:
		return mse ? "nearest-even, saturate \u00b16; scale of least "
			     "squared error among f16(amax / 6 * k/100), k = "
			     "80..110" :
			     "nearest-even, saturate \u00b16; scale f16(amax / 6)";
	case ST_DTYPE_F8_E4M3:
		return mse ? "nearest-even, saturate \u00b1448; scale of least "
			     "squared error among amax / 448 * k/100, k = "
			     "80..110" :
			     "nearest-even, saturate \u00b1448; scale amax / 448";
	default:
		return NULL;
	}
}

/* The manifest entry of one matrix. */
static int matrix_json(const struct st_store_matrix *x, int m,
		       enum st_scale_search ss, int lossless, json_t *o)
{
	enum st_dtype dt = x->fmt.dtype;
	const char *scale = st_scale_type_name(st_wformat_scale_type(dt));
	int fp4 = dt == ST_DTYPE_MXFP4 || dt == ST_DTYPE_NVFP4 ||
		  dt == ST_DTYPE_E2M1_F16;
	char name[ST_WFORMAT_NAME_MAX];
	int r;

	if (st_wformat_name(&x->fmt, name, sizeof(name)))
		return -EINVAL;
	if ((r = es_cv_jset(o, "name", json_string(es_cv_mat_names[m]))) ||
	    (r = es_cv_jset_int(o, "rows", (uint64_t)x->rows)) ||
	    (r = es_cv_jset_int(o, "cols", (uint64_t)x->cols)) ||
	    (r = es_cv_jset(o, "format", json_string(name))) ||
	    (r = es_cv_jset(o, "layout", json_string(x->il_rows ? "ocp-r16" :
					       fp4 ? "ocp" : "row-major"))))
		return r;
	if (scale &&
	    ((r = es_cv_jset_int(o, "block", x->fmt.group)) ||
	     (r = es_cv_jset(o, "scale", json_string(scale))) ||
	     (r = es_cv_jset(o, "scale_search",
		       json_string(st_scale_search_name(ss)))) ||
	     (r = es_cv_jset(o, "rounding", json_string(lossless ?
			"none: the checkpoint's codes and scales, byte for byte" :
			rounding_text(dt, ss))))))
		return r;
	if ((r = es_cv_jset_int(o, "data_offset", x->data_offset)) ||
	    (r = es_cv_jset_int(o, "data_bytes", x->data_bytes)))
		return r;
	if (x->scale_bytes &&
	    ((r = es_cv_jset_int(o, "scale_offset", x->scale_offset)) ||
	     (r = es_cv_jset_int(o, "scale_bytes", x->scale_bytes))))
		return r;
	if (x->tscale_bytes &&
	    ((r = es_cv_jset(o, "tensor_scale", json_string("f32"))) ||
	     (r = es_cv_jset(o, "tensor_scale_use", json_string("multiply"))) ||
	     (r = es_cv_jset_int(o, "tensor_scale_offset", x->tscale_offset)) ||
	     (r = es_cv_jset_int(o, "tensor_scale_bytes", x->tscale_bytes))))
		return r;
	return 0;
}

/* Rewrites matrix x of a record, filled row-major, in its interleaved
 * layout (x->il_rows set: st_mxfp4il.h); nothing for other matrices. */
static int interleave_matrix(struct conv *c, const struct st_store_matrix *x,
			     uint8_t *rec)
{
	uint8_t *tmp;
	int r;

	if (!x->il_rows)
		return 0;
	tmp = malloc(x->data_bytes + x->scale_bytes);
	if (!tmp)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	memcpy(tmp, rec + x->data_offset, x->data_bytes);
	memcpy(tmp + x->data_bytes, rec + x->scale_offset, x->scale_bytes);
	r = st_mxfp4il_pack(tmp, tmp + x->data_bytes, x->rows, x->cols,
			    rec + x->data_offset, rec + x->scale_offset);
	free(tmp);
	if (r)
		return st_diag_set(c->diag, r, "interleaving an MXFP4 matrix "
				   "of %lld x %lld failed", (long long)x->rows,
				   (long long)x->cols);
	return 0;
}

/* Writes experts-LLL.bin of layer l and appends its manifest entry. */
static int write_expert_layer(struct conv *c, int l, uint8_t *rec, float *row,
			      json_t *layers)
{
	const struct st_store_layer *ly = &c->layers[l];
	int E = c->cfg.n_experts, fd = -1, r;
	json_t *o = json_object(), *mats = json_array(), *sums = json_array();
	char name[64];

	st_store_expert_file_name(l, name, sizeof(name));
	if (!o || !mats || !sums) {
		r = -ENOMEM;
		goto fail;
	}
	if ((r = es_cv_jset_int(o, "layer", (uint64_t)l)) ||
	    (r = es_cv_jset_int(o, "record_bytes", ly->record_bytes)))
		goto fail;
	for (int m = 0; m < 3; m++) {
		json_t *mo = json_object();

		if ((r = es_cv_jappend(mats, mo)) ||
		    (r = matrix_json(&ly->mat[m], m,
				       es_cv_effective_search(ly->mat[m].fmt.dtype,
							c->o.scale_search),
				       c->dsv4, mo)))
			goto fail;
	}
	r = es_cv_jset(o, "matrices", mats);
	mats = NULL;
	if (r)
		goto fail;
	if ((r = es_cv_create_out_file(c, name, &fd)))
		goto fail;
	for (int e = 0; e < E; e++) {
		uint64_t src_bytes = 0;
		char h[17];

		memset(rec, 0, ly->record_bytes);
		for (int m = 0; m < 3; m++) {
			const struct st_tensor_info *t =
				c->experts[((size_t)l * E + e) * 3 + m];

			if ((r = fill_matrix(c, t, &ly->mat[m], l, e, m, rec,
					     row)) ||
			    (r = interleave_matrix(c, &ly->mat[m], rec)))
				goto fail;
			src_bytes += t->n_bytes;
		}
		r = es_cv_jappend(sums, json_string(es_cv_hex64(st_xxh3(rec, ly->record_bytes),
						    h)));
		if (r)
			goto fail;
		r = es_cv_pwrite_full(fd, rec, ly->record_bytes,
				(uint64_t)e * ly->record_bytes);
		if (r) {
			r = es_cv_write_error(c, r, name);
			goto fail;
		}
		if ((r = es_cv_progress(c, src_bytes)))
			goto fail;
	}
	r = es_cv_finish_out_file(c, fd, name);
	fd = -1;
	if (r)
		goto fail;
	if ((r = es_cv_jset(o, "file", json_string(name))) ||
	    (r = es_cv_jset_int(o, "bytes", (uint64_t)E * ly->record_bytes)))
		goto fail;
	r = es_cv_jset(o, "xxh3", sums);
	sums = NULL;
	if (r)
		goto fail;
	r = es_cv_jappend(layers, o);
	o = NULL;
fail:
	if (fd >= 0)
		close(fd);
	json_decref(o);
	json_decref(mats);
	json_decref(sums);
	return r;
}

/* experts.policy.shared_experts: what the shared experts were written in
 * ("bf16", "f32", "fp8"), or that the model has none. */
static const char *shared_name(const struct conv *c)
{
	int seen_bf16 = 0, seen_f32 = 0;

	if (!c->cfg.shared_inter)
		return "none (the model has none)";
	if (c->o.shared_experts_set &&
	    c->o.shared_experts.dtype == ST_DTYPE_F8_E4M3)
		return "fp8";
	for (int i = 0; i < c->ck->n_tensors; i++)
		if (c->is_shexp[i]) {
			if (es_cv_dense_out_dtype(c, i) == ST_DTYPE_BF16)
				seen_bf16 = 1;
			else
				seen_f32 = 1;
		}
	return seen_bf16 && seen_f32 ? "mixed" : seen_f32 ? "f32" : "bf16";
}

/* What the attention projections were written in ("bf16", "f32", or
 * "mixed" when the checkpoint's own dtypes differ and auto kept them). */
static const char *attention_name(const struct conv *c)
{
	int seen_bf16 = 0, seen_f32 = 0;

	if (c->dsv4)
		return "fp8 (E4M3 with E8M0 block scales, as the checkpoint)";
	if (c->o.dense_fp8 != ES_DENSE_FP8_NONE)
		return "fp8"; /* q/k/v/o as E4M3 (dense_fp8_matrix) */
	for (int i = 0; i < c->ck->n_tensors; i++)
		if (c->is_attn[i]) {
			if (es_cv_dense_out_dtype(c, i) == ST_DTYPE_BF16)
				seen_bf16 = 1;
			else
				seen_f32 = 1;
		}
	return seen_bf16 && seen_f32 ? "mixed" : seen_f32 ? "f32" : "bf16";
}

/* experts.policy.calibration: which statistics the calibrated search
 * used (by content hash: no path, so the store stays reproducible). */
static int calibration_json(struct conv *c, json_t *pol)
{
	json_t *o = json_object();
	char h[17];
	int r = o ? 0 : -ENOMEM;

	if (!r)
		r = es_cv_jset(o, "stats_xxh3", json_string(es_cv_hex64(c->cal_file_xxh3, h)));
	if (!r)
		r = es_cv_jset(o, "model_id", json_string(es_cv_hex64(c->cal.model_id, h)));
	if (!r)
		r = es_cv_jset(o, "text_xxh3", json_string(es_cv_hex64(c->cal.text_xxh3, h)));
	if (!r)
		r = es_cv_jset_int(o, "tokens", c->cal.n_tokens);
	if (!r)
		r = es_cv_jset_int(o, "min_tokens", ST_CALIB_MIN_TOKENS);
	if (!r)
		r = es_cv_jset_int(o, "fallback_experts", c->cal_fallback);
	if (r) {
		json_decref(o);
		return r;
	}
	return es_cv_jset(pol, "calibration", o);
}

/* experts: {n_layers, n_experts, record_bytes, record_align,
 * section_align, policy, layers: []}; *ret_layers borrowed from it. */
static int experts_json(struct conv *c, json_t **ret_ex, json_t **ret_layers)
{
	json_t *ex = json_object(), *pol = json_object(), *layers = json_array();
	char def[ST_WFORMAT_NAME_MAX], keep[4096];
	int r = 0;

	if (!ex || !pol || !layers)
		r = -ENOMEM;
	if (!r && (st_wformat_name(&c->def_fmt, def, sizeof(def)) ||
		   es_convert_keep_str(&c->o, keep, sizeof(keep))))
		r = -EINVAL;
	if (!r)
		r = es_cv_jset_int(ex, "n_layers", (uint64_t)c->cfg.n_layers);
	if (!r)
		r = es_cv_jset_int(ex, "n_experts", (uint64_t)c->cfg.n_experts);
	if (!r)
		r = es_cv_jset_int(ex, "record_bytes", c->record_bytes);
	if (!r)
		r = es_cv_jset_int(ex, "record_align", ST_STORE_RECORD_ALIGN);
	if (!r)
		r = es_cv_jset_int(ex, "section_align", ST_STORE_SECTION_ALIGN);
	if (!r && !(r = es_cv_jset(pol, "default", json_string(def))))
		r = es_cv_jset(pol, "keep", json_string(keep));
	if (!r)
		r = es_cv_jset(pol, "scale_search",
			 json_string(st_scale_search_name(c->o.scale_search)));
	if (!r && c->o.calib_path)
		r = calibration_json(c, pol);
	if (!r)
		r = es_cv_jset(pol, "attention", json_string(attention_name(c)));
	if (!r && c->dsv4)
		r = es_cv_jset(pol, "source", json_string("lossless: the "
			 "checkpoint's MXFP4 experts and FP8 / BF16 / F32 / "
			 "I64 dense tensors byte for byte"));
	if (!r)
		r = es_cv_jset(pol, "shared_experts", json_string(c->dsv4 ?
			 "dense (FP8 with E8M0 block scales, as the checkpoint)" :
			 shared_name(c)));
	if (!r) {
		r = es_cv_jset(ex, "policy", pol);
		pol = NULL;
	}
	if (!r)
		r = json_object_set(ex, "layers", layers) ? -ENOMEM : 0;
	json_decref(pol);
	if (r) {
		json_decref(layers);
		json_decref(ex);
		return r;
	}
	*ret_ex = ex;
	*ret_layers = layers; /* borrowed from ex after this point */
	json_decref(layers);
	return 0;
}

int es_cv_write_experts(struct conv *c)
{
	json_t *ex = NULL, *layers = NULL;
	uint8_t *rec = NULL;
	float *row = NULL;
	int64_t max_cols = 0;
	int r;

	for (int m = 0; m < 3; m++)
		max_cols = ST_MAX(max_cols, c->layers[0].mat[m].cols);
	r = experts_json(c, &ex, &layers);
	if (r)
		goto out;
	row = malloc((size_t)max_cols * sizeof(float));
	if (!row || posix_memalign((void **)&rec, ST_STORE_RECORD_ALIGN,
				   c->record_bytes)) {
		rec = NULL;
		r = -ENOMEM;
		goto out;
	}
	for (int l = 0; l < c->cfg.n_layers && !r; l++)
		r = write_expert_layer(c, l, rec, row, layers);
	if (!r) {
		r = es_cv_jset(c->manifest, "experts", ex);
		ex = NULL;
	}
out:
	json_decref(ex);
	free(rec);
	free(row);
	if (r == -ENOMEM)
		st_diag_set(c->diag, r, "out of memory");
	return r;
}

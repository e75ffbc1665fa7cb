/*
 * es_convert_check.c — phase 1 of the store writer for the Hugging Face
 * MoE families (Mixtral, Qwen2/3-MoE, ...): every expert matrix and dense
 * role present with its shape and dtype, the copied files and the
 * tokenizer load, every float weight finite.  Nothing is written here.
 */
#include "es_convert_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "st_log.h"

/* --- phase 1: checks ----------------------------------------------------- */

int es_cv_check_experts(struct conv *c)
{
	int L = c->cfg.n_layers, E = c->cfg.n_experts;

	c->experts = calloc((size_t)L * E * 3, sizeof(*c->experts));
	if (!c->experts)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	for (int l = 0; l < L; l++)
		for (int e = 0; e < E; e++)
			for (int m = 0; m < 3; m++) {
				const struct st_tensor_info *t;
				char name[256];
				int r = st_expert_tensor_name(&c->cfg, l, e,
							      (enum st_expert_mat)m,
							      name, sizeof(name));

				if (r)
					return st_diag_set(c->diag, r, "expert "
							   "tensor name (%d, %d): "
							   "%s", l, e,
							   st_strerror(r));
				t = st_checkpoint_find(c->ck, name);
				if (!t)
					return st_diag_set(c->diag, -ST_E_NOTFOUND,
							   "checkpoint %s: tensor %s "
							   "is missing (layer %d, "
							   "expert %d, %s matrix)",
							   c->model_dir, name, l, e,
							   es_cv_mat_names[m]);
				if ((r = es_cv_check_shape(c, t, c->layers[0].mat[m].rows,
						     c->layers[0].mat[m].cols)))
					return r;
				if (!es_cv_float_dtype(t->dtype))
					return st_diag_set(c->diag,
							   -ST_E_UNSUPPORTED,
							   "checkpoint %s: tensor %s: "
							   "dtype %s (expert matrices "
							   "must be F32, F16 or BF16)",
							   c->model_dir, name,
							   st_dtype_traits(t->dtype)->name);
				c->experts[((size_t)l * E + e) * 3 + m] = t;
				c->is_expert[t - c->ck->tensors] = 1;
			}
	return 0;
}

int es_cv_check_dense(struct conv *c)
{
	int all_bf16 = 1;

	for (int role = 0; role < ST_T_ROLE_COUNT; role++) {
		int global = role == ST_T_EMBED || role == ST_T_FINAL_NORM ||
			     role == ST_T_LM_HEAD;
		int n = global ? 1 : c->cfg.n_layers;

		for (int l = 0; l < n; l++) {
			const struct st_tensor_info *t;
			int64_t rows, cols;
			char name[256];
			int r = st_dense_tensor_name(&c->cfg,
						     (enum st_dense_role)role, l,
						     name, sizeof(name));

			if (r == -ST_E_NOTFOUND)
				break;
			if (r)
				return st_diag_set(c->diag, r, "dense tensor name "
						   "(role %d, layer %d): %s", role,
						   l, st_strerror(r));
			t = st_checkpoint_find(c->ck, name);
			if (!t)
				return st_diag_set(c->diag, -ST_E_NOTFOUND,
						   "checkpoint %s: tensor %s is "
						   "missing", c->model_dir, name);
			st_dense_tensor_shape(&c->cfg, (enum st_dense_role)role,
					      &rows, &cols);
			if ((r = es_cv_check_shape(c, t, rows, cols)))
				return r;
			if (role == ST_T_Q || role == ST_T_K || role == ST_T_V ||
			    role == ST_T_O)
				c->is_attn[t - c->ck->tensors] = 1;
			if (role == ST_T_SHEXP_GATE || role == ST_T_SHEXP_UP ||
			    role == ST_T_SHEXP_DOWN)
				c->is_shexp[t - c->ck->tensors] = 1;
		}
	}
	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i];

		if (c->is_expert[i])
			continue;
		if (strstr(t->name, ".experts."))
			return st_diag_set(c->diag, -ST_E_FORMAT,
					   "checkpoint %s: tensor %s looks like an "
					   "expert matrix, but config.json has %d "
					   "layers of %d experts", c->model_dir,
					   t->name, c->cfg.n_layers,
					   c->cfg.n_experts);
		if (!es_cv_float_dtype(t->dtype))
			return st_diag_set(c->diag, -ST_E_UNSUPPORTED,
					   "checkpoint %s: tensor %s: dtype %s "
					   "(dense tensors must be F32, F16 or "
					   "BF16)", c->model_dir, t->name,
					   st_dtype_traits(t->dtype)->name);
		if (t->n_dims > 4)
			return st_diag_set(c->diag, -ST_E_UNSUPPORTED,
					   "checkpoint %s: tensor %s has %d "
					   "dimensions (at most 4)", c->model_dir,
					   t->name, t->n_dims);
		all_bf16 &= t->dtype == ST_DTYPE_BF16;
	}
	c->dense_dtype = all_bf16 && !c->o.dense_f32 ? ST_DTYPE_BF16 :
						       ST_DTYPE_F32;
	return 0;
}

int es_cv_check_copied_files(struct conv *c)
{
	for (size_t i = 0; i < ES_CV_N_COPIED; i++) {
		char path[4200];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", c->model_dir,
			 es_cv_copied_files[i].name);
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			c->have_copied[i] = 1;
			c->total += (uint64_t)st.st_size;
		} else if (es_cv_copied_files[i].required) {
			return st_diag_set(c->diag, -ST_E_NOTFOUND,
					   "checkpoint %s: %s is missing (a store "
					   "needs the tokenizer)", c->model_dir,
					   es_cv_copied_files[i].name);
		}
	}
	return 0;
}

int es_cv_check_tokenizer(struct conv *c)
{
	struct st_tokenizer *tok = NULL;
	struct st_diag d = { "" };
	int r = st_tokenizer_load(c->model_dir, &tok, &d);
	int n;

	if (r)
		return st_diag_set(c->diag, r, "checkpoint %s: the tokenizer "
				   "cannot be loaded: %s; fix or replace "
				   "tokenizer.json / tokenizer_config.json "
				   "(nothing was written)", c->model_dir, d.msg);
	n = st_tokenizer_n_vocab(tok);
	st_tokenizer_free(tok);
	if (c->cfg.vocab_size > 0 && n > c->cfg.vocab_size)
		st_warn("convert: %s: tokenizer.json has token ids up to %d, "
			"but config.json vocab_size is %d (the embedding's "
			"rows): prompts that encode to the ids beyond will be "
			"refused; check that the tokenizer belongs to these "
			"weights", c->model_dir, n - 1, c->cfg.vocab_size);
	return 0;
}

/* Index of the first element of n (width-byte words at src) whose bits
 * under mask are all set, or -1.  Blocks are tested branch-free first
 * (the compiler vectorizes the OR), so a clean tensor costs one pass at
 * memory speed. */
#define NONFINITE_BLOCK 4096
static int64_t first_all_ones(const uint8_t *src, uint64_t n, size_t width,
			      uint32_t mask)
{
	for (uint64_t b = 0; b < n; b += NONFINITE_BLOCK) {
		uint64_t e = ST_MIN(n, b + NONFINITE_BLOCK);
		unsigned bad = 0;

		if (width == 2) {
			for (uint64_t i = b; i < e; i++) {
				uint16_t v;

				memcpy(&v, src + i * 2, 2);
				bad |= (v & mask) == mask;
			}
		} else {
			for (uint64_t i = b; i < e; i++) {
				uint32_t v;

				memcpy(&v, src + i * 4, 4);
				bad |= (v & mask) == mask;
			}
		}
		for (uint64_t i = b; bad && i < e; i++) {
			uint32_t v = 0;

			memcpy(&v, src + i * width, width); /* little-endian */
			if ((v & mask) == mask)
				return (int64_t)i;
		}
	}
	return -1;
}

/* Index of the first NaN or infinity (all exponent bits set) among the n
 * elements of a F32, F16 or BF16 tensor at src, or -1 (also for any
 * other dtype: codes are kept as shipped); *ret_nan: a NaN (mantissa not
 * zero) rather than an infinity. */
static int64_t first_nonfinite(enum st_dtype dt, const uint8_t *src,
			       uint64_t n, int *ret_nan)
{
	uint32_t mask, mant, v = 0;
	size_t es;
	int64_t k;

	switch (dt) {
	case ST_DTYPE_F32: mask = 0x7f800000u; mant = 0x007fffffu; es = 4; break;
	case ST_DTYPE_F16: mask = 0x7c00u; mant = 0x03ffu; es = 2; break;
	case ST_DTYPE_BF16: mask = 0x7f80u; mant = 0x007fu; es = 2; break;
	default: return -1;
	}
	k = first_all_ones(src, n, es, mask);
	if (k >= 0) {
		memcpy(&v, src + (uint64_t)k * es, es);
		*ret_nan = (v & mant) != 0;
	}
	return k;
}

int es_cv_check_finite(struct conv *c)
{
	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i];
		int nan = 0;
		int64_t k = first_nonfinite(t->dtype,
					    st_checkpoint_data(c->ck, t),
					    t->n_elems, &nan);
		char where[64] = "";

		if (k < 0)
			continue;
		if (t->n_dims == 2)
			snprintf(where, sizeof(where), " [%" PRId64 ", %" PRId64
				 "]", k / t->shape[1], k % t->shape[1]);
		return st_diag_set(c->diag, -ST_E_FORMAT, "checkpoint %s: "
				   "tensor %s (file %s) holds %s at element %"
				   PRId64 "%s: the weights are damaged; "
				   "re-download or re-export the checkpoint "
				   "(nothing was written)", c->model_dir,
				   t->name, c->ck->file_names[t->file_index],
				   nan ? "a NaN" : "an infinity", k, where);
	}
	return 0;
}

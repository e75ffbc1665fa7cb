/*
 * es_convert_dense.c — phase 2 of the store writer: dense.bin, every
 * tensor that is not a routed expert, in the store's dense dtype (BF16 or
 * F32, FP8 E4M3 with per-128 scales for the roles --dense / --attention
 * name) or, for DeepSeek-V4, as the checkpoint has it.
 */
#include "es_convert_int.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --- phase 2: dense.bin -------------------------------------------------- */

enum st_dtype es_cv_dense_out_dtype(const struct conv *c, int i)
{
	if (c->dsv4) /* V4: every dense tensor as the checkpoint has it */
		return c->ck->tensors[i].dtype;
	if (c->is_attn[i] && c->o.attention_dtype != ST_DTYPE_COUNT)
		return c->o.attention_dtype;
	/* --shared-experts bf16|f32 (fp8 goes through dense_fp8_matrix) */
	if (c->is_shexp[i] && c->o.shared_experts_set &&
	    (c->o.shared_experts.dtype == ST_DTYPE_BF16 ||
	     c->o.shared_experts.dtype == ST_DTYPE_F32))
		return c->o.shared_experts.dtype;
	return c->dense_dtype;
}

/* Writes tensor t at `off` of fd in the store's dense dtype; returns the
 * bytes written in *ret_bytes and their XXH3 in *ret_xxh3. */
static int write_dense_tensor(struct conv *c, int fd, float *fbuf,
			      const struct st_tensor_info *t, uint64_t off,
			      uint64_t *ret_bytes, uint64_t *ret_xxh3)
{
	const uint8_t *src = st_checkpoint_data(c->ck, t);
	size_t es = st_dtype_traits(t->dtype)->block_bytes;
	enum st_dtype odt = es_cv_dense_out_dtype(c, (int)(t - c->ck->tensors));
	int direct = t->dtype == odt;
	uint64_t out_es = direct ? es : odt == ST_DTYPE_BF16 ? 2 : 4;
	int r;

	XXH3_64bits_reset(c->xs);
	for (uint64_t i = 0; i < t->n_elems; i += CHUNK_ELEMS) {
		size_t n = (size_t)ST_MIN((uint64_t)CHUNK_ELEMS, t->n_elems - i);
		const void *out = src + i * es;

		if (!direct) {
			/* only BF16 stays BF16; everything else becomes F32 */
			r = st_convert_to_f32(t->dtype, src + i * es, n, fbuf);
			if (r)
				return st_diag_set(c->diag, r, "tensor %s: cannot "
						   "convert %s", t->name,
						   st_dtype_traits(t->dtype)->name);
			if (odt == ST_DTYPE_BF16) {
				/* F32/F16 -> BF16 (--attention bf16), in
				 * place: each bf16 goes to a lower address
				 * than the float it came from */
				uint16_t *h = (uint16_t *)(void *)fbuf;

				for (size_t k = 0; k < n; k++)
					h[k] = st_f32_to_bf16(fbuf[k]);
			}
			out = fbuf;
		}
		XXH3_64bits_update(c->xs, out, n * out_es);
		r = es_cv_pwrite_full(fd, out, n * out_es, off + i * out_es);
		if (r)
			return es_cv_write_error(c, r, ST_STORE_DENSE_FILE);
	}
	*ret_bytes = t->n_elems * out_es;
	*ret_xxh3 = XXH3_64bits_digest(c->xs);
	return 0;
}

int es_cv_dense_fp8_matrix(struct conv *c, const char *name, int64_t *ret_rows,
			    int64_t *ret_cols)
{
	static const enum st_dense_role roles[] = { ST_T_LM_HEAD, ST_T_Q,
						    ST_T_K, ST_T_V, ST_T_O,
						    ST_T_SHEXP_GATE,
						    ST_T_SHEXP_UP,
						    ST_T_SHEXP_DOWN };
	const int shexp_fp8 = c->o.shared_experts_set &&
			      c->o.shared_experts.dtype == ST_DTYPE_F8_E4M3;

	if (!c->o.dense_fp8 && !shexp_fp8)
		return 0;
	for (size_t i = 0; i < ST_ARRAY_SIZE(roles); i++) {
		const int sh = roles[i] >= ST_T_SHEXP_GATE;
		int n = roles[i] == ST_T_LM_HEAD ? 1 : c->cfg.n_layers;

		if (sh ? !shexp_fp8 : !c->o.dense_fp8)
			continue;
		if (roles[i] == ST_T_LM_HEAD &&
		    c->o.dense_fp8 == ES_DENSE_FP8_ATTENTION)
			continue;

		for (int l = 0; l < n; l++) {
			char nm[256];

			if (st_dense_tensor_name(&c->cfg, roles[i], l, nm,
						 sizeof(nm)) == 0 &&
			    !strcmp(nm, name)) {
				st_dense_tensor_shape(&c->cfg, roles[i], ret_rows,
						      ret_cols);
				return 1;
			}
		}
	}
	return 0;
}

/* Writes matrix t (rows x cols) as FP8 E4M3 codes at `off` (row by row,
 * st_fp8_quantize_row with blocks of ST_FP8_DEFAULT_BLOCK) and its scales
 * (rows x nblk floats) into *ret_scales (malloc'ed, caller frees). */
static int write_dense_fp8(struct conv *c, int fd, const struct st_tensor_info *t,
			   int64_t rows, int64_t cols, uint64_t off,
			   uint64_t *ret_xxh3, float **ret_scales)
{
	const uint8_t *src = st_checkpoint_data(c->ck, t);
	const size_t es = st_dtype_traits(t->dtype)->block_bytes;
	const int64_t nblk = (cols + ST_FP8_DEFAULT_BLOCK - 1) /
			     ST_FP8_DEFAULT_BLOCK;
	float *row = malloc(sizeof(float) * (size_t)cols);
	uint8_t *codes = malloc((size_t)cols);
	float *sc = malloc(sizeof(float) * (size_t)(rows * nblk));
	int r = 0;

	if (!row || !codes || !sc) {
		r = -ENOMEM;
		goto out;
	}
	XXH3_64bits_reset(c->xs);
	for (int64_t i = 0; i < rows && !r; i++) {
		r = st_convert_to_f32(t->dtype, src + (size_t)(i * cols) * es,
				      (size_t)cols, row);
		if (r) {
			st_diag_set(c->diag, r, "tensor %s: cannot convert %s",
				    t->name, st_dtype_traits(t->dtype)->name);
			break;
		}
		st_fp8_quantize_row(row, (size_t)cols, ST_FP8_DEFAULT_BLOCK,
				    codes, sc + i * nblk);
		XXH3_64bits_update(c->xs, codes, (size_t)cols);
		r = es_cv_pwrite_full(fd, codes, (size_t)cols, off + (uint64_t)(i * cols));
		if (r)
			r = es_cv_write_error(c, r, ST_STORE_DENSE_FILE);
	}
	*ret_xxh3 = XXH3_64bits_digest(c->xs);
out:
	free(row);
	free(codes);
	if (r)
		free(sc);
	else
		*ret_scales = sc;
	return r;
}

/* Appends one manifest entry of dense.bin. */
static int dense_entry(json_t *arr, const char *name, const char *dtype,
		       int n_dims, const int64_t *shape, uint64_t off,
		       uint64_t bytes, uint64_t h, const char *source_dtype)
{
	json_t *o = json_object(), *sh;
	int r;

	if ((r = es_cv_jappend(arr, o)))
		return r;
	sh = json_array();
	for (int d = 0; d < n_dims && sh && !r; d++)
		r = es_cv_jappend(sh, json_integer(shape[d]));
	if (r || !sh) {
		json_decref(sh);
		return r ? r : -ENOMEM;
	}
	if ((r = es_cv_jset(o, "name", json_string(name))) ||
	    (r = es_cv_jset(o, "dtype", json_string(dtype))) ||
	    (r = es_cv_jset(o, "shape", sh)) ||
	    (r = es_cv_jset_int(o, "offset", off)) ||
	    (r = es_cv_jset_int(o, "bytes", bytes)) ||
	    (r = es_cv_jset_hex(o, "xxh3", h)) ||
	    (r = es_cv_jset(o, "source_dtype", json_string(source_dtype))))
		return r;
	return 0;
}

/* --dense fp8: matrix t as codes plus a NAME.scale tensor; advances *cur. */
static int write_dense_fp8_pair(struct conv *c, int fd, json_t *arr,
				const struct st_tensor_info *t, int64_t rows,
				int64_t cols, uint64_t *cur)
{
	const int64_t nblk = (cols + ST_FP8_DEFAULT_BLOCK - 1) /
			     ST_FP8_DEFAULT_BLOCK;
	const int64_t shape[2] = { rows, cols }, sshape[2] = { rows, nblk };
	uint64_t off = ST_ALIGN_UP(*cur, ST_STORE_DENSE_ALIGN), soff, h = 0;
	uint64_t sbytes = (uint64_t)(rows * nblk) * sizeof(float);
	float *sc = NULL;
	char sname[600];
	int r;

	r = write_dense_fp8(c, fd, t, rows, cols, off, &h, &sc);
	if (r)
		return r;
	r = dense_entry(arr, t->name, "F8_E4M3", 2, shape, off,
			(uint64_t)(rows * cols), h,
			st_dtype_traits(t->dtype)->name);
	soff = ST_ALIGN_UP(off + (uint64_t)(rows * cols), ST_STORE_DENSE_ALIGN);
	snprintf(sname, sizeof(sname), "%s.scale", t->name);
	if (!r) {
		r = es_cv_pwrite_full(fd, sc, sbytes, soff);
		if (r)
			r = es_cv_write_error(c, r, ST_STORE_DENSE_FILE);
	}
	if (!r)
		r = dense_entry(arr, sname, "F32", 2, sshape, soff, sbytes,
				st_xxh3(sc, sbytes), "F32");
	free(sc);
	*cur = soff + sbytes;
	return r;
}

int es_cv_write_dense(struct conv *c)
{
	json_t *dense = json_object(), *arr = json_array();
	float *fbuf = malloc(CHUNK_ELEMS * sizeof(float));
	uint64_t cur = 0;
	int fd = -1, r;

	if (!dense || !arr || !fbuf) {
		r = -ENOMEM;
		goto out;
	}
	if ((r = es_cv_create_out_file(c, ST_STORE_DENSE_FILE, &fd)))
		goto out;
	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i];
		uint64_t off = ST_ALIGN_UP(cur, ST_STORE_DENSE_ALIGN);
		uint64_t bytes = 0, h = 0;
		json_t *o, *shape;

		if (c->is_expert[i])
			continue;
		{
			int64_t rows, cols;

			if (es_cv_dense_fp8_matrix(c, t->name, &rows, &cols)) {
				r = write_dense_fp8_pair(c, fd, arr, t, rows,
							 cols, &cur);
				if (!r)
					r = es_cv_progress(c, t->n_bytes);
				if (r)
					goto out;
				continue;
			}
		}
		r = write_dense_tensor(c, fd, fbuf, t, off, &bytes, &h);
		if (r)
			goto out;
		cur = off + bytes;
		o = json_object();
		if ((r = es_cv_jappend(arr, o)))
			goto out;
		shape = json_array();
		for (int d = 0; d < t->n_dims && shape && !r; d++)
			r = es_cv_jappend(shape, json_integer(t->shape[d]));
		if (r) {
			json_decref(shape);
			goto out;
		}
		if ((r = es_cv_jset(o, "name", json_string(t->name))) ||
		    (r = es_cv_jset(o, "dtype", json_string(st_dtype_traits(
				es_cv_dense_out_dtype(c, i))->name))) ||
		    (r = es_cv_jset(o, "shape", shape)) ||
		    (r = es_cv_jset_int(o, "offset", off)) ||
		    (r = es_cv_jset_int(o, "bytes", bytes)) ||
		    (r = es_cv_jset_hex(o, "xxh3", h)) ||
		    (r = es_cv_jset(o, "source_dtype",
			      json_string(st_dtype_traits(t->dtype)->name))))
			goto out;
		if ((r = es_cv_progress(c, t->n_bytes)))
			goto out;
	}
	cur = ST_ALIGN_UP(cur, ST_STORE_DENSE_ALIGN);
	if (ftruncate(fd, (off_t)cur) < 0) {
		r = es_cv_write_error(c, -errno, ST_STORE_DENSE_FILE);
		goto out;
	}
	r = es_cv_finish_out_file(c, fd, ST_STORE_DENSE_FILE);
	fd = -1;
	if (r)
		goto out;
	if ((r = es_cv_jset(dense, "file", json_string(ST_STORE_DENSE_FILE))) ||
	    (r = es_cv_jset_int(dense, "bytes", cur)) ||
	    (r = es_cv_jset_int(dense, "align", ST_STORE_DENSE_ALIGN)))
		goto out;
	r = es_cv_jset(dense, "tensors", arr);
	arr = NULL;
	if (r)
		goto out;
	r = es_cv_jset(c->manifest, "dense", dense);
	dense = NULL;
out:
	if (fd >= 0)
		close(fd);
	free(fbuf);
	json_decref(arr);
	json_decref(dense);
	if (r == -ENOMEM)
		st_diag_set(c->diag, r, "out of memory");
	return r;
}

/* cw_dsv_tensors.c — see cw_dsv_tensors.h. */
#include "cw_dsv_tensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cw_dsv_ops.h"
#include "es_client.h"
#include "st_formats.h"

const struct st_tensor_info *cw_dsv_src_lookup(struct cw_dsv_src *s,
					       const char *name,
					       const void **data)
{
	const struct st_store_tensor *st;
	struct st_tensor_info *t;

	if (!s->st) {
		const struct st_tensor_info *ct = st_checkpoint_find(s->ck, name);

		if (ct && data)
			*data = st_checkpoint_data(s->ck, ct);
		return ct;
	}
	st = st_store_find_dense(s->st, name);
	if (!st)
		return NULL;
	t = &s->tmp[s->tmp_i];
	s->tmp_i ^= 1;
	memset(t, 0, sizeof(*t));
	t->name = st->name;
	t->dtype = st->dtype;
	t->n_dims = st->n_dims;
	t->n_elems = 1;
	for (int d = 0; d < st->n_dims; d++) {
		t->shape[d] = st->shape[d];
		t->n_elems *= (uint64_t)st->shape[d];
	}
	t->n_bytes = st->n_bytes;
	if (data)
		*data = s->dense + st->offset;
	return t;
}

int cw_dsv_src_find(struct cw_dsv_src *s, const char *name, enum st_dtype dt,
		    int64_t d0, int64_t d1, const struct st_tensor_info **ret,
		    const void **data)
{
	const void *bytes = NULL;
	const struct st_tensor_info *t = cw_dsv_src_lookup(s, name, &bytes);
	int nd = d1 < 0 ? 1 : 2;

	if (!t)
		return st_diag_set(s->diag, -ST_E_NOTFOUND,
				   "tensor %s missing from the checkpoint (not a %s checkpoint in the official layout, or a different config)",
				   name, s->family);
	if (t->dtype != dt)
		return st_diag_set(s->diag, -ST_E_FORMAT,
				   "tensor %s: dtype %s, expected %s", name,
				   st_dtype_traits(t->dtype)->name,
				   st_dtype_traits(dt)->name);
	if (t->n_dims != nd || t->shape[0] != d0 ||
	    (nd == 2 && t->shape[1] != d1))
		return st_diag_set(s->diag, -ST_E_FORMAT,
				   "tensor %s: shape does not match the config (expected [%lld%s%lld])",
				   name, (long long)d0, nd == 2 ? ", " : "",
				   nd == 2 ? (long long)d1 : 0LL);
	if (!s->st && s->used)
		s->used[t - s->ck->tensors] = 1;
	*ret = t;
	*data = bytes;
	return 0;
}

int cw_dsv_src_plain(struct cw_dsv_src *s, const char *name, int64_t d0,
		     int64_t d1, float **ret)
{
	const struct st_tensor_info *t = cw_dsv_src_lookup(s, name, NULL);
	const void *data;
	int r;

	if (t && t->dtype != ST_DTYPE_BF16 && t->dtype != ST_DTYPE_F32)
		return st_diag_set(s->diag, -ST_E_FORMAT,
				   "tensor %s: dtype %s, expected BF16 or F32",
				   name, st_dtype_traits(t->dtype)->name);
	r = cw_dsv_src_find(s, name, t ? t->dtype : ST_DTYPE_F32, d0, d1, &t,
			    &data);
	if (r < 0)
		return r;
	*ret = malloc(t->n_elems * sizeof(float));
	if (!*ret)
		return st_diag_set(s->diag, -ENOMEM, "out of memory (%s)",
				   name);
	return st_convert_to_f32(t->dtype, data, t->n_elems, *ret);
}

int cw_dsv_src_check_scales(struct cw_dsv_src *s, const char *name,
			    const uint8_t *sc, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		if (sc[i] == 255)
			return st_diag_set(s->diag, -ST_E_FORMAT,
					   "tensor %s: scale byte %llu is 255 (E8M0 NaN): corrupt checkpoint, re-download it",
					   name, (unsigned long long)i);
	return 0;
}

int cw_dsv_src_fp8(struct cw_dsv_src *s, const char *prefix, int rows,
		   int cols, int b0, int b1, struct cw_dsv_mat *m)
{
	const struct st_tensor_info *tw, *ts;
	const void *w, *sc;
	char name[300];
	int r;

	snprintf(name, sizeof(name), "%s.weight", prefix);
	if ((r = cw_dsv_src_find(s, name, ST_DTYPE_F8_E4M3, rows, cols, &tw,
				 &w)) < 0)
		return r;
	snprintf(name, sizeof(name), "%s.scale", prefix);
	if ((r = cw_dsv_src_find(s, name, ST_DTYPE_F8_E8M0, (rows + b0 - 1) / b0,
				 (cols + b1 - 1) / b1, &ts, &sc)) < 0 ||
	    (r = cw_dsv_src_check_scales(s, name, sc, ts->n_elems)) < 0)
		return r;
	m->rows = rows;
	m->cols = cols;
	m->quantized = 1;
	if (s->fast) { /* E4M3 codes on the fast kernel */
		if (cw_dsv_mat_keep_fp8(m, w, sc, b0, b1) < 0)
			return st_diag_set(s->diag, -ENOMEM,
					   "out of memory (%s)", prefix);
		return 0;
	}
	m->w = malloc((size_t)rows * cols * sizeof(float));
	if (!m->w)
		return st_diag_set(s->diag, -ENOMEM, "out of memory (%s)",
				   prefix);
	cw_dsv_fp8_dequant(w, sc, rows, cols, b0, b1, m->w);
	return 0;
}

int cw_dsv_src_mxfp4(struct cw_dsv_src *s, const char *prefix, int rows,
		     int cols, struct cw_dsv_mat *m)
{
	const struct st_tensor_info *tw, *ts;
	const uint8_t *w, *sc;
	char name[300];
	int r;

	if (cols % ST_MXFP4_BLOCK)
		return st_diag_set(s->diag, -ST_E_CONFIG,
				   "%s: %d inputs, not a multiple of 32 (FP4 experts need it)",
				   prefix, cols);
	snprintf(name, sizeof(name), "%s.weight", prefix);
	if ((r = cw_dsv_src_find(s, name, ST_DTYPE_I8, rows, cols / 2, &tw,
				 (const void **)&w)) < 0)
		return r;
	snprintf(name, sizeof(name), "%s.scale", prefix);
	if ((r = cw_dsv_src_find(s, name, ST_DTYPE_F8_E8M0, rows, cols / 32,
				 &ts, (const void **)&sc)) < 0 ||
	    (r = cw_dsv_src_check_scales(s, name, sc, ts->n_elems)) < 0)
		return r;
	m->rows = rows;
	m->cols = cols;
	m->quantized = 1;
	m->w = malloc((size_t)rows * cols * sizeof(float));
	if (!m->w)
		return st_diag_set(s->diag, -ENOMEM, "out of memory (%s)",
				   prefix);
	for (int o = 0; o < rows; o++)
		st_mxfp4_dequantize_row(w + (size_t)o * cols / 2,
					sc + (size_t)o * cols / 32, cols,
					ST_FP4_LAYOUT_OCP,
					m->w + (size_t)o * cols);
	return 0;
}

int cw_dsv_src_mat_plain(struct cw_dsv_src *s, const char *name, int rows,
			 int cols, struct cw_dsv_mat *m)
{
	m->rows = rows;
	m->cols = cols;
	return cw_dsv_src_plain(s, name, rows, cols, &m->w);
}

int cw_dsv_src_mat16(struct cw_dsv_src *s, const char *name, int rows,
		     int cols, struct cw_dsv_mat *m)
{
	const struct st_tensor_info *t = cw_dsv_src_lookup(s, name, NULL);
	const void *data;
	int r;

	if (!s->fast || !t || t->dtype != ST_DTYPE_BF16)
		return cw_dsv_src_mat_plain(s, name, rows, cols, m);
	if ((r = cw_dsv_src_find(s, name, ST_DTYPE_BF16, rows, cols, &t,
				 &data)) < 0)
		return r;
	m->rows = rows;
	m->cols = cols;
	if (cw_dsv_mat_keep_bf16(m, data) < 0)
		return st_diag_set(s->diag, -ENOMEM, "out of memory (%s)",
				   name);
	return 0;
}

int cw_dsv_src_map_store(struct cw_dsv_src *s, const struct st_store *st,
			 struct st_diag *diag)
{
	char path[4300];
	void *map;
	int fd, r = 0;

	s->st = st;
	st_store_path(st, st->dense_file, path, sizeof(path));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return st_diag_set(diag, -errno, "%s: %s", path, strerror(errno));
	if (st->dense_bytes) {
		map = mmap(NULL, st->dense_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			r = st_diag_set(diag, -errno, "%s: mmap: %s", path,
					strerror(errno));
		} else {
			s->dense = map;
			s->dense_len = st->dense_bytes;
		}
	}
	close(fd); /* the mapping keeps the file */
	return r;
}

void cw_dsv_src_unmap(struct cw_dsv_src *s)
{
	if (s->dense && s->dense_len)
		munmap((void *)s->dense, s->dense_len);
	s->dense = NULL;
	s->dense_len = 0;
}

int cw_dsv_check_store_experts(const struct st_store *s, int hidden,
			       int inter, struct st_diag *diag)
{
	for (int l = 0; l < s->n_layers; l++)
		for (int k = 0; k < 3; k++) {
			const struct st_store_matrix *x = &s->layers[l].mat[k];
			int rows = k == 2 ? hidden : inter;
			int cols = k == 2 ? inter : hidden;

			if (x->fmt.dtype != ST_DTYPE_MXFP4 ||
			    x->fmt.group != ST_MXFP4_BLOCK || x->rows != rows ||
			    x->cols != cols)
				return st_diag_set(diag, -ST_E_FORMAT,
						   "store %s: layer %d expert matrix %d is not MXFP4 [%d, %d]: re-run strata convert",
						   s->dir, l, k, rows, cols);
		}
	return 0;
}

int cw_dsv_check_expertd(const struct st_store *s, struct es_client *es,
			 int top_k, const char *store_dir,
			 struct st_diag *diag)
{
	if (!es || es_client_n_layers(es) != s->n_layers ||
	    es_client_n_experts(es) != s->n_experts ||
	    es_client_record_bytes(es) != s->record_bytes)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "store %s: expertd %s this store (start expertd with --store %s)",
				   store_dir, es ? "serves another store than" :
				   "is needed to serve the experts of", store_dir);
	if (es_client_n_slots(es) < top_k)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "expertd's host budget holds %d experts, a token needs %d: raise --host-budget",
				   es_client_n_slots(es), top_k);
	return 0;
}

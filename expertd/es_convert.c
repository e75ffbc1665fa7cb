/*
 * es_convert.c — the store writer: checkpoint -> strata store (see
 * es_convert.h for the contract, common/st_store.h for the format).
 *
 * Three phases:
 *  1. check: config, every expert matrix and every dense role with its
 *     shape and dtype, tokenizer files; nothing is written before all pass;
 *  2. write into OUT.tmp-<pid>: dense.bin, experts-LLL.bin, the copied
 *     files, manifest.json last; every file fsynced, then the directory;
 *  3. publish: rename the temporary directory to OUT (atomic exchange with
 *     an existing store under force), fsync the parent.
 * The output depends only on the checkpoint and the options: tensors in the
 * checkpoint's (name-sorted) order, zero padding, a manifest with a fixed
 * key order and no times or absolute paths.
 */
#include "es_convert.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "st_build_config.h"
#include "st_config.h"
#include "st_safetensors.h"
#include "st_store.h"
#include "st_util.h"

/* The store files are little-endian, written from host memory as is. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "the store writer assumes a little-endian host");

/* Elements converted per step for large dense tensors. */
#define CHUNK_ELEMS ((size_t)1 << 20)

static const char *const mat_names[3] = { "gate", "up", "down" };

/* Copied into the store: required ones first, then optional. */
static const struct {
	const char *name;
	int required;
} copied_files[] = {
	{ "config.json", 1 },
	{ "generation_config.json", 0 },
	{ "tokenizer.json", 1 },
	{ "tokenizer_config.json", 1 },
};

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
	enum st_dtype dense_dtype;
	struct st_store_matrix mat[3];
	uint64_t record_bytes;
	int have_copied[ST_ARRAY_SIZE(copied_files)];

	uint64_t done, total;     /* progress, bytes read */
	XXH3_state_t *xs;
	json_t *manifest;
};

void es_convert_opts_init(struct es_convert_opts *opts)
{
	static const struct es_convert_opts def = ES_CONVERT_OPTS_DEFAULT;

	*opts = def;
}

/* Reports progress; returns -ECANCELED when the caller asked to stop
 * (opts.cancel), so the writer unwinds and removes its temporary dir. */
static int progress(struct conv *c, uint64_t bytes)
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

/* Checks tensor t against the expected [rows, cols] (cols 0: a vector). */
static int check_shape(struct conv *c, const struct st_tensor_info *t,
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

static int float_dtype(enum st_dtype dt)
{
	return dt == ST_DTYPE_F32 || dt == ST_DTYPE_F16 || dt == ST_DTYPE_BF16;
}

/* --- phase 1: checks ----------------------------------------------------- */

static int check_experts(struct conv *c)
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
							   mat_names[m]);
				if ((r = check_shape(c, t, c->mat[m].rows,
						     c->mat[m].cols)))
					return r;
				if (!float_dtype(t->dtype))
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

static int check_dense(struct conv *c)
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
			if ((r = check_shape(c, t, rows, cols)))
				return r;
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
		if (!float_dtype(t->dtype))
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

static int check_copied_files(struct conv *c)
{
	for (size_t i = 0; i < ST_ARRAY_SIZE(copied_files); i++) {
		char path[4200];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", c->model_dir,
			 copied_files[i].name);
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			c->have_copied[i] = 1;
			c->total += (uint64_t)st.st_size;
		} else if (copied_files[i].required) {
			return st_diag_set(c->diag, -ST_E_NOTFOUND,
					   "checkpoint %s: %s is missing (a store "
					   "needs the tokenizer)", c->model_dir,
					   copied_files[i].name);
		}
	}
	return 0;
}

/* --- output directory ---------------------------------------------------- */

/* Is `name` "<base><suffix><digits>"?  Returns the number or -1. */
static long leftover_pid(const char *name, const char *base,
			 const char *suffix)
{
	size_t bl = strlen(base), sl = strlen(suffix);
	char *end;
	long pid;

	if (strncmp(name, base, bl) || strncmp(name + bl, suffix, sl))
		return -1;
	name += bl + sl;
	if (*name < '0' || *name > '9')
		return -1;
	pid = strtol(name, &end, 10);
	return *end || pid <= 0 ? -1 : pid;
}

/* Removes OUT.tmp-<pid> / OUT.old-<pid> left by converts that died (their
 * pid is gone); a live convert's directory is left alone. */
static void remove_leftovers(struct conv *c)
{
	DIR *d = opendir(c->parent);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d))) {
		long pid = leftover_pid(de->d_name, c->base, ".tmp-");
		char path[8400];

		if (pid < 0)
			pid = leftover_pid(de->d_name, c->base, ".old-");
		if (pid < 0 || (pid != getpid() && st_pid_alive((int)pid)))
			continue;
		snprintf(path, sizeof(path), "%s/%s", c->parent, de->d_name);
		st_rm_rf(path);
	}
	closedir(d);
}

/* An existing directory we may replace under force: empty, or a store. */
static int replaceable(const char *dir)
{
	char path[4200];
	DIR *d;
	struct dirent *de;
	int empty = 1;

	snprintf(path, sizeof(path), "%s/%s", dir, ST_STORE_MANIFEST);
	if (st_path_exists(path))
		return 1;
	d = opendir(dir);
	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = 0;
	closedir(d);
	return empty;
}

static int prepare_out(struct conv *c, const char *out_dir, int *ret_exists)
{
	size_t n = strlen(out_dir);
	struct stat st;
	char *slash;

	while (n > 1 && out_dir[n - 1] == '/')
		n--;
	if (n == 0 || n >= sizeof(c->out) - 32)
		return st_diag_set(c->diag, -EINVAL, "output directory \"%s\": "
				   "empty or too long", out_dir);
	memcpy(c->out, out_dir, n);
	c->out[n] = 0;
	slash = strrchr(c->out, '/');
	if (!slash) {
		snprintf(c->parent, sizeof(c->parent), ".");
		c->base = c->out;
	} else {
		size_t pl = slash == c->out ? 1 : (size_t)(slash - c->out);

		memcpy(c->parent, c->out, pl);
		c->parent[pl] = 0;
		c->base = slash + 1;
	}
	if (!*c->base || !strcmp(c->base, ".") || !strcmp(c->base, ".."))
		return st_diag_set(c->diag, -EINVAL, "output directory \"%s\": "
				   "name a new directory", out_dir);
	if (stat(c->parent, &st) < 0)
		return st_diag_set(c->diag, -errno, "output directory %s: parent "
				   "%s: %s", c->out, c->parent, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return st_diag_set(c->diag, -ENOTDIR, "output directory %s: "
				   "parent %s is not a directory", c->out,
				   c->parent);
	remove_leftovers(c);
	*ret_exists = lstat(c->out, &st) == 0;
	if (*ret_exists) {
		if (!c->o.force)
			return st_diag_set(c->diag, -EEXIST,
					   "output directory %s exists; pass "
					   "--force to replace it", c->out);
		if (!S_ISDIR(st.st_mode) || !replaceable(c->out))
			return st_diag_set(c->diag, -EEXIST,
					   "output directory %s exists and is not "
					   "a strata store; refusing to replace it",
					   c->out);
	}
	snprintf(c->tmp, sizeof(c->tmp), "%s.tmp-%d", c->out, (int)getpid());
	if (mkdir(c->tmp, 0755) < 0)
		return st_diag_set(c->diag, -errno, "cannot create %s: %s", c->tmp,
				   strerror(errno));
	return 0;
}

/* --- writing helpers ----------------------------------------------------- */

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

static int create_out_file(struct conv *c, const char *name, int *ret_fd)
{
	char path[4400];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", c->tmp, name);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return st_diag_set(c->diag, -errno, "cannot create %s: %s", path,
				   strerror(errno));
	*ret_fd = fd;
	return 0;
}

/* fsync + close, reporting either failure (a write error may only show at
 * fsync time on some file systems). */
static int finish_out_file(struct conv *c, int fd, const char *name)
{
	int r = 0;

	if (fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	if (r)
		return st_diag_set(c->diag, r, "%s/%s: %s", c->tmp, name,
				   strerror(-r));
	return 0;
}

static int write_error(struct conv *c, int r, const char *name)
{
	return st_diag_set(c->diag, r, "writing %s/%s: %s", c->tmp, name,
			   strerror(-r));
}

static char *hex64(uint64_t x, char buf[17])
{
	snprintf(buf, 17, "%016" PRIx64, x);
	return buf;
}

/* json_object_set_new that reports allocation failure (of v or the set). */
static int jset(json_t *o, const char *key, json_t *v)
{
	if (!v)
		return -ENOMEM;
	return json_object_set_new(o, key, v) ? -ENOMEM : 0;
}

static int jappend(json_t *a, json_t *v)
{
	if (!v)
		return -ENOMEM;
	return json_array_append_new(a, v) ? -ENOMEM : 0;
}

static int jset_hex(json_t *o, const char *key, uint64_t x)
{
	char h[17];

	return jset(o, key, json_string(hex64(x, h)));
}

static int jset_int(json_t *o, const char *key, uint64_t x)
{
	return jset(o, key, json_integer((json_int_t)x));
}

/* --- phase 2: dense.bin -------------------------------------------------- */

/* Writes tensor t at `off` of fd in the store's dense dtype; returns the
 * bytes written in *ret_bytes and their XXH3 in *ret_xxh3. */
static int write_dense_tensor(struct conv *c, int fd, float *fbuf,
			      const struct st_tensor_info *t, uint64_t off,
			      uint64_t *ret_bytes, uint64_t *ret_xxh3)
{
	const uint8_t *src = st_checkpoint_data(c->ck, t);
	size_t es = st_dtype_traits(t->dtype)->block_bytes;
	int direct = t->dtype == c->dense_dtype;
	uint64_t out_es = c->dense_dtype == ST_DTYPE_BF16 ? 2 : 4;
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
			out = fbuf;
		}
		XXH3_64bits_update(c->xs, out, n * out_es);
		r = pwrite_full(fd, out, n * out_es, off + i * out_es);
		if (r)
			return write_error(c, r, ST_STORE_DENSE_FILE);
	}
	*ret_bytes = t->n_elems * out_es;
	*ret_xxh3 = XXH3_64bits_digest(c->xs);
	return 0;
}

static int write_dense(struct conv *c)
{
	json_t *dense = json_object(), *arr = json_array();
	const char *dt_name = st_dtype_traits(c->dense_dtype)->name;
	float *fbuf = malloc(CHUNK_ELEMS * sizeof(float));
	uint64_t cur = 0;
	int fd = -1, r;

	if (!dense || !arr || !fbuf) {
		r = -ENOMEM;
		goto out;
	}
	if ((r = create_out_file(c, ST_STORE_DENSE_FILE, &fd)))
		goto out;
	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i];
		uint64_t off = ST_ALIGN_UP(cur, ST_STORE_DENSE_ALIGN);
		uint64_t bytes = 0, h = 0;
		json_t *o, *shape;

		if (c->is_expert[i])
			continue;
		r = write_dense_tensor(c, fd, fbuf, t, off, &bytes, &h);
		if (r)
			goto out;
		cur = off + bytes;
		o = json_object();
		if ((r = jappend(arr, o)))
			goto out;
		shape = json_array();
		for (int d = 0; d < t->n_dims && shape && !r; d++)
			r = jappend(shape, json_integer(t->shape[d]));
		if (r) {
			json_decref(shape);
			goto out;
		}
		if ((r = jset(o, "name", json_string(t->name))) ||
		    (r = jset(o, "dtype", json_string(dt_name))) ||
		    (r = jset(o, "shape", shape)) ||
		    (r = jset_int(o, "offset", off)) ||
		    (r = jset_int(o, "bytes", bytes)) ||
		    (r = jset_hex(o, "xxh3", h)) ||
		    (r = jset(o, "source_dtype",
			      json_string(st_dtype_traits(t->dtype)->name))))
			goto out;
		if ((r = progress(c, t->n_bytes)))
			goto out;
	}
	cur = ST_ALIGN_UP(cur, ST_STORE_DENSE_ALIGN);
	if (ftruncate(fd, (off_t)cur) < 0) {
		r = write_error(c, -errno, ST_STORE_DENSE_FILE);
		goto out;
	}
	r = finish_out_file(c, fd, ST_STORE_DENSE_FILE);
	fd = -1;
	if (r)
		goto out;
	if ((r = jset(dense, "file", json_string(ST_STORE_DENSE_FILE))) ||
	    (r = jset_int(dense, "bytes", cur)) ||
	    (r = jset_int(dense, "align", ST_STORE_DENSE_ALIGN)))
		goto out;
	r = jset(dense, "tensors", arr);
	arr = NULL;
	if (r)
		goto out;
	r = jset(c->manifest, "dense", dense);
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

/* --- phase 2: expert files ----------------------------------------------- */

/* Fills matrix m of a record from checkpoint tensor t. */
static int fill_matrix(struct conv *c, const struct st_tensor_info *t, int m,
		       uint8_t *rec, float *row)
{
	const struct st_store_matrix *x = &c->mat[m];
	const uint8_t *src = st_checkpoint_data(c->ck, t);
	size_t es = st_dtype_traits(t->dtype)->block_bytes;
	size_t cols = (size_t)x->cols;
	int r;

	if (c->o.expert_dtype == ST_DTYPE_BF16 && t->dtype == ST_DTYPE_BF16) {
		memcpy(rec + x->data_offset, src, x->data_bytes);
		return 0;
	}
	for (int64_t i = 0; i < x->rows; i++) {
		const uint8_t *s = src + (size_t)i * cols * es;

		switch (c->o.expert_dtype) {
		case ST_DTYPE_MXFP4:
			r = st_convert_to_f32(t->dtype, s, cols, row);
			if (!r)
				r = st_mxfp4_quantize_row(
					row, cols,
					rec + x->data_offset + (size_t)i * cols / 2,
					rec + x->scale_offset +
						(size_t)i * cols / ST_MXFP4_BLOCK);
			break;
		case ST_DTYPE_BF16:
			r = st_convert_to_f32(t->dtype, s, cols, row);
			for (size_t j = 0; !r && j < cols; j++) {
				uint16_t h = st_f32_to_bf16(row[j]);

				memcpy(rec + x->data_offset + ((size_t)i * cols + j) * 2,
				       &h, 2);
			}
			break;
		default:
			r = st_convert_to_f32(t->dtype, s, cols,
					      (float *)(rec + x->data_offset) +
						      (size_t)i * cols);
			break;
		}
		if (r)
			return st_diag_set(c->diag, r, "tensor %s: row %" PRId64
					   ": conversion failed: %s", t->name, i,
					   st_strerror(r));
	}
	return 0;
}

static int write_expert_layer(struct conv *c, int l, uint8_t *rec, float *row,
			      json_t *files)
{
	int E = c->cfg.n_experts, fd = -1, r;
	json_t *o = json_object(), *sums = json_array();
	char name[64];

	st_store_expert_file_name(l, name, sizeof(name));
	if (!o || !sums) {
		r = -ENOMEM;
		goto fail;
	}
	if ((r = create_out_file(c, name, &fd)))
		goto fail;
	for (int e = 0; e < E; e++) {
		uint64_t src_bytes = 0;
		char h[17];

		memset(rec, 0, c->record_bytes);
		for (int m = 0; m < 3; m++) {
			const struct st_tensor_info *t =
				c->experts[((size_t)l * E + e) * 3 + m];

			if ((r = fill_matrix(c, t, m, rec, row)))
				goto fail;
			src_bytes += t->n_bytes;
		}
		r = jappend(sums, json_string(hex64(st_xxh3(rec, c->record_bytes),
						    h)));
		if (r)
			goto fail;
		r = pwrite_full(fd, rec, c->record_bytes,
				(uint64_t)e * c->record_bytes);
		if (r) {
			r = write_error(c, r, name);
			goto fail;
		}
		if ((r = progress(c, src_bytes)))
			goto fail;
	}
	r = finish_out_file(c, fd, name);
	fd = -1;
	if (r)
		goto fail;
	if ((r = jset_int(o, "layer", (uint64_t)l)) ||
	    (r = jset(o, "name", json_string(name))) ||
	    (r = jset_int(o, "bytes", (uint64_t)E * c->record_bytes)))
		goto fail;
	r = jset(o, "xxh3", sums);
	sums = NULL;
	if (r)
		goto fail;
	r = jappend(files, o);
	o = NULL;
fail:
	if (fd >= 0)
		close(fd);
	json_decref(o);
	json_decref(sums);
	return r;
}

static int experts_json(struct conv *c, json_t **ret_ex, json_t **ret_files)
{
	const char *fmt = st_store_format_name(c->o.expert_dtype);
	json_t *ex = json_object(), *mats = json_array(), *files = json_array();
	int r;

	if (!ex || !mats || !files) {
		json_decref(ex);
		json_decref(mats);
		json_decref(files);
		return -ENOMEM;
	}
	r = jset(ex, "format", json_string(fmt));
	if (!r)
		r = jset_int(ex, "n_layers", (uint64_t)c->cfg.n_layers);
	if (!r)
		r = jset_int(ex, "n_experts", (uint64_t)c->cfg.n_experts);
	if (!r)
		r = jset_int(ex, "record_bytes", c->record_bytes);
	if (!r)
		r = jset_int(ex, "record_align", ST_STORE_RECORD_ALIGN);
	if (!r)
		r = jset_int(ex, "section_align", ST_STORE_SECTION_ALIGN);
	for (int m = 0; m < 3 && !r; m++) {
		const struct st_store_matrix *x = &c->mat[m];
		json_t *o = json_object();

		if ((r = jappend(mats, o)))
			break;
		if ((r = jset(o, "name", json_string(mat_names[m]))) ||
		    (r = jset_int(o, "rows", (uint64_t)x->rows)) ||
		    (r = jset_int(o, "cols", (uint64_t)x->cols)) ||
		    (r = jset(o, "format", json_string(fmt))))
			break;
		if (c->o.expert_dtype == ST_DTYPE_MXFP4 &&
		    ((r = jset_int(o, "block", ST_MXFP4_BLOCK)) ||
		     (r = jset(o, "scale", json_string("e8m0"))) ||
		     (r = jset(o, "layout", json_string("ocp"))) ||
		     (r = jset(o, "rounding",
			       json_string("nearest-even, saturate \u00b16")))))
			break;
		if ((r = jset_int(o, "data_offset", x->data_offset)) ||
		    (r = jset_int(o, "data_bytes", x->data_bytes)))
			break;
		if (c->o.expert_dtype == ST_DTYPE_MXFP4 &&
		    ((r = jset_int(o, "scale_offset", x->scale_offset)) ||
		     (r = jset_int(o, "scale_bytes", x->scale_bytes))))
			break;
	}
	if (!r) {
		r = json_object_set(ex, "matrices", mats) ? -ENOMEM : 0;
		if (!r)
			r = json_object_set(ex, "files", files) ? -ENOMEM : 0;
	}
	json_decref(mats);
	if (r) {
		json_decref(files);
		json_decref(ex);
		return r;
	}
	*ret_ex = ex;
	*ret_files = files; /* borrowed from ex after this point */
	json_decref(files);
	return 0;
}

static int write_experts(struct conv *c)
{
	json_t *ex = NULL, *files = NULL;
	uint8_t *rec = NULL;
	float *row = NULL;
	int64_t max_cols = ST_MAX(ST_MAX(c->mat[0].cols, c->mat[1].cols),
				  c->mat[2].cols);
	int r;

	r = experts_json(c, &ex, &files);
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
		r = write_expert_layer(c, l, rec, row, files);
	if (!r) {
		r = jset(c->manifest, "experts", ex);
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

/* --- phase 2: copied files and the manifest ------------------------------ */

static int write_whole(struct conv *c, const char *name, const void *buf,
		       size_t len)
{
	int fd, r;

	if ((r = create_out_file(c, name, &fd)))
		return r;
	r = pwrite_full(fd, buf, len, 0);
	if (r) {
		close(fd);
		return write_error(c, r, name);
	}
	return finish_out_file(c, fd, name);
}

static int copy_files(struct conv *c, json_t *arr)
{
	for (size_t i = 0; i < ST_ARRAY_SIZE(copied_files); i++) {
		const char *name = copied_files[i].name;
		char path[4200];
		char *buf = NULL;
		size_t len;
		json_t *o;
		int r;

		if (!c->have_copied[i])
			continue;
		if (!strcmp(name, "config.json")) {
			/* exactly the text the config was parsed from */
			buf = c->config_text;
			len = c->config_len;
		} else {
			snprintf(path, sizeof(path), "%s/%s", c->model_dir, name);
			r = st_read_file(path, &buf, &len);
			if (r)
				return st_diag_set(c->diag, r, "%s: %s", path,
						   strerror(-r));
		}
		r = write_whole(c, name, buf, len);
		if (!r && !(r = jappend(arr, (o = json_object()))))
			if (!(r = jset(o, "name", json_string(name))) &&
			    !(r = jset_int(o, "bytes", len)))
				r = jset_hex(o, "xxh3", st_xxh3(buf, len));
		if (buf != c->config_text)
			free(buf);
		if (r)
			return r == -ENOMEM ? st_diag_set(c->diag, r, "out of "
							  "memory") : r;
		if ((r = progress(c, len)))
			return r;
	}
	return 0;
}

static int manifest_head(struct conv *c)
{
	json_t *m = c->manifest, *src = json_object(), *sf = json_array();
	int r;

	if (!src || !sf) {
		json_decref(src);
		json_decref(sf);
		return -ENOMEM;
	}
	r = jset(src, "files", sf);
	for (int i = 0; i < c->ck->n_files && !r; i++) {
		json_t *o = json_object();

		if (!(r = jappend(sf, o)) &&
		    !(r = jset(o, "name", json_string(c->ck->file_names[i]))))
			r = jset_int(o, "bytes", c->ck->file_sizes[i]);
	}
	if (r) {
		json_decref(src);
		return r;
	}
	if ((r = jset(m, "format", json_string(ST_STORE_FORMAT))) ||
	    (r = jset_int(m, "version", ST_STORE_VERSION)) ||
	    (r = jset(m, "writer", json_string("strata " ST_VERSION)))) {
		json_decref(src);
		return r;
	}
	if (jset(m, "config", json_stringn(c->config_text, c->config_len))) {
		json_decref(src);
		return st_diag_set(c->diag, -ST_E_FORMAT, "%s/config.json: not "
				   "valid UTF-8 (or out of memory)",
				   c->model_dir);
	}
	if ((r = jset(m, "source", src)))
		return r;
	return jset(m, "files", json_array());
}

static int write_manifest(struct conv *c)
{
	char *text = json_dumps(c->manifest, JSON_INDENT(1) |
					      JSON_PRESERVE_ORDER |
					      JSON_ENSURE_ASCII);
	size_t len;
	int r;

	if (!text)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	len = strlen(text);
	text[len] = '\n'; /* json_dumps leaves the NUL there: replace it */
	r = write_whole(c, ST_STORE_MANIFEST, text, len + 1);
	free(text);
	return r;
}

static int fsync_dir(struct conv *c, const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return st_diag_set(c->diag, -errno, "%s: %s", dir,
				   strerror(errno));
	if (fsync(fd) < 0)
		r = st_diag_set(c->diag, -errno, "fsync %s: %s", dir,
				strerror(errno));
	close(fd);
	return r;
}

/* --- phase 3: publish ---------------------------------------------------- */

static int publish(struct conv *c, int exists)
{
	char old[4200];

	if (!exists) {
		if (renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->out,
			      RENAME_NOREPLACE) == 0)
			return fsync_dir(c, c->parent);
		if (errno == EEXIST || errno == ENOTEMPTY)
			return st_diag_set(c->diag, -EEXIST, "output directory %s "
					   "appeared during the conversion; not "
					   "replacing it", c->out);
		if (errno != EINVAL && errno != ENOSYS)
			return st_diag_set(c->diag, -errno, "rename %s -> %s: %s",
					   c->tmp, c->out, strerror(errno));
		if (rename(c->tmp, c->out) < 0)
			return st_diag_set(c->diag, -errno, "rename %s -> %s: %s",
					   c->tmp, c->out, strerror(errno));
		return fsync_dir(c, c->parent);
	}
	/* force: swap the new store in atomically; the old one ends up in
	 * tmp and is removed with it. */
	if (renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->out, RENAME_EXCHANGE) == 0)
		return fsync_dir(c, c->parent);
	if (errno != EINVAL && errno != ENOSYS)
		return st_diag_set(c->diag, -errno, "exchange %s and %s: %s",
				   c->tmp, c->out, strerror(errno));
	/* no RENAME_EXCHANGE on this file system: move the old one aside */
	snprintf(old, sizeof(old), "%s.old-%d", c->out, (int)getpid());
	if (rename(c->out, old) < 0)
		return st_diag_set(c->diag, -errno, "rename %s -> %s: %s", c->out,
				   old, strerror(errno));
	if (rename(c->tmp, c->out) < 0) {
		int e = errno;

		rename(old, c->out);
		return st_diag_set(c->diag, -e, "rename %s -> %s: %s", c->tmp,
				   c->out, strerror(e));
	}
	st_rm_rf(old);
	return fsync_dir(c, c->parent);
}

/* --- entry --------------------------------------------------------------- */

static int check_all(struct conv *c)
{
	char path[4200];
	int r;

	if (c->o.expert_dtype != ST_DTYPE_MXFP4 &&
	    c->o.expert_dtype != ST_DTYPE_BF16 &&
	    c->o.expert_dtype != ST_DTYPE_F32)
		return st_diag_set(c->diag, -EINVAL, "expert format %d: must be "
				   "mxfp4, bf16 or f32", (int)c->o.expert_dtype);
	if ((r = st_config_load(c->model_dir, &c->cfg, c->diag)))
		return r;
	snprintf(path, sizeof(path), "%s/config.json", c->model_dir);
	if ((r = st_read_file(path, &c->config_text, &c->config_len)))
		return st_diag_set(c->diag, r, "%s: %s", path, strerror(-r));
	if ((r = st_store_layout(&c->cfg, c->o.expert_dtype, c->mat,
				 &c->record_bytes, c->diag)))
		return r;
	if ((r = st_checkpoint_open(c->model_dir, &c->ck, c->diag)))
		return r;
	c->is_expert = calloc((size_t)c->ck->n_tensors + 1, 1);
	if (!c->is_expert)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if ((r = check_experts(c)) || (r = check_dense(c)) ||
	    (r = check_copied_files(c)))
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
	if ((r = manifest_head(c)))
		return r == -ENOMEM ? st_diag_set(c->diag, r, "out of memory") : r;
	files = json_object_get(c->manifest, "files");
	if ((r = copy_files(c, files)) || (r = write_dense(c)) ||
	    (r = write_experts(c)) || (r = write_manifest(c)) ||
	    (r = fsync_dir(c, c->tmp)))
		return r;
	return 0;
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
		r = prepare_out(&c, out_dir, &exists);
	if (!r) {
		made_tmp = 1;
		if (c.o.progress)
			c.o.progress(0, c.total, c.o.progress_arg);
		r = write_all(&c);
	}
	if (!r)
		r = publish(&c, exists);
	if (made_tmp)
		st_rm_rf(c.tmp); /* on success: gone, or the replaced store */
	if (!r && c.o.progress)
		c.o.progress(c.total, c.total, c.o.progress_arg);
	json_decref(c.manifest);
	XXH3_freeState(c.xs);
	free(c.experts);
	free(c.is_expert);
	free(c.config_text);
	st_checkpoint_close(c.ck);
	return r;
}

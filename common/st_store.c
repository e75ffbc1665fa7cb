/*
 * st_store.c — reading and checking a strata store (format: st_store.h).
 *
 * st_store_open trusts nothing in manifest.json: every number is range
 * checked, the embedded config is parsed again and the expert geometry and
 * record layout are recomputed from it (st_store_layout, shared with the
 * writer in expertd/convert/) and compared, and every listed file must
 * exist with the size the manifest gives.  Checksums are checked when data
 * is read (st_store_read_record) or all at once (st_store_verify).
 */
#include "st_store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "st_engram_hash.h"
#include "st_store_engram.h"
#include "st_util.h"

/* Bounds on manifest numbers: far above any real model, low enough that
 * no product of two of them overflows 64 bits. */
#define MAX_LAYERS 4096
#define MAX_EXPERTS 65536
#define MAX_DIM (INT64_C(1) << 40)
#define MAX_BYTES (UINT64_C(1) << 50)
#define MAX_TENSORS (1 << 20)
#define MAX_FILES 64

/* Streaming buffer for checksums of large tensors and files. */
#define HASH_CHUNK_BYTES (4u << 20)

/* --- layout, names ------------------------------------------------------ */

static const char *const mat_names[3] = { "gate", "up", "down" };

int st_store_expert_file_name(int layer, char *buf, size_t len)
{
	int n = snprintf(buf, len, "experts-%03d.bin", layer);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int st_store_layout(const struct st_model_config *cfg,
		    const struct st_wformat fmt[3],
		    struct st_store_matrix ret_mat[3],
		    uint64_t *ret_record_bytes, struct st_diag *diag)
{
	uint64_t cur = 0;

	for (int m = 0; m < 3; m++) {
		struct st_store_matrix *x = &ret_mat[m];
		char name[ST_WFORMAT_NAME_MAX];
		int64_t rows, cols;
		int r;

		memset(x, 0, sizeof(*x));
		if (st_wformat_name(&fmt[m], name, sizeof(name)))
			return st_diag_set(diag, -EINVAL, "expert %s matrix: "
					   "invalid format (dtype %d, group %u)",
					   mat_names[m], (int)fmt[m].dtype,
					   fmt[m].group);
		st_expert_tensor_shape(cfg, (enum st_expert_mat)m, &rows, &cols);
		x->rows = rows;
		x->cols = cols;
		x->fmt = fmt[m];
		r = st_wformat_matrix_bytes(&fmt[m], rows, cols, &x->data_bytes,
					    &x->scale_bytes, &x->tscale_bytes);
		if (r == -ST_E_UNSUPPORTED)
			return st_diag_set(diag, r, "expert %s matrix has %" PRId64
					   " columns, which %s cannot hold (%s); "
					   "convert with another format",
					   mat_names[m], cols, name,
					   fmt[m].dtype == ST_DTYPE_E2M1_F16 ?
					   "an even width is needed" :
					   "a whole number of blocks is needed");
		if (r)
			return st_diag_set(diag, r == -EINVAL ? -ST_E_LIMIT : r,
					   "expert %s matrix [%" PRId64 ", %" PRId64
					   "] out of range", mat_names[m], rows,
					   cols);
		x->data_offset = ST_ALIGN_UP(cur, ST_STORE_SECTION_ALIGN);
		cur = x->data_offset + x->data_bytes;
		if (x->scale_bytes) {
			x->scale_offset = ST_ALIGN_UP(cur, ST_STORE_SECTION_ALIGN);
			cur = x->scale_offset + x->scale_bytes;
		}
		if (x->tscale_bytes) {
			x->tscale_offset = ST_ALIGN_UP(cur, ST_STORE_SECTION_ALIGN);
			cur = x->tscale_offset + x->tscale_bytes;
		}
	}
	*ret_record_bytes = ST_ALIGN_UP(cur, ST_STORE_RECORD_ALIGN);
	return 0;
}

/* --- manifest parsing helpers ------------------------------------------ */

/* Where we are, for messages: "store DIR: manifest.json: WHAT: problem". */
struct mctx {
	const char *dir;
	struct st_diag *diag;
};

static int bad(const struct mctx *c, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int bad(const struct mctx *c, int err, const char *fmt, ...)
{
	char what[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return st_diag_set(c->diag, err, "store %s: %s: %s", c->dir,
			   ST_STORE_MANIFEST, what);
}

static int get_int(const struct mctx *c, json_t *obj, const char *where,
		   const char *key, int64_t min, int64_t max, int64_t *ret)
{
	json_t *v = json_object_get(obj, key);
	json_int_t x = 0;

	if (!v || !json_is_integer(v))
		return bad(c, -ST_E_FORMAT, "%s.%s: missing or not an integer",
			   where, key);
	x = json_integer_value(v);
	if (x < min || x > max)
		return bad(c, -ST_E_FORMAT,
			   "%s.%s: %lld out of range [%" PRId64 ", %" PRId64 "]",
			   where, key, (long long)x, min, max);
	*ret = x;
	return 0;
}

static int get_u64(const struct mctx *c, json_t *obj, const char *where,
		   const char *key, uint64_t max, uint64_t *ret)
{
	int64_t x = 0;
	int r = get_int(c, obj, where, key, 0, (int64_t)max, &x);

	if (r == 0)
		*ret = (uint64_t)x;
	return r;
}

static int get_str(const struct mctx *c, json_t *obj, const char *where,
		   const char *key, const char **ret)
{
	json_t *v = json_object_get(obj, key);

	if (!v || !json_is_string(v))
		return bad(c, -ST_E_FORMAT, "%s.%s: missing or not a string",
			   where, key);
	*ret = json_string_value(v);
	return 0;
}

static int parse_hex64(const char *s, uint64_t *ret)
{
	uint64_t x = 0;

	if (strlen(s) != 16)
		return -1;
	for (int i = 0; i < 16; i++) {
		int d;

		if (s[i] >= '0' && s[i] <= '9')
			d = s[i] - '0';
		else if (s[i] >= 'a' && s[i] <= 'f')
			d = s[i] - 'a' + 10;
		else
			return -1;
		x = x << 4 | (uint64_t)d;
	}
	*ret = x;
	return 0;
}

static int hex_value(const struct mctx *c, json_t *v, const char *where,
		     uint64_t *ret)
{
	if (!v || !json_is_string(v) || parse_hex64(json_string_value(v), ret))
		return bad(c, -ST_E_FORMAT,
			   "%s: not a checksum (16 lower-case hex digits)",
			   where);
	return 0;
}

static int get_hex(const struct mctx *c, json_t *obj, const char *where,
		   const char *key, uint64_t *ret)
{
	char w[256];

	snprintf(w, sizeof(w), "%s.%s", where, key);
	return hex_value(c, json_object_get(obj, key), w, ret);
}

/* A plain base name inside the store directory: no path separators, not
 * hidden, not "." or "..", printable. */
static int safe_base_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > 255 || s[0] == '.')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (s[i] == '/' || (unsigned char)s[i] < 0x20)
			return 0;
	return 1;
}

/* Checks that store file `name` exists and is exactly `bytes` long. */
static int check_file_size(const struct mctx *c, const char *name,
			   uint64_t bytes)
{
	char path[4096];
	struct stat st;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", c->dir, name) >=
	    sizeof(path))
		return st_diag_set(c->diag, -ENAMETOOLONG, "store %s: path of %s "
				   "too long", c->dir, name);
	if (stat(path, &st) < 0) {
		int e = -errno;

		return st_diag_set(c->diag, e, "store %s: %s (listed in %s): %s; "
				   "the store is incomplete, re-run strata convert",
				   c->dir, name, ST_STORE_MANIFEST, strerror(-e));
	}
	if (!S_ISREG(st.st_mode))
		return st_diag_set(c->diag, -ST_E_FORMAT, "store %s: %s is not a "
				   "regular file", c->dir, name);
	if ((uint64_t)st.st_size != bytes)
		return st_diag_set(c->diag, -ST_E_FORMAT,
				   "store %s: %s is %" PRIu64 " bytes, %s says %"
				   PRIu64 " (truncated or damaged); re-run strata "
				   "convert", c->dir, name, (uint64_t)st.st_size,
				   ST_STORE_MANIFEST, bytes);
	return 0;
}

/* --- sections of the manifest ------------------------------------------ */

static int parse_config(const struct mctx *c, json_t *root, struct st_store *s)
{
	struct st_diag d = { { 0 } };
	const char *text = NULL;
	int r;

	r = get_str(c, root, "manifest", "config", &text);
	if (r)
		return r;
	s->config_json = strdup(text);
	if (!s->config_json)
		return -ENOMEM;
	if (st_dsv_config_detect(text) == ST_DSV_REV_V41) {
		r = st_dsv_config_parse(text, "manifest.json config",
					ST_DSV_REV_V41, &s->dsv41, &d);
		if (!r)
			r = st_dsv41_config_check_store(&s->dsv41,
							"manifest.json config",
							&d);
		if (r)
			return bad(c, r, "embedded config: %s", d.msg);
		s->is_dsv41 = 1;
		st_dsv_expert_config(&s->dsv41, &s->cfg);
		return 0;
	}
	if (st_dsv_config_detect(text) == ST_DSV_REV_V4) {
		r = st_dsv_config_parse(text, "manifest.json config",
					ST_DSV_REV_V4, &s->dsv4, &d);
		if (r)
			return bad(c, r, "embedded config: %s", d.msg);
		s->is_dsv4 = 1;
		st_dsv_expert_config(&s->dsv4, &s->cfg);
		return 0;
	}
	r = st_config_parse(text, "manifest.json config", &s->cfg, &d);
	if (r)
		return bad(c, r, "embedded config: %s", d.msg);
	return 0;
}

static int parse_files(const struct mctx *c, json_t *root, struct st_store *s)
{
	static const char *required[] = { "config.json", "tokenizer.json",
					  "tokenizer_config.json" };
	json_t *arr = json_object_get(root, "files");
	size_t n;
	int r;

	if (!arr || !json_is_array(arr))
		return bad(c, -ST_E_FORMAT, "files: missing or not an array");
	n = json_array_size(arr);
	if (n > MAX_FILES)
		return bad(c, -ST_E_FORMAT, "files: %zu entries (at most %d)", n,
			   MAX_FILES);
	s->files = calloc(n ? n : 1, sizeof(*s->files));
	if (!s->files)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		struct st_store_file *f = &s->files[i];
		json_t *o = json_array_get(arr, i);
		char where[64];
		const char *name = NULL;

		snprintf(where, sizeof(where), "files[%zu]", i);
		if (!json_is_object(o))
			return bad(c, -ST_E_FORMAT, "%s: not an object", where);
		if ((r = get_str(c, o, where, "name", &name)))
			return r;
		if (!safe_base_name(name) || !strcmp(name, ST_STORE_MANIFEST) ||
		    !strcmp(name, ST_STORE_DENSE_FILE) ||
		    !strncmp(name, "experts-", 8))
			return bad(c, -ST_E_FORMAT, "%s.name: \"%s\" is not an "
				   "allowed file name", where, name);
		for (size_t j = 0; j < i; j++)
			if (!strcmp(s->files[j].name, name))
				return bad(c, -ST_E_FORMAT, "%s.name: \"%s\" listed "
					   "twice", where, name);
		f->name = strdup(name);
		if (!f->name)
			return -ENOMEM;
		s->n_files = (int)i + 1;
		if ((r = get_u64(c, o, where, "bytes", MAX_BYTES, &f->n_bytes)) ||
		    (r = get_hex(c, o, where, "xxh3", &f->xxh3)) ||
		    (r = check_file_size(c, name, f->n_bytes)))
			return r;
	}
	for (size_t k = 0; k < ST_ARRAY_SIZE(required); k++) {
		int found = 0;

		for (int i = 0; i < s->n_files; i++)
			found |= !strcmp(s->files[i].name, required[k]);
		if (!found)
			return bad(c, -ST_E_FORMAT, "files: %s is not listed",
				   required[k]);
	}
	return 0;
}

/* config.json in the store must be the embedded text; generation_config.json
 * (if copied) contributes EOS ids, read through st_config_load. */
static int check_config_copy(const struct mctx *c, struct st_store *s)
{
	char path[4096];
	char *text = NULL;
	size_t len = 0;
	int r, has_gen = 0;

	snprintf(path, sizeof(path), "%s/config.json", c->dir);
	r = st_read_file(path, &text, &len);
	if (r)
		return st_diag_set(c->diag, r, "store %s: config.json: %s", c->dir,
				   st_strerror(r));
	r = len != strlen(s->config_json) || memcmp(text, s->config_json, len);
	free(text);
	if (r)
		return bad(c, -ST_E_FORMAT, "config: differs from the store's "
			   "config.json; re-run strata convert");
	for (int i = 0; i < s->n_files; i++)
		has_gen |= !strcmp(s->files[i].name, "generation_config.json");
	/* V4.1: the EOS id comes from config.json (st_config_load does not
	 * read the composite V4.1 config) */
	if (has_gen && !s->is_dsv41) {
		struct st_model_config full;
		struct st_diag d = { { 0 } };

		r = st_config_load(c->dir, &full, &d);
		if (r)
			return st_diag_set(c->diag, r, "store %s: %s", c->dir,
					   d.msg);
		if (full.arch != s->cfg.arch ||
		    full.n_layers != s->cfg.n_layers ||
		    full.n_experts != s->cfg.n_experts ||
		    full.hidden_size != s->cfg.hidden_size)
			return bad(c, -ST_E_FORMAT, "config: reads differently "
				   "from the store's config.json");
		s->cfg.n_eos = full.n_eos;
		memcpy(s->cfg.eos_token_ids, full.eos_token_ids,
		       sizeof(full.eos_token_ids));
	}
	return 0;
}

static int parse_tensor(const struct mctx *c, json_t *o, const char *where,
			uint64_t dense_bytes, int v4, struct st_store_tensor *t)
{
	const struct st_dtype_traits *tr;
	const char *name = NULL, *dtype = NULL, *src = NULL;
	json_t *shape;
	uint64_t elems = 1;
	int r;

	if (!json_is_object(o))
		return bad(c, -ST_E_FORMAT, "%s: not an object", where);
	if ((r = get_str(c, o, where, "name", &name)))
		return r;
	if (!*name || strlen(name) > 512)
		return bad(c, -ST_E_FORMAT, "%s.name: empty or too long", where);
	t->name = strdup(name);
	if (!t->name)
		return -ENOMEM;
	if ((r = get_str(c, o, where, "dtype", &dtype)))
		return r;
	if (st_dtype_from_name(dtype, &t->dtype) ||
	    (t->dtype != ST_DTYPE_F32 && t->dtype != ST_DTYPE_BF16 &&
	     t->dtype != ST_DTYPE_F8_E4M3 &&
	     !(v4 && (t->dtype == ST_DTYPE_F8_E8M0 ||
		      t->dtype == ST_DTYPE_I64))))
		return bad(c, -ST_E_FORMAT, "tensor %s: dtype \"%s\" (a store "
			   "holds F32, BF16 or F8_E4M3 dense tensors%s)", name,
			   dtype, v4 ? ", F8_E8M0 scales and I64 tid2eid" : "");
	if ((r = get_str(c, o, where, "source_dtype", &src)))
		return r;
	shape = json_object_get(o, "shape");
	if (!shape || !json_is_array(shape) || json_array_size(shape) > 4)
		return bad(c, -ST_E_FORMAT, "tensor %s: shape missing or more "
			   "than 4 dimensions", name);
	t->n_dims = (int)json_array_size(shape);
	for (int d = 0; d < t->n_dims; d++) {
		json_t *v = json_array_get(shape, (size_t)d);

		if (!json_is_integer(v) || json_integer_value(v) < 1 ||
		    json_integer_value(v) > MAX_DIM)
			return bad(c, -ST_E_FORMAT, "tensor %s: shape[%d] not an "
				   "integer in [1, 2^40]", name, d);
		t->shape[d] = json_integer_value(v);
		if (elems > MAX_BYTES / (uint64_t)t->shape[d])
			return bad(c, -ST_E_FORMAT, "tensor %s: too many "
				   "elements", name);
		elems *= (uint64_t)t->shape[d];
	}
	if ((r = get_u64(c, o, where, "offset", MAX_BYTES, &t->offset)) ||
	    (r = get_u64(c, o, where, "bytes", MAX_BYTES, &t->n_bytes)) ||
	    (r = get_hex(c, o, where, "xxh3", &t->xxh3)))
		return r;
	tr = st_dtype_traits(t->dtype);
	if (t->n_bytes != elems * tr->block_bytes)
		return bad(c, -ST_E_FORMAT, "tensor %s: %" PRIu64 " bytes, but "
			   "its shape and dtype make %" PRIu64, name, t->n_bytes,
			   elems * tr->block_bytes);
	if (t->offset % ST_STORE_DENSE_ALIGN)
		return bad(c, -ST_E_FORMAT, "tensor %s: offset %" PRIu64 " not "
			   "%d-aligned", name, t->offset, ST_STORE_DENSE_ALIGN);
	if (t->offset + t->n_bytes > dense_bytes)
		return bad(c, -ST_E_FORMAT, "tensor %s: [%" PRIu64 ", %" PRIu64
			   ") outside %s (%" PRIu64 " bytes)", name, t->offset,
			   t->offset + t->n_bytes, ST_STORE_DENSE_FILE,
			   dense_bytes);
	return 0;
}

static int cmp_tensor_offset(const void *a, const void *b)
{
	const struct st_store_tensor *x = a, *y = b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	const struct st_store_tensor *x = a, *y = b;

	return strcmp(x->name, y->name);
}

/* V4: the global tensors and every layer's norms must be present with
 * their shapes (the forward pass checks the rest when it loads). */
static int check_dense_dsv4(const struct mctx *c, const struct st_store *s)
{
	const struct st_model_config *v = &s->cfg; /* V4 and V4.1 */

	for (int l = -1; l < v->n_layers; l++) {
		char name[3][64];
		int64_t rows[3] = { v->vocab_size, v->vocab_size, v->hidden_size };
		int n = 3;

		if (l < 0) {
			snprintf(name[0], sizeof(name[0]), "embed.weight");
			snprintf(name[1], sizeof(name[1]), "head.weight");
			snprintf(name[2], sizeof(name[2]), "norm.weight");
		} else {
			snprintf(name[0], sizeof(name[0]),
				 "layers.%d.attn_norm.weight", l);
			snprintf(name[1], sizeof(name[1]),
				 "layers.%d.ffn_norm.weight", l);
			rows[0] = rows[1] = v->hidden_size;
			n = 2;
		}
		for (int i = 0; i < n; i++) {
			const struct st_store_tensor *t =
				st_store_find_dense(s, name[i]);

			if (!t)
				return bad(c, -ST_E_FORMAT, "dense tensor %s "
					   "(needed by the config) is missing",
					   name[i]);
			if (t->shape[0] != rows[i] ||
			    t->n_dims != (rows[i] == v->vocab_size ? 2 : 1))
				return bad(c, -ST_E_FORMAT, "dense tensor %s: "
					   "shape does not match the config",
					   name[i]);
		}
	}
	return 0;
}

/* Every dense role the config names must be present with its shape. */
static int check_dense_roles(const struct mctx *c, const struct st_store *s)
{
	if (s->is_dsv4 || s->is_dsv41)
		return check_dense_dsv4(c, s);
	for (int role = 0; role < ST_T_ROLE_COUNT; role++) {
		int global = role == ST_T_EMBED || role == ST_T_FINAL_NORM ||
			     role == ST_T_LM_HEAD;
		int n = global ? 1 : s->cfg.n_layers;

		for (int l = 0; l < n; l++) {
			const struct st_store_tensor *t;
			int64_t rows, cols;
			char name[256];
			int r = st_dense_tensor_name(&s->cfg,
						     (enum st_dense_role)role, l,
						     name, sizeof(name));

			if (r == -ST_E_NOTFOUND)
				break;
			if (r)
				return bad(c, r, "dense role %d: no tensor name",
					   role);
			t = st_store_find_dense(s, name);
			if (!t)
				return bad(c, -ST_E_FORMAT, "dense tensor %s (needed "
					   "by the config) is missing", name);
			st_dense_tensor_shape(&s->cfg, (enum st_dense_role)role,
					      &rows, &cols);
			if (cols == 0 ? (t->n_dims != 1 || t->shape[0] != rows)
				      : (t->n_dims != 2 || t->shape[0] != rows ||
					 t->shape[1] != cols))
				return bad(c, -ST_E_FORMAT, "dense tensor %s: shape "
					   "does not match the config ([%" PRId64
					   ", %" PRId64 "])", name, rows, cols);
		}
	}
	return 0;
}

static int parse_dense(const struct mctx *c, json_t *root, struct st_store *s)
{
	json_t *dense = json_object_get(root, "dense"), *arr;
	const char *file = NULL;
	int64_t align = 0;
	size_t n;
	int r;

	if (!dense || !json_is_object(dense))
		return bad(c, -ST_E_FORMAT, "dense: missing or not an object");
	if ((r = get_str(c, dense, "dense", "file", &file)))
		return r;
	if (strcmp(file, ST_STORE_DENSE_FILE))
		return bad(c, -ST_E_FORMAT, "dense.file: \"%s\", expected \"%s\"",
			   file, ST_STORE_DENSE_FILE);
	s->dense_file = strdup(file);
	if (!s->dense_file)
		return -ENOMEM;
	if ((r = get_u64(c, dense, "dense", "bytes", MAX_BYTES,
			 &s->dense_bytes)) ||
	    (r = get_int(c, dense, "dense", "align", ST_STORE_DENSE_ALIGN,
			 ST_STORE_DENSE_ALIGN, &align)))
		return r;
	arr = json_object_get(dense, "tensors");
	if (!arr || !json_is_array(arr))
		return bad(c, -ST_E_FORMAT, "dense.tensors: missing or not an "
			   "array");
	n = json_array_size(arr);
	if (n > MAX_TENSORS)
		return bad(c, -ST_E_FORMAT, "dense.tensors: %zu entries", n);
	s->dense = calloc(n ? n : 1, sizeof(*s->dense));
	if (!s->dense)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		char where[64];

		snprintf(where, sizeof(where), "dense.tensors[%zu]", i);
		s->n_dense = (int)i + 1;
		r = parse_tensor(c, json_array_get(arr, i), where,
				 s->dense_bytes, s->is_dsv4 || s->is_dsv41,
				 &s->dense[i]);
		if (r)
			return r;
	}
	qsort(s->dense, n, sizeof(*s->dense), cmp_tensor_offset);
	for (size_t i = 1; i < n; i++)
		if (s->dense[i].offset <
		    s->dense[i - 1].offset + s->dense[i - 1].n_bytes)
			return bad(c, -ST_E_FORMAT, "tensors %s and %s overlap in "
				   "%s", s->dense[i - 1].name, s->dense[i].name,
				   ST_STORE_DENSE_FILE);
	qsort(s->dense, n, sizeof(*s->dense), cmp_tensor_name);
	for (size_t i = 1; i < n; i++)
		if (!strcmp(s->dense[i].name, s->dense[i - 1].name))
			return bad(c, -ST_E_FORMAT, "tensor %s listed twice",
				   s->dense[i].name);
	if ((r = check_dense_roles(c, s)))
		return r;
	return check_file_size(c, s->dense_file, s->dense_bytes);
}

/* The format of matrix entry o (experts.layers[layer].matrices[m]): name,
 * spelling, block, scale type and layout must agree with each other. */
static int parse_matrix_format(const struct mctx *c, json_t *o,
			       const char *where, int m,
			       struct st_wformat *ret, int *ret_il_rows)
{
	const char *name = NULL, *fmt = NULL, *str = NULL;
	const char *want_scale;
	int64_t v = 0;
	int r;

	if (!json_is_object(o))
		return bad(c, -ST_E_FORMAT, "%s: not an object", where);
	if ((r = get_str(c, o, where, "name", &name)) ||
	    (r = get_str(c, o, where, "format", &fmt)))
		return r;
	if (strcmp(name, mat_names[m]))
		return bad(c, -ST_E_FORMAT, "%s.name: \"%s\", expected \"%s\"",
			   where, name, mat_names[m]);
	if (st_wformat_parse(fmt, ret))
		return bad(c, -ST_E_FORMAT, "%s.format: \"%s\" (known: f32, "
			   "bf16, mxfp4, nvfp4, e2m1-g<N>, fp8, fp8-b<N>)", where,
			   fmt);
	if ((r = get_str(c, o, where, "layout", &str)))
		return r;
	*ret_il_rows = 0;
	if (ret->dtype == ST_DTYPE_MXFP4 && !strcmp(str, "ocp-r16"))
		*ret_il_rows = ST_MXFP4IL_ROWS;
	else if (strcmp(str, ret->dtype == ST_DTYPE_MXFP4 ||
				  ret->dtype == ST_DTYPE_NVFP4 ||
				  ret->dtype == ST_DTYPE_E2M1_F16 ? "ocp" :
				  "row-major"))
		return bad(c, -ST_E_FORMAT, "%s.layout: \"%s\" (this version "
			   "reads \"ocp-r16\" or \"ocp\" for MXFP4, \"ocp\" "
			   "for other 4-bit codes, \"row-major\" otherwise)",
			   where, str);
	want_scale = st_scale_type_name(st_wformat_scale_type(ret->dtype));
	if (!want_scale)
		return 0;
	if ((r = get_int(c, o, where, "block", ret->group, ret->group, &v)) ||
	    (r = get_str(c, o, where, "scale", &str)))
		return r;
	if (strcmp(str, want_scale))
		return bad(c, -ST_E_FORMAT, "%s.scale: \"%s\" (%s scales are "
			   "%s)", where, str, fmt, want_scale);
	if ((r = get_str(c, o, where, "rounding", &str)))
		return r;
	if (ret->dtype == ST_DTYPE_NVFP4) {
		if ((r = get_str(c, o, where, "tensor_scale", &str)))
			return r;
		if (strcmp(str, "f32"))
			return bad(c, -ST_E_FORMAT, "%s.tensor_scale: \"%s\" "
				   "(nvfp4 tensor scales are f32)", where, str);
		if ((r = get_str(c, o, where, "tensor_scale_use", &str)))
			return r;
		if (strcmp(str, "multiply"))
			return bad(c, -ST_E_FORMAT, "%s.tensor_scale_use: \"%s\" "
				   "(this version stores the multiplying form)",
				   where, str);
	}
	return 0;
}

/* Offsets and sizes of matrix entry o must equal the layout computed from
 * the config and the formats. */
static int check_matrix_layout(const struct mctx *c, json_t *o,
			       const char *where,
			       const struct st_store_matrix *x)
{
	uint64_t u = 0;
	int r;

#define EXPECT(key, want)                                                  \
	do {                                                                   \
		if ((r = get_u64(c, o, where, key, MAX_BYTES, &u)))                \
			return r;                                                      \
		if (u != (uint64_t)(want))                                         \
			return bad(c, -ST_E_FORMAT, "%s." key ": %" PRIu64            \
				   " but the config and format give %" PRIu64,         \
				   where, u, (uint64_t)(want));                        \
	} while (0)
	EXPECT("rows", x->rows);
	EXPECT("cols", x->cols);
	EXPECT("data_offset", x->data_offset);
	EXPECT("data_bytes", x->data_bytes);
	if (x->scale_bytes) {
		EXPECT("scale_offset", x->scale_offset);
		EXPECT("scale_bytes", x->scale_bytes);
	}
	if (x->tscale_bytes) {
		EXPECT("tensor_scale_offset", x->tscale_offset);
		EXPECT("tensor_scale_bytes", x->tscale_bytes);
	}
#undef EXPECT
	return 0;
}

/* experts.layers[layer]: formats, layout, file name, size, checksums. */
static int parse_layer(const struct mctx *c, json_t *o, int layer,
		       struct st_store *s)
{
	struct st_store_layer *ly = &s->layers[layer];
	struct st_wformat fmt[3];
	int il_rows[3];
	struct st_diag d = { { 0 } };
	char where[64], want[64];
	const char *name = NULL;
	json_t *mats, *sums;
	int64_t v = 0;
	uint64_t bytes = 0, rb = 0;
	int r;

	snprintf(where, sizeof(where), "experts.layers[%d]", layer);
	if (!json_is_object(o))
		return bad(c, -ST_E_FORMAT, "%s: not an object", where);
	if ((r = get_int(c, o, where, "layer", layer, layer, &v)) ||
	    (r = get_u64(c, o, where, "record_bytes", MAX_BYTES,
			 &ly->record_bytes)))
		return r;
	mats = json_object_get(o, "matrices");
	if (!mats || !json_is_array(mats) || json_array_size(mats) != 3)
		return bad(c, -ST_E_FORMAT, "%s.matrices: not an array of 3 "
			   "(gate, up, down)", where);
	for (int m = 0; m < 3; m++) {
		char w[96];

		snprintf(w, sizeof(w), "%s.matrices[%d]", where, m);
		if ((r = parse_matrix_format(c, json_array_get(mats, (size_t)m),
					     w, m, &fmt[m], &il_rows[m])))
			return r;
	}
	r = st_store_layout(&s->cfg, fmt, ly->mat, &rb, &d);
	if (r)
		return bad(c, r, "%s: %s", where, d.msg);
	for (int m = 0; m < 3; m++) {
		if (il_rows[m] && ly->mat[m].cols % 32)
			return bad(c, -ST_E_FORMAT, "%s.matrices[%d]: ocp-r16 "
				   "needs columns a multiple of 32, not %lld",
				   where, m, (long long)ly->mat[m].cols);
		ly->mat[m].il_rows = il_rows[m];
	}
	if (rb != ly->record_bytes)
		return bad(c, -ST_E_FORMAT, "%s.record_bytes: %" PRIu64 ", but "
			   "the config and formats give %" PRIu64, where,
			   ly->record_bytes, rb);
	if (ly->record_bytes > s->record_bytes)
		return bad(c, -ST_E_FORMAT, "%s.record_bytes: %" PRIu64 " is "
			   "larger than experts.record_bytes (%" PRIu64 ")",
			   where, ly->record_bytes, s->record_bytes);
	for (int m = 0; m < 3; m++) {
		char w[96];

		snprintf(w, sizeof(w), "%s.matrices[%d]", where, m);
		if ((r = check_matrix_layout(c, json_array_get(mats, (size_t)m),
					     w, &ly->mat[m])))
			return r;
	}
	if ((r = get_str(c, o, where, "file", &name)) ||
	    (r = get_u64(c, o, where, "bytes", MAX_BYTES, &bytes)))
		return r;
	st_store_expert_file_name(layer, want, sizeof(want));
	if (strcmp(name, want))
		return bad(c, -ST_E_FORMAT, "%s.file: \"%s\", expected \"%s\"",
			   where, name, want);
	s->expert_files[layer] = strdup(name);
	if (!s->expert_files[layer])
		return -ENOMEM;
	if (bytes != (uint64_t)s->n_experts * ly->record_bytes)
		return bad(c, -ST_E_FORMAT, "%s.bytes: %" PRIu64 ", but %d "
			   "records of %" PRIu64 " bytes make %" PRIu64, where,
			   bytes, s->n_experts, ly->record_bytes,
			   (uint64_t)s->n_experts * ly->record_bytes);
	sums = json_object_get(o, "xxh3");
	if (!sums || !json_is_array(sums) ||
	    json_array_size(sums) != (size_t)s->n_experts)
		return bad(c, -ST_E_FORMAT, "%s.xxh3: not an array of %d "
			   "checksums", where, s->n_experts);
	for (int e = 0; e < s->n_experts; e++) {
		char w[96];

		snprintf(w, sizeof(w), "%s.xxh3[%d]", where, e);
		r = hex_value(c, json_array_get(sums, (size_t)e), w,
			      &s->expert_xxh3[(size_t)layer * s->n_experts + e]);
		if (r)
			return r;
	}
	return check_file_size(c, name, bytes);
}

static int parse_policy(const struct mctx *c, json_t *ex, struct st_store *s)
{
	json_t *p = json_object_get(ex, "policy");
	const char *def = NULL, *keep = NULL;
	struct st_wformat f;
	int r;

	if (!p || !json_is_object(p))
		return bad(c, -ST_E_FORMAT, "experts.policy: missing or not an "
			   "object");
	if ((r = get_str(c, p, "experts.policy", "default", &def)) ||
	    (r = get_str(c, p, "experts.policy", "keep", &keep)))
		return r;
	if (st_wformat_parse(def, &f))
		return bad(c, -ST_E_FORMAT, "experts.policy.default: \"%s\" is "
			   "not a format", def);
	if (strlen(keep) > 4096)
		return bad(c, -ST_E_FORMAT, "experts.policy.keep: longer than "
			   "4096 characters");
	s->policy_default = strdup(def);
	s->policy_keep = strdup(keep);
	return s->policy_default && s->policy_keep ? 0 : -ENOMEM;
}

static int parse_experts(const struct mctx *c, json_t *root,
			 struct st_store *s)
{
	json_t *ex = json_object_get(root, "experts"), *layers;
	uint64_t max_rb = 0;
	int64_t v = 0;
	int r;

	if (!ex || !json_is_object(ex))
		return bad(c, -ST_E_FORMAT, "experts: missing or not an object");
	if ((r = get_int(c, ex, "experts", "n_layers", 1, MAX_LAYERS, &v)))
		return r;
	/* V4: the MTP block kept (strata convert since it keeps it) is one
	 * more expert layer */
	if (s->is_dsv4 && s->dsv4.n_nextn > 0 && v == s->cfg.n_layers + 1)
		s->n_mtp = 1;
	else if (v != s->cfg.n_layers)
		return bad(c, -ST_E_FORMAT, "experts.n_layers: %lld, the config "
			   "has %d layers", (long long)v, s->cfg.n_layers);
	s->n_layers = (int)v;
	if ((r = get_int(c, ex, "experts", "n_experts", 1, MAX_EXPERTS, &v)))
		return r;
	if (v != s->cfg.n_experts)
		return bad(c, -ST_E_FORMAT, "experts.n_experts: %lld, the config "
			   "has %d experts", (long long)v, s->cfg.n_experts);
	s->n_experts = (int)v;
	if ((r = get_int(c, ex, "experts", "record_align", ST_STORE_RECORD_ALIGN,
			 ST_STORE_RECORD_ALIGN, &v)) ||
	    (r = get_int(c, ex, "experts", "section_align",
			 ST_STORE_SECTION_ALIGN, ST_STORE_SECTION_ALIGN, &v)) ||
	    (r = get_u64(c, ex, "experts", "record_bytes", MAX_BYTES,
			 &s->record_bytes)) ||
	    (r = parse_policy(c, ex, s)))
		return r;
	layers = json_object_get(ex, "layers");
	if (!layers || !json_is_array(layers) ||
	    json_array_size(layers) != (size_t)s->n_layers)
		return bad(c, -ST_E_FORMAT, "experts.layers: not an array of %d "
			   "(one per layer)", s->n_layers);
	s->layers = calloc((size_t)s->n_layers, sizeof(*s->layers));
	s->expert_files = calloc((size_t)s->n_layers, sizeof(char *));
	s->expert_xxh3 = calloc((size_t)s->n_layers * (size_t)s->n_experts,
				sizeof(uint64_t));
	if (!s->layers || !s->expert_files || !s->expert_xxh3)
		return -ENOMEM;
	for (int l = 0; l < s->n_layers; l++) {
		if ((r = parse_layer(c, json_array_get(layers, (size_t)l), l, s)))
			return r;
		max_rb = ST_MAX(max_rb, s->layers[l].record_bytes);
	}
	if (max_rb != s->record_bytes)
		return bad(c, -ST_E_FORMAT, "experts.record_bytes: %" PRIu64
			   ", but the largest layer record is %" PRIu64,
			   s->record_bytes, max_rb);
	return 0;
}

/* --- open / close -------------------------------------------------------- */

void st_store_close(struct st_store *s)
{
	if (!s)
		return;
	free(s->dir);
	free(s->config_json);
	if (s->expert_files)
		for (int l = 0; l < s->n_layers; l++)
			free(s->expert_files[l]);
	free(s->expert_files);
	free(s->expert_xxh3);
	free(s->layers);
	free(s->policy_default);
	free(s->policy_keep);
	free(s->dense_file);
	for (int i = 0; i < s->n_dense; i++)
		free(s->dense[i].name);
	free(s->dense);
	for (int i = 0; i < s->n_files; i++)
		free(s->files[i].name);
	free(s->files);
	free(s->engram);
	st_engram_hash_free(s->engram_hash);
	free(s);
}

/* The command that makes the store at dir again from its checkpoint, with
 * the expert policy and dense format its manifest names (the checkpoint
 * directory is not recorded in a store: MODEL_DIR stands for it). */
static void reconvert_command(const char *dir, json_t *root, char *buf,
			      size_t len)
{
	json_t *pol = json_object_get(json_object_get(root, "experts"),
				      "policy");
	const char *def = json_string_value(json_object_get(pol, "default"));
	const char *keep = json_string_value(json_object_get(pol, "keep"));
	const char *att = json_string_value(json_object_get(pol, "attention"));
	const char *ss = json_string_value(json_object_get(pol,
							   "scale_search"));
	const char *src = json_string_value(json_object_get(pol, "source"));
	int lossless = src && !strncmp(src, "lossless", 8);

	snprintf(buf, len, "strata convert --model MODEL_DIR --out %s --force"
		 "%s%s%s%s%s%s%s%s (MODEL_DIR: the checkpoint it was made from)",
		 dir, !lossless && def ? " --experts " : "",
		 !lossless && def ? def : "",
		 !lossless && keep && *keep ? " --keep-layers " : "",
		 !lossless && keep && *keep ? keep : "",
		 !lossless && ss && strcmp(ss, "none") ? " --scale-search " : "",
		 !lossless && ss && strcmp(ss, "none") ? ss : "",
		 !lossless && att && !strcmp(att, "fp8") ? " --dense fp8" : "",
		 "");
}

static int open_parsed(const struct mctx *c, json_t *root, struct st_store *s)
{
	const char *fmt;
	int64_t version;
	json_t *v;
	int r;

	if (!json_is_object(root))
		return bad(c, -ST_E_FORMAT, "not a JSON object");
	v = json_object_get(root, "format");
	if (!v || !json_is_string(v) ||
	    strcmp((fmt = json_string_value(v)), ST_STORE_FORMAT))
		return bad(c, -ST_E_FORMAT, "format is not \"%s\" (not a strata "
			   "store)", ST_STORE_FORMAT);
	v = json_object_get(root, "version");
	if (!v || !json_is_integer(v))
		return bad(c, -ST_E_FORMAT, "version: missing or not an integer");
	version = json_integer_value(v);
	if (version != ST_STORE_VERSION) {
		char cmd[600];

		reconvert_command(c->dir, root, cmd, sizeof(cmd));
		return bad(c, -ST_E_VERSION, "store version %lld, this strata "
			   "reads version %d%s; re-run strata convert: %s",
			   (long long)version, ST_STORE_VERSION,
			   version == 2 ? " (MXFP4 experts now stored "
			   "row-interleaved)" : "", cmd);
	}
	if ((r = parse_config(c, root, s)) || (r = parse_files(c, root, s)) ||
	    (r = check_config_copy(c, s)) || (r = parse_dense(c, root, s)) ||
	    (r = parse_experts(c, root, s)))
		return r;
	if (s->is_dsv41 && (r = st_store_engram_parse(s, root, c->diag)))
		return r;
	return 0;
}

int st_store_open(const char *dir, struct st_store **ret, struct st_diag *diag)
{
	struct mctx c = { dir, diag };
	struct st_store *s;
	json_error_t jerr;
	char path[4096];
	char *text = NULL;
	size_t len;
	json_t *root;
	int r;

	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir,
			     ST_STORE_MANIFEST) >= sizeof(path))
		return st_diag_set(diag, -ENAMETOOLONG, "store path too long");
	r = st_read_file(path, &text, &len);
	if (r == -ENOENT)
		return st_diag_set(diag, r, "store %s: no %s (not a strata store; "
				   "create one with strata convert)", dir,
				   ST_STORE_MANIFEST);
	if (r)
		return st_diag_set(diag, r, "store %s: %s: %s", dir,
				   ST_STORE_MANIFEST, st_strerror(r));
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	free(text);
	if (!root)
		return bad(&c, -ST_E_FORMAT, "line %d column %d: %s", jerr.line,
			   jerr.column, jerr.text);
	s = calloc(1, sizeof(*s));
	if (!s || !(s->dir = strdup(dir))) {
		free(s);
		json_decref(root);
		return st_diag_set(diag, -ENOMEM, "store %s: out of memory", dir);
	}
	r = open_parsed(&c, root, s);
	json_decref(root);
	if (r) {
		if (r == -ENOMEM)
			st_diag_set(diag, r, "store %s: out of memory", dir);
		st_store_close(s);
		return r;
	}
	*ret = s;
	return 0;
}

const struct st_store_tensor *st_store_find_dense(const struct st_store *s,
						  const char *name)
{
	struct st_store_tensor key = { .name = (char *)name };

	if (!s || !name || s->n_dense == 0)
		return NULL;
	return bsearch(&key, s->dense, (size_t)s->n_dense, sizeof(*s->dense),
		       cmp_tensor_name);
}

int st_store_path(const struct st_store *s, const char *base, char *buf,
		  size_t len)
{
	int n = snprintf(buf, len, "%s/%s", s->dir, base);

	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* --- reading and verifying ---------------------------------------------- */

/* pread of exactly len bytes; -EIO when the file ends first. */
static int pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int st_store_read_record(const struct st_store *s, int fd, int layer,
			 int expert, void *buf, struct st_diag *diag)
{
	return st_store_read_record_timed(s, fd, layer, expert, buf, NULL,
					  diag);
}

int st_store_read_record_timed(const struct st_store *s, int fd, int layer,
			       int expert, void *buf, uint64_t *sum_ns,
			       struct st_diag *diag)
{
	uint64_t want, got, rb, t0;
	const char *file;
	int r;

	if (layer < 0 || layer >= s->n_layers || expert < 0 ||
	    expert >= s->n_experts)
		return st_diag_set(diag, -EINVAL, "store %s: expert (%d, %d) out "
				   "of range (%d layers, %d experts)", s->dir,
				   layer, expert, s->n_layers, s->n_experts);
	file = s->expert_files[layer];
	rb = s->layers[layer].record_bytes;
	r = pread_full(fd, buf, rb, (uint64_t)expert * rb);
	if (r)
		return st_diag_set(diag, r, "expert file %s/%s: record %d (layer "
				   "%d, expert %d): read failed: %s%s", s->dir,
				   file, expert, layer, expert, st_strerror(r),
				   r == -EIO ? " (file shorter than the manifest "
				   "says?)" : "");
	want = s->expert_xxh3[(size_t)layer * s->n_experts + expert];
	t0 = sum_ns ? st_now_ns() : 0;
	got = st_xxh3(buf, rb);
	if (sum_ns)
		*sum_ns += st_now_ns() - t0;
	if (rb < s->record_bytes)
		memset((uint8_t *)buf + rb, 0, s->record_bytes - rb);
	if (got != want)
		return st_diag_set(diag, -ST_E_CHECKSUM,
				   "expert file %s/%s: record %d (layer %d, expert "
				   "%d) checksum mismatch (xxh3 %016" PRIx64
				   ", manifest %016" PRIx64 "); the store is "
				   "damaged: re-run strata convert", s->dir, file,
				   expert, layer, expert, got, want);
	return 0;
}

struct verify_state {
	void (*progress)(uint64_t done, uint64_t total, void *arg);
	void *arg;
	uint64_t done, total;
	int n_bad, first_err;
	struct st_diag *diag;
	uint8_t *chunk;      /* HASH_CHUNK_BYTES */
	XXH3_state_t *xs;
};

static void verify_note(struct verify_state *v, int err,
			const struct st_diag *d)
{
	if (!err)
		return;
	v->n_bad++;
	if (!v->first_err) {
		v->first_err = err;
		if (v->diag)
			*v->diag = *d;
	}
}

static void verify_tick(struct verify_state *v, uint64_t bytes)
{
	v->done += bytes;
	if (v->progress)
		v->progress(v->done, v->total, v->arg);
}

/* XXH3-64 of bytes [off, off + len) of fd, streamed. */
static int hash_range(struct verify_state *v, int fd, uint64_t off,
		      uint64_t len, uint64_t *ret)
{
	XXH3_64bits_reset(v->xs);
	while (len) {
		size_t n = len < HASH_CHUNK_BYTES ? (size_t)len : HASH_CHUNK_BYTES;
		int r = pread_full(fd, v->chunk, n, off);

		if (r)
			return r;
		XXH3_64bits_update(v->xs, v->chunk, n);
		off += n;
		len -= n;
	}
	*ret = XXH3_64bits_digest(v->xs);
	return 0;
}

static int open_store_file(const struct st_store *s, const char *name,
			   struct st_diag *d)
{
	char path[4096];
	int fd;

	if (st_store_path(s, name, path, sizeof(path)))
		return st_diag_set(d, -ENAMETOOLONG, "store %s: path too long",
				   s->dir);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return st_diag_set(d, -errno, "store %s: %s: %s", s->dir, name,
				   strerror(errno));
	return fd;
}

static void verify_dense(const struct st_store *s, struct verify_state *v)
{
	struct st_diag d = { { 0 } };
	int fd = open_store_file(s, s->dense_file, &d);

	if (fd < 0) {
		verify_note(v, fd, &d);
		for (int i = 0; i < s->n_dense; i++)
			verify_tick(v, s->dense[i].n_bytes);
		return;
	}
	for (int i = 0; i < s->n_dense; i++) {
		const struct st_store_tensor *t = &s->dense[i];
		uint64_t h;
		int r = hash_range(v, fd, t->offset, t->n_bytes, &h);

		if (r)
			verify_note(v, st_diag_set(&d, r, "store %s: %s: tensor %s:"
						   " read failed: %s", s->dir,
						   s->dense_file, t->name,
						   st_strerror(r)), &d);
		else if (h != t->xxh3)
			verify_note(v, st_diag_set(&d, -ST_E_CHECKSUM,
						   "store %s: %s: tensor %s (offset "
						   "%" PRIu64 ", %" PRIu64 " bytes) "
						   "checksum mismatch; the store is "
						   "damaged: re-run strata convert",
						   s->dir, s->dense_file, t->name,
						   t->offset, t->n_bytes), &d);
		verify_tick(v, t->n_bytes);
	}
	close(fd);
}

static void verify_experts(const struct st_store *s, struct verify_state *v)
{
	struct st_diag d = { { 0 } };
	void *rec = NULL;

	if (posix_memalign(&rec, ST_STORE_RECORD_ALIGN, s->record_bytes)) {
		verify_note(v, st_diag_set(&d, -ENOMEM, "store %s: out of memory",
					   s->dir), &d);
		return;
	}
	for (int l = 0; l < s->n_layers; l++) {
		const uint64_t rb = s->layers[l].record_bytes;
		int fd = open_store_file(s, s->expert_files[l], &d);

		if (fd < 0) {
			verify_note(v, fd, &d);
			verify_tick(v, (uint64_t)s->n_experts * rb);
			continue;
		}
		for (int e = 0; e < s->n_experts; e++) {
			verify_note(v, st_store_read_record(s, fd, l, e, rec, &d),
				    &d);
			verify_tick(v, rb);
		}
		close(fd);
	}
	free(rec);
}

static void verify_files(const struct st_store *s, struct verify_state *v)
{
	struct st_diag d = { { 0 } };

	for (int i = 0; i < s->n_files; i++) {
		const struct st_store_file *f = &s->files[i];
		int fd = open_store_file(s, f->name, &d);
		uint64_t h;
		int r;

		if (fd < 0) {
			verify_note(v, fd, &d);
		} else {
			r = hash_range(v, fd, 0, f->n_bytes, &h);
			close(fd);
			if (r)
				verify_note(v, st_diag_set(&d, r, "store %s: %s: "
							   "read failed: %s", s->dir,
							   f->name, st_strerror(r)),
					    &d);
			else if (h != f->xxh3)
				verify_note(v, st_diag_set(&d, -ST_E_CHECKSUM,
							   "store %s: %s: checksum "
							   "mismatch; re-run strata "
							   "convert", s->dir,
							   f->name), &d);
		}
		verify_tick(v, f->n_bytes);
	}
}

int st_store_verify(const char *dir,
		    void (*progress)(uint64_t done, uint64_t total, void *arg),
		    void *arg, int *ret_n_bad, struct st_diag *diag)
{
	struct verify_state v = { .progress = progress, .arg = arg,
				  .diag = diag };
	struct st_store *s = NULL;
	int r;

	if (ret_n_bad)
		*ret_n_bad = 0;
	r = st_store_open(dir, &s, diag);
	if (r) {
		if (ret_n_bad)
			*ret_n_bad = 1;
		return r;
	}
	for (int i = 0; i < s->n_dense; i++)
		v.total += s->dense[i].n_bytes;
	for (int l = 0; l < s->n_layers; l++)
		v.total += (uint64_t)s->n_experts * s->layers[l].record_bytes;
	for (int i = 0; i < s->n_files; i++)
		v.total += s->files[i].n_bytes;
	v.total += s->engram_bytes;
	v.chunk = malloc(HASH_CHUNK_BYTES);
	v.xs = XXH3_createState();
	if (!v.chunk || !v.xs) {
		free(v.chunk);
		XXH3_freeState(v.xs);
		st_store_close(s);
		if (ret_n_bad)
			*ret_n_bad = 1;
		return st_diag_set(diag, -ENOMEM, "store %s: out of memory", dir);
	}
	if (progress)
		progress(0, v.total, arg);
	verify_dense(s, &v);
	verify_experts(s, &v);
	verify_files(s, &v);
	if (s->is_dsv41) {
		struct st_diag d = { { 0 } };
		int nb = 0, er = st_store_engram_verify(s, &nb, &d);

		if (er)
			verify_note(&v, er, &d);
		v.n_bad += nb > 1 ? nb - 1 : 0;
		verify_tick(&v, s->engram_bytes);
	}
	free(v.chunk);
	XXH3_freeState(v.xs);
	st_store_close(s);
	if (ret_n_bad)
		*ret_n_bad = v.n_bad;
	return v.first_err;
}

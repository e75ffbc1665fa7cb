/*
 * st_safetensors.c — validating reader of safetensors checkpoints, single
 * file or sharded with model.safetensors.index.json (format: see
 * st_safetensors.h and https://github.com/huggingface/safetensors README).
 *
 * Files are mapped read-only; tensor data is never copied here.  Every
 * header field is checked before use, so a corrupt or hostile file gives an
 * error naming the file, the tensor and the problem, never a crash (the one
 * thing we cannot guard against is the file shrinking under the mapping).
 */
#include "st_safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "st_util.h"

/* The reference implementation's limit on the JSON header (safetensors
 * MAX_HEADER_SIZE, 100 MB). */
#define ST_SAFETENSORS_MAX_HEADER 100000000ull
/* More tensors than this in one file is not a checkpoint we can use. */
#define ST_SAFETENSORS_MAX_TENSORS (1 << 24)

void st_tensor_infos_free(struct st_tensor_info *t, int n)
{
	if (!t)
		return;
	for (int i = 0; i < n; i++)
		free(t[i].name);
	free(t);
}

static int cmp_by_name(const void *a, const void *b)
{
	const struct st_tensor_info *x = a, *y = b;

	return strcmp(x->name, y->name);
}

static int cmp_by_offset(const void *a, const void *b)
{
	const struct st_tensor_info *x = *(const struct st_tensor_info *const *)a;
	const struct st_tensor_info *y = *(const struct st_tensor_info *const *)b;

	if (x->file_offset != y->file_offset)
		return x->file_offset < y->file_offset ? -1 : 1;
	return x->n_bytes < y->n_bytes ? -1 : x->n_bytes > y->n_bytes;
}

/* A JSON integer >= 0, or -1. */
static int64_t json_u63(const json_t *v)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	return json_integer_value(v);
}

/*
 * Fills *t from one header entry.  data_len is the size of the data area;
 * data_start the absolute offset where it begins.
 */
static int parse_entry(const char *file, const char *name, const json_t *e,
		       uint64_t data_start, uint64_t data_len,
		       struct st_tensor_info *t, struct st_diag *diag)
{
	const json_t *dt = json_object_get(e, "dtype");
	const json_t *shape = json_object_get(e, "shape");
	const json_t *offs = json_object_get(e, "data_offsets");
	int64_t begin, end;
	uint64_t n = 1;
	int r;

	if (!json_is_object(e))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: entry is not a JSON object",
				   file, name);
	if (!json_is_string(dt))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: \"dtype\" missing or not a string",
				   file, name);
	r = st_dtype_from_name(json_string_value(dt), &t->dtype);
	if (r < 0 || t->dtype == ST_DTYPE_MXFP4)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: tensor %s: dtype \"%s\" not supported (F32, F16, BF16, F8_E4M3, U8, I8, I32, I64)",
				   file, name, json_string_value(dt));
	if (!json_is_array(shape))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: \"shape\" missing or not a list",
				   file, name);
	if (json_array_size(shape) > ST_MAX_DIMS)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: %zu dimensions (at most %d)",
				   file, name, json_array_size(shape),
				   ST_MAX_DIMS);
	t->n_dims = (int)json_array_size(shape);
	for (int d = 0; d < t->n_dims; d++) {
		int64_t x = json_u63(json_array_get(shape, d));

		if (x < 0)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: tensor %s: shape[%d] is not a non-negative integer",
					   file, name, d);
		t->shape[d] = x;
		if (x != 0 && n > UINT64_MAX / (uint64_t)x)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: tensor %s: element count overflows",
					   file, name);
		n *= (uint64_t)x;
	}
	t->n_elems = n;
	t->n_bytes = st_dtype_bytes(t->dtype, n);
	if (n != 0 && t->n_bytes == 0)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: byte count overflows",
				   file, name);
	if (!json_is_array(offs) || json_array_size(offs) != 2)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: \"data_offsets\" missing or not [begin, end]",
				   file, name);
	begin = json_u63(json_array_get(offs, 0));
	end = json_u63(json_array_get(offs, 1));
	if (begin < 0 || end < 0)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: data_offsets are not non-negative integers",
				   file, name);
	if (end < begin)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: data_offsets [%lld, %lld) end before begin",
				   file, name, (long long)begin, (long long)end);
	if ((uint64_t)end > data_len)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: data_offsets [%lld, %lld) beyond the end of the data (%llu bytes; file truncated?)",
				   file, name, (long long)begin, (long long)end,
				   (unsigned long long)data_len);
	if ((uint64_t)(end - begin) != t->n_bytes)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: tensor %s: data_offsets [%lld, %lld) hold %lld bytes but %s x %llu elements need %llu",
				   file, name, (long long)begin, (long long)end,
				   (long long)(end - begin),
				   json_string_value(dt),
				   (unsigned long long)n,
				   (unsigned long long)t->n_bytes);
	t->file_offset = data_start + (uint64_t)begin;
	return 0;
}

/* No two non-empty tensors share a byte. */
static int check_overlaps(const char *file, struct st_tensor_info *t, int n,
			  struct st_diag *diag)
{
	struct st_tensor_info **by_off;
	const struct st_tensor_info *prev = NULL;
	int r = 0;

	if (n < 2)
		return 0;
	by_off = malloc((size_t)n * sizeof(*by_off));
	if (!by_off)
		return st_diag_set(diag, -ENOMEM, "%s: out of memory", file);
	for (int i = 0; i < n; i++)
		by_off[i] = &t[i];
	qsort(by_off, (size_t)n, sizeof(*by_off), cmp_by_offset);
	for (int i = 0; i < n; i++) {
		const struct st_tensor_info *c = by_off[i];

		if (c->n_bytes == 0)
			continue;
		if (prev && c->file_offset < prev->file_offset + prev->n_bytes) {
			r = st_diag_set(diag, -ST_E_FORMAT,
					"%s: tensor %s overlaps tensor %s",
					file, c->name, prev->name);
			break;
		}
		/* sorted by begin: the furthest-reaching tensor so far is
		 * the one to compare the next against */
		if (!prev || c->file_offset + c->n_bytes >
			     prev->file_offset + prev->n_bytes)
			prev = c;
	}
	free(by_off);
	return r;
}

int st_safetensors_parse(const void *buf, uint64_t len, const char *file_name,
			 int file_index, struct st_tensor_info **ret_tensors,
			 struct st_diag *diag)
{
	const uint8_t *p = buf;
	const char *file = file_name ? file_name : "safetensors";
	struct st_tensor_info *t = NULL;
	json_error_t jerr;
	json_t *root;
	const char *key;
	json_t *val;
	uint64_t hlen = 0;
	int n = 0, r = 0;
	size_t cap;

	if (len < 8)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: %llu bytes, shorter than the 8-byte header length",
				   file, (unsigned long long)len);
	for (int i = 7; i >= 0; i--)
		hlen = (hlen << 8) | p[i];
	if (hlen > len - 8)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: header length %llu beyond the end of the file (%llu bytes; truncated?)",
				   file, (unsigned long long)hlen,
				   (unsigned long long)len);
	if (hlen < 2 || hlen > ST_SAFETENSORS_MAX_HEADER)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: header length %llu outside [2, %llu]",
				   file, (unsigned long long)hlen,
				   ST_SAFETENSORS_MAX_HEADER);
	root = json_loadb((const char *)p + 8, (size_t)hlen,
			  JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: header is not valid JSON (column %d): %s",
				   file, jerr.column, jerr.text);
	if (!json_is_object(root)) {
		json_decref(root);
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: header is not a JSON object", file);
	}
	cap = json_object_size(root);
	if (cap > ST_SAFETENSORS_MAX_TENSORS) {
		json_decref(root);
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: %zu header entries (at most %d)", file,
				   cap, ST_SAFETENSORS_MAX_TENSORS);
	}
	t = calloc(cap ? cap : 1, sizeof(*t));
	if (!t) {
		json_decref(root);
		return st_diag_set(diag, -ENOMEM, "%s: out of memory", file);
	}
	json_object_foreach(root, key, val) {
		if (strcmp(key, "__metadata__") == 0) {
			if (!json_is_object(val)) {
				r = st_diag_set(diag, -ST_E_FORMAT,
						"%s: __metadata__ is not a JSON object",
						file);
				break;
			}
			continue;
		}
		if (key[0] == '\0') {
			r = st_diag_set(diag, -ST_E_FORMAT,
					"%s: tensor with an empty name", file);
			break;
		}
		r = parse_entry(file, key, val, 8 + hlen, len - 8 - hlen,
				&t[n], diag);
		if (r < 0)
			break;
		t[n].file_index = file_index;
		t[n].name = strdup(key);
		if (!t[n].name) {
			r = st_diag_set(diag, -ENOMEM, "%s: out of memory",
					file);
			break;
		}
		n++;
	}
	json_decref(root);
	if (r == 0)
		r = check_overlaps(file, t, n, diag);
	if (r < 0) {
		st_tensor_infos_free(t, n);
		return r;
	}
	qsort(t, (size_t)n, sizeof(*t), cmp_by_name);
	if (ret_tensors)
		*ret_tensors = t;
	else
		st_tensor_infos_free(t, n);
	return n;
}

/* --- checkpoints --- */

void st_checkpoint_close(struct st_checkpoint *ck)
{
	if (!ck)
		return;
	for (int i = 0; i < ck->n_files; i++) {
		if (ck->maps && ck->maps[i])
			munmap((void *)ck->maps[i], ck->file_sizes[i]);
		if (ck->file_names)
			free(ck->file_names[i]);
	}
	free(ck->maps);
	free(ck->file_sizes);
	free(ck->file_names);
	st_tensor_infos_free(ck->tensors, ck->n_tensors);
	free(ck->dir);
	free(ck);
}

/* Maps DIR/NAME read-only into ck slot i. */
static int map_file(struct st_checkpoint *ck, int i, struct st_diag *diag)
{
	char path[4096];
	struct stat st;
	void *m;
	int fd, r;

	if (snprintf(path, sizeof(path), "%s/%s", ck->dir,
		     ck->file_names[i]) >= (int)sizeof(path))
		return st_diag_set(diag, -ENAMETOOLONG, "%s/%s: path too long",
				   ck->dir, ck->file_names[i]);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		return st_diag_set(diag, r, "%s: %s", path, st_strerror(r));
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		close(fd);
		return st_diag_set(diag, r, "%s: %s", path, st_strerror(r));
	}
	if (!S_ISREG(st.st_mode) || st.st_size < 8) {
		close(fd);
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: not a regular file of at least 8 bytes",
				   path);
	}
	m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	r = -errno;
	close(fd);
	if (m == MAP_FAILED)
		return st_diag_set(diag, r, "%s: mmap: %s", path,
				   st_strerror(r));
	ck->maps[i] = m;
	ck->file_sizes[i] = (uint64_t)st.st_size;
	return 0;
}

static int alloc_files(struct st_checkpoint *ck, int n)
{
	ck->file_names = calloc((size_t)n, sizeof(*ck->file_names));
	ck->maps = calloc((size_t)n, sizeof(*ck->maps));
	ck->file_sizes = calloc((size_t)n, sizeof(*ck->file_sizes));
	if (!ck->file_names || !ck->maps || !ck->file_sizes)
		return -ENOMEM;
	ck->n_files = n;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A shard name from the index must be a plain file name in the directory. */
static int shard_name_ok(const char *s)
{
	return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 &&
	       strcmp(s, "..") != 0;
}

/*
 * Reads the index: the sorted, unique shard names into ck->file_names.
 * *ret_map gets the weight_map object (a reference owned by *ret_root).
 */
static int read_index(struct st_checkpoint *ck, const char *path,
		      json_t **ret_root, json_t **ret_map,
		      struct st_diag *diag)
{
	json_error_t jerr;
	json_t *root, *map, *val;
	const char *key;
	char **names = NULL;
	size_t n = 0;
	int r = 0, n_unique = 0;

	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: line %d column %d: %s", path,
				   jerr.line, jerr.column, jerr.text);
	map = json_object_get(root, "weight_map");
	if (!json_is_object(root) || !json_is_object(map)) {
		json_decref(root);
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: no \"weight_map\" object", path);
	}
	names = calloc(json_object_size(map) + 1, sizeof(*names));
	if (!names) {
		json_decref(root);
		return st_diag_set(diag, -ENOMEM, "%s: out of memory", path);
	}
	json_object_foreach(map, key, val) {
		if (!json_is_string(val) ||
		    !shard_name_ok(json_string_value(val))) {
			r = st_diag_set(diag, -ST_E_FORMAT,
					"%s: tensor %s: shard is not a plain file name in the directory",
					path, key);
			break;
		}
		names[n++] = (char *)json_string_value(val);
	}
	if (r == 0 && n == 0)
		r = st_diag_set(diag, -ST_E_FORMAT, "%s: empty weight_map",
				path);
	if (r == 0) {
		qsort(names, n, sizeof(*names), cmp_str);
		for (size_t i = 0; i < n; i++)
			if (i == 0 || strcmp(names[i], names[i - 1]) != 0)
				names[n_unique++] = names[i];
		r = alloc_files(ck, n_unique);
		if (r < 0)
			st_diag_set(diag, r, "%s: out of memory", path);
	}
	for (int i = 0; r == 0 && i < n_unique; i++) {
		ck->file_names[i] = strdup(names[i]);
		if (!ck->file_names[i])
			r = st_diag_set(diag, -ENOMEM, "%s: out of memory",
					path);
	}
	free(names);
	if (r < 0) {
		json_decref(root);
		return r;
	}
	*ret_root = root;
	*ret_map = map;
	return 0;
}

/*
 * Every tensor of the index in its shard, and (our choice, stricter than
 * transformers, which ignores them) no tensor in a shard that the index
 * does not list there: a mismatch means shards of different checkpoints.
 */
static int check_index(const struct st_checkpoint *ck, const json_t *map,
		       const char *index_name, struct st_diag *diag)
{
	const char *key;
	json_t *val;

	json_object_foreach((json_t *)map, key, val) {
		const struct st_tensor_info *t = st_checkpoint_find(ck, key);

		if (!t)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: tensor %s listed in %s is missing from that shard",
					   index_name, key,
					   json_string_value(val));
		if (strcmp(ck->file_names[t->file_index],
			   json_string_value(val)) != 0)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: tensor %s listed in %s is in %s instead",
					   index_name, key,
					   json_string_value(val),
					   ck->file_names[t->file_index]);
	}
	for (int i = 0; i < ck->n_tensors; i++)
		if (!json_object_get(map, ck->tensors[i].name))
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: tensor %s in %s is not listed in the index",
					   index_name, ck->tensors[i].name,
					   ck->file_names[ck->tensors[i].file_index]);
	return 0;
}

/* Parses every mapped file and merges the tensor lists, sorted by name. */
static int parse_all(struct st_checkpoint *ck, struct st_diag *diag)
{
	for (int i = 0; i < ck->n_files; i++) {
		struct st_tensor_info *t = NULL, *all;
		char path[4096];
		int n;

		snprintf(path, sizeof(path), "%s/%s", ck->dir,
			 ck->file_names[i]);
		n = st_safetensors_parse(ck->maps[i], ck->file_sizes[i], path,
					 i, &t, diag);
		if (n < 0)
			return n;
		if (ck->n_tensors > ST_SAFETENSORS_MAX_TENSORS - n) {
			st_tensor_infos_free(t, n);
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: too many tensors", ck->dir);
		}
		all = realloc(ck->tensors, (size_t)(ck->n_tensors + n + 1) *
						   sizeof(*all));
		if (!all) {
			st_tensor_infos_free(t, n);
			return st_diag_set(diag, -ENOMEM, "out of memory");
		}
		ck->tensors = all;
		memcpy(all + ck->n_tensors, t, (size_t)n * sizeof(*t));
		ck->n_tensors += n;
		free(t); /* names moved into ck->tensors */
	}
	qsort(ck->tensors, (size_t)ck->n_tensors, sizeof(*ck->tensors),
	      cmp_by_name);
	for (int i = 1; i < ck->n_tensors; i++)
		if (strcmp(ck->tensors[i].name, ck->tensors[i - 1].name) == 0)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: tensor %s is in both %s and %s",
					   ck->dir, ck->tensors[i].name,
					   ck->file_names[ck->tensors[i - 1].file_index],
					   ck->file_names[ck->tensors[i].file_index]);
	return 0;
}

int st_checkpoint_open(const char *dir, struct st_checkpoint **ret,
		       struct st_diag *diag)
{
	struct st_checkpoint *ck;
	json_t *index_root = NULL, *map = NULL;
	char index_path[4096], single[4096];
	int r;

	if (snprintf(index_path, sizeof(index_path),
		     "%s/model.safetensors.index.json", dir) >=
		    (int)sizeof(index_path) ||
	    snprintf(single, sizeof(single), "%s/model.safetensors", dir) >=
		    (int)sizeof(single))
		return st_diag_set(diag, -ENAMETOOLONG, "%s: path too long",
				   dir);
	ck = calloc(1, sizeof(*ck));
	if (!ck || !(ck->dir = strdup(dir))) {
		free(ck);
		return st_diag_set(diag, -ENOMEM, "out of memory");
	}
	if (st_path_exists(index_path)) {
		r = read_index(ck, index_path, &index_root, &map, diag);
	} else if (st_path_exists(single)) {
		r = alloc_files(ck, 1);
		if (r == 0 && !(ck->file_names[0] = strdup("model.safetensors")))
			r = -ENOMEM;
		if (r < 0)
			st_diag_set(diag, r, "out of memory");
	} else {
		r = st_diag_set(diag, -ENOENT,
				"%s: neither model.safetensors nor model.safetensors.index.json",
				dir);
	}
	for (int i = 0; r == 0 && i < ck->n_files; i++)
		r = map_file(ck, i, diag);
	if (r == 0)
		r = parse_all(ck, diag);
	if (r == 0 && map)
		r = check_index(ck, map, index_path, diag);
	json_decref(index_root);
	if (r < 0) {
		st_checkpoint_close(ck);
		return r;
	}
	*ret = ck;
	return 0;
}

const struct st_tensor_info *st_checkpoint_find(const struct st_checkpoint *ck,
						const char *name)
{
	struct st_tensor_info key = { .name = (char *)name };

	if (!ck || !name || ck->n_tensors == 0)
		return NULL;
	return bsearch(&key, ck->tensors, (size_t)ck->n_tensors,
		       sizeof(*ck->tensors), cmp_by_name);
}

const void *st_checkpoint_data(const struct st_checkpoint *ck,
			       const struct st_tensor_info *t)
{
	if (!ck || !t || t->file_index < 0 || t->file_index >= ck->n_files)
		return NULL;
	if (t->file_offset > ck->file_sizes[t->file_index] ||
	    t->n_bytes > ck->file_sizes[t->file_index] - t->file_offset)
		return NULL;
	return ck->maps[t->file_index] + t->file_offset;
}

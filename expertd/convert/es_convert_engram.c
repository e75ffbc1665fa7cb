/*
 * es_convert_engram.c — DeepSeek-V4.1 tensor classes, engram.bin and
 * engram_hash.bin for `strata convert` (see es_convert_engram.h).
 */
#include "es_convert_engram.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "st_util.h"

static const char *const skip_name[ES_V41_N_SKIP] = {
	"mtp.*", "vision.*, aligner.*, image_start, image_end, image_newline",
};
static const char *const skip_why[ES_V41_N_SKIP] = {
	"DSpark draft layers (speculative decoding; not run by strata)",
	"vision tower (text-only serving)",
};

const char *es_v41_skip_name(int group)
{
	return group >= 0 && group < ES_V41_N_SKIP ? skip_name[group] : "?";
}

const char *es_v41_skip_why(int group)
{
	return group >= 0 && group < ES_V41_N_SKIP ? skip_why[group] : "?";
}

static int prefix(const char *s, const char *p)
{
	return !strncmp(s, p, strlen(p));
}

enum es_v41_class es_v41_classify(const char *name, int n_layers,
				  int *ret_group, const char **ret_why)
{
	static const char *const layer_parts[] = {
		"attn.", "ffn.", "engram.", "attn_norm.", "ffn_norm.",
		"hc_attn_", "hc_ffn_",
	};
	const char *rest;
	char *end;
	long l;

	*ret_group = -1;
	*ret_why = NULL;
	if (prefix(name, "mtp.")) {
		*ret_group = 0;
		return ES_V41_SKIP;
	}
	if (prefix(name, "vision.") || prefix(name, "aligner.") ||
	    prefix(name, "image_start") || prefix(name, "image_end") ||
	    prefix(name, "image_newline")) {
		*ret_group = 1;
		return ES_V41_SKIP;
	}
	if (!strcmp(name, "embed.weight") || !strcmp(name, "head.weight") ||
	    !strcmp(name, "norm.weight"))
		return ES_V41_DENSE;
	if (prefix(name, "hc_head") || strstr(name, ".attn.ape") ||
	    strstr(name, "tid2eid") || strstr(name, ".indexer.compressor.")) {
		*ret_why = "a DeepSeek-V4 tensor that V4.1 does not have (is "
			   "config.json's model_type right?)";
		return ES_V41_REFUSE;
	}
	if (!prefix(name, "layers.")) {
		*ret_why = "not a DeepSeek-V4.1 text-model tensor";
		return ES_V41_REFUSE;
	}
	l = strtol(name + 7, &end, 10);
	if (end == name + 7 || *end != '.' || l < 0 || l >= n_layers) {
		*ret_why = "layer index missing or beyond num_hidden_layers";
		return ES_V41_REFUSE;
	}
	rest = end + 1;
	for (size_t i = 0; i < ST_ARRAY_SIZE(layer_parts); i++)
		if (prefix(rest, layer_parts[i]))
			return ES_V41_DENSE;
	*ret_why = "not a DeepSeek-V4.1 layer tensor";
	return ES_V41_REFUSE;
}

static int find(const struct st_checkpoint *ck, const char *name,
		enum st_dtype dt, int64_t rows, int64_t cols,
		const struct st_tensor_info **ret, struct st_diag *diag)
{
	const struct st_tensor_info *t = st_checkpoint_find(ck, name);

	if (!t)
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "checkpoint %s: Engram table %s is missing (config engram_layer_ids names its layer)",
				   ck->dir, name);
	if (t->dtype != dt || t->n_dims != 2 || t->shape[0] != rows ||
	    t->shape[1] != cols)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "checkpoint %s: tensor %s: expected %s [%lld, %lld] (engram_num_embeddings, engram_head_dim%s)",
				   ck->dir, name, st_dtype_traits(dt)->name,
				   (long long)rows, (long long)cols,
				   dt == ST_DTYPE_F8_E8M0 ? " / 32: one scale per 32 columns of each row" : "");
	*ret = t;
	return 0;
}

int es_engram_check(const struct st_checkpoint *ck,
		    const struct st_dsv_config *g, const char *model_dir,
		    uint8_t *mark, struct es_engram_plan *ret,
		    struct st_diag *diag)
{
	int64_t rows64[ST_DSV_MAX_ENGRAM];
	uint64_t next = 1;
	char path[4200];
	int r;

	memset(ret, 0, sizeof(*ret));
	if (g->n_engram < 1 || g->n_engram > ST_ENGRAM_MAX_LAYERS)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "checkpoint %s: %d Engram layers (1..%d supported)",
				   model_dir, g->n_engram, ST_ENGRAM_MAX_LAYERS);
	for (int i = 0; i < g->n_engram; i++) {
		char nm[128];

		snprintf(nm, sizeof(nm), "layers.%d.engram.embed.weight",
			 g->engram_layer[i]);
		if ((r = find(ck, nm, ST_DTYPE_F8_E4M3, g->engram_rows[i],
			      g->engram_head_dim, &ret->weight[i], diag)))
			return r;
		snprintf(nm, sizeof(nm), "layers.%d.engram.embed.scale",
			 g->engram_layer[i]);
		if ((r = find(ck, nm, ST_DTYPE_F8_E8M0, g->engram_rows[i],
			      g->engram_head_dim / ST_ENGRAM_SCALE_BLOCK,
			      &ret->scale[i], diag)))
			return r;
		mark[ret->weight[i] - ck->tensors] = 2;
		mark[ret->scale[i] - ck->tensors] = 2;
		if ((r = st_engram_layout_init(g->engram_layer[i], g->engram_head_dim,
					       g->engram_rows[i], next,
					       &ret->layout[i], diag)))
			return r;
		next += ret->layout[i].n_blocks;
		rows64[i] = g->engram_rows[i];
	}
	ret->n = g->n_engram;
	ret->bytes = next * ST_ENGRAM_BLOCK_BYTES;
	/* any other engram.embed tensor is at a layer the config does not
	 * list as an Engram layer */
	for (int i = 0; i < ck->n_tensors; i++)
		if (strstr(ck->tensors[i].name, ".engram.") && !mark[i] &&
		    strstr(ck->tensors[i].name, ".engram.embed."))
			return st_diag_set(diag, -ST_E_FORMAT,
					   "checkpoint %s: tensor %s is at a layer config engram_layer_ids does not list",
					   model_dir, ck->tensors[i].name);
	snprintf(path, sizeof(path), "%s/engram_hash.json", model_dir);
	if (!st_path_exists(path))
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "%s is missing: a DeepSeek-V4.1 store needs the frozen Engram hash inputs (compressed token map, multipliers, primes, offsets), made once from the tokenizer; see MODEL_FAMILY_DEEPSEEK_V4.md 3.5",
				   path);
	if ((r = st_engram_hash_load_json(path, &ret->hash, diag)))
		return r;
	if (st_engram_hash_heads(ret->hash) != g->engram_n_heads ||
	    st_engram_hash_rows_per_pos(ret->hash) !=
	    (g->engram_max_ngram - 1) * g->engram_n_heads ||
	    st_engram_hash_vocab(ret->hash) != g->vocab_size)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: %d heads, %d rows per position, %d token ids; config.json says %d, %d, %d",
				   path, st_engram_hash_heads(ret->hash),
				   st_engram_hash_rows_per_pos(ret->hash),
				   st_engram_hash_vocab(ret->hash), g->engram_n_heads,
				   (g->engram_max_ngram - 1) * g->engram_n_heads,
				   g->vocab_size);
	return st_engram_hash_check_config(ret->hash, g->n_engram,
					   g->engram_layer, rows64, diag);
}

void es_engram_plan_fini(struct es_engram_plan *p)
{
	st_engram_hash_free(p->hash);
	p->hash = NULL;
}

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *q = buf;

	while (len) {
		ssize_t n = pwrite(fd, q, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		q += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

#define WRITE_BLOCKS 256

/* One layer's blocks, WRITE_BLOCKS at a time; xxh3 of them into l. */
static int write_layer(int fd, const struct st_checkpoint *ck,
		       const struct st_tensor_info *w,
		       const struct st_tensor_info *s,
		       struct st_engram_layout *l, uint8_t *buf)
{
	const uint8_t *wd = st_checkpoint_data(ck, w);
	const uint8_t *sd = st_checkpoint_data(ck, s);
	const int ns = l->dim / ST_ENGRAM_SCALE_BLOCK;
	XXH3_state_t *xs = XXH3_createState();
	int r = 0;

	if (!xs)
		return -ENOMEM;
	XXH3_64bits_reset(xs);
	for (uint64_t b0 = 0; b0 < l->n_blocks && !r; b0 += WRITE_BLOCKS) {
		uint64_t n = ST_MIN((uint64_t)WRITE_BLOCKS, l->n_blocks - b0);

		memset(buf, 0, n * ST_ENGRAM_BLOCK_BYTES);
		for (uint64_t k = 0; k < n; k++) {
			uint8_t *blk = buf + k * ST_ENGRAM_BLOCK_BYTES;
			int64_t r0 = (int64_t)((b0 + k) * l->rows_per_block);

			for (uint32_t j = 0; j < l->rows_per_block &&
			     r0 + j < l->rows; j++) {
				int64_t row = r0 + j;
				uint8_t *dst = blk + (size_t)j * l->row_bytes;

				memcpy(dst, wd + (size_t)row * l->dim,
				       (size_t)l->dim);
				memcpy(dst + l->dim, sd + (size_t)row * ns,
				       (size_t)ns);
			}
			st_engram_block_seal(blk, l->first_block + b0 + k);
		}
		XXH3_64bits_update(xs, buf, n * ST_ENGRAM_BLOCK_BYTES);
		r = pwrite_full(fd, buf, n * ST_ENGRAM_BLOCK_BYTES,
				(l->first_block + b0) * ST_ENGRAM_BLOCK_BYTES);
	}
	l->xxh3 = XXH3_64bits_digest(xs);
	XXH3_freeState(xs);
	return r;
}

static int jset(json_t *o, const char *key, json_t *v)
{
	if (!v)
		return -ENOMEM;
	return json_object_set_new(o, key, v) ? -ENOMEM : 0;
}

static int jhex(json_t *o, const char *key, uint64_t x)
{
	char h[17];

	snprintf(h, sizeof(h), "%016" PRIx64, x);
	return jset(o, key, json_string(h));
}

static int engram_json(const struct es_engram_plan *p,
		       const struct st_engram_layout *l, json_t *manifest)
{
	json_t *e = json_object(), *arr = json_array();
	int r = 0;

	if (!e || !arr) {
		json_decref(e);
		json_decref(arr);
		return -ENOMEM;
	}
	if ((r = jset(e, "file", json_string(ST_ENGRAM_FILE))) ||
	    (r = jset(e, "bytes", json_integer((json_int_t)p->bytes))) ||
	    (r = jset(e, "block_bytes", json_integer(ST_ENGRAM_BLOCK_BYTES))) ||
	    (r = jset(e, "row_format", json_string("dim E4M3 bytes, then "
		      "dim/32 E8M0 bytes (value = e4m3 * 2^(s-127) per 32 "
		      "columns); whole rows per 4 KiB block, last 8 bytes of "
		      "each block XXH3-64 (seed: block index)"))) ||
	    (r = jset(e, "hash_file", json_string(ST_ENGRAM_HASH_FILE)))) {
		json_decref(e);
		json_decref(arr);
		return r;
	}
	if ((r = jset(e, "layers", arr))) {
		json_decref(e);
		return r;
	}
	for (int i = 0; i < p->n && !r; i++) {
		json_t *o = json_object();

		if (!o || json_array_append_new(arr, o))
			r = -ENOMEM;
		if (!r && !(r = jset(o, "layer", json_integer(l[i].layer))) &&
		    !(r = jset(o, "rows", json_integer(l[i].rows))) &&
		    !(r = jset(o, "dim", json_integer(l[i].dim))) &&
		    !(r = jset(o, "row_bytes", json_integer(l[i].row_bytes))) &&
		    !(r = jset(o, "rows_per_block",
			       json_integer(l[i].rows_per_block))) &&
		    !(r = jset(o, "first_block",
			       json_integer((json_int_t)l[i].first_block))) &&
		    !(r = jset(o, "blocks",
			       json_integer((json_int_t)l[i].n_blocks))))
			r = jhex(o, "xxh3", l[i].xxh3);
	}
	if (r) {
		json_decref(e);
		return r;
	}
	return jset(manifest, "engram", e);
}

static int write_hash(const struct es_engram_plan *p, const char *dir,
		      json_t *files, struct st_diag *diag)
{
	char path[4400];
	char *buf = NULL;
	size_t len = 0;
	json_t *o;
	int fd, r;

	snprintf(path, sizeof(path), "%s/%s", dir, ST_ENGRAM_HASH_FILE);
	if ((r = st_engram_hash_save(p->hash, path, diag)))
		return r;
	if ((r = st_read_file(path, &buf, &len)))
		return st_diag_set(diag, r, "%s: %s", path, st_strerror(r));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) < 0)
		r = st_diag_set(diag, -errno, "%s: %s", path, strerror(errno));
	if (fd >= 0)
		close(fd);
	o = json_object();
	if (!r && (!o || json_array_append_new(files, o)))
		r = -ENOMEM;
	if (!r && !(r = jset(o, "name", json_string(ST_ENGRAM_HASH_FILE))) &&
	    !(r = jset(o, "bytes", json_integer((json_int_t)len))))
		r = jhex(o, "xxh3", st_xxh3(buf, len));
	free(buf);
	return r;
}

int es_engram_write(const struct es_engram_plan *p,
		    const struct st_checkpoint *ck, const char *dir,
		    json_t *manifest, json_t *files, struct st_diag *diag)
{
	struct st_engram_layout l[ST_ENGRAM_MAX_LAYERS];
	char path[4400];
	uint8_t *buf = NULL;
	int fd, r = 0;

	memcpy(l, p->layout, sizeof(l));
	snprintf(path, sizeof(path), "%s/%s", dir, ST_ENGRAM_FILE);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return st_diag_set(diag, -errno, "cannot create %s: %s", path,
				   strerror(errno));
	buf = malloc((size_t)WRITE_BLOCKS * ST_ENGRAM_BLOCK_BYTES);
	if (!buf)
		r = -ENOMEM;
	if (!r && !(r = st_engram_header_encode(l, p->n, buf)))
		r = pwrite_full(fd, buf, ST_ENGRAM_BLOCK_BYTES, 0);
	for (int i = 0; i < p->n && !r; i++)
		r = write_layer(fd, ck, p->weight[i], p->scale[i], &l[i], buf);
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	free(buf);
	if (r)
		return st_diag_set(diag, r, "writing %s: %s", path,
				   st_strerror(r));
	if ((r = engram_json(p, l, manifest)))
		return st_diag_set(diag, r, "out of memory");
	return write_hash(p, dir, files, diag);
}

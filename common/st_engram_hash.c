/*
 * st_engram_hash.c — the DeepSeek-V4.1 Engram n-gram hash (see
 * st_engram_hash.h): reading engram_hash.json, its binary store copy, and
 * the row ids of one position.
 */
#include "st_engram_hash.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_util.h"

#define EH_MAX_LAYERS 64
#define EH_MAX_NGRAM 8
#define EH_MAX_HEADS 64
#define EH_MAX_VOCAB (1 << 24)
#define EH_MAGIC "STENGH01"
#define EH_VERSION 1u

struct st_engram_hash {
	int n_layers;
	int max_ngram;            /* n-gram sizes 2 .. max_ngram */
	int heads;
	int vocab;                /* token ids [0, vocab) */
	int64_t cvocab;           /* C: compressed ids [0, C) */
	int64_t cpad;             /* compressed pad id */
	int pad_token_id;
	int layer_ids[EH_MAX_LAYERS];
	int64_t *mult;            /* [n_layers][max_ngram] */
	int64_t *primes;          /* [n_layers][(max_ngram-1)*heads] */
	int64_t *offsets;         /* [n_layers][(max_ngram-1)*heads] */
	int64_t rows[EH_MAX_LAYERS]; /* table rows per layer: sum of primes */
	uint32_t *map;            /* [vocab] compressed ids */
};

static int cols(const struct st_engram_hash *h)
{
	return (h->max_ngram - 1) * h->heads;
}

void st_engram_hash_free(struct st_engram_hash *h)
{
	if (!h)
		return;
	free(h->mult);
	free(h->primes);
	free(h->offsets);
	free(h->map);
	free(h);
}

/* Allocates the arrays once the sizes are known and range-checked. */
static int eh_alloc(struct st_engram_hash *h)
{
	size_t c = (size_t)h->n_layers * (size_t)cols(h);

	h->mult = calloc((size_t)h->n_layers * (size_t)h->max_ngram,
			 sizeof(int64_t));
	h->primes = calloc(c, sizeof(int64_t));
	h->offsets = calloc(c, sizeof(int64_t));
	h->map = calloc((size_t)h->vocab, sizeof(uint32_t));
	if (!h->mult || !h->primes || !h->offsets || !h->map)
		return -ENOMEM;
	return 0;
}

static int check_sizes(const struct st_engram_hash *h, const char *src,
		       struct st_diag *diag)
{
	if (h->n_layers < 1 || h->n_layers > EH_MAX_LAYERS)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: %d Engram layers (1..%d supported)",
				   src, h->n_layers, EH_MAX_LAYERS);
	if (h->max_ngram < 2 || h->max_ngram > EH_MAX_NGRAM)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: max_ngram_size %d (2..%d supported)",
				   src, h->max_ngram, EH_MAX_NGRAM);
	if (h->heads < 1 || h->heads > EH_MAX_HEADS)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: n_heads %d (1..%d supported)", src,
				   h->heads, EH_MAX_HEADS);
	if (h->vocab < 1 || h->vocab > EH_MAX_VOCAB)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: token_map has %d entries (1..%d supported)",
				   src, h->vocab, EH_MAX_VOCAB);
	if (h->cvocab < 1 || h->cvocab > UINT32_MAX)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: compressed_vocab_size %lld out of range",
				   src, (long long)h->cvocab);
	return 0;
}

/*
 * The value checks shared by the JSON and binary readers: map ids < C,
 * pad consistent, multipliers small enough that tok * mult cannot
 * overflow int64, primes positive, offsets the running sum of primes.
 */
static int check_values(struct st_engram_hash *h, const char *src,
			struct st_diag *diag)
{
	int64_t mult_max = INT64_MAX / h->cvocab;
	int li, s, c, i;

	for (i = 0; i < h->vocab; i++)
		if ((int64_t)h->map[i] >= h->cvocab)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: token_map[%d] = %u is not below compressed_vocab_size %lld",
					   src, i, h->map[i], (long long)h->cvocab);
	if (h->cpad < 0 || h->cpad >= h->cvocab)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: compressed_pad_id %lld outside [0, %lld)",
				   src, (long long)h->cpad, (long long)h->cvocab);
	if (h->pad_token_id < 0 || h->pad_token_id >= h->vocab)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: pad_token_id %d outside the token map (%d entries)",
				   src, h->pad_token_id, h->vocab);
	if ((int64_t)h->map[h->pad_token_id] != h->cpad)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: compressed_pad_id %lld is not token_map[pad_token_id %d] = %u",
				   src, (long long)h->cpad, h->pad_token_id,
				   h->map[h->pad_token_id]);
	for (li = 0; li < h->n_layers; li++) {
		const int64_t *m = h->mult + (size_t)li * h->max_ngram;
		const int64_t *pr = h->primes + (size_t)li * cols(h);
		const int64_t *of = h->offsets + (size_t)li * cols(h);
		int64_t sum = 0;

		if (h->layer_ids[li] < 0 ||
		    (li > 0 && h->layer_ids[li] <= h->layer_ids[li - 1]))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: layer_ids must be non-negative and increasing (entry %d is %d)",
					   src, li, h->layer_ids[li]);
		for (s = 0; s < h->max_ngram; s++)
			if (m[s] <= 0 || m[s] > mult_max)
				return st_diag_set(diag, -ST_E_CONFIG,
						   "%s: multipliers[%d][%d] = %lld outside [1, (2^63-1)/C = %lld]: the int64 products would overflow",
						   src, li, s, (long long)m[s],
						   (long long)mult_max);
		for (c = 0; c < cols(h); c++) {
			if (pr[c] <= 0 || pr[c] > (INT64_MAX >> 8))
				return st_diag_set(diag, -ST_E_CONFIG,
						   "%s: primes[%d][%d][%d] = %lld is not positive (or absurdly large)",
						   src, li, c / h->heads, c % h->heads,
						   (long long)pr[c]);
			if (of[c] != sum)
				return st_diag_set(diag, -ST_E_CONFIG,
						   "%s: offsets[%d][%d] = %lld, expected %lld (the running sum of the layer's primes)",
						   src, li, c, (long long)of[c],
						   (long long)sum);
			sum += pr[c];
		}
		h->rows[li] = sum;
	}
	return 0;
}

/* --- JSON ------------------------------------------------------------- */

static int jint(const json_t *root, const char *key, int64_t *ret,
		const char *src, struct st_diag *diag)
{
	const json_t *v = json_object_get(root, key);

	if (!v || !json_is_integer(v))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: key \"%s\" missing or not an integer",
				   src, key);
	*ret = json_integer_value(v);
	return 0;
}

/* A JSON array of `n` integers into dst (n * int64). */
static int jints(const json_t *a, size_t n, int64_t *dst, const char *src,
		 const char *what, struct st_diag *diag)
{
	size_t i;

	if (!json_is_array(a) || json_array_size(a) != n)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: %s must be an array of %zu integers",
				   src, what, n);
	for (i = 0; i < n; i++) {
		const json_t *v = json_array_get(a, i);

		if (!json_is_integer(v))
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: %s[%zu] is not an integer", src,
					   what, i);
		dst[i] = json_integer_value(v);
	}
	return 0;
}

static int parse_json(const json_t *root, const char *src,
		      struct st_engram_hash *h, struct st_diag *diag)
{
	const json_t *map, *lids, *mu, *pr, *of;
	int64_t v = 0, tmp[EH_MAX_LAYERS];
	char what[64];
	int rc, li, n;
	size_t i;

	if (!json_is_object(root))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: not a JSON object", src);
	if ((rc = jint(root, "max_ngram_size", &v, src, diag)) < 0)
		return rc;
	h->max_ngram = v < 0 || v > 1000 ? -1 : (int)v;
	if ((rc = jint(root, "n_heads", &v, src, diag)) < 0)
		return rc;
	h->heads = v < 0 || v > 1000 ? -1 : (int)v;
	if ((rc = jint(root, "compressed_vocab_size", &h->cvocab, src,
		       diag)) < 0 ||
	    (rc = jint(root, "compressed_pad_id", &h->cpad, src, diag)) < 0 ||
	    (rc = jint(root, "pad_token_id", &v, src, diag)) < 0)
		return rc;
	h->pad_token_id = v < -1 || v > EH_MAX_VOCAB ? -1 : (int)v;
	lids = json_object_get(root, "layer_ids");
	map = json_object_get(root, "token_map");
	if (!json_is_array(lids) || !json_is_array(map))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: layer_ids and token_map must be arrays",
				   src);
	h->n_layers = (int)ST_MIN(json_array_size(lids), (size_t)1000);
	h->vocab = (int)ST_MIN(json_array_size(map), (size_t)EH_MAX_VOCAB + 1);
	if ((rc = check_sizes(h, src, diag)) < 0)
		return rc;
	if ((rc = jints(lids, (size_t)h->n_layers, tmp, src, "layer_ids",
			diag)) < 0)
		return rc;
	for (li = 0; li < h->n_layers; li++) {
		if (tmp[li] < 0 || tmp[li] > 1 << 20)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: layer_ids[%d] = %lld out of range",
					   src, li, (long long)tmp[li]);
		h->layer_ids[li] = (int)tmp[li];
	}
	if ((rc = eh_alloc(h)) < 0)
		return st_diag_set(diag, rc, "%s: out of memory", src);
	for (i = 0; i < (size_t)h->vocab; i++) {
		const json_t *e = json_array_get(map, i);

		if (!json_is_integer(e) || json_integer_value(e) < 0 ||
		    json_integer_value(e) > UINT32_MAX)
			return st_diag_set(diag, json_is_integer(e) ?
					   -ST_E_CONFIG : -ST_E_FORMAT,
					   "%s: token_map[%zu] is not a non-negative 32-bit integer",
					   src, i);
		h->map[i] = (uint32_t)json_integer_value(e);
	}
	mu = json_object_get(root, "multipliers");
	pr = json_object_get(root, "primes");
	of = json_object_get(root, "offsets");
	if (!json_is_array(mu) || json_array_size(mu) != (size_t)h->n_layers ||
	    !json_is_array(pr) || json_array_size(pr) != (size_t)h->n_layers ||
	    !json_is_array(of) || json_array_size(of) != (size_t)h->n_layers)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: multipliers, primes and offsets need one entry per Engram layer (%d)",
				   src, h->n_layers);
	for (li = 0; li < h->n_layers; li++) {
		const json_t *pl = json_array_get(pr, (size_t)li);

		snprintf(what, sizeof(what), "multipliers[%d]", li);
		if ((rc = jints(json_array_get(mu, (size_t)li),
				(size_t)h->max_ngram,
				h->mult + (size_t)li * h->max_ngram, src, what,
				diag)) < 0)
			return rc;
		snprintf(what, sizeof(what), "offsets[%d]", li);
		if ((rc = jints(json_array_get(of, (size_t)li), (size_t)cols(h),
				h->offsets + (size_t)li * cols(h), src, what,
				diag)) < 0)
			return rc;
		if (!json_is_array(pl) ||
		    json_array_size(pl) != (size_t)(h->max_ngram - 1))
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: primes[%d] must hold %d n-gram sizes",
					   src, li, h->max_ngram - 1);
		for (n = 0; n < h->max_ngram - 1; n++) {
			snprintf(what, sizeof(what), "primes[%d][%d]", li, n);
			if ((rc = jints(json_array_get(pl, (size_t)n),
					(size_t)h->heads,
					h->primes + (size_t)li * cols(h) +
					(size_t)n * h->heads, src, what,
					diag)) < 0)
				return rc;
		}
	}
	return check_values(h, src, diag);
}

int st_engram_hash_load_json(const char *path, struct st_engram_hash **ret,
			     struct st_diag *diag)
{
	struct st_engram_hash *h;
	json_error_t jerr;
	json_t *root;
	char *text;
	size_t len;
	int rc;

	*ret = NULL;
	rc = st_read_file(path, &text, &len);
	if (rc < 0)
		return st_diag_set(diag, rc, "%s: cannot read: %s", path,
				   st_strerror(rc));
	root = json_loadb(text, len, 0, &jerr);
	free(text);
	if (!root)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: not JSON (line %d: %s)", path,
				   jerr.line, jerr.text);
	h = calloc(1, sizeof(*h));
	if (!h) {
		json_decref(root);
		return -ENOMEM;
	}
	rc = parse_json(root, path, h, diag);
	json_decref(root);
	if (rc < 0) {
		st_engram_hash_free(h);
		return rc;
	}
	*ret = h;
	return 0;
}

/* --- accessors and the hash -------------------------------------------- */

int st_engram_hash_heads(const struct st_engram_hash *h)
{
	return h->heads;
}

int st_engram_hash_rows_per_pos(const struct st_engram_hash *h)
{
	return cols(h);
}

int st_engram_hash_n_layers(const struct st_engram_hash *h)
{
	return h->n_layers;
}

int st_engram_hash_layer_id(const struct st_engram_hash *h, int li)
{
	return li < 0 || li >= h->n_layers ? -1 : h->layer_ids[li];
}

int64_t st_engram_hash_table_rows(const struct st_engram_hash *h, int li)
{
	return li < 0 || li >= h->n_layers ? -1 : h->rows[li];
}

int st_engram_hash_vocab(const struct st_engram_hash *h)
{
	return h->vocab;
}

int st_engram_hash_check_config(const struct st_engram_hash *h, int n_layers,
				const int *layer_ids,
				const int64_t *num_embeddings,
				struct st_diag *diag)
{
	int li;

	if (n_layers != h->n_layers)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "Engram hash has %d layers, the config %d",
				   h->n_layers, n_layers);
	for (li = 0; li < n_layers; li++) {
		if (layer_ids[li] != h->layer_ids[li])
			return st_diag_set(diag, -ST_E_CONFIG,
					   "Engram layer %d: hash file says model layer %d, config engram_layer_ids says %d",
					   li, h->layer_ids[li], layer_ids[li]);
		if (num_embeddings[li] != h->rows[li])
			return st_diag_set(diag, -ST_E_CONFIG,
					   "Engram layer %d: config engram_num_embeddings %lld != %lld (sum of the hash file's primes)",
					   li, (long long)num_embeddings[li],
					   (long long)h->rows[li]);
	}
	return 0;
}

int st_engram_hash_rows(const struct st_engram_hash *h, int li,
			const int32_t *tokens, int p, int64_t *out_rows)
{
	const int64_t *m, *pr, *of;
	int64_t tok[EH_MAX_NGRAM], rho;
	int s, n, hd, dead = 0;

	if (li < 0 || li >= h->n_layers || p < 0 || !tokens || !out_rows)
		return -EINVAL;
	for (s = 0; s < h->max_ngram; s++) {
		if (!dead && s > p)
			dead = 1;
		if (!dead) {
			int32_t t = tokens[p - s];

			if (t == ST_ENGRAM_TOKEN_DEAD)
				dead = 1;
			else if (t < 0 || t >= h->vocab)
				return -EINVAL;
			else
				tok[s] = h->map[t];
		}
		if (dead)
			tok[s] = h->cpad;
	}
	m = h->mult + (size_t)li * h->max_ngram;
	pr = h->primes + (size_t)li * cols(h);
	of = h->offsets + (size_t)li * cols(h);
	/* tok < C and mult <= (2^63-1)/C: no product overflows, and a XOR of
	 * non-negative int64 values stays non-negative, so % is too. */
	rho = tok[0] * m[0];
	for (n = 1; n < h->max_ngram; n++) {
		rho ^= tok[n] * m[n];
		for (hd = 0; hd < h->heads; hd++) {
			int c = (n - 1) * h->heads + hd;

			out_rows[c] = rho % pr[c] + of[c];
		}
	}
	return cols(h);
}

/* --- binary store file -------------------------------------------------- */

/*
 * Layout (little-endian, as every strata store file; x86-64/arm64 hosts):
 *   char magic[8] "STENGH01"; u32 version; u32 n_layers, max_ngram, heads,
 *   vocab, pad_token_id; i64 cvocab, cpad;
 *   i32 layer_ids[n_layers]; i64 mult[n_layers*max_ngram];
 *   i64 primes[n_layers*cols]; i64 offsets[n_layers*cols];
 *   u32 map[vocab]; u64 xxh3 of every preceding byte.
 */
struct eh_head {
	char magic[8];
	uint32_t version, n_layers, max_ngram, heads, vocab, pad_token_id;
	int64_t cvocab, cpad;
};

static size_t body_bytes(const struct st_engram_hash *h)
{
	size_t c = (size_t)h->n_layers * cols(h);

	return sizeof(int32_t) * h->n_layers +
	       sizeof(int64_t) * ((size_t)h->n_layers * h->max_ngram + 2 * c) +
	       sizeof(uint32_t) * (size_t)h->vocab;
}

int st_engram_hash_save(const struct st_engram_hash *h, const char *path,
			struct st_diag *diag)
{
	size_t c = (size_t)h->n_layers * cols(h), len, off;
	struct eh_head hd;
	uint64_t sum;
	char *buf;
	int i, rc;

	memset(&hd, 0, sizeof(hd));
	memcpy(hd.magic, EH_MAGIC, 8);
	hd.version = EH_VERSION;
	hd.n_layers = (uint32_t)h->n_layers;
	hd.max_ngram = (uint32_t)h->max_ngram;
	hd.heads = (uint32_t)h->heads;
	hd.vocab = (uint32_t)h->vocab;
	hd.pad_token_id = (uint32_t)h->pad_token_id;
	hd.cvocab = h->cvocab;
	hd.cpad = h->cpad;
	len = sizeof(hd) + body_bytes(h) + sizeof(uint64_t);
	buf = malloc(len);
	if (!buf)
		return st_diag_set(diag, -ENOMEM, "%s: out of memory", path);
	memcpy(buf, &hd, sizeof(hd));
	off = sizeof(hd);
	for (i = 0; i < h->n_layers; i++) {
		int32_t id = h->layer_ids[i];

		memcpy(buf + off, &id, 4);
		off += 4;
	}
	memcpy(buf + off, h->mult, 8 * (size_t)h->n_layers * h->max_ngram);
	off += 8 * (size_t)h->n_layers * h->max_ngram;
	memcpy(buf + off, h->primes, 8 * c);
	off += 8 * c;
	memcpy(buf + off, h->offsets, 8 * c);
	off += 8 * c;
	memcpy(buf + off, h->map, 4 * (size_t)h->vocab);
	off += 4 * (size_t)h->vocab;
	sum = st_xxh3(buf, off);
	memcpy(buf + off, &sum, 8);
	rc = st_write_file(path, buf, len);
	free(buf);
	if (rc < 0)
		return st_diag_set(diag, rc, "%s: cannot write: %s", path,
				   st_strerror(rc));
	return 0;
}

int st_engram_hash_load(const char *path, struct st_engram_hash **ret,
			struct st_diag *diag)
{
	struct st_engram_hash *h = NULL;
	struct eh_head hd;
	size_t len, off, c;
	uint64_t sum;
	char *buf;
	int i, rc;

	*ret = NULL;
	rc = st_read_file(path, &buf, &len);
	if (rc < 0)
		return st_diag_set(diag, rc, "%s: cannot read: %s", path,
				   st_strerror(rc));
	if (len < sizeof(hd) + 8 || memcmp(buf, EH_MAGIC, 8) != 0) {
		rc = st_diag_set(diag, -ST_E_BADMAGIC,
				 "%s: not a strata Engram hash file (bad magic or truncated); re-run strata convert",
				 path);
		goto out;
	}
	memcpy(&hd, buf, sizeof(hd));
	if (hd.version != EH_VERSION) {
		rc = st_diag_set(diag, -ST_E_VERSION,
				 "%s: Engram hash file version %u, this strata reads %u; re-run strata convert",
				 path, hd.version, EH_VERSION);
		goto out;
	}
	memcpy(&sum, buf + len - 8, 8);
	if (st_xxh3(buf, len - 8) != sum) {
		rc = st_diag_set(diag, -ST_E_CHECKSUM,
				 "%s: checksum mismatch (file corrupt); re-run strata convert",
				 path);
		goto out;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		rc = -ENOMEM;
		goto out;
	}
	h->n_layers = hd.n_layers > 1000 ? -1 : (int)hd.n_layers;
	h->max_ngram = hd.max_ngram > 1000 ? -1 : (int)hd.max_ngram;
	h->heads = hd.heads > 1000 ? -1 : (int)hd.heads;
	h->vocab = hd.vocab > EH_MAX_VOCAB ? -1 : (int)hd.vocab;
	h->pad_token_id = hd.pad_token_id > EH_MAX_VOCAB ? -1 :
			  (int)hd.pad_token_id;
	h->cvocab = hd.cvocab;
	h->cpad = hd.cpad;
	if ((rc = check_sizes(h, path, diag)) < 0)
		goto out;
	if (len != sizeof(hd) + body_bytes(h) + 8) {
		rc = st_diag_set(diag, -ST_E_FORMAT,
				 "%s: %zu bytes, the header implies %zu; re-run strata convert",
				 path, len, sizeof(hd) + body_bytes(h) + 8);
		goto out;
	}
	if ((rc = eh_alloc(h)) < 0)
		goto out;
	c = (size_t)h->n_layers * cols(h);
	off = sizeof(hd);
	for (i = 0; i < h->n_layers; i++) {
		int32_t id;

		memcpy(&id, buf + off, 4);
		off += 4;
		h->layer_ids[i] = id;
	}
	memcpy(h->mult, buf + off, 8 * (size_t)h->n_layers * h->max_ngram);
	off += 8 * (size_t)h->n_layers * h->max_ngram;
	memcpy(h->primes, buf + off, 8 * c);
	off += 8 * c;
	memcpy(h->offsets, buf + off, 8 * c);
	off += 8 * c;
	memcpy(h->map, buf + off, 4 * (size_t)h->vocab);
	rc = check_values(h, path, diag);
out:
	free(buf);
	if (rc < 0) {
		st_engram_hash_free(h);
		return rc;
	}
	*ret = h;
	return 0;
}

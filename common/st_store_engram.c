/*
 * st_store_engram.c — the Engram section of a DeepSeek-V4.1 store (see
 * st_store_engram.h).
 */
#include "st_store_engram.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "st_engram_hash.h"
#include "st_util.h"

static int eint(json_t *o, const char *key, int64_t *ret)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*ret = json_integer_value(v);
	return 0;
}

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

/* The layouts listed in the manifest must be exactly those the config
 * implies (so a reader can trust either). */
static int parse_layers(struct st_store *s, json_t *arr, struct st_diag *diag)
{
	const struct st_dsv_config *g = &s->dsv41;
	uint64_t next = 1;

	if (!json_is_array(arr) || json_array_size(arr) != (size_t)g->n_engram)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "store %s: manifest engram.layers must list the config's %d Engram layers; re-run strata convert",
				   s->dir, g->n_engram);
	s->engram = calloc((size_t)g->n_engram, sizeof(*s->engram));
	if (!s->engram)
		return -ENOMEM;
	s->n_engram = g->n_engram;
	for (int i = 0; i < g->n_engram; i++) {
		json_t *o = json_array_get(arr, (size_t)i), *h;
		struct st_engram_layout *l = &s->engram[i];
		int64_t layer, rows, dim, rb, rpb, fb, nb;
		int r;

		if ((r = st_engram_layout_init(g->engram_layer[i], g->engram_head_dim,
					       g->engram_rows[i], next, l,
					       diag)))
			return r;
		next += l->n_blocks;
		h = json_object_get(o, "xxh3");
		if (!json_is_object(o) || eint(o, "layer", &layer) ||
		    eint(o, "rows", &rows) || eint(o, "dim", &dim) ||
		    eint(o, "row_bytes", &rb) || eint(o, "rows_per_block", &rpb) ||
		    eint(o, "first_block", &fb) || eint(o, "blocks", &nb) ||
		    !json_is_string(h) ||
		    sscanf(json_string_value(h), "%16" SCNx64, &l->xxh3) != 1)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "store %s: manifest engram.layers[%d]: a field is missing or malformed; re-run strata convert",
					   s->dir, i);
		if (layer != l->layer || rows != l->rows || dim != l->dim ||
		    rb != l->row_bytes || rpb != l->rows_per_block ||
		    (uint64_t)fb != l->first_block || (uint64_t)nb != l->n_blocks)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "store %s: manifest engram.layers[%d] (layer %lld, %lld rows of %lld) does not match the config (layer %d, %lld rows of %d); re-run strata convert",
					   s->dir, i, (long long)layer,
					   (long long)rows, (long long)dim,
					   l->layer, (long long)l->rows, l->dim);
	}
	s->engram_bytes = next * ST_ENGRAM_BLOCK_BYTES;
	return 0;
}

/* engram.bin: its size and header block agree with the manifest. */
static int check_file(struct st_store *s, struct st_diag *diag)
{
	struct st_engram_layout hl[ST_ENGRAM_MAX_LAYERS];
	uint8_t *blk = NULL;
	char path[4096], src[4200];
	struct stat st;
	int fd, r, n = 0;

	if (st_store_path(s, ST_ENGRAM_FILE, path, sizeof(path)))
		return -ENAMETOOLONG;
	snprintf(src, sizeof(src), "store %s: %s", s->dir, ST_ENGRAM_FILE);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return st_diag_set(diag, -errno, "%s: %s; the store is incomplete, re-run strata convert",
				   src, strerror(errno));
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != s->engram_bytes) {
		close(fd);
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: %lld bytes, the manifest says %" PRIu64 " (truncated or damaged); re-run strata convert",
				   src, (long long)st.st_size, s->engram_bytes);
	}
	blk = malloc(ST_ENGRAM_BLOCK_BYTES);
	r = blk ? pread_full(fd, blk, ST_ENGRAM_BLOCK_BYTES, 0) : -ENOMEM;
	close(fd);
	if (r) {
		free(blk);
		return st_diag_set(diag, r, "%s: header: %s", src, st_strerror(r));
	}
	r = st_engram_header_decode(blk, src, hl, ST_ENGRAM_MAX_LAYERS, &n, diag);
	free(blk);
	if (r)
		return r;
	if (n != s->n_engram)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: header lists %d layers, the manifest %d; re-run strata convert",
				   src, n, s->n_engram);
	for (int i = 0; i < n; i++)
		if (hl[i].layer != s->engram[i].layer ||
		    hl[i].rows != s->engram[i].rows ||
		    hl[i].dim != s->engram[i].dim)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s: header layer %d differs from the manifest; re-run strata convert",
					   src, i);
	return 0;
}

int st_store_engram_parse(struct st_store *s, json_t *root,
			  struct st_diag *diag)
{
	json_t *e = json_object_get(root, "engram"), *f, *hf;
	const struct st_dsv_config *g = &s->dsv41;
	int64_t ids64[ST_DSV_MAX_ENGRAM];
	char path[4096];
	int listed = 0, r;

	if (!json_is_object(e))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "store %s: a DeepSeek-V4.1 store needs a manifest \"engram\" section; re-run strata convert",
				   s->dir);
	f = json_object_get(e, "file");
	hf = json_object_get(e, "hash_file");
	if (!json_is_string(f) || strcmp(json_string_value(f), ST_ENGRAM_FILE) ||
	    !json_is_string(hf) ||
	    strcmp(json_string_value(hf), ST_ENGRAM_HASH_FILE))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "store %s: manifest engram.file / hash_file must be \"%s\" / \"%s\"",
				   s->dir, ST_ENGRAM_FILE, ST_ENGRAM_HASH_FILE);
	if ((r = parse_layers(s, json_object_get(e, "layers"), diag)))
		return r;
	{
		int64_t bytes;

		if (eint(e, "bytes", &bytes) || (uint64_t)bytes != s->engram_bytes)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "store %s: manifest engram.bytes is not %" PRIu64 " (the layouts' size); re-run strata convert",
					   s->dir, s->engram_bytes);
	}
	if ((r = check_file(s, diag)))
		return r;
	for (int i = 0; i < s->n_files; i++)
		listed |= !strcmp(s->files[i].name, ST_ENGRAM_HASH_FILE);
	if (!listed)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "store %s: %s is not listed in the manifest's files; re-run strata convert",
				   s->dir, ST_ENGRAM_HASH_FILE);
	if (st_store_path(s, ST_ENGRAM_HASH_FILE, path, sizeof(path)))
		return -ENAMETOOLONG;
	if ((r = st_engram_hash_load(path, &s->engram_hash, diag)))
		return r;
	if (st_engram_hash_heads(s->engram_hash) != g->engram_n_heads ||
	    st_engram_hash_rows_per_pos(s->engram_hash) !=
	    (g->engram_max_ngram - 1) * g->engram_n_heads ||
	    st_engram_hash_vocab(s->engram_hash) != g->vocab_size)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "store %s: %s: heads / n-gram sizes / vocabulary differ from the config; re-run strata convert",
				   s->dir, ST_ENGRAM_HASH_FILE);
	for (int i = 0; i < g->n_engram; i++)
		ids64[i] = g->engram_rows[i];
	return st_engram_hash_check_config(s->engram_hash, g->n_engram,
					   g->engram_layer, ids64, diag);
}

int st_store_engram_verify(const struct st_store *s, int *ret_n_bad,
			   struct st_diag *diag)
{
	XXH3_state_t *xs = XXH3_createState();
	uint8_t *buf = malloc(ST_ENGRAM_BLOCK_BYTES * 256);
	int first = 0, fd = -1;
	char path[4096];

	*ret_n_bad = 0;
	if (!xs || !buf) {
		first = st_diag_set(diag, -ENOMEM, "out of memory");
		goto out;
	}
	if (st_store_path(s, ST_ENGRAM_FILE, path, sizeof(path)) ||
	    (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
		first = st_diag_set(diag, -errno, "store %s: %s: %s", s->dir,
				    ST_ENGRAM_FILE, strerror(errno));
		*ret_n_bad = 1;
		goto out;
	}
	for (int i = 0; i < s->n_engram; i++) {
		const struct st_engram_layout *l = &s->engram[i];
		struct st_diag d = { { 0 } };
		int bad = 0;

		XXH3_64bits_reset(xs);
		for (uint64_t b = 0; b < l->n_blocks && !bad; b += 256) {
			uint64_t n = ST_MIN((uint64_t)256, l->n_blocks - b);
			int r = pread_full(fd, buf, n * ST_ENGRAM_BLOCK_BYTES,
					   (l->first_block + b) *
					   ST_ENGRAM_BLOCK_BYTES);

			if (r) {
				bad = st_diag_set(&d, r, "store %s: %s: layer %d: read failed: %s",
						  s->dir, ST_ENGRAM_FILE, l->layer,
						  st_strerror(r));
				break;
			}
			for (uint64_t k = 0; k < n && !bad; k++)
				if (st_engram_block_check(buf + k * ST_ENGRAM_BLOCK_BYTES,
							  l->first_block + b + k))
					bad = st_diag_set(&d, -ST_E_CHECKSUM,
							  "store %s: %s: Engram layer %d block %" PRIu64 " (rows %" PRIu64 "..) checksum mismatch; the store is damaged: re-run strata convert",
							  s->dir, ST_ENGRAM_FILE, l->layer,
							  l->first_block + b + k,
							  (b + k) * l->rows_per_block);
			XXH3_64bits_update(xs, buf, n * ST_ENGRAM_BLOCK_BYTES);
		}
		if (!bad && XXH3_64bits_digest(xs) != l->xxh3)
			bad = st_diag_set(&d, -ST_E_CHECKSUM,
					  "store %s: %s: Engram layer %d checksum mismatch; re-run strata convert",
					  s->dir, ST_ENGRAM_FILE, l->layer);
		if (bad) {
			(*ret_n_bad)++;
			if (!first) {
				first = bad;
				if (diag)
					*diag = d;
			}
		}
	}
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	XXH3_freeState(xs);
	return first;
}

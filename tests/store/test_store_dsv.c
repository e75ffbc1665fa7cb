/*
 * test_store_dsv.c — `strata convert` of the DeepSeek-V4 family's fixtures
 * checked against the checkpoint read with independent code (the
 * safetensors header parsed here with jansson), one test for both
 * revisions (argv[1]: v4 or v41; the shared checks, store open and
 * geometry, a second convert byte-identical, run on both fixtures):
 *
 * v4: tiny-deepseek-v4: every expert record holds the checkpoint's E2M1
 * code bytes and E8M0 scale bytes at the offsets the manifest names, zero
 * elsewhere, the MTP block's experts (mtp.0.ffn.experts.*) as the last
 * expert layer (issue 22 §1b: the converter keeps the draft block); every
 * other tensor (FP8 E4M3 weights, E8M0 scales, BF16, F32, I64 tid2eid,
 * the MTP block's) byte-equal in dense.bin;
 * st_store_open / st_store_verify accept the store; a second convert is
 * byte-identical; options that would change the formats are refused; a
 * flipped byte fails verify.
 *
 * v41: tiny-deepseek-v41:
 *   - engram.bin: every row of both Engram tables at the block and offset
 *     computed here (whole rows per 4 KiB block, first block 1), its E4M3
 *     bytes then its E8M0 scale bytes equal to the checkpoint's, every
 *     block's trailing XXH3-64 (seeded with its index) right, padding zero;
 *   - dense.bin: every tensor but the experts and engram.embed.* byte-equal;
 *     expert records byte-equal (MXFP4 as in the checkpoint);
 *   - engram_hash.bin gives the rows of engram_hash.json;
 *   - st_store_open / st_store_verify accept it, a second convert is
 *     byte-identical, a flipped Engram byte fails verify naming the layer, a
 *     damaged header fails open;
 *   - checkpoints edited here: an mtp.* tensor is skipped and counted (a
 *     generation_config.json is copied and the store still opens), a
 *     V4-only or unknown tensor is refused by name, a missing
 *     engram_hash.json is refused;
 *   - the store holds the whole V4.1 configuration parsed by the one
 *     reader (st_config_dsv41), and convert refuses what it refuses.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <xxhash.h>

#include "es_convert.h"
#include "st_engram_hash.h"
#include "st_store.h"
#include "st_util.h"
#include "test_util.h"

static char g_model[4096], g_tmp[4096], g_store[4200];
static int g_v41; /* the revision under test: V4.1, else V4 */

/* The checkpoint, read here: whole file plus its parsed header. */
struct ck {
	char *buf;
	size_t len;
	json_t *hdr;
	size_t data0;
};

static void ck_open(struct ck *k, const char *dir)
{
	char path[4200];
	uint64_t n;

	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(st_read_file(path, &k->buf, &k->len), 0);
	memcpy(&n, k->buf, 8);
	k->hdr = json_loadb(k->buf + 8, (size_t)n, 0, NULL);
	assert_non_null(k->hdr);
	k->data0 = 8 + (size_t)n;
}

static void ck_close(struct ck *k)
{
	json_decref(k->hdr);
	free(k->buf);
}

/* Bytes of tensor `name` (NULL if absent); *len its size. */
static const uint8_t *ck_tensor(const struct ck *k, const char *name,
				const char **dtype, size_t *len)
{
	json_t *t = json_object_get(k->hdr, name), *off;
	size_t a, b;

	if (!t)
		return NULL;
	off = json_object_get(t, "data_offsets");
	a = (size_t)json_integer_value(json_array_get(off, 0));
	b = (size_t)json_integer_value(json_array_get(off, 1));
	assert_true(k->data0 + b <= k->len);
	*len = b - a;
	if (dtype)
		*dtype = json_string_value(json_object_get(t, "dtype"));
	return (const uint8_t *)k->buf + k->data0 + a;
}

static int convert(const char *model, const char *out, struct st_diag *d)
{
	struct es_convert_opts o;

	es_convert_opts_init(&o);
	return es_convert(model, out, &o, d);
}

static int setup(void **state)
{
	struct st_diag d = { { 0 } };

	(void)state;
	st_test_fixture_model(g_v41 ? "tiny-deepseek-v41" : "tiny-deepseek-v4",
			      g_model, sizeof(g_model));
	st_test_tmpdir(g_tmp, sizeof(g_tmp));
	snprintf(g_store, sizeof(g_store), "%s/store", g_tmp);
	if (convert(g_model, g_store, &d)) {
		fprintf(stderr, "convert: %s\n", d.msg);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	st_rm_rf(g_tmp);
	return 0;
}

static void test_open_and_geometry_v4(void **state)
{
	struct st_store *s = NULL;
	struct st_diag d = { { 0 } };
	json_t *cfg;
	char path[4200];

	(void)state;
	assert_int_equal(st_store_open(g_store, &s, &d), 0);
	snprintf(path, sizeof(path), "%s/config.json", g_model);
	cfg = json_load_file(path, 0, NULL);
	assert_non_null(cfg);
	assert_true(s->is_dsv4);
	/* the decoder layers, then the MTP block (num_nextn_predict_layers 1) */
	assert_int_equal(s->n_mtp, 1);
	assert_int_equal(s->n_layers, json_integer_value(json_object_get(
					      cfg, "num_hidden_layers")) + 1);
	assert_int_equal(s->cfg.n_layers, s->dsv4.n_layers);
	assert_int_equal(s->n_experts, json_integer_value(json_object_get(
					       cfg, "n_routed_experts")));
	assert_int_equal(s->cfg.expert_inter, json_integer_value(
		json_object_get(cfg, "moe_intermediate_size")));
	assert_int_equal(s->dsv4.n_hash_layers, json_integer_value(
		json_object_get(cfg, "num_hash_layers")));
	json_decref(cfg);
	assert_int_equal(s->layers[0].mat[0].fmt.dtype, ST_DTYPE_MXFP4);
	st_store_close(s);
	assert_int_equal(st_store_verify(g_store, NULL, NULL, NULL, &d), 0);
}

/* Every record: w1 -> gate, w3 -> up, w2 -> down, codes then scales at
 * the manifest offsets, byte for byte; the rest of the record zero. */
static void test_expert_records(void **state)
{
	static const char *const wn[3] = { "w1", "w3", "w2" };
	struct st_store *s = NULL;
	struct st_diag d = { { 0 } };
	struct ck k;
	uint8_t *rec, *want;
	size_t checked = 0;

	(void)state;
	ck_open(&k, g_model);
	assert_int_equal(st_store_open(g_store, &s, &d), 0);
	rec = malloc(s->record_bytes);
	want = malloc(s->record_bytes);
	assert_non_null(rec);
	assert_non_null(want);
	for (int l = 0; l < s->n_layers; l++) {
		char path[4300];
		int fd;

		st_store_path(s, s->expert_files[l], path, sizeof(path));
		fd = open(path, O_RDONLY);
		assert_true(fd >= 0);
		for (int e = 0; e < s->n_experts; e++) {
			assert_int_equal(st_store_read_record(s, fd, l, e, rec,
							      &d), 0);
			memset(want, 0, s->record_bytes);
			for (int m = 0; m < 3; m++) {
				const struct st_store_matrix *x =
					&s->layers[l].mat[m];
				const uint8_t *w, *sc;
				const char *dt = NULL;
				char nm[128], pfx[32];
				size_t wl, sl;

				if (l < s->dsv4.n_layers)
					snprintf(pfx, sizeof(pfx), "layers.%d", l);
				else
					snprintf(pfx, sizeof(pfx), "mtp.%d",
						 l - s->dsv4.n_layers);
				snprintf(nm, sizeof(nm), "%s.ffn.experts."
					 "%d.%s.weight", pfx, e, wn[m]);
				w = ck_tensor(&k, nm, &dt, &wl);
				assert_non_null(w);
				assert_string_equal(dt, "I8");
				snprintf(nm, sizeof(nm), "%s.ffn.experts."
					 "%d.%s.scale", pfx, e, wn[m]);
				sc = ck_tensor(&k, nm, &dt, &sl);
				assert_non_null(sc);
				assert_string_equal(dt, "F8_E8M0");
				assert_int_equal(wl, x->data_bytes);
				assert_int_equal(sl, x->scale_bytes);
				memcpy(want + x->data_offset, w, wl);
				memcpy(want + x->scale_offset, sc, sl);
			}
			assert_memory_equal(rec, want, s->record_bytes);
			checked++;
		}
		close(fd);
	}
	assert_int_equal(checked, (size_t)s->n_layers * s->n_experts);
	free(rec);
	free(want);
	st_store_close(s);
	ck_close(&k);
}

/* Every checkpoint tensor that is not a routed expert (the MTP block's
 * other tensors included) is in dense.bin with its own dtype and bytes;
 * nothing else is. */
static void test_dense_bytes(void **state)
{
	struct st_store *s = NULL;
	struct st_diag d = { { 0 } };
	struct ck k;
	const char *key;
	json_t *v;
	char path[4300], *dense;
	size_t dlen, n_dense = 0, seen_fp8 = 0, seen_i64 = 0, seen_e8m0 = 0;
	size_t seen_mtp = 0;

	(void)state;
	ck_open(&k, g_model);
	assert_int_equal(st_store_open(g_store, &s, &d), 0);
	st_store_path(s, s->dense_file, path, sizeof(path));
	assert_int_equal(st_read_file(path, &dense, &dlen), 0);
	json_object_foreach(k.hdr, key, v) {
		const struct st_store_tensor *t;
		const uint8_t *src;
		const char *dt = NULL;
		size_t len;

		if (!strcmp(key, "__metadata__"))
			continue;
		t = st_store_find_dense(s, key);
		if (strstr(key, ".experts.")) {
			assert_null(t);
			continue;
		}
		assert_non_null(t);
		seen_mtp += !strncmp(key, "mtp.0.", 6);
		src = ck_tensor(&k, key, &dt, &len);
		assert_string_equal(st_dtype_traits(t->dtype)->name, dt);
		assert_int_equal(t->n_bytes, len);
		assert_true(t->offset + len <= dlen);
		assert_memory_equal(dense + t->offset, src, len);
		seen_fp8 += t->dtype == ST_DTYPE_F8_E4M3;
		seen_e8m0 += t->dtype == ST_DTYPE_F8_E8M0;
		seen_i64 += t->dtype == ST_DTYPE_I64;
		n_dense++;
	}
	assert_int_equal(n_dense, (size_t)s->n_dense);
	assert_true(seen_fp8 > 0 && seen_fp8 == seen_e8m0);
	assert_int_equal(seen_i64, (size_t)s->dsv4.n_hash_layers);
	/* attention, norms, mHC, router, shared expert, e/h_proj, hc_head */
	assert_true(seen_mtp >= 30);
	assert_non_null(st_store_find_dense(s, "mtp.0.e_proj.weight"));
	free(dense);
	st_store_close(s);
	ck_close(&k);
}

static void test_open_and_geometry_v41(void **state)
{
	struct st_store *s = NULL;
	struct st_diag d = { { 0 } };

	(void)state;
	if (st_store_open(g_store, &s, &d))
		fail_msg("%s", d.msg);
	assert_true(s->is_dsv41);
	assert_false(s->is_dsv4);
	assert_int_equal(s->n_layers, 10);
	assert_int_equal(s->n_experts, 16);
	assert_int_equal(s->cfg.expert_inter, 64);
	assert_int_equal(s->layers[0].mat[0].fmt.dtype, ST_DTYPE_MXFP4);
	assert_int_equal(s->n_engram, 2);
	assert_int_equal(s->engram[0].layer, 1);
	assert_int_equal(s->engram[1].layer, 4);
	assert_int_equal(s->engram[0].rows, 660);
	assert_int_equal(s->engram[1].rows, 864);
	assert_int_equal(s->engram[0].dim, 64);
	assert_non_null(s->engram_hash);
	assert_int_equal(st_engram_hash_rows_per_pos(s->engram_hash), 6);
	st_store_close(s);
	assert_int_equal(st_store_verify(g_store, NULL, NULL, NULL, &d), 0);
}

/* Every Engram row where the layout puts it, computed here. */
static void test_engram_rows(void **state)
{
	static const int layer[2] = { 1, 4 };
	static const int64_t rows[2] = { 660, 864 };
	const int dim = 64, ns = 2, rb = 66, rpb = (4096 - 8) / 66;
	struct ck k;
	char path[4300], *file;
	size_t flen;
	uint64_t block = 1;
	int64_t checked = 0;

	(void)state;
	ck_open(&k, g_model);
	snprintf(path, sizeof(path), "%s/engram.bin", g_store);
	assert_int_equal(st_read_file(path, &file, &flen), 0);
	for (int li = 0; li < 2; li++) {
		const uint8_t *w, *sc;
		const char *dt = NULL;
		char nm[128];
		size_t wl, sl;
		uint64_t nblk = (uint64_t)(rows[li] + rpb - 1) / rpb;

		snprintf(nm, sizeof(nm), "layers.%d.engram.embed.weight", layer[li]);
		w = ck_tensor(&k, nm, &dt, &wl);
		assert_non_null(w);
		assert_string_equal(dt, "F8_E4M3");
		assert_int_equal(wl, (size_t)rows[li] * dim);
		snprintf(nm, sizeof(nm), "layers.%d.engram.embed.scale", layer[li]);
		sc = ck_tensor(&k, nm, &dt, &sl);
		assert_non_null(sc);
		assert_string_equal(dt, "F8_E8M0");
		assert_int_equal(sl, (size_t)rows[li] * ns);
		for (uint64_t b = 0; b < nblk; b++) {
			const uint8_t *blk = (const uint8_t *)file +
					     (block + b) * 4096;
			uint64_t sum;
			int used = 0;

			assert_true((block + b + 1) * 4096 <= flen);
			memcpy(&sum, blk + 4088, 8);
			assert_true(sum == XXH3_64bits_withSeed(blk, 4088,
								block + b));
			for (int j = 0; j < rpb; j++) {
				int64_t r = (int64_t)b * rpb + j;

				if (r >= rows[li])
					break;
				assert_memory_equal(blk + j * rb,
						    w + (size_t)r * dim, dim);
				assert_memory_equal(blk + j * rb + dim,
						    sc + (size_t)r * ns, ns);
				used = (j + 1) * rb;
				checked++;
			}
			for (int z = used; z < 4088; z++)
				assert_int_equal(blk[z], 0);
		}
		block += nblk;
	}
	assert_int_equal(checked, 660 + 864);
	assert_int_equal(flen, block * 4096);
	free(file);
	ck_close(&k);
}

/* Dense tensors byte for byte; no expert, Engram table or MTP tensor. */
static void test_dense_and_experts(void **state)
{
	struct st_store *s = NULL;
	struct st_diag d = { { 0 } };
	struct ck k;
	const char *key;
	json_t *v;
	char path[4300], *dense;
	size_t dlen, n_dense = 0;
	uint8_t *rec;
	int fd;

	(void)state;
	ck_open(&k, g_model);
	assert_int_equal(st_store_open(g_store, &s, &d), 0);
	st_store_path(s, s->dense_file, path, sizeof(path));
	assert_int_equal(st_read_file(path, &dense, &dlen), 0);
	json_object_foreach(k.hdr, key, v) {
		const struct st_store_tensor *t;
		const uint8_t *src;
		const char *dt = NULL;
		size_t len;

		if (!strcmp(key, "__metadata__"))
			continue;
		t = st_store_find_dense(s, key);
		if (strstr(key, ".experts.") || strstr(key, ".engram.embed.")) {
			assert_null(t);
			continue;
		}
		assert_non_null(t);
		src = ck_tensor(&k, key, &dt, &len);
		assert_string_equal(st_dtype_traits(t->dtype)->name, dt);
		assert_int_equal(t->n_bytes, len);
		assert_memory_equal(dense + t->offset, src, len);
		n_dense++;
	}
	assert_int_equal(n_dense, (size_t)s->n_dense);
	assert_non_null(st_store_find_dense(s, "layers.1.engram.wkv.weight"));
	assert_non_null(st_store_find_dense(s, "layers.4.engram.q_weight"));
	/* one expert record: w1 codes at the gate section */
	rec = malloc(s->record_bytes);
	st_store_path(s, s->expert_files[9], path, sizeof(path));
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(st_store_read_record(s, fd, 9, 15, rec, &d), 0);
	close(fd);
	{
		size_t len;
		const uint8_t *w = ck_tensor(&k, "layers.9.ffn.experts.15.w2.weight",
					     NULL, &len);

		assert_int_equal(len, s->layers[9].mat[2].data_bytes);
		assert_memory_equal(rec + s->layers[9].mat[2].data_offset, w, len);
	}
	free(rec);
	free(dense);
	st_store_close(s);
	ck_close(&k);
}

/* The store's hash file gives what the fixture's JSON gives. */
static void test_hash_file(void **state)
{
	struct st_store *s = NULL;
	struct st_diag d = { { 0 } };
	struct st_engram_hash *j = NULL;
	char path[4300];
	int32_t tok[50];
	int64_t a[6], b[6];

	(void)state;
	assert_int_equal(st_store_open(g_store, &s, &d), 0);
	snprintf(path, sizeof(path), "%s/engram_hash.json", g_model);
	assert_int_equal(st_engram_hash_load_json(path, &j, &d), 0);
	for (int i = 0; i < 50; i++)
		tok[i] = (int32_t)((i * 104729 + 5) % 129280);
	for (int p = 0; p < 50; p++)
		for (int li = 0; li < 2; li++) {
			assert_int_equal(st_engram_hash_rows(s->engram_hash, li,
							     tok, p, a), 6);
			assert_int_equal(st_engram_hash_rows(j, li, tok, p, b), 6);
			assert_memory_equal(a, b, sizeof(a));
		}
	st_engram_hash_free(j);
	st_store_close(s);
}

static void cmp_file(const char *a_dir, const char *b_dir, const char *name)
{
	char pa[4300], pb[4300], *a, *b;
	size_t la, lb;

	snprintf(pa, sizeof(pa), "%s/%s", a_dir, name);
	snprintf(pb, sizeof(pb), "%s/%s", b_dir, name);
	assert_int_equal(st_read_file(pa, &a, &la), 0);
	assert_int_equal(st_read_file(pb, &b, &lb), 0);
	assert_int_equal(la, lb);
	assert_memory_equal(a, b, la);
	free(a);
	free(b);
}

static void test_repeat_identical(void **state)
{
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	char again[4200];

	(void)state;
	snprintf(again, sizeof(again), "%s/again", g_tmp);
	assert_int_equal(convert(g_model, again, &d), 0);
	assert_int_equal(st_store_open(g_store, &s, &d), 0);
	cmp_file(g_store, again, ST_STORE_MANIFEST);
	cmp_file(g_store, again, ST_STORE_DENSE_FILE);
	if (g_v41) {
		cmp_file(g_store, again, ST_ENGRAM_FILE);
		cmp_file(g_store, again, ST_ENGRAM_HASH_FILE);
	}
	for (int l = 0; l < s->n_layers; l++)
		cmp_file(g_store, again, s->expert_files[l]);
	st_store_close(s);
	st_rm_rf(again);
}

/* Options that would re-quantize or re-type are refused, not ignored. */
static void test_refused_options(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };

	(void)state;
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_experts("nvfp4", &o, &d), 0);
	assert_int_equal(es_convert_check(g_model, &o, &d), -ST_E_UNSUPPORTED);
	assert_non_null(strstr(d.msg, "--experts"));
	es_convert_opts_init(&o);
	o.dense_fp8 = 1;
	assert_int_equal(es_convert_check(g_model, &o, &d), -ST_E_UNSUPPORTED);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_keep("first=fp8", &o, &d), 1);
	assert_int_equal(es_convert_check(g_model, &o, &d), -ST_E_UNSUPPORTED);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_check(g_model, &o, &d), 0);
}

/* A flipped E2M1 byte in one record is caught by verify. */
static void test_corrupt_record(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	char copy[4200], path[4300];
	uint8_t b;
	int fd, n_bad = 0;

	(void)state;
	snprintf(copy, sizeof(copy), "%s/corrupt", g_tmp);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert(g_model, copy, &o, &d), 0);
	snprintf(path, sizeof(path), "%s/experts-003.bin", copy);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, 4096 * 5 + 7), 1);
	b ^= 0x10;
	assert_int_equal(pwrite(fd, &b, 1, 4096 * 5 + 7), 1);
	close(fd);
	assert_int_equal(st_store_verify(copy, NULL, NULL, &n_bad, &d),
			 -ST_E_CHECKSUM);
	assert_int_equal(n_bad, 1);
	st_rm_rf(copy);
}

/* Copies the store's manifest with one dense tensor's field changed
 * into a fresh store copy; st_store_open must refuse it, naming why. */
static void tamper(const char *tensor, const char *key, json_t *val,
		   const char *want_msg)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	char copy[4200], path[4300];
	json_t *root, *arr, *t;
	size_t i;
	int found = 0;

	snprintf(copy, sizeof(copy), "%s/tamper", g_tmp);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert(g_model, copy, &o, &d), 0);
	snprintf(path, sizeof(path), "%s/%s", copy, ST_STORE_MANIFEST);
	root = json_load_file(path, JSON_PRESERVE_ORDER, NULL);
	assert_non_null(root);
	arr = json_object_get(json_object_get(root, "dense"), "tensors");
	json_array_foreach(arr, i, t)
		if (!strcmp(json_string_value(json_object_get(t, "name")),
			    tensor)) {
			json_object_set_new(t, key, val);
			found = 1;
		}
	assert_true(found);
	assert_int_equal(json_dump_file(root, path, JSON_PRESERVE_ORDER), 0);
	json_decref(root);
	assert_int_equal(st_store_open(copy, &s, &d), -ST_E_FORMAT);
	assert_non_null(strstr(d.msg, want_msg));
	st_rm_rf(copy);
}

/* The reader's V4 checks: a required tensor missing (renamed), and a
 * dtype a store never holds. */
static void test_reader_checks(void **state)
{
	(void)state;
	tamper("norm.weight", "name", json_string("norm.weight.x"),
	       "norm.weight");
	tamper("layers.0.ffn.gate.tid2eid", "dtype", json_string("F16"),
	       "F16");
}

static void flip(const char *dir, const char *name, uint64_t off)
{
	char path[4300];
	uint8_t b;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x04;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

static void test_corrupt_engram(void **state)
{
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	char copy[4200];
	int n_bad = 0;

	(void)state;
	snprintf(copy, sizeof(copy), "%s/corrupt", g_tmp);
	assert_int_equal(convert(g_model, copy, &d), 0);
	/* a row byte in layer 4's table (its blocks start at 12) */
	flip(copy, ST_ENGRAM_FILE, 4096 * 14 + 100);
	assert_int_equal(st_store_verify(copy, NULL, NULL, &n_bad, &d),
			 -ST_E_CHECKSUM);
	assert_int_equal(n_bad, 1);
	assert_non_null(strstr(d.msg, "Engram layer 4 block 14"));
	/* the header: open refuses */
	flip(copy, ST_ENGRAM_FILE, 4096 * 14 + 100);
	assert_int_equal(st_store_verify(copy, NULL, NULL, &n_bad, &d), 0);
	flip(copy, ST_ENGRAM_FILE, 30);
	assert_int_equal(st_store_open(copy, &s, &d), -ST_E_CHECKSUM);
	assert_null(s);
	assert_non_null(strstr(d.msg, "engram.bin"));
	assert_non_null(strstr(d.msg, "strata convert"));
	st_rm_rf(copy);
}

/* A model directory in g_tmp/name: the fixture's small files linked, and
 * model.safetensors with one extra tensor `extra` (BF16 [4], zero) when
 * not NULL; engram_hash.json left out when !with_hash. */
static void make_model(const char *name, const char *extra, int with_hash,
		       char *ret, size_t len)
{
	static const char *const files[] = { "config.json", "tokenizer.json",
					     "tokenizer_config.json",
					     "engram_hash.json" };
	struct ck k;
	char src[4300], dst[4300], *hdr, *out;
	size_t hl, pad, olen, dlen;
	uint64_t n;

	snprintf(ret, len, "%s/%s", g_tmp, name);
	assert_int_equal(st_mkdir_p(ret, 0755), 0);
	for (size_t i = 0; i < 4; i++) {
		if (i == 3 && !with_hash)
			continue;
		snprintf(src, sizeof(src), "%s/%s", g_model, files[i]);
		snprintf(dst, sizeof(dst), "%s/%s", ret, files[i]);
		assert_int_equal(symlink(src, dst), 0);
	}
	ck_open(&k, g_model);
	dlen = k.len - k.data0;
	if (extra) {
		json_t *t = json_pack("{s:s, s:[i], s:[I, I]}", "dtype", "BF16",
				      "shape", 4, "data_offsets",
				      (json_int_t)dlen, (json_int_t)dlen + 8);

		json_object_set_new(k.hdr, extra, t);
	}
	hdr = json_dumps(k.hdr, JSON_COMPACT | JSON_SORT_KEYS);
	hl = strlen(hdr);
	pad = (8 - hl % 8) % 8;
	olen = 8 + hl + pad + dlen + (extra ? 8 : 0);
	out = calloc(1, olen);
	n = hl + pad;
	memcpy(out, &n, 8);
	memcpy(out + 8, hdr, hl);
	memset(out + 8 + hl, ' ', pad);
	memcpy(out + 8 + n, k.buf + k.data0, dlen);
	snprintf(dst, sizeof(dst), "%s/model.safetensors", ret);
	assert_int_equal(st_write_file(dst, out, olen), 0);
	free(out);
	free(hdr);
	ck_close(&k);
}

static void test_edited_checkpoints(void **state)
{
	struct st_diag d = { { 0 } };
	char dir[4300], out[4400], path[4500];
	json_t *m;

	(void)state;
	/* DSpark (MTP) tensor: skipped, counted in the manifest */
	make_model("m_mtp", "mtp.0.ffn.gate.weight", 1, dir, sizeof(dir));
	/* with a generation_config.json (copied; the V4.1 reader keeps the
	 * config's EOS) */
	snprintf(path, sizeof(path), "%s/generation_config.json", dir);
	assert_int_equal(st_write_file(path, "{\"eos_token_id\": 1}\n", 20), 0);
	snprintf(out, sizeof(out), "%s/store", dir);
	if (convert(dir, out, &d))
		fail_msg("%s", d.msg);
	{
		struct st_store *s = NULL;

		if (st_store_open(out, &s, &d))
			fail_msg("%s", d.msg);
		assert_int_equal(s->cfg.eos_token_ids[0], 1);
		st_store_close(s);
	}
	snprintf(path, sizeof(path), "%s/manifest.json", out);
	m = json_load_file(path, 0, NULL);
	assert_non_null(m);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(
		json_object_get(m, "skipped"), 0), "count")), 1);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(
		json_object_get(m, "skipped"), 1), "count")), 0);
	json_decref(m);
	/* V4-only and unknown tensors: refused by name */
	make_model("m_ape", "layers.3.attn.ape", 1, dir, sizeof(dir));
	assert_int_equal(es_convert_check(dir, NULL, &d), -ST_E_FORMAT);
	assert_non_null(strstr(d.msg, "layers.3.attn.ape"));
	assert_non_null(strstr(d.msg, "DeepSeek-V4"));
	make_model("m_odd", "lm_extra.bias", 1, dir, sizeof(dir));
	assert_int_equal(es_convert_check(dir, NULL, &d), -ST_E_FORMAT);
	assert_non_null(strstr(d.msg, "lm_extra.bias"));
	make_model("m_layer", "layers.10.attn_norm.weight", 1, dir, sizeof(dir));
	assert_int_equal(es_convert_check(dir, NULL, &d), -ST_E_FORMAT);
	assert_non_null(strstr(d.msg, "layers.10.attn_norm.weight"));
	/* no engram_hash.json */
	make_model("m_nohash", NULL, 0, dir, sizeof(dir));
	assert_int_equal(es_convert_check(dir, NULL, &d), -ST_E_NOTFOUND);
	assert_non_null(strstr(d.msg, "engram_hash.json"));
}

/* make_model(name) with text_config key `key` set to the JSON `value`
 * (parsed here) in its config.json. */
static void make_model_key(const char *name, const char *key,
			   const char *value, char *ret, size_t len)
{
	char src[4300], dst[4300];
	json_t *c, *v;

	make_model(name, NULL, 1, ret, len);
	snprintf(src, sizeof(src), "%s/config.json", g_model);
	snprintf(dst, sizeof(dst), "%s/config.json", ret);
	c = json_load_file(src, 0, NULL);
	v = json_loads(value, JSON_DECODE_ANY, NULL);
	assert_non_null(c);
	assert_non_null(v);
	json_object_set_new(json_object_get(c, "text_config"), key, v);
	assert_int_equal(unlink(dst), 0);
	assert_int_equal(json_dump_file(c, dst, JSON_INDENT(1)), 0);
	json_decref(c);
}

/* One V4.1 config reader (st_config_dsv41) for the store writer, the
 * store reader and the forward pass: the opened store carries the whole
 * text configuration, equal to the fixture's config.json read here with
 * jansson (keys the old store-only reader never read: gate_temp,
 * candidate source, compress ratios, KV sources, compressed Engram
 * vocabulary); convert refuses what the forward pass would refuse (an
 * unknown text_config key, named) and what only a store needs (Engram
 * row width not a multiple of 32, Engram layers out of order). */
static void test_one_config_reader(void **state)
{
	struct st_store *s = NULL;
	struct st_diag d = { { 0 } };
	char path[4300], dir[4300];
	json_t *c, *t;

	(void)state;
	snprintf(path, sizeof(path), "%s/config.json", g_model);
	c = json_load_file(path, 0, NULL);
	assert_non_null(c);
	t = json_object_get(c, "text_config");
	if (st_store_open(g_store, &s, &d))
		fail_msg("%s", d.msg);
	assert_true(s->is_dsv41);
	assert_true(s->dsv41.gate_temp ==
		    json_number_value(json_object_get(t, "gate_temp")));
	assert_true(s->dsv41.gate_temp != 1.0); /* the fixture's 0.8 */
	assert_int_equal(s->dsv41.candidate_source,
			 json_integer_value(json_object_get(
				 t, "candidate_source_layer_id")));
	assert_int_equal(s->dsv41.n_layers, 10);
	for (int l = 0; l < 10; l++)
		assert_int_equal(s->dsv41.compress_ratio[l],
				 json_integer_value(json_array_get(
					 json_object_get(t, "compress_ratios"),
					 (size_t)l)));
	assert_int_equal(s->dsv41.kv_source[2] + s->dsv41.kv_source[4] +
			 s->dsv41.kv_source[6], 3);
	assert_int_equal(s->dsv41.kv_source[8], 0);
	assert_int_equal(s->dsv41.index_source[8], 1);
	assert_int_equal(s->dsv41.engram_compressed_vocab,
			 json_integer_value(json_object_get(
				 t, "engram_compressed_vocab_size")));
	assert_int_equal(s->dsv41.engram_head_dim, 64);
	assert_int_equal(s->dsv41.engram_n_heads, 2);
	assert_int_equal(s->dsv41.fp8_block[0], 32);
	assert_int_equal(st_dsv41_engram_index(&s->dsv41, 4), 1);
	assert_int_equal(st_dsv41_engram_index(&s->dsv41, 2), -1);
	/* the expert geometry derived from it */
	assert_int_equal(s->cfg.expert_inter, 64);
	assert_int_equal(s->cfg.top_k, 3);
	assert_int_equal(s->cfg.max_position_embeddings, 65536);
	assert_string_equal(s->cfg.model_type, "deepseek_v41");
	st_store_close(s);
	json_decref(c);

	make_model_key("m_unknown", "frobnicate_ratio", "3", dir, sizeof(dir));
	assert_int_equal(es_convert_check(dir, NULL, &d), -ST_E_CONFIG);
	assert_non_null(strstr(d.msg, "frobnicate_ratio"));
	make_model_key("m_edim", "engram_head_dim", "48", dir, sizeof(dir));
	assert_int_equal(es_convert_check(dir, NULL, &d), -ST_E_CONFIG);
	assert_non_null(strstr(d.msg, "engram_head_dim 48"));
	make_model_key("m_eorder", "engram_layer_ids", "[4, 1]", dir,
		       sizeof(dir));
	assert_int_equal(es_convert_check(dir, NULL, &d), -ST_E_CONFIG);
	assert_non_null(strstr(d.msg, "increasing"));
}

int main(int argc, char **argv)
{
	const struct CMUnitTest v4[] = {
		cmocka_unit_test(test_open_and_geometry_v4),
		cmocka_unit_test(test_expert_records),
		cmocka_unit_test(test_dense_bytes),
		cmocka_unit_test(test_repeat_identical),
		cmocka_unit_test(test_refused_options),
		cmocka_unit_test(test_corrupt_record),
		cmocka_unit_test(test_reader_checks),
	};
	const struct CMUnitTest v41[] = {
		cmocka_unit_test(test_open_and_geometry_v41),
		cmocka_unit_test(test_engram_rows),
		cmocka_unit_test(test_dense_and_experts),
		cmocka_unit_test(test_hash_file),
		cmocka_unit_test(test_repeat_identical),
		cmocka_unit_test(test_corrupt_engram),
		cmocka_unit_test(test_edited_checkpoints),
		cmocka_unit_test(test_one_config_reader),
	};

	if (argc != 2 || (strcmp(argv[1], "v4") && strcmp(argv[1], "v41"))) {
		fprintf(stderr, "usage: %s v4|v41\n", argv[0]);
		return 1;
	}
	g_v41 = !strcmp(argv[1], "v41");
	if (g_v41)
		return cmocka_run_group_tests_name("test_store_dsv41", v41,
						   setup, teardown);
	return cmocka_run_group_tests_name("test_store_dsv4", v4, setup,
					   teardown);
}

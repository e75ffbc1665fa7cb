/*
 * test_store_dsv4.c — `strata convert` of the DeepSeek-V4 fixture checked
 * against the checkpoint read with independent code (the safetensors
 * header parsed here with jansson): every expert record holds the
 * checkpoint's E2M1 code bytes and E8M0 scale bytes at the offsets the
 * manifest names, zero elsewhere; every non-MTP dense tensor (FP8 E4M3
 * weights, E8M0 scales, BF16, F32, I64 tid2eid) byte-equal in dense.bin;
 * no mtp.* tensor; st_store_open / st_store_verify accept the store; a
 * second convert is byte-identical; options that would change the
 * formats are refused; a flipped byte fails verify.
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

#include "es_convert.h"
#include "st_store.h"
#include "st_util.h"
#include "test_util.h"

static char g_model[4096], g_tmp[4096], g_store[4200];

/* The checkpoint, read here: whole file plus its parsed header. */
struct ck {
	char *buf;
	size_t len;
	json_t *hdr;
	size_t data0;
};

static void ck_open(struct ck *k)
{
	char path[4200];
	uint64_t n;

	snprintf(path, sizeof(path), "%s/model.safetensors", g_model);
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

static int setup(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };

	(void)state;
	st_test_fixture_model("tiny-deepseek-v4", g_model, sizeof(g_model));
	st_test_tmpdir(g_tmp, sizeof(g_tmp));
	snprintf(g_store, sizeof(g_store), "%s/store", g_tmp);
	es_convert_opts_init(&o);
	if (es_convert(g_model, g_store, &o, &d)) {
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

static void test_open_and_geometry(void **state)
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
	assert_int_equal(s->n_layers, json_integer_value(json_object_get(
					      cfg, "num_hidden_layers")));
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
	ck_open(&k);
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
				char nm[128];
				size_t wl, sl;

				snprintf(nm, sizeof(nm), "layers.%d.ffn.experts."
					 "%d.%s.weight", l, e, wn[m]);
				w = ck_tensor(&k, nm, &dt, &wl);
				assert_non_null(w);
				assert_string_equal(dt, "I8");
				snprintf(nm, sizeof(nm), "layers.%d.ffn.experts."
					 "%d.%s.scale", l, e, wn[m]);
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

/* Every checkpoint tensor that is neither a routed expert nor MTP is in
 * dense.bin with its own dtype and bytes; nothing else is. */
static void test_dense_bytes(void **state)
{
	struct st_store *s = NULL;
	struct st_diag d = { { 0 } };
	struct ck k;
	const char *key;
	json_t *v;
	char path[4300], *dense;
	size_t dlen, n_dense = 0, seen_fp8 = 0, seen_i64 = 0, seen_e8m0 = 0;

	(void)state;
	ck_open(&k);
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
		if (!strncmp(key, "mtp.", 4) || strstr(key, ".experts.")) {
			assert_null(t);
			continue;
		}
		assert_non_null(t);
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
	free(dense);
	st_store_close(s);
	ck_close(&k);
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
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	char again[4200];

	(void)state;
	snprintf(again, sizeof(again), "%s/again", g_tmp);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert(g_model, again, &o, &d), 0);
	assert_int_equal(st_store_open(g_store, &s, &d), 0);
	cmp_file(g_store, again, ST_STORE_MANIFEST);
	cmp_file(g_store, again, ST_STORE_DENSE_FILE);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open_and_geometry),
		cmocka_unit_test(test_expert_records),
		cmocka_unit_test(test_dense_bytes),
		cmocka_unit_test(test_repeat_identical),
		cmocka_unit_test(test_refused_options),
		cmocka_unit_test(test_corrupt_record),
		cmocka_unit_test(test_reader_checks),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

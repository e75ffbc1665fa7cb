/*
 * test_safetensors.c — the safetensors reader on files written by this test:
 * every kind of malformed header gives the right code and a message naming
 * the file, the tensor and the problem; a valid file reads back exactly;
 * a sharded copy of tiny-mixtral (split by this test's own writer) reads
 * back byte-identical to the single file; index inconsistencies are named.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "st_error.h"
#include "st_formats.h"
#include "st_safetensors.h"
#include "st_util.h"
#include "test_util.h"

static char tmp_root[256];
static int case_no;

/* A fresh directory under the test's temporary root. */
static const char *new_dir(char *buf, size_t len)
{
	snprintf(buf, len, "%s/c%d", tmp_root, case_no++);
	assert_int_equal(st_mkdir_p(buf, 0700), 0);
	return buf;
}

/* Writes u64 header length `hlen`, then `hdr`, then `data`. */
static void write_raw(const char *path, uint64_t hlen, const char *hdr,
		      const void *data, size_t dlen)
{
	size_t n = strlen(hdr);
	uint8_t *buf = malloc(8 + n + dlen + 1);

	assert_non_null(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)(hlen >> (8 * i));
	memcpy(buf + 8, hdr, n);
	if (dlen)
		memcpy(buf + 8 + n, data, dlen);
	assert_int_equal(st_write_file(path, buf, 8 + n + dlen), 0);
	free(buf);
}

/* One single-file checkpoint in a new directory; returns the dir. */
static const char *write_single(char *dir, size_t len, const char *hdr,
				const void *data, size_t dlen)
{
	char path[1024];

	new_dir(dir, len);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	write_raw(path, strlen(hdr), hdr, data, dlen);
	return dir;
}

/* Opening `dir` fails with `code` and a message holding every string. */
static void expect_error(const char *dir, int code, const char *s1,
			 const char *s2, const char *s3)
{
	struct st_checkpoint *ck = NULL;
	struct st_diag diag = { { 0 } };
	int r = st_checkpoint_open(dir, &ck, &diag);

	if (r != code)
		fprintf(stderr, "%s: got %d (%s), want %d\n", dir, r,
			diag.msg, code);
	assert_int_equal(r, code);
	assert_null(ck);
	const char *want[3] = { s1, s2, s3 };
	for (int i = 0; i < 3; i++) {
		if (!want[i])
			continue;
		if (!strstr(diag.msg, want[i]))
			fprintf(stderr, "message \"%s\" lacks \"%s\"\n",
				diag.msg, want[i]);
		assert_non_null(strstr(diag.msg, want[i]));
	}
}

static const uint8_t zeros[64];

static void test_truncated(void **state)
{
	char dir[512], path[1024];

	/* header length beyond the end of the file */
	new_dir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	write_raw(path, 4096, "{}", NULL, 0);
	expect_error(dir, -ST_E_FORMAT, "model.safetensors",
		     "header length 4096 beyond the end", NULL);
	/* shorter than the length field */
	new_dir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(st_write_file(path, "abc", 3), 0);
	expect_error(dir, -ST_E_FORMAT, "model.safetensors", NULL, NULL);
	assert_int_equal(st_safetensors_parse("abc", 3, "x.safetensors", 0,
					      NULL, NULL), -ST_E_FORMAT);
	/* tensor data beyond the end (file cut short) */
	write_single(dir, sizeof(dir),
		     "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
		     zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "model.safetensors", "tensor w",
		     "beyond the end of the data");
}

static void test_bad_offsets(void **state)
{
	char dir[512];

	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}",
		     zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "tensor a", "end before begin", NULL);
	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
		     zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "tensor a", "non-negative", NULL);
	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
		     zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "tensor a", "data_offsets", NULL);
	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}",
		     zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "tensor a", "data_offsets", NULL);
	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,9223372036854775807]}}",
		     zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "tensor a", "beyond the end", NULL);
	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "tensor a", "data_offsets", NULL);
}

static void test_size_mismatch(void **state)
{
	char dir[512];

	/* F32 [2, 2] needs 16 bytes, the offsets hold 12 */
	write_single(dir, sizeof(dir),
		     "{\"m\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}",
		     zeros, 16);
	expect_error(dir, -ST_E_FORMAT, "tensor m", "hold 12 bytes",
		     "need 16");
	/* BF16 [3] needs 6, holds 8 */
	write_single(dir, sizeof(dir),
		     "{\"m\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,8]}}",
		     zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "tensor m", "need 6", NULL);
	/* shape not a list, negative dim, too many dims, overflow */
	write_single(dir, sizeof(dir),
		     "{\"m\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}",
		     zeros, 16);
	expect_error(dir, -ST_E_FORMAT, "tensor m", "shape", NULL);
	write_single(dir, sizeof(dir),
		     "{\"m\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}",
		     zeros, 16);
	expect_error(dir, -ST_E_FORMAT, "tensor m", "shape[0]", NULL);
	write_single(dir, sizeof(dir),
		     "{\"m\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
		     zeros, 1);
	expect_error(dir, -ST_E_FORMAT, "tensor m", "dimensions", NULL);
	write_single(dir, sizeof(dir),
		     "{\"m\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}",
		     zeros, 16);
	expect_error(dir, -ST_E_FORMAT, "tensor m", "overflow", NULL);
}

static void test_overlap(void **state)
{
	char dir[512];

	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		     zeros, 12);
	expect_error(dir, -ST_E_FORMAT, "tensor b overlaps tensor a", NULL,
		     NULL);
	/* a small tensor inside a large one, listed first */
	write_single(dir, sizeof(dir),
		     "{\"s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9,10]},"
		     "\"big\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
		     "\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[16,20]}}",
		     zeros, 20);
	expect_error(dir, -ST_E_FORMAT, "tensor s overlaps tensor big", NULL,
		     NULL);
	/* same begin */
	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		     "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
		     zeros, 4);
	expect_error(dir, -ST_E_FORMAT, "overlaps", NULL, NULL);
}

static void test_bad_json(void **state)
{
	char dir[512];

	write_single(dir, sizeof(dir), "{\"a\": {\"dtype\": ", zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "model.safetensors", "not valid JSON",
		     NULL);
	write_single(dir, sizeof(dir), "[1, 2]", zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "not a JSON object", NULL, NULL);
	write_single(dir, sizeof(dir),
		     "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		     "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
		     zeros, 2);
	expect_error(dir, -ST_E_FORMAT, "not valid JSON", NULL, NULL);
	write_single(dir, sizeof(dir), "{\"a\": 5}", zeros, 8);
	expect_error(dir, -ST_E_FORMAT, "tensor a", "not a JSON object", NULL);
	write_single(dir, sizeof(dir),
		     "{\"__metadata__\": [1], \"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
		     zeros, 1);
	expect_error(dir, -ST_E_FORMAT, "__metadata__", NULL, NULL);
}

static void test_bad_dtype(void **state)
{
	char dir[512];

	write_single(dir, sizeof(dir),
		     "{\"q\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,2]}}",
		     zeros, 2);
	expect_error(dir, -ST_E_UNSUPPORTED, "tensor q", "Q4_K", NULL);
	/* strata's packed type is not a safetensors dtype */
	write_single(dir, sizeof(dir),
		     "{\"q\":{\"dtype\":\"MXFP4\",\"shape\":[32],\"data_offsets\":[0,17]}}",
		     zeros, 17);
	expect_error(dir, -ST_E_UNSUPPORTED, "tensor q", "MXFP4", NULL);
	write_single(dir, sizeof(dir),
		     "{\"q\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,2]}}",
		     zeros, 2);
	expect_error(dir, -ST_E_FORMAT, "tensor q", "dtype", NULL);
}

static void test_missing_files(void **state)
{
	char dir[512];

	new_dir(dir, sizeof(dir));
	expect_error(dir, -ENOENT, dir, NULL, NULL);
}

static void test_valid_file(void **state)
{
	/* a: F32 [2,3]; b: BF16 [4]; c: U8 [3]; e: F32 [0] (empty);
	 * d: I64 []: a scalar; header padded with spaces as writers do */
	const float a[6] = { 1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-20f };
	const uint16_t b[4] = { 0x3f80, 0xc040, 0x0000, 0x7f80 };
	const uint8_t c[3] = { 7, 8, 9 };
	const int64_t d = -1234567890123ll;
	uint8_t data[24 + 8 + 3 + 5 + 8];
	char dir[512], hdr[1024];
	struct st_checkpoint *ck = NULL;
	struct st_diag diag = { { 0 } };
	const struct st_tensor_info *t;
	float out[6];

	memset(data, 0xee, sizeof(data));
	memcpy(data, a, 24);
	memcpy(data + 24, b, 8);
	memcpy(data + 32, c, 3);
	memcpy(data + 40, &d, 8); /* 5 bytes of gap before it: allowed */
	snprintf(hdr, sizeof(hdr), "%-384s",
		 "{\"__metadata__\":{\"format\":\"pt\"},"
		 "\"c\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[32,35]},"
		 "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
		 "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
		 "\"d\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[40,48]},"
		 "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}");
	assert_int_equal(strlen(hdr), 384);
	write_single(dir, sizeof(dir), hdr, data, sizeof(data));
	assert_int_equal(st_checkpoint_open(dir, &ck, &diag), 0);
	assert_int_equal(ck->n_files, 1);
	assert_int_equal(ck->n_tensors, 5);
	for (int i = 0; i < 5; i++) /* sorted by name, metadata skipped */
		assert_int_equal(ck->tensors[i].name[0], "abcde"[i]);

	t = st_checkpoint_find(ck, "a");
	assert_non_null(t);
	assert_int_equal(t->dtype, ST_DTYPE_F32);
	assert_int_equal(t->n_dims, 2);
	assert_int_equal(t->shape[0], 2);
	assert_int_equal(t->shape[1], 3);
	assert_int_equal(t->n_elems, 6);
	assert_int_equal(t->n_bytes, 24);
	assert_int_equal(t->file_offset, 8 + 384);
	assert_int_equal(st_convert_to_f32(t->dtype, st_checkpoint_data(ck, t),
					   6, out), 0);
	assert_memory_equal(out, a, sizeof(a));

	t = st_checkpoint_find(ck, "b");
	assert_non_null(t);
	assert_int_equal(t->dtype, ST_DTYPE_BF16);
	assert_int_equal(st_convert_to_f32(t->dtype, st_checkpoint_data(ck, t),
					   4, out), 0);
	assert_true(out[0] == 1.0f && out[1] == -3.0f && out[2] == 0.0f);
	assert_true(isinf(out[3]) && out[3] > 0);

	t = st_checkpoint_find(ck, "c");
	assert_non_null(t);
	assert_int_equal(t->dtype, ST_DTYPE_U8);
	assert_memory_equal(st_checkpoint_data(ck, t), c, 3);

	t = st_checkpoint_find(ck, "d");
	assert_non_null(t);
	assert_int_equal(t->n_dims, 0);
	assert_int_equal(t->n_elems, 1);
	assert_memory_equal(st_checkpoint_data(ck, t), &d, 8);

	t = st_checkpoint_find(ck, "e");
	assert_non_null(t);
	assert_int_equal(t->n_elems, 0);
	assert_int_equal(t->n_bytes, 0);

	assert_null(st_checkpoint_find(ck, "f"));
	assert_null(st_checkpoint_find(ck, ""));
	assert_null(st_checkpoint_find(ck, "__metadata__"));
	st_checkpoint_close(ck);
	st_checkpoint_close(NULL);

	/* the same image through st_safetensors_parse directly */
	uint8_t *img = malloc(8 + 384 + sizeof(data));
	struct st_tensor_info *ti = NULL;

	assert_non_null(img);
	for (int i = 0; i < 8; i++)
		img[i] = (uint8_t)((uint64_t)384 >> (8 * i));
	memcpy(img + 8, hdr, 384);
	memcpy(img + 8 + 384, data, sizeof(data));
	assert_int_equal(st_safetensors_parse(img, 8 + 384 + sizeof(data),
					      "mem", 3, &ti, &diag), 5);
	assert_string_equal(ti[0].name, "a");
	assert_int_equal(ti[0].file_index, 3);
	st_tensor_infos_free(ti, 5);
	/* every truncation of the image is refused, none crashes */
	for (uint64_t len = 0; len < 8 + 384 + 48; len++)
		assert_true(st_safetensors_parse(img, len, "mem", 0, NULL,
						 NULL) < 0);
	/* random byte flips in the length field and header: parsed or
	 * refused, never a crash (run under ASan to see more) */
	uint64_t rng = 12345;
	uint8_t *mut = malloc(8 + 384 + sizeof(data));

	assert_non_null(mut);
	for (int k = 0; k < 20000; k++) {
		memcpy(mut, img, 8 + 384 + sizeof(data));
		for (int f = 0; f < 1 + k % 4; f++) {
			rng = rng * 6364136223846793005ull + 1442695040888963407ull;
			mut[(rng >> 33) % (8 + 384)] = (uint8_t)(rng >> 20);
		}
		int n = st_safetensors_parse(mut, 8 + 384 + sizeof(data),
					     "mut", 0, &ti, NULL);
		if (n >= 0)
			st_tensor_infos_free(ti, n);
	}
	free(mut);
	free(img);
}

/* --- a small safetensors writer for the sharded test --- */

struct wtensor {
	const struct st_tensor_info *t;
	const void *data;
};

static void write_shard(const char *path, const struct wtensor *w, int n)
{
	json_t *hdr = json_object();
	uint64_t off = 0;
	char *text;
	size_t tlen, plen;
	FILE *f;

	json_object_set_new(hdr, "__metadata__",
			    json_pack("{s:s}", "format", "pt"));
	for (int i = 0; i < n; i++) {
		const struct st_tensor_info *t = w[i].t;
		json_t *shape = json_array();

		for (int d = 0; d < t->n_dims; d++)
			json_array_append_new(shape,
					      json_integer(t->shape[d]));
		json_object_set_new(hdr, t->name,
				    json_pack("{s:s,s:o,s:[I,I]}", "dtype",
					      st_dtype_traits(t->dtype)->name,
					      "shape", shape,
					      "data_offsets", (json_int_t)off,
					      (json_int_t)(off + t->n_bytes)));
		off += t->n_bytes;
	}
	text = json_dumps(hdr, JSON_COMPACT);
	assert_non_null(text);
	json_decref(hdr);
	tlen = strlen(text);
	plen = ST_ALIGN_UP(tlen, 8);
	f = fopen(path, "wb");
	assert_non_null(f);
	for (int i = 0; i < 8; i++)
		fputc((int)((uint64_t)plen >> (8 * i)) & 0xff, f);
	fwrite(text, 1, tlen, f);
	for (size_t i = tlen; i < plen; i++)
		fputc(' ', f);
	for (int i = 0; i < n; i++)
		fwrite(w[i].data, 1, w[i].t->n_bytes, f);
	assert_int_equal(fclose(f), 0);
	free(text);
}

static const char *shard_name(int s)
{
	static const char *const names[3] = {
		"model-00001-of-00003.safetensors",
		"model-00002-of-00003.safetensors",
		"model-00003-of-00003.safetensors",
	};
	return names[s];
}

/* Splits `ck` into 3 shards in dir (tensor i goes to shard i % 3) and
 * writes an index from `map` (which the caller may then alter). */
static void write_shards(const struct st_checkpoint *ck, const char *dir)
{
	struct wtensor *w[3];
	int n[3] = { 0 };
	char path[1024];

	for (int s = 0; s < 3; s++) {
		w[s] = calloc((size_t)ck->n_tensors, sizeof(**w));
		assert_non_null(w[s]);
	}
	/* reverse order inside each shard, so offsets differ from the
	 * original file */
	for (int i = ck->n_tensors - 1; i >= 0; i--) {
		int s = i % 3;

		w[s][n[s]].t = &ck->tensors[i];
		w[s][n[s]].data = st_checkpoint_data(ck, &ck->tensors[i]);
		n[s]++;
	}
	for (int s = 0; s < 3; s++) {
		snprintf(path, sizeof(path), "%s/%s", dir, shard_name(s));
		write_shard(path, w[s], n[s]);
		free(w[s]);
	}
}

static json_t *index_of(const struct st_checkpoint *ck)
{
	json_t *map = json_object();

	for (int i = 0; i < ck->n_tensors; i++)
		json_object_set_new(map, ck->tensors[i].name,
				    json_string(shard_name(i % 3)));
	return json_pack("{s:{s:I},s:o}", "metadata", "total_size",
			 (json_int_t)12345, "weight_map", map);
}

static void write_index(const char *dir, json_t *index)
{
	char path[1024];

	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	assert_int_equal(json_dump_file(index, path, JSON_INDENT(2)), 0);
}

static void test_sharded(void **state)
{
	char fixture[1024], dir[512];
	struct st_checkpoint *one = NULL, *many = NULL;
	struct st_diag diag = { { 0 } };
	json_t *index, *map;

	/* skip this case alone when ../shared is absent (outside CI, where
	 * st_test_fixture_model fails instead) */
	const char *sh = getenv("STRATA_SHARED_DIR"), *ci = getenv("CI");
	snprintf(fixture, sizeof(fixture), "%s/fixtures/models/tiny-mixtral",
		 sh && *sh ? sh : "../shared");
	if (!st_path_exists(fixture) &&
	    !(ci && *ci && strcmp(ci, "0") && strcmp(ci, "false")))
		skip();
	st_test_fixture_model("tiny-mixtral", fixture, sizeof(fixture));
	assert_int_equal(st_checkpoint_open(fixture, &one, &diag), 0);
	assert_true(one->n_tensors > 3);

	new_dir(dir, sizeof(dir));
	write_shards(one, dir);
	index = index_of(one);
	write_index(dir, index);
	if (st_checkpoint_open(dir, &many, &diag) != 0)
		fail_msg("%s", diag.msg);
	assert_int_equal(many->n_files, 3);
	for (int s = 0; s < 3; s++)
		assert_string_equal(many->file_names[s], shard_name(s));
	assert_int_equal(many->n_tensors, one->n_tensors);
	for (int i = 0; i < one->n_tensors; i++) {
		const struct st_tensor_info *a = &one->tensors[i];
		const struct st_tensor_info *b = st_checkpoint_find(many,
								    a->name);

		assert_non_null(b);
		assert_string_equal(a->name, many->tensors[i].name);
		assert_int_equal(b->file_index, i % 3);
		assert_int_equal(a->dtype, b->dtype);
		assert_int_equal(a->n_dims, b->n_dims);
		assert_memory_equal(a->shape, b->shape,
				    sizeof(a->shape[0]) * (size_t)a->n_dims);
		assert_int_equal(a->n_bytes, b->n_bytes);
		assert_memory_equal(st_checkpoint_data(one, a),
				    st_checkpoint_data(many, b), a->n_bytes);
	}
	st_checkpoint_close(many);

	/* the index lists a tensor its shard does not hold */
	map = json_object_get(index, "weight_map");
	json_object_set_new(map, "model.layers.9.fake.weight",
			    json_string(shard_name(1)));
	write_index(dir, index);
	expect_error(dir, -ST_E_FORMAT, "model.layers.9.fake.weight",
		     shard_name(1), "missing");
	json_object_del(map, "model.layers.9.fake.weight");

	/* a tensor listed under the wrong shard */
	json_object_set_new(map, one->tensors[0].name,
			    json_string(shard_name(2)));
	write_index(dir, index);
	expect_error(dir, -ST_E_FORMAT, one->tensors[0].name, "instead",
		     NULL);
	json_object_set_new(map, one->tensors[0].name,
			    json_string(shard_name(0)));

	/* a tensor present in a shard but not in the index (our choice:
	 * an error, the shards do not match the index) */
	json_object_del(map, one->tensors[4].name);
	write_index(dir, index);
	expect_error(dir, -ST_E_FORMAT, one->tensors[4].name,
		     "not listed in the index", NULL);
	json_object_set_new(map, one->tensors[4].name,
			    json_string(shard_name(1)));

	/* a shard name that leaves the directory */
	json_object_set_new(map, one->tensors[0].name,
			    json_string("../model.safetensors"));
	write_index(dir, index);
	expect_error(dir, -ST_E_FORMAT, one->tensors[0].name,
		     "plain file name", NULL);
	json_object_set_new(map, one->tensors[0].name,
			    json_string(shard_name(0)));

	/* a shard file missing from the directory */
	json_object_set_new(map, one->tensors[0].name,
			    json_string("model-00004-of-00003.safetensors"));
	write_index(dir, index);
	expect_error(dir, -ENOENT, "model-00004-of-00003.safetensors", NULL,
		     NULL);
	json_object_set_new(map, one->tensors[0].name,
			    json_string(shard_name(0)));

	/* the index as it was opens again */
	write_index(dir, index);
	assert_int_equal(st_checkpoint_open(dir, &many, &diag), 0);
	st_checkpoint_close(many);

	/* a bad index */
	json_object_del(index, "weight_map");
	write_index(dir, index);
	expect_error(dir, -ST_E_FORMAT, "weight_map", NULL, NULL);
	json_decref(index);
	st_checkpoint_close(one);
}

static void test_duplicate_across_shards(void **state)
{
	char dir[512], path[1024];
	const char *hdr =
		"{\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}";

	new_dir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/a.safetensors", dir);
	write_raw(path, strlen(hdr), hdr, zeros, 2);
	snprintf(path, sizeof(path), "%s/b.safetensors", dir);
	write_raw(path, strlen(hdr), hdr, zeros, 2);
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
	const char *idx = "{\"weight_map\":{\"x\":\"a.safetensors\",\"y\":\"b.safetensors\"}}";
	assert_int_equal(st_write_file(path, idx, strlen(idx)), 0);
	expect_error(dir, -ST_E_FORMAT, "tensor x is in both", "a.safetensors",
		     "b.safetensors");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_bad_offsets),
		cmocka_unit_test(test_size_mismatch),
		cmocka_unit_test(test_overlap),
		cmocka_unit_test(test_bad_json),
		cmocka_unit_test(test_bad_dtype),
		cmocka_unit_test(test_missing_files),
		cmocka_unit_test(test_valid_file),
		cmocka_unit_test(test_sharded),
		cmocka_unit_test(test_duplicate_across_shards),
	};
	int r;

	st_test_tmpdir(tmp_root, sizeof(tmp_root));
	r = cmocka_run_group_tests(tests, NULL, NULL);
	st_rm_rf(tmp_root);
	return r;
}

/*
 * test_store_convert.c — `strata convert` output checked against the
 * checkpoint with independent code: geometry and record sizes computed
 * here from config.json, every record checksum, MXFP4 codes and scales
 * against a reference quantizer written from the OCP MX spec
 * (store_testlib.c), BF16 records and dense tensors byte-equal to the
 * checkpoint, F32 equal to the exact widening, deterministic output, and
 * the progress callback.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <xxhash.h>

#include "es_convert.h"
#include "st_store.h"
#include "st_util.h"
#include "store_testlib.h"
#include "test_util.h"

static char g_mixtral[4096], g_qwen[4096];

/* What the test reads from config.json itself. */
struct geom {
	int qwen;       /* 0: mixtral naming, 1: qwen3_moe naming */
	int n_layers, n_experts, hidden, inter;
};

static void read_geom(const char *model, struct geom *g)
{
	char path[4096];
	json_t *root, *v;

	snprintf(path, sizeof(path), "%s/config.json", model);
	root = json_load_file(path, 0, NULL);
	assert_non_null(root);
	g->qwen = !strcmp(json_string_value(json_object_get(root, "model_type")),
			  "qwen3_moe");
	g->n_layers = (int)json_integer_value(json_object_get(root,
						"num_hidden_layers"));
	g->hidden = (int)json_integer_value(json_object_get(root, "hidden_size"));
	v = json_object_get(root, g->qwen ? "num_experts" : "num_local_experts");
	g->n_experts = (int)json_integer_value(v);
	v = json_object_get(root, g->qwen ? "moe_intermediate_size" :
					    "intermediate_size");
	g->inter = (int)json_integer_value(v);
	json_decref(root);
	assert_true(g->n_layers > 0 && g->n_experts > 0 && g->hidden > 0 &&
		    g->inter > 0);
}

static void expert_name(const struct geom *g, int l, int e, int m, char *buf,
			size_t len)
{
	static const char *mix[3] = { "w1", "w3", "w2" };
	static const char *qw[3] = { "gate_proj", "up_proj", "down_proj" };

	if (g->qwen)
		snprintf(buf, len, "model.layers.%d.mlp.experts.%d.%s.weight", l,
			 e, qw[m]);
	else
		snprintf(buf, len, "model.layers.%d.block_sparse_moe.experts.%d."
			 "%s.weight", l, e, mix[m]);
}

/* Independent layout: gate/up [I, H], down [H, I]; sections 64-aligned,
 * record 4096-aligned (st_store.h).  Formats are named by their spelling
 * here ("mxfp4", "e2m1-g128", ...) and sized from their definitions. */
struct lay {
	char fmt[32];
	int group;        /* elements per scale (0: none) */
	int64_t rows[3], cols[3];
	uint64_t data_off[3], data_bytes[3], scale_off[3], scale_bytes[3];
	uint64_t tscale_off[3];
	uint64_t record_bytes, used;
};

static void layout(const struct geom *g, const char *fmt, struct lay *y)
{
	uint64_t cur = 0;
	int fp4 = 0, scale_size = 0, tscale = 0, elem2 = 0, elem4 = 0;

	memset(y, 0, sizeof(*y));
	snprintf(y->fmt, sizeof(y->fmt), "%s", fmt);
	if (!strcmp(fmt, "mxfp4")) {
		fp4 = 1; y->group = 32; scale_size = 1;
	} else if (!strcmp(fmt, "nvfp4")) {
		fp4 = 1; y->group = 16; scale_size = 1; tscale = 1;
	} else if (!strncmp(fmt, "e2m1-g", 6)) {
		fp4 = 1; y->group = atoi(fmt + 6); scale_size = 2;
	} else if (!strcmp(fmt, "fp8")) {
		y->group = 128; scale_size = 4;
	} else if (!strncmp(fmt, "fp8-b", 5)) {
		y->group = atoi(fmt + 5); scale_size = 4;
	} else if (!strcmp(fmt, "bf16")) {
		elem2 = 1;
	} else {
		assert_string_equal(fmt, "f32");
		elem4 = 1;
	}
	for (int m = 0; m < 3; m++) {
		uint64_t n;

		y->rows[m] = m == 2 ? g->hidden : g->inter;
		y->cols[m] = m == 2 ? g->inter : g->hidden;
		n = (uint64_t)y->rows[m] * (uint64_t)y->cols[m];
		y->data_off[m] = (cur + 63) / 64 * 64;
		y->data_bytes[m] = fp4 ? n / 2 : elem2 ? n * 2 : elem4 ? n * 4 : n;
		cur = y->data_off[m] + y->data_bytes[m];
		if (y->group) {
			uint64_t per_row = ((uint64_t)y->cols[m] + y->group - 1) /
					   y->group;

			y->scale_off[m] = (cur + 63) / 64 * 64;
			y->scale_bytes[m] = (uint64_t)y->rows[m] * per_row *
					    (uint64_t)scale_size;
			cur = y->scale_off[m] + y->scale_bytes[m];
		}
		if (tscale) {
			y->tscale_off[m] = (cur + 63) / 64 * 64;
			cur = y->tscale_off[m] + 4;
		}
	}
	y->used = cur;
	y->record_bytes = (cur + 4095) / 4096 * 4096;
}

struct prog {
	int n_calls, monotonic, first_zero;
	uint64_t last_done, total;
};

static void on_progress(uint64_t done, uint64_t total, void *arg)
{
	struct prog *p = arg;

	if (p->n_calls == 0) {
		p->first_zero = done == 0;
		p->total = total;
		p->monotonic = 1;
	}
	if (done < p->last_done || total != p->total || done > total)
		p->monotonic = 0;
	p->last_done = done;
	p->n_calls++;
}

static uint64_t file_size_or0(const char *dir, const char *name)
{
	char path[4096];
	size_t len;
	uint8_t *b;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (access(path, R_OK))
		return 0;
	b = tst_read(path, &len);
	free(b);
	return len;
}

/* Row r of a BF16 checkpoint matrix widened to float. */
static void src_row(const uint8_t *src, int64_t cols, int64_t r, float *x)
{
	for (int64_t i = 0; i < cols; i++) {
		uint16_t h;

		memcpy(&h, src + (r * cols + i) * 2, 2);
		x[i] = tst_bf16(h);
	}
}

/* Compares one record with the checkpoint through the reference
 * quantizers of store_testlib.c; returns the number of MXFP4 ties met (to
 * show the rounding rule was exercised). */
static int check_record(const struct geom *g, const struct lay *y,
			const struct tst_sft *ck, int l, int e,
			const uint8_t *rec)
{
	int n_ties = 0;

	for (int m = 0; m < 3; m++) {
		const struct tst_tensor *t;
		const uint8_t *src;
		const uint8_t *data = rec + y->data_off[m], *sc = rec + y->scale_off[m];
		char name[256];
		int64_t rows = y->rows[m], cols = y->cols[m];
		int64_t ng = y->group ? (cols + y->group - 1) / y->group : 0;
		float x[512], global = 1.0f;

		expert_name(g, l, e, m, name, sizeof(name));
		t = tst_sft_find(ck, name);
		assert_non_null(t);
		assert_string_equal(t->dtype, "BF16");
		assert_int_equal(t->end - t->begin, (uint64_t)(rows * cols * 2));
		assert_true(cols <= 512);
		src = tst_sft_data(ck, t);
		if (!strcmp(y->fmt, "bf16")) {
			assert_memory_equal(data, src, y->data_bytes[m]);
			continue;
		}
		if (!strcmp(y->fmt, "nvfp4")) {
			/* tensor scale: largest |w| of the matrix / (6 * 448) */
			float amax = 0.0f, want;

			for (int64_t r = 0; r < rows; r++) {
				src_row(src, cols, r, x);
				for (int64_t i = 0; i < cols; i++)
					amax = fmaxf(amax, fabsf(x[i]));
			}
			want = amax / 2688.0f;
			memcpy(&global, rec + y->tscale_off[m], 4);
			if (global != want)
				fail_msg("%s: tensor scale %g, want %g", name,
					 global, want);
		}
		for (int64_t r = 0; r < rows; r++) {
			src_row(src, cols, r, x);
			if (!strcmp(y->fmt, "f32")) {
				assert_memory_equal(data + r * cols * 4, x,
						    (size_t)cols * 4);
				continue;
			}
			for (int64_t b = 0; b < ng; b++) {
				int64_t c0 = b * y->group;
				int bn = (int)ST_MIN((int64_t)y->group, cols - c0);
				uint8_t codes[512], want_c[512], s8 = 0;
				int ok = 1;

				if (!strcmp(y->fmt, "mxfp4")) {
					tst_ref_mxfp4_block(x + c0, &s8, codes, &n_ties);
					/* version 3: rows interleaved by 16,
					 * 4-byte words (st_mxfp4il.h) */
					ok = sc[st_mxfp4il_scale_offset(rows, cols,
									r, b)] == s8;
					for (int j = 0; j < 4; j++)
						ok &= !memcmp(data + st_mxfp4il_word_offset(
								      rows, cols, r, b, j),
							      codes + 4 * j, 4);
				} else if (!strcmp(y->fmt, "nvfp4")) {
					tst_ref_nvfp4_block(x + c0, global, &s8, codes);
					ok = !memcmp(data + (r * cols + c0) / 2, codes, 8) &&
					     sc[r * ng + b] == s8;
				} else if (y->fmt[0] == 'e') {
					uint16_t s16, got16;

					tst_ref_e2m1f16_group(x + c0, bn, &s16, want_c);
					memcpy(&got16, sc + (r * ng + b) * 2, 2);
					ok = got16 == s16;
					for (int i = 0; i < bn; i++) {
						int64_t c = r * cols + c0 + i;

						ok &= ((data[c / 2] >> (4 * (c & 1))) & 15) ==
						      want_c[i];
					}
				} else { /* fp8 */
					float s32, got32;

					tst_ref_fp8_block(x + c0, bn, &s32, want_c);
					memcpy(&got32, sc + (r * ng + b) * 4, 4);
					ok = !memcmp(&got32, &s32, 4) &&
					     !memcmp(data + r * cols + c0, want_c,
						     (size_t)bn);
				}
				if (!ok)
					fail_msg("%s (%s) row %" PRId64 " group %"
						 PRId64 ": codes/scale differ from "
						 "the reference", name, y->fmt, r, b);
			}
		}
	}
	for (uint64_t i = y->used; i < y->record_bytes; i++)
		if (rec[i])
			fail_msg("record (%d, %d): padding byte %" PRIu64
				 " not zero", l, e, i);
	return n_ties;
}

static void check_dense(const struct st_store *s, const struct tst_sft *ck,
			int dense_f32)
{
	char path[4096];
	int n_nonexpert = 0;
	size_t len;
	uint8_t *dense;

	snprintf(path, sizeof(path), "%s/dense.bin", s->dir);
	dense = tst_read(path, &len);
	assert_int_equal(len, s->dense_bytes);
	assert_int_equal(len % 4096, 0);
	for (int i = 0; i < ck->n; i++) {
		const struct tst_tensor *t = &ck->t[i];
		const struct st_store_tensor *d;
		uint64_t n = (t->end - t->begin) / 2;
		const uint8_t *src = tst_sft_data(ck, t);

		if (strstr(t->name, ".experts."))
			continue;
		n_nonexpert++;
		d = st_store_find_dense(s, t->name);
		if (!d)
			fail_msg("dense tensor %s missing from the store", t->name);
		assert_int_equal(d->n_dims, t->n_dims);
		for (int k = 0; k < t->n_dims; k++)
			assert_int_equal(d->shape[k], t->shape[k]);
		assert_int_equal(d->offset % 4096, 0);
		assert_true(d->offset + d->n_bytes <= len);
		assert_int_equal(d->xxh3, XXH3_64bits(dense + d->offset,
						      d->n_bytes));
		if (!dense_f32) {
			assert_int_equal(d->dtype, ST_DTYPE_BF16);
			assert_int_equal(d->n_bytes, n * 2);
			assert_memory_equal(dense + d->offset, src, n * 2);
		} else {
			assert_int_equal(d->dtype, ST_DTYPE_F32);
			assert_int_equal(d->n_bytes, n * 4);
			for (uint64_t k = 0; k < n; k++) {
				uint16_t h;
				float f;

				memcpy(&h, src + 2 * k, 2);
				memcpy(&f, dense + d->offset + 4 * k, 4);
				if (f != tst_bf16(h) && !(f != f))
					fail_msg("%s[%" PRIu64 "]: %g, BF16 %g",
						 t->name, k, f, tst_bf16(h));
			}
		}
	}
	assert_int_equal(s->n_dense, n_nonexpert);
	free(dense);
}

static void check_copies(const char *model, const char *store)
{
	static const char *names[] = { "config.json", "generation_config.json",
				       "tokenizer.json", "tokenizer_config.json" };

	for (size_t i = 0; i < 4; i++) {
		char a[4400], b[4400];
		uint8_t *x, *y;
		size_t lx, ly;

		snprintf(a, sizeof(a), "%s/%s", model, names[i]);
		snprintf(b, sizeof(b), "%s/%s", store, names[i]);
		if (access(a, R_OK)) {
			assert_int_not_equal(access(b, F_OK), 0);
			continue;
		}
		x = tst_read(a, &lx);
		y = tst_read(b, &ly);
		assert_int_equal(lx, ly);
		assert_memory_equal(x, y, lx);
		free(x);
		free(y);
	}
}

/* Converts `model` with default format `fmt` and keep spec `keep` (NULL
 * for none); want[l] is the format layer l must have (the test's own
 * reading of the spec; NULL: fmt everywhere).  Checks everything. */
static void convert_and_check_keep(const char *model, const char *fmt,
				   const char *keep, const char *const *want,
				   int dense_f32)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	struct prog p = { 0 };
	struct tst_sft ck;
	struct geom g;
	struct lay y[16];
	char tmp[4096], out[4200], path[4400];
	uint8_t *rec;
	uint64_t want_total = 0, max_rec = 0;
	int r, n_ties = 0, n_mx = 0;

	read_geom(model, &g);
	assert_true(g.n_layers <= 16);
	for (int l = 0; l < g.n_layers; l++) {
		layout(&g, want ? want[l] : fmt, &y[l]);
		max_rec = ST_MAX(max_rec, y[l].record_bytes);
		n_mx += !strcmp(y[l].fmt, "mxfp4");
	}
	snprintf(path, sizeof(path), "%s/model.safetensors", model);
	tst_sft_load(path, &ck);
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(out, sizeof(out), "%s/store", tmp);

	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_experts(fmt, &o, &d), 0);
	if (keep)
		assert_true(es_convert_parse_keep(keep, &o, &d) > 0);
	o.dense_f32 = dense_f32;
	o.progress = on_progress;
	o.progress_arg = &p;
	r = es_convert(model, out, &o, &d);
	if (r)
		fail_msg("es_convert: %s (%s)", d.msg, st_strerror(r));
	assert_int_equal(tst_count_prefix(tmp, "store.tmp-"), 0);

	/* progress: (0, total) first, monotonic, (total, total) last, total =
	 * every checkpoint tensor byte plus the copied files */
	for (int i = 0; i < ck.n; i++)
		want_total += ck.t[i].end - ck.t[i].begin;
	want_total += file_size_or0(model, "config.json") +
		      file_size_or0(model, "generation_config.json") +
		      file_size_or0(model, "tokenizer.json") +
		      file_size_or0(model, "tokenizer_config.json");
	assert_true(p.n_calls > g.n_layers * g.n_experts);
	assert_true(p.first_zero);
	assert_true(p.monotonic);
	assert_int_equal(p.total, want_total);
	assert_int_equal(p.last_done, want_total);

	r = st_store_open(out, &s, &d);
	if (r)
		fail_msg("st_store_open: %s", d.msg);
	assert_int_equal(s->n_layers, g.n_layers);
	assert_int_equal(s->n_experts, g.n_experts);
	assert_int_equal(s->cfg.n_layers, g.n_layers);
	assert_int_equal(s->record_bytes, max_rec);
	assert_string_equal(s->policy_default, fmt);
	for (int l = 0; l < g.n_layers; l++) {
		const struct st_store_layer *ly = &s->layers[l];

		assert_int_equal(ly->record_bytes, y[l].record_bytes);
		assert_int_equal(ly->record_bytes % 4096, 0);
		for (int m = 0; m < 3; m++) {
			char name[ST_WFORMAT_NAME_MAX];

			assert_int_equal(st_wformat_name(&ly->mat[m].fmt, name,
							 sizeof(name)), 0);
			assert_string_equal(name, y[l].fmt);
			assert_int_equal(ly->mat[m].fmt.group, y[l].group);
			assert_int_equal(ly->mat[m].rows, y[l].rows[m]);
			assert_int_equal(ly->mat[m].cols, y[l].cols[m]);
			assert_int_equal(ly->mat[m].data_offset, y[l].data_off[m]);
			/* MXFP4 read back as interleaved, the rest row-major */
			assert_int_equal(ly->mat[m].il_rows,
					 strcmp(y[l].fmt, "mxfp4") ? 0 :
					 ST_MXFP4IL_ROWS);
			assert_int_equal(ly->mat[m].data_bytes, y[l].data_bytes[m]);
			assert_int_equal(ly->mat[m].scale_offset, y[l].scale_off[m]);
			assert_int_equal(ly->mat[m].scale_bytes, y[l].scale_bytes[m]);
			assert_int_equal(ly->mat[m].tscale_offset,
					 y[l].tscale_off[m]);
		}
	}

	rec = aligned_alloc(4096, max_rec);
	assert_non_null(rec);
	for (int l = 0; l < g.n_layers; l++) {
		const uint64_t rb = y[l].record_bytes;
		char name[64];
		size_t len;
		uint8_t *file;
		int fd;

		snprintf(name, sizeof(name), "experts-%03d.bin", l);
		assert_string_equal(s->expert_files[l], name);
		snprintf(path, sizeof(path), "%s/%s", out, name);
		file = tst_read(path, &len);
		assert_int_equal(len, (uint64_t)g.n_experts * rb);
		fd = open(path, O_RDONLY);
		assert_true(fd >= 0);
		for (int e = 0; e < g.n_experts; e++) {
			const uint8_t *x = file + (uint64_t)e * rb;

			assert_int_equal(XXH3_64bits(x, rb),
					 s->expert_xxh3[l * g.n_experts + e]);
			memset(rec, 0xa5, max_rec);
			r = st_store_read_record(s, fd, l, e, rec, &d);
			if (r)
				fail_msg("read_record(%d, %d): %s", l, e, d.msg);
			assert_memory_equal(rec, x, rb);
			/* a smaller layer's record is zero-padded to the slot */
			for (uint64_t i = rb; i < max_rec; i++)
				if (rec[i])
					fail_msg("read_record(%d, %d): byte %" PRIu64
						 " past the record not zeroed", l, e,
						 i);
			n_ties += check_record(&g, &y[l], &ck, l, e, rec);
		}
		close(fd);
		free(file);
	}
	if (n_mx) /* BF16 weights land on E2M1 midpoints */
		assert_true(n_ties > 0);
	free(rec);

	check_dense(s, &ck, dense_f32);
	check_copies(model, out);
	assert_int_equal(st_store_verify(out, NULL, NULL, &r, &d), 0);
	assert_int_equal(r, 0);
	st_store_close(s);
	tst_sft_free(&ck);
	st_rm_rf(tmp);
}

static void convert_and_check(const char *model, const char *fmt,
			      int dense_f32)
{
	convert_and_check_keep(model, fmt, NULL, NULL, dense_f32);
}

static void mixtral_mxfp4(void **state) { convert_and_check(g_mixtral, "mxfp4", 0); }
static void qwen_mxfp4(void **state) { convert_and_check(g_qwen, "mxfp4", 0); }
static void mixtral_bf16(void **state) { convert_and_check(g_mixtral, "bf16", 0); }
static void qwen_bf16(void **state) { convert_and_check(g_qwen, "bf16", 0); }
static void mixtral_f32_dense_f32(void **state) { convert_and_check(g_mixtral, "f32", 1); }
static void mixtral_nvfp4(void **state) { convert_and_check(g_mixtral, "nvfp4", 0); }
static void qwen_nvfp4(void **state) { convert_and_check(g_qwen, "nvfp4", 0); }
/* qwen's 96-wide down rows: one short group of 96 with g128, 3 of 32 */
static void qwen_e2m1(void **state)
{
	convert_and_check(g_qwen, "e2m1-g32", 0);
	convert_and_check(g_qwen, "e2m1-g128", 0);
}
static void mixtral_e2m1_fp8(void **state)
{
	convert_and_check(g_mixtral, "e2m1-g128", 0);
	convert_and_check(g_mixtral, "fp8", 0);
}
static void qwen_fp8(void **state)
{
	convert_and_check(g_qwen, "fp8", 0);     /* block 128 > rows of 96 */
	convert_and_check(g_qwen, "fp8-b24", 0); /* 32 = 24 + 8 */
}

/* Mixed precision: layers differ in format and record size. */
static void mixed_layers(void **state)
{
	static const char *const want_mx[4] = { "fp8", "nvfp4", "bf16", "fp8" };
	static const char *const want_qw[4] = { "bf16", "e2m1-g32", "e2m1-g32",
						"f32" };

	convert_and_check_keep(g_mixtral, "nvfp4", "first,last=fp8;2=bf16",
			       want_mx, 0);
	/* later rules win: 0-3 all bf16, then 1-2 back to e2m1, 3 to f32 */
	convert_and_check_keep(g_qwen, "mxfp4", "0-3=bf16;1-2=e2m1-g32;last=f32",
			       want_qw, 0);
}

/* Same checkpoint, same options: byte-identical stores. */
static void deterministic_one(const char *model, const char *fmt,
			      const char *keep)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	char tmp[4096], a[4200], b[4200];

	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(a, sizeof(a), "%s/a", tmp);
	snprintf(b, sizeof(b), "%s/second-store", tmp);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_experts(fmt, &o, &d), 0);
	if (keep)
		assert_true(es_convert_parse_keep(keep, &o, &d) > 0);
	assert_int_equal(es_convert(model, a, &o, &d), 0);
	assert_int_equal(es_convert(model, b, &o, &d), 0);
	assert_int_equal(tst_dirs_differ(a, b), 0);
	assert_true(tst_count_prefix(a, "experts-") > 0);
	st_rm_rf(tmp);
}

static void deterministic(void **state)
{
	deterministic_one(g_mixtral, "mxfp4", NULL);
	deterministic_one(g_qwen, "bf16", NULL);
	deterministic_one(g_mixtral, "nvfp4", "first,last=fp8");
	deterministic_one(g_qwen, "e2m1-g128", "1=bf16;2=fp8-b16");
}

static const char *jstr(json_t *o, const char *key)
{
	const char *v = json_string_value(json_object_get(o, key));

	if (!v)
		fail_msg("manifest: \"%s\" missing or not a string", key);
	return v;
}

static json_t *layer_mat(json_t *root, int l, int m)
{
	json_t *ly = json_array_get(json_object_get(json_object_get(root,
				"experts"), "layers"), (size_t)l);

	assert_non_null(ly);
	assert_int_equal(json_integer_value(json_object_get(ly, "layer")), l);
	assert_int_equal(json_array_size(json_object_get(ly, "matrices")), 3);
	return json_array_get(json_object_get(ly, "matrices"), (size_t)m);
}

/* The manifest carries the per-layer, per-matrix format description and
 * the policy asked for. */
static void manifest_describes_format(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	char tmp[4096], out[4200], out2[4200], path[4400];
	json_t *root, *m0, *ex;

	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(out, sizeof(out), "%s/s", tmp);
	assert_int_equal(es_convert(g_qwen, out, NULL, &d), 0); /* defaults */
	snprintf(path, sizeof(path), "%s/manifest.json", out);
	root = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
	assert_non_null(root);
	assert_string_equal(jstr(root, "format"), "strata-store");
	assert_int_equal(json_integer_value(json_object_get(root, "version")), 3);
	ex = json_object_get(root, "experts");
	assert_string_equal(jstr(json_object_get(ex, "policy"), "default"),
			    "mxfp4");
	assert_string_equal(jstr(json_object_get(ex, "policy"), "keep"), "");
	m0 = layer_mat(root, 3, 2);
	assert_string_equal(jstr(m0, "name"), "down");
	assert_string_equal(jstr(m0, "format"), "mxfp4");
	assert_int_equal(json_integer_value(json_object_get(m0, "block")), 32);
	assert_string_equal(jstr(m0, "scale"), "e8m0");
	assert_string_equal(jstr(m0, "layout"), "ocp-r16");
	assert_string_equal(jstr(m0, "rounding"), "nearest-even, saturate "
			    "\u00b16; scale 2^(floor(log2 amax) - 2)");
	/* no absolute paths: the model directory appears nowhere */
	{
		size_t len;
		uint8_t *text = tst_read(path, &len);

		assert_null(strstr((char *)text, g_qwen));
		assert_null(strstr((char *)text, tmp));
		free(text);
	}
	json_decref(root);

	/* mixed: nvfp4 with first and last at fp8, layer 2 at e2m1-g128 */
	snprintf(out2, sizeof(out2), "%s/mixed", tmp);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_experts("nvfp4", &o, &d), 0);
	assert_int_equal(es_convert_parse_keep("last,first=fp8", &o, &d), 2);
	assert_int_equal(es_convert_parse_keep("2=e2m1-g128", &o, &d), 1);
	assert_int_equal(es_convert(g_qwen, out2, &o, &d), 0);
	snprintf(path, sizeof(path), "%s/manifest.json", out2);
	root = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
	assert_non_null(root);
	ex = json_object_get(root, "experts");
	assert_string_equal(jstr(json_object_get(ex, "policy"), "default"),
			    "nvfp4");
	assert_string_equal(jstr(json_object_get(ex, "policy"), "keep"),
			    "last,first=fp8;2=e2m1-g128");
	m0 = layer_mat(root, 0, 0);
	assert_string_equal(jstr(m0, "format"), "fp8");
	assert_int_equal(json_integer_value(json_object_get(m0, "block")), 128);
	assert_string_equal(jstr(m0, "scale"), "f32");
	assert_string_equal(jstr(m0, "layout"), "row-major");
	m0 = layer_mat(root, 1, 1);
	assert_string_equal(jstr(m0, "name"), "up");
	assert_string_equal(jstr(m0, "format"), "nvfp4");
	assert_int_equal(json_integer_value(json_object_get(m0, "block")), 16);
	assert_string_equal(jstr(m0, "scale"), "e4m3");
	assert_string_equal(jstr(m0, "tensor_scale"), "f32");
	assert_string_equal(jstr(m0, "tensor_scale_use"), "multiply");
	assert_int_equal(json_integer_value(json_object_get(m0,
						"tensor_scale_bytes")), 4);
	m0 = layer_mat(root, 2, 2);
	assert_string_equal(jstr(m0, "format"), "e2m1-g128");
	assert_int_equal(json_integer_value(json_object_get(m0, "block")), 128);
	assert_string_equal(jstr(m0, "scale"), "f16");
	assert_string_equal(jstr(m0, "layout"), "ocp");
	m0 = layer_mat(root, 3, 0);
	assert_string_equal(jstr(m0, "format"), "fp8");
	assert_int_equal(json_integer_value(json_object_get(ex, "record_bytes")),
			 json_integer_value(json_object_get(json_array_get(
				 json_object_get(ex, "layers"), 0), "record_bytes")));
	json_decref(root);
	st_rm_rf(tmp);
}

/* Shard 1: layers 0 and 1; shard 2: the rest. */
static int in_shard(const char *name, void *arg)
{
	int first = !strncmp(name, "model.layers.0.", 15) ||
		    !strncmp(name, "model.layers.1.", 15);

	return *(int *)arg == 1 ? first : !first;
}

/* A sharded checkpoint (index + 2 shards) converts to the same data as
 * the single file; the manifest lists both shards. */
static void sharded_checkpoint(void **state)
{
	struct st_diag d = { { 0 } };
	struct tst_sft ck;
	struct tst_snap sa, sb;
	char tmp[4096], model[4200], a[4200], b[4200], path[4400];
	json_t *index = json_object(), *map = json_object(), *root, *src;
	int one = 1, two = 2;

	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(model, sizeof(model), "%s/model", tmp);
	assert_int_equal(mkdir(model, 0755), 0);
	tst_model_links(g_qwen, model, NULL);
	snprintf(path, sizeof(path), "%s/model.safetensors", g_qwen);
	tst_sft_load(path, &ck);
	snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", model);
	assert_int_equal(tst_sft_write_subset(path, &ck, in_shard, &one), 0);
	snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", model);
	assert_int_equal(tst_sft_write_subset(path, &ck, in_shard, &two), 0);
	for (int i = 0; i < ck.n; i++)
		json_object_set_new(map, ck.t[i].name,
				    json_string(in_shard(ck.t[i].name, &one) ?
						"model-00001-of-00002.safetensors" :
						"model-00002-of-00002.safetensors"));
	json_object_set_new(index, "metadata", json_object());
	json_object_set_new(index, "weight_map", map);
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", model);
	assert_int_equal(json_dump_file(index, path, JSON_INDENT(2)), 0);
	json_decref(index);
	tst_sft_free(&ck);

	snprintf(a, sizeof(a), "%s/from-single", tmp);
	snprintf(b, sizeof(b), "%s/from-shards", tmp);
	assert_int_equal(es_convert(g_qwen, a, NULL, &d), 0);
	if (es_convert(model, b, NULL, &d))
		fail_msg("sharded: %s", d.msg);
	tst_snapshot(a, &sa);
	tst_snapshot(b, &sb);
	assert_int_equal(sa.n, sb.n);
	for (int i = 0; i < sa.n; i++) {
		assert_string_equal(sa.names[i], sb.names[i]);
		if (strcmp(sa.names[i], "manifest.json"))
			assert_int_equal(sa.hashes[i], sb.hashes[i]);
	}
	snprintf(path, sizeof(path), "%s/manifest.json", b);
	root = json_load_file(path, 0, NULL);
	src = json_object_get(json_object_get(root, "source"), "files");
	assert_int_equal(json_array_size(src), 2);
	assert_string_equal(json_string_value(json_object_get(
				    json_array_get(src, 1), "name")),
			    "model-00002-of-00002.safetensors");
	json_decref(root);
	st_rm_rf(tmp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(mixtral_mxfp4),
		cmocka_unit_test(qwen_mxfp4),
		cmocka_unit_test(mixtral_bf16),
		cmocka_unit_test(qwen_bf16),
		cmocka_unit_test(mixtral_f32_dense_f32),
		cmocka_unit_test(mixtral_nvfp4),
		cmocka_unit_test(qwen_nvfp4),
		cmocka_unit_test(qwen_e2m1),
		cmocka_unit_test(mixtral_e2m1_fp8),
		cmocka_unit_test(qwen_fp8),
		cmocka_unit_test(mixed_layers),
		cmocka_unit_test(deterministic),
		cmocka_unit_test(manifest_describes_format),
		cmocka_unit_test(sharded_checkpoint),
	};

	st_test_fixture_model("tiny-mixtral", g_mixtral, sizeof(g_mixtral));
	st_test_fixture_model("tiny-qwen3moe", g_qwen, sizeof(g_qwen));
	return cmocka_run_group_tests(tests, NULL, NULL);
}

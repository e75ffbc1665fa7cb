/*
 * test_es_engram.c — expertd's Engram tier (DeepSeek-V4.1) with a real
 * expertd serving a store converted from tiny-deepseek-v41:
 *   - rows fetched through expertd equal the checkpoint's rows read and
 *     dequantized here independently (safetensors header parsed with
 *     jansson, E4M3 and E8M0 decoded by their definitions) for many random
 *     ids, with a cache smaller than the tables, so hits, misses and
 *     evictions all occur; a FETCH larger than the cache; prefetch then
 *     fetch hits; the provider adapter (cw_engram_es_get_rows) through a
 *     struct of the forward pass's provider shape;
 *   - the same after a clean restart (new client) and after kill -9 and a
 *     restart that adopts the segments (same client);
 *   - a damaged engram.bin block refused with a clear error while other
 *     rows are still served; a damaged header refused at start;
 *   - a too small --engram-cache refused with the minimum;
 *   - malformed ENGRAM messages answered with an error naming the field
 *     (expertd keeps serving); the latency histogram's buckets and
 *     quantiles.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "cw_engram_es.h"
#include "es_client.h"
#include "es_client_int.h"
#include "es_engram_proto.h"
#include "es_harness.h"
#include "st_util.h"
#include "test_util.h"

#define CACHE_ARG "49000"   /* 500 rows of 66 + 32 bytes: < 1524 rows */

static struct es_h H;
static float *ref[2];        /* [rows][64] per Engram layer */
static const int64_t nrows[2] = { 660, 864 };
static const int dim = 64;
static uint64_t rng = 88172645463325252ull;

static uint64_t xorshift(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* E4M3 by its definition: sign, 4 exponent bits (bias 7), 3 mantissa
 * bits, subnormals at exponent 0; 0x7f / 0xff NaN. */
static float e4m3(uint8_t b)
{
	int s = b >> 7, ex = (b >> 3) & 15, m = b & 7;
	float v;

	if ((b & 0x7f) == 0x7f)
		return NAN;
	v = ex ? ldexpf(1.0f + m / 8.0f, ex - 7) : ldexpf(m / 8.0f, -6);
	return s ? -v : v;
}

/* The fixture's tables read straight from model.safetensors. */
static void load_reference(void)
{
	char dir[1024], path[1100], *buf;
	size_t len;
	uint64_t hl;
	json_t *hdr;

	st_test_fixture_model("tiny-deepseek-v41", dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(st_read_file(path, &buf, &len), 0);
	memcpy(&hl, buf, 8);
	hdr = json_loadb(buf + 8, hl, 0, NULL);
	assert_non_null(hdr);
	for (int li = 0; li < 2; li++) {
		char nw[64], ns[64];
		json_t *tw, *ts;
		const uint8_t *w, *s;

		snprintf(nw, sizeof(nw), "layers.%d.engram.embed.weight",
			 li ? 4 : 1);
		snprintf(ns, sizeof(ns), "layers.%d.engram.embed.scale",
			 li ? 4 : 1);
		tw = json_object_get(json_object_get(hdr, nw), "data_offsets");
		ts = json_object_get(json_object_get(hdr, ns), "data_offsets");
		assert_non_null(tw);
		assert_non_null(ts);
		w = (const uint8_t *)buf + 8 + hl +
		    json_integer_value(json_array_get(tw, 0));
		s = (const uint8_t *)buf + 8 + hl +
		    json_integer_value(json_array_get(ts, 0));
		ref[li] = malloc(sizeof(float) * nrows[li] * dim);
		for (int64_t r = 0; r < nrows[li]; r++)
			for (int j = 0; j < dim; j++)
				ref[li][r * dim + j] = e4m3(w[r * dim + j]) *
					ldexpf(1.0f, s[r * 2 + j / 32] - 127);
	}
	json_decref(hdr);
	free(buf);
}

static int group_setup(void **state)
{
	(void)state;
	if (es_h_init(&H, "tiny-deepseek-v41", "eseng") < 0)
		return -1;
	load_reference();
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	es_h_fini(&H);
	free(ref[0]);
	free(ref[1]);
	return 0;
}

static int test_teardown(void **state)
{
	(void)state;
	es_h_reset(&H);
	return 0;
}

static struct es_client *open_client(const char *name)
{
	struct st_diag diag = { "" };
	struct es_client *c = NULL;

	if (es_client_open(H.run_dir, H.inst, name, ES_H_TIMEOUT_MS, &c, &diag))
		fail_msg("es_client_open: %s", diag.msg);
	return c;
}

/* n random ids of layer li fetched and compared with the reference. */
static void fetch_check(struct es_client *c, int li, int n)
{
	struct st_diag diag = { "" };
	int64_t *ids = malloc(sizeof(int64_t) * n);
	float *out = malloc(sizeof(float) * n * dim);

	for (int i = 0; i < n; i++)
		ids[i] = (int64_t)(xorshift() % (uint64_t)nrows[li]);
	if (es_client_engram_fetch(c, li, n, ids, out, &diag))
		fail_msg("fetch: %s", diag.msg);
	for (int i = 0; i < n; i++)
		if (memcmp(out + (size_t)i * dim, ref[li] + ids[i] * dim,
			   sizeof(float) * dim))
			fail_msg("layer %d row %lld differs", li,
				 (long long)ids[i]);
	free(ids);
	free(out);
}

/* Counters once the engine has looked up `lookups` rows in all: a
 * PREFETCH is answered before the engine takes it. */
static void stats_after(struct es_client *c, uint64_t lookups,
			struct es_engram_stats *st)
{
	struct st_diag diag = { "" };

	for (int i = 0; i < 5000; i++) {
		assert_int_equal(es_client_engram_stats(c, st, &diag), 0);
		if (st->lookups >= lookups)
			return;
		st_sleep_ns(1000000);
	}
	fail_msg("expertd did not take the prefetches in 5 s");
}

static void test_fetch_random(void **state)
{
	struct st_diag diag = { "" };
	struct es_engram_info info;
	struct es_engram_stats st;
	struct es_client *c;
	uint64_t asked = 0;

	(void)state;
	assert_int_equal(es_h_start(&H, "--engram-cache", CACHE_ARG, NULL), 0);
	c = open_client("eng");
	assert_int_equal(es_client_engram_info(c, &info, &diag), 0);
	assert_int_equal(info.n_layers, 2);
	assert_int_equal(info.layer_id[0], 1);
	assert_int_equal(info.layer_id[1], 4);
	assert_int_equal(info.rows[1], 864);
	assert_int_equal(info.dim[0], 64);
	assert_int_equal(info.row_bytes[0], 66);
	assert_true(info.cache_rows >= 256 && info.cache_rows < 660 + 864);
	for (int k = 0; k < 60; k++) {
		int n = 1 + (int)(xorshift() % 200), li = (int)(xorshift() % 2);

		fetch_check(c, li, n);
		asked += (uint64_t)n;
	}
	assert_int_equal(es_client_engram_stats(c, &st, &diag), 0);
	assert_int_equal(st.lookups, asked);
	assert_true(st.hits > 0);
	assert_true(st.misses > 0);
	assert_true(st.evictions > 0);
	assert_int_equal(st.hits + st.merged + st.misses, asked);
	assert_true(st.reads >= st.misses);
	assert_int_equal(st.read_bytes, st.reads * 4096);
	assert_true(st.cache_used <= info.cache_rows);
	assert_true(st.lat_p50_ns > 0 && st.lat_p99_ns >= st.lat_p50_ns);
	assert_int_equal(st.read_errors, 0);
	/* more rows than the cache holds and than one FETCH carries */
	fetch_check(c, 1, 5000);
	/* prefetch, then the same rows hit */
	{
		int64_t ids[100];
		float out[100 * 64];
		uint64_t hits0;

		for (int i = 0; i < 100; i++)
			ids[i] = 300 + i;
		assert_int_equal(es_client_engram_stats(c, &st, &diag), 0);
		assert_int_equal(es_client_engram_prefetch(c, 0, 100, ids,
							   &diag), 0);
		stats_after(c, st.lookups + 100, &st);
		hits0 = st.hits + st.merged;
		assert_int_equal(es_client_engram_fetch(c, 0, 100, ids, out,
							&diag), 0);
		assert_int_equal(es_client_engram_stats(c, &st, &diag), 0);
		assert_int_equal(st.hits + st.merged - hits0, 100);
		for (int i = 0; i < 100; i++)
			assert_memory_equal(out + i * 64, ref[0] + ids[i] * 64,
					    sizeof(float) * 64);
	}
	/* per-token prefetch from the store's hash: the rows of positions
	 * 0..39 of a token sequence for the second Engram layer, then the
	 * same rows fetched are all cache hits */
	{
		int32_t tok[40];
		int64_t ids[40 * 6];
		float *out = malloc(sizeof(float) * 40 * 6 * 64);
		uint64_t seen0;

		for (int i = 0; i < 40; i++)
			tok[i] = (int32_t)(xorshift() % 129280);
		assert_int_equal(es_client_engram_stats(c, &st, &diag), 0);
		seen0 = st.lookups;
		for (int p = 0; p < 40; p++) {
			assert_int_equal(cw_engram_es_prefetch_token(c,
					 H.st->engram_hash, tok, p, 1, &diag), 0);
			assert_int_equal(st_engram_hash_rows(H.st->engram_hash, 1,
					 tok, p, ids + p * 6), 6);
		}
		stats_after(c, seen0 + 240, &st);
		seen0 = st.hits + st.merged;
		assert_int_equal(es_client_engram_fetch(c, 1, 240, ids, out,
							&diag), 0);
		assert_int_equal(es_client_engram_stats(c, &st, &diag), 0);
		assert_int_equal(st.hits + st.merged - seen0, 240);
		for (int i = 0; i < 240; i++)
			assert_memory_equal(out + i * 64, ref[1] + ids[i] * 64,
					    sizeof(float) * 64);
		free(out);
	}
	/* the forward pass's provider shape: fn pointer + ctx */
	{
		struct {
			int (*get_rows)(void *ctx, int ei, const int64_t *ids,
					int n, float *out, struct st_diag *d);
			void *ctx;
		} prov = { cw_engram_es_get_rows, c };
		int64_t ids[3] = { 863, 0, 431 };
		float out[3 * 64];

		assert_int_equal(prov.get_rows(prov.ctx, 1, ids, 3, out, &diag), 0);
		for (int i = 0; i < 3; i++)
			assert_memory_equal(out + i * 64, ref[1] + ids[i] * 64,
					    sizeof(float) * 64);
	}
	/* bad arguments */
	{
		int64_t bad = 660;
		float out[64];

		assert_int_equal(es_client_engram_fetch(c, 0, 1, &bad, out,
							&diag), -EINVAL);
		assert_int_equal(es_client_engram_fetch(c, 2, 1, &bad, out,
							&diag), -EINVAL);
	}
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
}

static void test_restarts(void **state)
{
	struct es_client *c;

	(void)state;
	assert_int_equal(es_h_start(&H, "--engram-cache", CACHE_ARG, NULL), 0);
	c = open_client("r1");
	fetch_check(c, 0, 300);
	es_client_close(c);
	/* clean restart, new client */
	assert_int_equal(es_h_stop(&H), 0);
	assert_int_equal(es_h_start(&H, "--engram-cache", CACHE_ARG, NULL), 0);
	c = open_client("r2");
	fetch_check(c, 1, 300);
	/* kill -9; the restarted expertd adopts both segments and the same
	 * client goes on */
	es_h_kill9(&H);
	assert_int_equal(es_h_start(&H, "--engram-cache", CACHE_ARG, NULL), 0);
	es_client_set_restart_wait(c, 5000);
	fetch_check(c, 0, 200);
	fetch_check(c, 1, 200);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
}

static void flip_engram_byte(uint64_t off)
{
	char path[700];
	uint8_t b;
	int fd;

	snprintf(path, sizeof(path), "%s/engram.bin", H.store);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x20;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

static void test_corrupt(void **state)
{
	struct st_diag diag = { "" };
	struct es_engram_stats st;
	struct es_client *c;
	char err[4096];
	float out[64];
	/* layer 1 (index 0) rows per block: (4096 - 8) / 66 = 61; block 3
	 * holds rows 122 .. 182 */
	int64_t bad = 130, good = 10;

	(void)state;
	flip_engram_byte(3 * 4096 + 5);
	assert_int_equal(es_h_start(&H, "--engram-cache", CACHE_ARG, NULL), 0);
	c = open_client("bad");
	assert_int_equal(es_client_engram_fetch(c, 0, 1, &bad, out, &diag),
			 -ST_E_CHECKSUM);
	assert_non_null(strstr(diag.msg, "engram.bin"));
	assert_non_null(strstr(diag.msg, "block 3"));
	assert_non_null(strstr(diag.msg, "strata convert"));
	/* the other rows are still served, and the same again fails */
	assert_int_equal(es_client_engram_fetch(c, 0, 1, &good, out, &diag), 0);
	assert_memory_equal(out, ref[0] + good * 64, sizeof(out));
	assert_int_equal(es_client_engram_fetch(c, 0, 1, &bad, out, &diag),
			 -ST_E_CHECKSUM);
	assert_int_equal(es_client_engram_stats(c, &st, &diag), 0);
	assert_true(st.read_errors >= 2 && st.rereads >= 2);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
	flip_engram_byte(3 * 4096 + 5);
	/* a damaged header: expertd does not start, and says why */
	flip_engram_byte(20);
	assert_int_equal(es_h_run_fail(&H, err, sizeof(err), "--engram-cache",
				       CACHE_ARG, NULL), 1);
	assert_non_null(strstr(err, "engram.bin"));
	assert_non_null(strstr(err, "strata convert"));
	flip_engram_byte(20);
	/* a cache too small */
	assert_int_equal(es_h_run_fail(&H, err, sizeof(err), "--engram-cache",
				       "4KiB", NULL), 1);
	assert_non_null(strstr(err, "--engram-cache 4KiB"));
	assert_non_null(strstr(err, "at least"));
}

/* Sends a raw ENGRAM payload; returns the status, message in diag. */
static int raw_engram(struct es_client *c, uint32_t li, uint32_t flags,
		      const int64_t *rows, uint32_t n, struct st_diag *diag)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	es_engram_req_encode(&w, (uint32_t)getpid(), li, n, flags, 99, rows);
	r = es_client_rpc(c, ES_MSG_ENGRAM, &w, NULL, NULL, NULL, diag);
	st_wbuf_fini(&w);
	return r;
}

static void test_malformed(void **state)
{
	struct st_diag diag = { "" };
	struct es_client *c;
	int64_t rows[2] = { 5, 660 };

	(void)state;
	assert_int_equal(es_h_start(&H, "--engram-cache", CACHE_ARG, NULL), 0);
	c = open_client("mal");
	assert_int_equal(raw_engram(c, 0, 0, rows, 2, &diag), -ST_E_PROTO);
	assert_non_null(strstr(diag.msg, "row[1] = 660"));
	assert_int_equal(raw_engram(c, 2, 0, rows, 1, &diag), -ST_E_PROTO);
	assert_non_null(strstr(diag.msg, "layer index 2"));
	assert_int_equal(raw_engram(c, 0, 4, rows, 1, &diag), -ST_E_PROTO);
	assert_non_null(strstr(diag.msg, "flags"));
	assert_int_equal(raw_engram(c, 0, 0, rows, 0, &diag), -ST_E_PROTO);
	assert_non_null(strstr(diag.msg, "0 rows"));
	/* still serving */
	fetch_check(c, 0, 10);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
}

static void test_latency_histogram(void **state)
{
	uint64_t hist[ES_ENGRAM_LAT_BUCKETS] = { 0 };
	uint64_t prev = 0;

	(void)state;
	for (int b = 1; b < ES_ENGRAM_LAT_BUCKETS - 1; b++) {
		uint64_t lo = es_engram_lat_bucket_lo(b);

		assert_true(lo > prev);
		assert_int_equal(es_engram_lat_bucket(lo), b);
		assert_int_equal(es_engram_lat_bucket(es_engram_lat_bucket_hi(b) - 1), b);
		/* buckets are at most 1/8 of their value wide */
		assert_true((es_engram_lat_bucket_hi(b) - lo) * 8 <= lo);
		prev = lo;
	}
	/* 90 reads of 100 us and 10 of 5 ms: p50 ~100 us, p99 ~5 ms */
	hist[es_engram_lat_bucket(100000)] = 90;
	hist[es_engram_lat_bucket(5000000)] = 10;
	assert_true(llabs((long long)es_engram_lat_quantile(hist, 0.5) - 100000) <
		    7000);
	assert_true(llabs((long long)es_engram_lat_quantile(hist, 0.99) -
			  5000000) < 350000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_fetch_random, test_teardown),
		cmocka_unit_test_teardown(test_restarts, test_teardown),
		cmocka_unit_test_teardown(test_corrupt, test_teardown),
		cmocka_unit_test_teardown(test_malformed, test_teardown),
		cmocka_unit_test(test_latency_histogram),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

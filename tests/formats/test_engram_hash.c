/*
 * test_engram_hash.c — the DeepSeek-V4.1 Engram n-gram hash
 * (common/st_engram_hash.c) against:
 *   - an independent computation written here from the family doc
 *     (MODEL_FAMILY_DEEPSEEK_V4.md 3.5): the fixture's engram_hash.json read
 *     with jansson, n-grams built by explicit slot lists, int64 products,
 *     xor, mod, offsets;
 *   - the fixture's reference.json debug.engram_hash_ids (case p4, every
 *     position, both Engram layers);
 *   - n-grams that cross a prompt/generation boundary (prompt, then the
 *     greedy continuation fed one id at a time into a growing history);
 *   - pad slots (p < s) and DEAD positions (sticky pad);
 *   - the binary store copy (round trip, byte-identical save, corruption
 *     refused) and malformed JSON refused by name.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "st_engram_hash.h"
#include "st_error.h"
#include "st_util.h"
#include "test_util.h"

#define MODEL "tiny-deepseek-v41"

static char hash_path[1200], ref_path[1200];
static json_t *hj; /* engram_hash.json, parsed here independently */

/* --- the independent computation ---------------------------------------- */

static int64_t jget(const json_t *a, size_t i)
{
	return json_integer_value(json_array_get(a, i));
}

/* Row ids of position p, Engram layer li, from hj: the n-gram of size g
 * is tokens p-g+1 .. p; slot s (token p-s) is the compressed pad id if
 * p-s < 0 or a DEAD (-1) token occurs at or after it going back. */
static void ref_rows(int li, const int32_t *tokens, int p, int64_t *out)
{
	const json_t *map = json_object_get(hj, "token_map");
	const json_t *mult = json_array_get(json_object_get(hj, "multipliers"), li);
	const json_t *primes = json_array_get(json_object_get(hj, "primes"), li);
	const json_t *offs = json_array_get(json_object_get(hj, "offsets"), li);
	int64_t cpad = json_integer_value(json_object_get(hj, "compressed_pad_id"));
	int maxn = (int)json_integer_value(json_object_get(hj, "max_ngram_size"));
	int heads = (int)json_integer_value(json_object_get(hj, "n_heads"));
	int64_t slot[8];
	int s, g, hd, dead = 0;

	for (s = 0; s < maxn; s++) {
		if (p - s < 0 || tokens[p - s] < 0)
			dead = 1;
		slot[s] = dead ? cpad : jget(map, (size_t)tokens[p - s]);
	}
	for (g = 2; g <= maxn; g++) {
		int64_t h = 0;

		/* the hash of the g-gram is the xor of all its slot products */
		for (s = 0; s < g; s++)
			h ^= slot[s] * jget(mult, (size_t)s);
		for (hd = 0; hd < heads; hd++) {
			int c = (g - 2) * heads + hd;
			int64_t pr = jget(json_array_get(primes, (size_t)(g - 2)),
					  (size_t)hd);

			assert_true(h >= 0);
			out[c] = h % pr + jget(offs, (size_t)c);
		}
	}
}

static struct st_engram_hash *load(void)
{
	struct st_diag diag = { { 0 } };
	struct st_engram_hash *h = NULL;

	if (st_engram_hash_load_json(hash_path, &h, &diag) != 0)
		fail_msg("%s", diag.msg);
	return h;
}

static json_t *p4_case(json_t *ref)
{
	json_t *cases = json_object_get(ref, "cases"), *c;
	size_t i;

	json_array_foreach(cases, i, c)
		if (strncmp(json_string_value(json_object_get(c, "name")), "p4",
			    2) == 0)
			return c;
	fail_msg("reference.json: no p4 case");
	return NULL;
}

/* --- tests --------------------------------------------------------------- */

static void test_shape(void **state)
{
	struct st_engram_hash *h = load();
	int64_t ne[2] = { 660, 864 };
	int ids[2] = { 1, 4 };
	struct st_diag diag = { { 0 } };

	(void)state;
	assert_int_equal(st_engram_hash_heads(h), 2);
	assert_int_equal(st_engram_hash_rows_per_pos(h), 6);
	assert_int_equal(st_engram_hash_n_layers(h), 2);
	assert_int_equal(st_engram_hash_layer_id(h, 1), 4);
	/* README: layer 1 uses 101,103/107,109/113,127 -> 660; layer 4 -> 864 */
	assert_int_equal(st_engram_hash_table_rows(h, 0), 660);
	assert_int_equal(st_engram_hash_table_rows(h, 1), 864);
	assert_int_equal(st_engram_hash_vocab(h), 129280);
	assert_int_equal(st_engram_hash_check_config(h, 2, ids, ne, &diag), 0);
	ne[1] = 865;
	assert_int_equal(st_engram_hash_check_config(h, 2, ids, ne, &diag),
			 -ST_E_CONFIG);
	assert_non_null(strstr(diag.msg, "865"));
	st_engram_hash_free(h);
}

/* A hand-worked position: p = 0, token 0 (BOS).  Slots 1..3 are pad
 * (compressed 2), slot 0 is map[0] = 0, so every n-gram hash is the xor of
 * the pad products 2*mult[s]. */
static void test_first_position_by_hand(void **state)
{
	struct st_engram_hash *h = load();
	const int64_t m[4] = { 76310196577375, 4819545792771, 35808620736297,
			       73676547517103 };
	int32_t tok[1] = { 0 };
	int64_t out[6], x2, x3, x4;

	(void)state;
	x2 = 0 ^ (2 * m[1]);
	x3 = x2 ^ (2 * m[2]);
	x4 = x3 ^ (2 * m[3]);
	assert_int_equal(st_engram_hash_rows(h, 0, tok, 0, out), 6);
	assert_int_equal(out[0], x2 % 101 + 0);
	assert_int_equal(out[1], x2 % 103 + 101);
	assert_int_equal(out[2], x3 % 107 + 204);
	assert_int_equal(out[3], x3 % 109 + 311);
	assert_int_equal(out[4], x4 % 113 + 420);
	assert_int_equal(out[5], x4 % 127 + 533);
	st_engram_hash_free(h);
}

/* p4 prompt: every position and layer against the reference's debug ids
 * and against ref_rows. */
static void test_p4_reference(void **state)
{
	struct st_engram_hash *h = load();
	json_error_t err;
	json_t *ref = json_load_file(ref_path, 0, &err), *ids, *dbg;
	int32_t *tok;
	int64_t out[6], mine[6];
	size_t n, p;
	int li, c, checked = 0;

	(void)state;
	assert_non_null(ref);
	ids = json_object_get(p4_case(ref), "ids");
	dbg = json_object_get(json_object_get(ref, "debug"), "engram_hash_ids");
	n = json_array_size(ids);
	assert_true(n >= 64);
	assert_int_equal(json_array_size(dbg), n);
	tok = calloc(n, sizeof(*tok));
	for (p = 0; p < n; p++)
		tok[p] = (int32_t)json_integer_value(json_array_get(ids, p));
	for (p = 0; p < n; p++) {
		for (li = 0; li < 2; li++) {
			const json_t *want = json_array_get(json_array_get(dbg, p),
							    (size_t)li);

			assert_int_equal(st_engram_hash_rows(h, li, tok, (int)p, out), 6);
			ref_rows(li, tok, (int)p, mine);
			for (c = 0; c < 6; c++) {
				assert_int_equal(out[c], jget(want, (size_t)c));
				assert_int_equal(out[c], mine[c]);
				assert_true(out[c] >= 0 &&
					    out[c] < st_engram_hash_table_rows(h, li));
				checked++;
			}
		}
	}
	assert_int_equal(checked, (int)n * 12);
	free(tok);
	json_decref(ref);
	st_engram_hash_free(h);
}

/* Prompt then the greedy continuation, one id at a time: the n-grams that
 * straddle the boundary mix prompt and generated ids.  The history is a
 * growing buffer; each step hashes only the newest position, the way a
 * decode loop would. */
static void test_prompt_generation_boundary(void **state)
{
	struct st_engram_hash *h = load();
	json_error_t err;
	json_t *ref = json_load_file(ref_path, 0, &err), *cases, *c;
	size_t ci;
	int64_t out[6], mine[6];
	int cases_done = 0;

	(void)state;
	assert_non_null(ref);
	cases = json_object_get(ref, "cases");
	json_array_foreach(cases, ci, c) {
		json_t *ids = json_object_get(c, "ids");
		json_t *gen = json_object_get(c, "greedy_continuation");
		size_t np = json_array_size(ids), ng = json_array_size(gen), i;
		int32_t *hist = calloc(np + ng, sizeof(*hist));
		int li, cc, boundary_rows = 0;

		assert_true(ng > 4);
		for (i = 0; i < np; i++)
			hist[i] = (int32_t)json_integer_value(json_array_get(ids, i));
		for (i = 0; i < ng; i++) {
			int p = (int)(np + i);

			hist[p] = (int32_t)json_integer_value(json_array_get(gen, i));
			for (li = 0; li < 2; li++) {
				assert_int_equal(st_engram_hash_rows(h, li, hist,
								     p, out), 6);
				ref_rows(li, hist, p, mine);
				for (cc = 0; cc < 6; cc++)
					assert_int_equal(out[cc], mine[cc]);
				if (i < 3)
					boundary_rows++;
			}
			/* A pointer into the history needs only the last
			 * max_ngram ids: the same rows from a copy of them. */
			if (p >= 3) {
				int32_t tail[4];

				memcpy(tail, hist + p - 3, sizeof(tail));
				assert_int_equal(st_engram_hash_rows(h, 0, tail, 3,
								     out), 6);
				ref_rows(0, hist, p, mine);
				for (cc = 0; cc < 6; cc++)
					assert_int_equal(out[cc], mine[cc]);
			}
		}
		assert_int_equal(boundary_rows, 6);
		free(hist);
		cases_done++;
	}
	assert_true(cases_done >= 6);
	json_decref(ref);
	st_engram_hash_free(h);
}

/* p < s uses pad for the missing slots; a DEAD token pads it and every
 * older slot even when real tokens lie beyond it. */
static void test_pad_and_dead(void **state)
{
	struct st_engram_hash *h = load();
	int32_t a[6] = { 0, 3000, 4000, ST_ENGRAM_TOKEN_DEAD, 5000, 6000 };
	int32_t b[6] = { 9, 9, 9, 9, 5000, 6000 };
	int32_t padded[6] = { 2, 2, 2, 2, 5000, 6000 };
	int64_t out[6], mine[6], x[6];
	int p, c;

	(void)state;
	for (p = 0; p < 6; p++) {
		assert_int_equal(st_engram_hash_rows(h, 1, a, p, out), 6);
		ref_rows(1, a, p, mine);
		for (c = 0; c < 6; c++)
			assert_int_equal(out[c], mine[c]);
	}
	/* At p = 5, the DEAD at 3 means slots 2 and 3 are pad: the same rows
	 * as when 3 is a real pad token (map[2] is the compressed pad)
	 * whatever precedes it. */
	assert_int_equal(st_engram_hash_rows(h, 1, a, 5, out), 6);
	assert_int_equal(st_engram_hash_rows(h, 1, padded, 5, x), 6);
	for (c = 0; c < 6; c++)
		assert_int_equal(out[c], x[c]);
	/* ... and p = 1 of b (slots 2, 3 missing) equals p = 5 of padded */
	assert_int_equal(st_engram_hash_rows(h, 1, b + 4, 1, out), 6);
	for (c = 0; c < 6; c++)
		assert_int_equal(out[c], x[c]);
	/* Bad input */
	b[5] = 129280;
	assert_int_equal(st_engram_hash_rows(h, 1, b, 5, out), -EINVAL);
	b[5] = -7;
	assert_int_equal(st_engram_hash_rows(h, 1, b, 5, out), -EINVAL);
	assert_int_equal(st_engram_hash_rows(h, 2, a, 0, out), -EINVAL);
	assert_int_equal(st_engram_hash_rows(h, 0, a, -1, out), -EINVAL);
	st_engram_hash_free(h);
}

static void test_binary_round_trip(void **state)
{
	struct st_engram_hash *h = load(), *g = NULL;
	struct st_diag diag = { { 0 } };
	char dir[256], p1[300], p2[300], *b1, *b2;
	size_t l1, l2;
	int32_t tok[40];
	int64_t o1[6], o2[6];
	int i, p, c;

	(void)state;
	st_test_tmpdir(dir, sizeof(dir));
	snprintf(p1, sizeof(p1), "%s/a.bin", dir);
	snprintf(p2, sizeof(p2), "%s/b.bin", dir);
	assert_int_equal(st_engram_hash_save(h, p1, &diag), 0);
	assert_int_equal(st_engram_hash_load(p1, &g, &diag), 0);
	assert_int_equal(st_engram_hash_save(g, p2, &diag), 0);
	assert_int_equal(st_read_file(p1, &b1, &l1), 0);
	assert_int_equal(st_read_file(p2, &b2, &l2), 0);
	assert_int_equal(l1, l2);
	assert_memory_equal(b1, b2, l1);
	for (i = 0; i < 40; i++)
		tok[i] = (int32_t)((i * 7919 + 13) % 129280);
	for (p = 0; p < 40; p++)
		for (i = 0; i < 2; i++) {
			st_engram_hash_rows(h, i, tok, p, o1);
			st_engram_hash_rows(g, i, tok, p, o2);
			for (c = 0; c < 6; c++)
				assert_int_equal(o1[c], o2[c]);
		}
	st_engram_hash_free(g);
	g = NULL;
	/* one flipped byte inside the token map: checksum refusal */
	b1[l1 / 2] ^= 0x10;
	assert_int_equal(st_write_file(p1, b1, l1), 0);
	assert_int_equal(st_engram_hash_load(p1, &g, &diag), -ST_E_CHECKSUM);
	assert_null(g);
	assert_non_null(strstr(diag.msg, "strata convert"));
	/* truncated */
	assert_int_equal(st_write_file(p1, b2, l2 - 100), 0);
	assert_true(st_engram_hash_load(p1, &g, &diag) < 0);
	/* wrong magic */
	b2[0] = 'X';
	assert_int_equal(st_write_file(p1, b2, l2), 0);
	assert_int_equal(st_engram_hash_load(p1, &g, &diag), -ST_E_BADMAGIC);
	free(b1);
	free(b2);
	st_engram_hash_free(h);
	st_rm_rf(dir);
}

/* An edited copy of engram_hash.json: the load fails with `want` and the
 * message names `needle`. */
static void expect_refused(json_t *j, int want, const char *needle)
{
	struct st_diag diag = { { 0 } };
	struct st_engram_hash *h = NULL;
	char dir[256], path[300];

	st_test_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/engram_hash.json", dir);
	assert_int_equal(json_dump_file(j, path, JSON_COMPACT), 0);
	assert_int_equal(st_engram_hash_load_json(path, &h, &diag), want);
	assert_null(h);
	if (!strstr(diag.msg, needle))
		fail_msg("message \"%s\" does not name \"%s\"", diag.msg, needle);
	st_rm_rf(dir);
}

static void test_json_refusals(void **state)
{
	json_t *j;

	(void)state;
	j = json_deep_copy(hj);
	json_array_set_new(json_object_get(j, "token_map"), 77,
			   json_integer(99510));
	expect_refused(j, -ST_E_CONFIG, "token_map[77]");
	json_decref(j);

	j = json_deep_copy(hj);
	json_array_remove(json_object_get(j, "token_map"), 5);
	/* map shorter by one: still consistent by itself, so it loads; the
	 * vocab then differs from the model's (checked by callers) */
	{
		struct st_diag diag = { { 0 } };
		struct st_engram_hash *h = NULL;
		char dir[256], path[300];

		st_test_tmpdir(dir, sizeof(dir));
		snprintf(path, sizeof(path), "%s/e.json", dir);
		json_dump_file(j, path, JSON_COMPACT);
		assert_int_equal(st_engram_hash_load_json(path, &h, &diag), 0);
		assert_int_equal(st_engram_hash_vocab(h), 129279);
		st_engram_hash_free(h);
		st_rm_rf(dir);
	}
	json_decref(j);

	j = json_deep_copy(hj);
	json_array_set_new(json_array_get(json_object_get(j, "offsets"), 1), 3,
			   json_integer(400));
	expect_refused(j, -ST_E_CONFIG, "offsets[1][3]");
	json_decref(j);

	j = json_deep_copy(hj);
	json_array_set_new(json_array_get(json_array_get(json_object_get(j,
			   "primes"), 0), 2), 1, json_integer(0));
	expect_refused(j, -ST_E_CONFIG, "primes[0][2][1]");
	json_decref(j);

	j = json_deep_copy(hj);
	json_array_set_new(json_array_get(json_object_get(j, "multipliers"), 0),
			   2, json_integer(INT64_MAX / 99510 + 1));
	expect_refused(j, -ST_E_CONFIG, "multipliers[0][2]");
	json_decref(j);

	j = json_deep_copy(hj);
	json_object_set_new(j, "compressed_pad_id", json_integer(3));
	expect_refused(j, -ST_E_CONFIG, "compressed_pad_id");
	json_decref(j);

	j = json_deep_copy(hj);
	json_object_del(j, "n_heads");
	expect_refused(j, -ST_E_FORMAT, "n_heads");
	json_decref(j);

	j = json_deep_copy(hj);
	json_array_remove(json_array_get(json_object_get(j, "offsets"), 0), 0);
	expect_refused(j, -ST_E_FORMAT, "offsets[0]");
	json_decref(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shape),
		cmocka_unit_test(test_first_position_by_hand),
		cmocka_unit_test(test_p4_reference),
		cmocka_unit_test(test_prompt_generation_boundary),
		cmocka_unit_test(test_pad_and_dead),
		cmocka_unit_test(test_binary_round_trip),
		cmocka_unit_test(test_json_refusals),
	};
	char dir[1024];
	json_error_t err;

	st_test_fixture_model(MODEL, dir, sizeof(dir));
	snprintf(hash_path, sizeof(hash_path), "%s/engram_hash.json", dir);
	snprintf(ref_path, sizeof(ref_path), "%s/reference.json", dir);
	hj = json_load_file(hash_path, 0, &err);
	if (!hj) {
		fprintf(stderr, "%s: %s\n", hash_path, err.text);
		return 1;
	}
	return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * test_dsv4_load.c — the DeepSeek-V4 loader refuses damaged checkpoints
 * with a message naming the tensor: copies of the tiny-deepseek-v4 fixture
 * with one fault each (an E8M0 scale byte 255 in an FP8 dense scale and in
 * an FP4 expert scale (PITFALLS P5), a tid2eid entry outside [0,
 * n_experts), a missing tensor, a config whose expert width does not match
 * the tensors), and the unmodified copy loads; on it, refused evals (past
 * the state's capacity, token ids out of range) leave the state intact.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "dsv_test_util.h"
#include "st_safetensors.h"
#include "st_util.h"
#include "test_util.h"

static int n_fail;
static char tmp[4096];

static void write_or_die(const char *name, const void *buf, size_t len)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", tmp, name);
	if (st_write_file(path, buf, len) < 0) {
		fprintf(stderr, "cannot write %s\n", path);
		exit(1);
	}
}

/* Bad eval arguments leave the state as it was: the sequence then goes on
 * with the same logits as a fresh one. */
static void check_eval_errors(struct cw_dsv_model *m)
{
	const struct st_dsv_config *c = cw_dsv_config(m);
	struct cw_dsv_state *s = NULL, *f = NULL;
	struct st_diag diag = { 0 };
	int32_t ids[5] = { 0, 19923, 11, 4, 7 }, bad[2] = { 5, -1 };
	float *a = malloc((size_t)c->vocab_size * 4);
	float *b = malloc((size_t)c->vocab_size * 4);

	CHECK(cw_dsv_state_new(m, 4, &s) == 0, "state");
	CHECK(cw_dsv_state_new(m, 4, &f) == 0, "state");
	CHECK(cw_dsv_eval(m, s, ids, 2, 0, a, &diag) == 0, "eval");
	CHECK(cw_dsv_eval(m, s, ids + 2, 3, 0, a, &diag) == -ST_E_LIMIT,
	      "eval past the state's capacity not refused");
	CHECK(cw_dsv_eval(m, s, bad, 2, 0, a, &diag) == -EINVAL,
	      "token id -1 not refused");
	bad[1] = c->vocab_size;
	CHECK(cw_dsv_eval(m, s, bad, 2, 0, a, &diag) == -EINVAL,
	      "token id vocab_size not refused");
	CHECK(cw_dsv_state_len(s) == 2, "state length changed by errors");
	CHECK(cw_dsv_eval(m, s, ids + 2, 2, 0, a, &diag) == 0, "eval");
	CHECK(cw_dsv_eval(m, f, ids, 4, 0, b, &diag) == 0, "eval");
	CHECK(memcmp(a, b, (size_t)c->vocab_size * 4) == 0,
	      "logits after refused evals differ from a fresh sequence");
	cw_dsv_state_free(s);
	cw_dsv_state_free(f);
	free(a);
	free(b);
}

/* Loads the temporary copy and checks the error and the message. */
static void expect(const char *what, int err, const char *word)
{
	struct cw_dsv_model *m = NULL;
	struct st_diag diag = { 0 };
	int r = cw_dsv_load(tmp, ST_DSV_REV_V4, CW_COMPUTE_REFERENCE, &m,
			    &diag);

	CHECK(r == err, "%s: load returned %d (%s), expected %d", what, r,
	      diag.msg, err);
	CHECK(!word || strstr(diag.msg, word),
	      "%s: message \"%s\" does not name %s", what, diag.msg, word);
	if (r == 0) {
		check_eval_errors(m);
		cw_dsv_free(m);
	}
	printf("%s: %s\n", what, r == 0 ? "loads" : diag.msg);
}

static const struct st_tensor_info *find(struct st_tensor_info *t, int n,
					 const char *name)
{
	for (int i = 0; i < n; i++)
		if (strcmp(t[i].name, name) == 0)
			return &t[i];
	fprintf(stderr, "fixture lacks %s\n", name);
	exit(1);
}

int main(void)
{
	char dir[4096], path[4200];
	char *st = NULL, *cfg = NULL, *mod;
	size_t st_len, cfg_len;
	struct st_tensor_info *t = NULL;
	struct st_diag diag = { 0 };
	const struct st_tensor_info *ti;
	const char *name;
	int n;

	st_test_fixture_model("tiny-deepseek-v4", dir, sizeof(dir));
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	if (st_read_file(path, &st, &st_len) < 0)
		return 1;
	snprintf(path, sizeof(path), "%s/config.json", dir);
	if (st_read_file(path, &cfg, &cfg_len) < 0)
		return 1;
	n = st_safetensors_parse(st, st_len, "model.safetensors", 0, &t, &diag);
	if (n < 0) {
		fprintf(stderr, "%s\n", diag.msg);
		return 1;
	}
	mod = malloc(st_len);
	write_or_die("config.json", cfg, cfg_len);

	memcpy(mod, st, st_len);
	write_or_die("model.safetensors", mod, st_len);
	expect("unmodified copy", 0, NULL);

	name = "layers.4.attn.wo_a.scale";
	ti = find(t, n, name);
	memcpy(mod, st, st_len);
	mod[ti->file_offset + ti->n_bytes - 1] = (char)255;
	write_or_die("model.safetensors", mod, st_len);
	expect("FP8 scale byte 255", -ST_E_FORMAT, name);

	name = "layers.5.ffn.experts.7.w2.scale";
	ti = find(t, n, name);
	memcpy(mod, st, st_len);
	mod[ti->file_offset + 1] = (char)255;
	write_or_die("model.safetensors", mod, st_len);
	expect("FP4 scale byte 255", -ST_E_FORMAT, name);

	name = "layers.1.ffn.gate.tid2eid";
	ti = find(t, n, name);
	memcpy(mod, st, st_len);
	mod[ti->file_offset + 8 * 1000] = 8; /* n_experts is 8 */
	write_or_die("model.safetensors", mod, st_len);
	expect("tid2eid entry 8", -ST_E_FORMAT, "tid2eid");

	/* rename a tensor in the header (same length: offsets unchanged) */
	memcpy(mod, st, st_len);
	{
		char *h = memmem(mod, 8 + 100000, "\"layers.3.ffn.gate.bias\"",
				 24);

		CHECK(h != NULL, "header lacks layers.3.ffn.gate.bias");
		if (h)
			memcpy(h, "\"layers.3.ffn.gate.bia_\"", 24);
	}
	write_or_die("model.safetensors", mod, st_len);
	/* the renamed tensor is also unknown: the loader does not complain
	 * about extra tensors, only about the missing one */
	expect("missing gate bias", -ST_E_NOTFOUND, "layers.3.ffn.gate.bias");

	write_or_die("model.safetensors", st, st_len);
	{
		char *c2 = malloc(cfg_len + 1), *p;

		memcpy(c2, cfg, cfg_len);
		c2[cfg_len] = 0;
		p = strstr(c2, "\"moe_intermediate_size\": 64");
		CHECK(p != NULL, "config lacks moe_intermediate_size 64");
		if (p)
			memcpy(p, "\"moe_intermediate_size\": 96", 27);
		write_or_die("config.json", c2, cfg_len);
		expect("config expert width 96", -ST_E_FORMAT,
		       "shared_experts.w1");
		free(c2);
	}
	st_tensor_infos_free(t, n);
	free(st);
	free(cfg);
	free(mod);
	snprintf(path, sizeof(path), "rm -rf '%s'", tmp);
	if (system(path) != 0)
		fprintf(stderr, "could not remove %s\n", tmp);
	return dsvt_finish(n_fail);
}

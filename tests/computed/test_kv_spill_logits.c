/*
 * test_kv_spill_logits.c — issue 4: with a KV budget of a quarter of what
 * the workload needs, 8 interleaved sequences produce exactly (bit for bit)
 * the logits they produce with an unlimited budget, in reference mode.
 *
 * kjv-moe (experts BF16, F32 KV rows of 512 bytes per layer, pages of 16
 * rows = 8 KiB): 8 sequences of 64 tokens each need 8 x 4 pages x 6 layers
 * = 192 pages (1.5 MiB); the small run gives kvd a budget of 48 pages
 * (384 KiB) plus a spill file.  Each step pins one sequence (restoring its
 * pages), evaluates its next token and unpins it, as computed does, round
 * robin over the sequences; the teacher-forced tokens are windows of
 * valid-small.txt.
 *
 * Also the prefix cache (issue 4): a sequence that maps the first 96 rows
 * of a 120-token prompt from pages another sequence published computes the
 * remaining 24 positions with logits bit-identical to a sequence that
 * computed all 120 itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_model.h"
#include "es_convert.h"
#include "st_tokenizer.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

#define N_SEQ 8
#define N_TOK 64

struct run {
	float *logits; /* [N_SEQ][N_TOK][vocab] */
	uint64_t spilled, restored;
};

static int run_once(const char *store, const int32_t *ids, int vocab,
		    const char *budget, const char *spill, struct run *ret)
{
	struct st_test_inst t;
	struct st_diag diag = { "" };
	struct es_client *es = NULL;
	struct kv_client *kv = NULL;
	struct cw_model *m = NULL;
	struct cw_model_opts mo = { ST_DTYPE_F32, 16, 1, CW_COMPUTE_REFERENCE,
				    0 };
	const char *es_args[] = { "--store", store, NULL };
	const char *kv_args[6] = { "--budget", budget, NULL, NULL, NULL };
	uint32_t seqs[N_SEQ];
	struct kv_stats ks;
	int r = -1;

	if (spill) {
		kv_args[2] = "--spill-budget";
		kv_args[3] = spill;
	}
	st_test_inst_init(&t, spill ? "spill" : "full");
	if (st_test_daemon_start(&t, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&t, "kvd", kv_args, 30) < 0)
		goto out;
	if (es_client_open(t.run_dir, t.name, "t", 10000, &es, &diag) < 0 ||
	    kv_client_open(t.run_dir, t.name, "t", 10000, &kv, &diag) < 0 ||
	    cw_model_open(store, es, kv, &mo, &m, &diag) < 0)
		goto out;
	for (int s = 0; s < N_SEQ; s++)
		if (kv_client_seq_create(kv, &seqs[s], &diag) < 0)
			goto out;
	for (int p = 0; p < N_TOK; p++)
		for (int s = 0; s < N_SEQ; s++) {
			float *out = ret->logits +
				     ((size_t)s * N_TOK + p) * (size_t)vocab;

			if (kv_client_seq_pin(kv, 1, &seqs[s], NULL, &diag) < 0 ||
			    cw_model_eval(m, seqs[s], (uint32_t)p,
					  ids + s * N_TOK + p, 1, NULL, out,
					  &diag) < 0 ||
			    kv_client_seq_unpin(kv, 1, &seqs[s], &diag) < 0)
				goto out;
		}
	if (kv_client_stats(kv, &ks) == 0) {
		ret->spilled = ks.spill_pages_total;
		ret->restored = ks.restore_pages_total;
	}
	r = 0;
out:
	if (r < 0)
		fprintf(stderr, "run (%s): %s\n", spill ? "spill" : "full",
			diag.msg);
	cw_model_close(m);
	kv_client_close(kv);
	es_client_close(es);
	st_test_inst_stop(&t);
	st_rm_rf(t.run_dir);
	return r;
}

/* 0 when the prefix-cache logits equal the full computation's. */
static int prefix_check(const char *store, const int32_t *ids, int vocab)
{
	struct st_test_inst t;
	struct st_diag diag = { "" };
	struct es_client *es = NULL;
	struct kv_client *kv = NULL;
	struct cw_model *m = NULL;
	struct cw_model_opts mo = { ST_DTYPE_F32, 16, 1, CW_COMPUTE_REFERENCE,
				    0 };
	const char *es_args[] = { "--store", store, NULL };
	uint32_t a, b, c, cached = 0, cached_c = 0;
	float *la = malloc(sizeof(float) * 120 * (size_t)vocab);
	float *lb = malloc(sizeof(float) * 24 * (size_t)vocab);
	int r = -1;

	st_test_inst_init(&t, "prefix");
	if (!la || !lb || st_test_daemon_start(&t, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&t, "kvd", NULL, 30) < 0)
		goto out;
	if (es_client_open(t.run_dir, t.name, "t", 10000, &es, &diag) < 0 ||
	    kv_client_open(t.run_dir, t.name, "t", 10000, &kv, &diag) < 0 ||
	    cw_model_open(store, es, kv, &mo, &m, &diag) < 0)
		goto out;
	/* c: the whole prompt, no cache */
	if (kv_client_seq_create(kv, &c, &diag) < 0 ||
	    cw_model_eval(m, c, 0, ids, 120, la, NULL, &diag) < 0)
		goto out;
	/* a: the first 100 tokens, published */
	if (kv_client_seq_create_prefix(kv, ids, 100, &a, &cached, &diag) < 0 ||
	    cached != 0 ||
	    cw_model_eval(m, a, 0, ids, 100, NULL, NULL, &diag) < 0 ||
	    kv_client_seq_publish(kv, a, ids, 100, &diag) < 0)
		goto out;
	/* b: 120 tokens; 96 rows (6 full pages) come from a */
	if (kv_client_seq_create_prefix(kv, ids, 120, &b, &cached_c, &diag) < 0)
		goto out;
	if (cached_c != 96) {
		fprintf(stderr, "FAIL: %u rows mapped from the cache, expected "
			"96\n", cached_c);
		goto out;
	}
	if (cw_model_eval(m, b, 96, ids + 96, 24, lb, NULL, &diag) < 0)
		goto out;
	if (memcmp(la + (size_t)96 * vocab, lb, sizeof(float) * 24 * (size_t)vocab)) {
		fprintf(stderr, "FAIL: logits with the prefix cache differ\n");
		goto out;
	}
	printf("prefix cache: 96 of 120 rows mapped, the last 24 positions' "
	       "logits bit-identical to a full computation\n");
	r = 0;
out:
	if (r < 0 && diag.msg[0])
		fprintf(stderr, "prefix check: %s\n", diag.msg);
	cw_model_close(m);
	kv_client_close(kv);
	es_client_close(es);
	st_test_inst_stop(&t);
	st_rm_rf(t.run_dir);
	free(la);
	free(lb);
	return r;
}

int main(void)
{
	char model[4200], tmp[4096], store[4200], path[4400], *text;
	struct es_convert_opts o;
	struct st_diag diag = { "" };
	struct st_tokenizer *tok;
	struct run full = { 0 }, small = { 0 };
	int32_t *all_ids;
	size_t n_ids, len;
	const int vocab = 2048; /* kjv-moe */
	size_t n = (size_t)N_SEQ * N_TOK * vocab;
	int fail = 0;

	snprintf(model, sizeof(model), "%s/models/kjv-moe", st_test_source_dir());
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(store, sizeof(store), "%s/store", tmp);
	es_convert_opts_init(&o);
	o.expert_dtype = ST_DTYPE_BF16;
	snprintf(path, sizeof(path), "%s/valid-small.txt", model);
	if (es_convert(model, store, &o, &diag) < 0 ||
	    st_read_file(path, &text, &len) < 0 ||
	    st_tokenizer_load(store, &tok, &diag) < 0 ||
	    st_tokenizer_encode(tok, text, len, 0, 0, &all_ids, &n_ids) < 0 ||
	    n_ids < N_SEQ * N_TOK) {
		fprintf(stderr, "setup: %s\n", diag.msg);
		return 1;
	}
	full.logits = malloc(n * sizeof(float));
	small.logits = malloc(n * sizeof(float));
	if (run_once(store, all_ids, vocab, "64MiB", NULL, &full) < 0 ||
	    run_once(store, all_ids, vocab, "384KiB", "4MiB", &small) < 0)
		return 1;
	printf("quarter budget: %llu pages spilled, %llu restored\n",
	       (unsigned long long)small.spilled,
	       (unsigned long long)small.restored);
	if (small.spilled == 0 || small.restored == 0) {
		fprintf(stderr, "FAIL: the small budget never spilled\n");
		fail = 1;
	}
	if (full.spilled != 0) {
		fprintf(stderr, "FAIL: the unlimited budget spilled\n");
		fail = 1;
	}
	if (memcmp(full.logits, small.logits, n * sizeof(float))) {
		fprintf(stderr, "FAIL: logits differ between the unlimited and "
			"the quarter KV budget\n");
		fail = 1;
	} else {
		printf("%d x %d positions: logits bit-identical\n", N_SEQ, N_TOK);
	}
	if (prefix_check(store, all_ids, vocab) < 0)
		fail = 1;
	st_tokenizer_free(tok);
	free(text);
	free(all_ids);
	free(full.logits);
	free(small.logits);
	st_rm_rf(tmp);
	return fail;
}

/*
 * bitident_dump.c — writes what a refactoring must not change: for every
 * prompt of a model's reference.json, the token ids of a free-running
 * greedy generation and the raw bytes of the logits at a few positions.
 * scripts/check-bitident.sh runs it on every fixture model and compares
 * two such dumps byte for byte (issue 21: "bit-identical before and
 * after").
 *
 * Usage: bitident_dump KIND MODEL_DIR OUT_PREFIX
 *   KIND  moe-f32, moe-mxfp4, moe-fast (Mixtral / Qwen3-MoE / kjv-moe:
 *         strata convert into a temp store, real expertd and kvd, the
 *         reference or fast forward pass of cw_model.c);
 *         dsv4, dsv4-qat, dsv4-fast (cw_dsv4 from the checkpoint, no
 *         daemons; exact math but -qat: every official round trip on);
 *         dsv41, dsv41-noqat, dsv41-fast (cw_dsv41 from the checkpoint;
 *         the three KV round trips, CW_DSV41_QAT_ALL, but -noqat: exact
 *         math).  The flags are set explicitly, not the load defaults
 *         (issue 28 changed those), so the dumps stay comparable.
 * For prompt i it writes OUT_PREFIX.p<i>.ids (int32, native order: the
 * prompt, then BITIDENT_GREEDY generated ids) and OUT_PREFIX.p<i>.logits
 * (float32 rows of vocab_size, native order: prompt positions 0 and n-1,
 * then the rows the first and last generated id were chosen from).
 * Prompts: reference.json's "prompts" or "cases" (their "ids"); a model
 * without reference.json (a generated one) gets two fixed prompts.
 * Exits 0, or 1 on any error (printed).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "cw_model.h"
#include "cw_sampler.h"
#include "es_client.h"
#include "es_convert.h"
#include "kv_client.h"
#include "st_config_dsv_family.h"
#include "st_config_dsv41.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

#define BITIDENT_GREEDY 12

/* One forward pass behind a common face: eval n ids at the sequence's
 * next positions, logits of every position (all) or the last (last). */
struct runner {
	int vocab;
	int (*begin)(struct runner *r, int max_tokens);
	int (*eval)(struct runner *r, const int32_t *ids, int n, float *all,
		    float *last);
	void (*end)(struct runner *r);
	/* moe */
	struct cw_model *model;
	struct es_client *es;
	struct kv_client *kv;
	struct st_test_inst inst;
	char tmp[4096];
	uint32_t seq, pos;
	/* dsv */
	struct cw_dsv_model *m4;
	struct cw_dsv_state *s4;
	struct cw_dsv_model *m41;
	struct cw_dsv_state *s41;
};

static int moe_begin(struct runner *r, int max_tokens)
{
	struct st_diag diag = { "" };

	(void)max_tokens;
	r->pos = 0;
	if (kv_client_seq_create(r->kv, &r->seq, &diag) < 0) {
		fprintf(stderr, "seq create: %s\n", diag.msg);
		return -1;
	}
	return 0;
}

static int moe_eval(struct runner *r, const int32_t *ids, int n, float *all,
		    float *last)
{
	struct st_diag diag = { "" };
	int rc = cw_model_eval(r->model, r->seq, r->pos, ids, n, all,
			       all ? NULL : last, &diag);

	if (rc < 0) {
		fprintf(stderr, "eval: %s\n", diag.msg);
		return rc;
	}
	if (all)
		memcpy(last, all + (size_t)(n - 1) * r->vocab,
		       sizeof(float) * (size_t)r->vocab);
	r->pos += (uint32_t)n;
	return 0;
}

static void moe_end(struct runner *r)
{
	(void)r; /* sequences go with kvd */
}

static int moe_open(struct runner *r, const char *dir, const char *variant)
{
	struct es_convert_opts o;
	struct st_diag diag = { "" };
	struct cw_model_opts mo = { ST_DTYPE_F32, 16, 1, CW_COMPUTE_REFERENCE,
				    0 };
	char store[4200];
	const char *es_args[] = { "--store", store, NULL };
	const char *kv_args[] = { "--budget", "256MiB", NULL };
	int rc;

	st_test_tmpdir(r->tmp, sizeof(r->tmp));
	snprintf(store, sizeof(store), "%s/store", r->tmp);
	es_convert_opts_init(&o);
	o.expert_dtype = strcmp(variant, "f32") ? ST_DTYPE_MXFP4 : ST_DTYPE_BF16;
	if (!strcmp(variant, "fast"))
		mo.compute = CW_COMPUTE_FAST;
	rc = es_convert(dir, store, &o, &diag);
	if (rc < 0) {
		fprintf(stderr, "convert: %s\n", diag.msg);
		return rc;
	}
	st_test_inst_init(&r->inst, "bitid");
	if (st_test_daemon_start(&r->inst, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&r->inst, "kvd", kv_args, 30) < 0)
		return -1;
	rc = es_client_open(r->inst.run_dir, r->inst.name, "bitid", 10000,
			    &r->es, &diag);
	if (!rc)
		rc = kv_client_open(r->inst.run_dir, r->inst.name, "bitid",
				    10000, &r->kv, &diag);
	if (!rc)
		rc = cw_model_open(store, r->es, r->kv, &mo, &r->model, &diag);
	if (rc < 0) {
		fprintf(stderr, "open: %s (%s)\n", diag.msg, st_strerror(rc));
		return rc;
	}
	r->vocab = (int)cw_model_config(r->model)->vocab_size;
	r->begin = moe_begin;
	r->eval = moe_eval;
	r->end = moe_end;
	return 0;
}

static void moe_close(struct runner *r)
{
	cw_model_close(r->model);
	kv_client_close(r->kv);
	es_client_close(r->es);
	st_test_inst_stop(&r->inst);
	if (r->tmp[0])
		st_rm_rf(r->tmp);
	if (r->inst.run_dir[0])
		st_rm_rf(r->inst.run_dir);
}

/* After a DeepSeek eval: its error printed, or the last position's logits
 * copied out of `all` (n x vocab floats) into `last` when all rows came. */
static int eval_done(const struct runner *r, int rc, const struct st_diag *diag,
		     int n, const float *all, float *last)
{
	if (rc < 0) {
		fprintf(stderr, "eval: %s\n", diag->msg);
		return rc;
	}
	if (all)
		memcpy(last, all + (size_t)(n - 1) * r->vocab,
		       sizeof(float) * (size_t)r->vocab);
	return 0;
}

static int dsv4_begin(struct runner *r, int max_tokens)
{
	return cw_dsv_state_new(r->m4, max_tokens, &r->s4);
}

static int dsv4_eval(struct runner *r, const int32_t *ids, int n, float *all,
		     float *last)
{
	struct st_diag diag = { "" };
	int rc = cw_dsv_eval(r->m4, r->s4, ids, n, all != NULL,
			      all ? all : last, &diag);

	return eval_done(r, rc, &diag, n, all, last);
}

static void dsv4_end(struct runner *r)
{
	cw_dsv_state_free(r->s4);
	r->s4 = NULL;
}

static int dsv41_begin(struct runner *r, int max_tokens)
{
	return cw_dsv_state_new(r->m41, max_tokens, &r->s41);
}

static int dsv41_eval(struct runner *r, const int32_t *ids, int n, float *all,
		      float *last)
{
	struct st_diag diag = { "" };
	int rc = cw_dsv_eval(r->m41, r->s41, ids, n, all != NULL,
			       all ? all : last, &diag);

	return eval_done(r, rc, &diag, n, all, last);
}

static void dsv41_end(struct runner *r)
{
	cw_dsv_state_free(r->s41);
	r->s41 = NULL;
}

static int dsv_open(struct runner *r, const char *dir, const char *kind)
{
	struct st_diag diag = { "" };
	enum cw_compute mode = strstr(kind, "-fast") ? CW_COMPUTE_FAST :
						       CW_COMPUTE_REFERENCE;
	int rc;

	if (!strncmp(kind, "dsv41", 5)) {
		rc = cw_dsv_load(dir, ST_DSV_REV_V41, mode, &r->m41, &diag);
		if (!rc)
			rc = cw_dsv_set_qat(r->m41,
					    strcmp(kind, "dsv41-noqat") ?
					    CW_DSV41_QAT_ALL : 0);
		if (!rc)
			r->vocab = (int)cw_dsv_config(r->m41)->vocab_size;
		r->begin = dsv41_begin;
		r->eval = dsv41_eval;
		r->end = dsv41_end;
	} else {
		rc = cw_dsv_load(dir, ST_DSV_REV_V4, mode, &r->m4, &diag);
		if (!rc)
			rc = cw_dsv_set_qat(r->m4, strcmp(kind, "dsv4-qat") ?
					    0 : CW_DSV4_QAT_OFFICIAL);
		if (!rc)
			r->vocab = (int)cw_dsv_config(r->m4)->vocab_size;
		r->begin = dsv4_begin;
		r->eval = dsv4_eval;
		r->end = dsv4_end;
	}
	if (rc < 0)
		fprintf(stderr, "load %s: %s (%s)\n", dir, diag.msg,
			st_strerror(rc));
	return rc;
}

/* Writes n bytes of p to path; 0 or -1 (printed). */
static int write_bytes(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");

	if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
		perror(path);
		return -1;
	}
	return 0;
}

/* Prompt i of ids[n]: all logits, BITIDENT_GREEDY free-running greedy
 * steps, the two files.  0 or -1. */
static int dump_prompt(struct runner *r, const int32_t *prompt, int n,
		       const char *prefix, int i)
{
	size_t V = (size_t)r->vocab, row = V * sizeof(float);
	int32_t *ids = calloc((size_t)n + BITIDENT_GREEDY, sizeof(int32_t));
	float *all = malloc(row * (size_t)n), *last = malloc(row);
	float *keep = malloc(row * 4);
	char path[4300];
	int rc = -1;

	if (!ids || !all || !last || !keep || r->begin(r, n + BITIDENT_GREEDY) < 0)
		goto out;
	memcpy(ids, prompt, sizeof(int32_t) * (size_t)n);
	if (r->eval(r, ids, n, all, last) < 0)
		goto out;
	memcpy(keep, all, row);
	memcpy(keep + V, all + (size_t)(n - 1) * V, row);
	for (int g = 0; g < BITIDENT_GREEDY; g++) {
		ids[n + g] = cw_argmax(last, (int)V);
		if (g == 0)
			memcpy(keep + 2 * V, last, row);
		if (g + 1 == BITIDENT_GREEDY) {
			memcpy(keep + 3 * V, last, row);
			break;
		}
		if (r->eval(r, &ids[n + g], 1, NULL, last) < 0)
			goto out;
	}
	snprintf(path, sizeof(path), "%s.p%d.ids", prefix, i);
	if (write_bytes(path, ids, sizeof(int32_t) * (size_t)(n + BITIDENT_GREEDY)) < 0)
		goto out;
	snprintf(path, sizeof(path), "%s.p%d.logits", prefix, i);
	if (write_bytes(path, keep, row * 4) < 0)
		goto out;
	rc = 0;
out:
	if (r->end)
		r->end(r);
	free(ids);
	free(all);
	free(last);
	free(keep);
	return rc;
}

int main(int argc, char **argv)
{
	struct runner r;
	json_t *ref, *prompts, *p;
	json_error_t jerr;
	char path[4200];
	size_t i;
	int rc;

	if (argc != 4) {
		fprintf(stderr, "usage: %s KIND MODEL_DIR OUT_PREFIX\n", argv[0]);
		return 1;
	}
	memset(&r, 0, sizeof(r));
	snprintf(path, sizeof(path), "%s/reference.json", argv[2]);
	ref = json_load_file(path, 0, &jerr);
	if (!ref) {
		/* a generated model: two fixed prompts of small ids */
		printf("%s: %s; fixed prompts\n", path, jerr.text);
		ref = json_pack("{s:[{s:[i,i,i,i,i,i]},{s:[i,i,i,i,i,i,i,i,i,i,i]}]}",
				"prompts", "ids", 1, 17, 42, 7, 99, 3, "ids", 1,
				5, 9, 13, 200, 31, 8, 8, 64, 2, 11);
	}
	prompts = json_object_get(ref, "prompts");
	if (!prompts)
		prompts = json_object_get(ref, "cases");
	if (!json_is_array(prompts)) {
		fprintf(stderr, "%s: no prompts or cases\n", path);
		return 1;
	}
	rc = !strncmp(argv[1], "moe-", 4) ? moe_open(&r, argv[2], argv[1] + 4) :
	     !strncmp(argv[1], "dsv4", 4) ? dsv_open(&r, argv[2], argv[1]) : -1;
	if (rc == -1 && strncmp(argv[1], "moe-", 4) && strncmp(argv[1], "dsv4", 4))
		fprintf(stderr, "unknown kind %s\n", argv[1]);
	json_array_foreach(prompts, i, p) {
		const json_t *jids = json_object_get(p, "ids");
		int n = (int)json_array_size(jids);
		int32_t *ids;

		if (rc < 0)
			break;
		ids = calloc((size_t)n + 1, sizeof(int32_t));
		if (!ids || n == 0) {
			free(ids);
			rc = -1;
			break;
		}
		for (int j = 0; j < n; j++)
			ids[j] = (int32_t)json_integer_value(json_array_get(jids, (size_t)j));
		rc = dump_prompt(&r, ids, n, argv[3], (int)i);
		free(ids);
	}
	if (r.model || r.inst.name[0])
		moe_close(&r);
	cw_dsv_free(r.m4);
	cw_dsv_free(r.m41);
	json_decref(ref);
	if (rc < 0) {
		fprintf(stderr, "%s %s: failed\n", argv[1], argv[2]);
		return 1;
	}
	printf("%s %s: %zu prompts dumped\n", argv[1], argv[2],
	       json_array_size(prompts));
	return 0;
}

/*
 * serve_setup.h — what the C serve tests (test_batch_eval.c,
 * test_expert_overlap.c, test_spec_gen.c) set up alike: a fixture model
 * converted into a temp store, a real expertd and kvd serving it, a
 * client of each and the model open on them.
 */
#ifndef SERVE_SETUP_H
#define SERVE_SETUP_H

#include "cw_model.h"
#include "test_daemons.h"

struct es_client;
struct kv_client;
struct es_convert_opts;

/* One served store; every pointer owned (st_test_serve_close). */
struct st_test_serve {
	char model_dir[4096];  /* ../shared fixture */
	char tmp[4096];        /* temp directory holding the store */
	char store[4200];      /* <tmp>/store */
	struct st_test_inst inst;
	struct es_client *es;
	struct kv_client *kv;
	struct cw_model *m;
};

/*
 * Converts ../shared fixture `fixture` (exits 77 without it) with the
 * options o (NULL: es_convert_opts_init's) into t->store, starts expertd
 * with --store and es_args, kvd with kv_args (NULL-terminated, at most 12
 * entries; NULL: none) for an instance tagged `tag`, and opens the
 * clients ("test") and the model with mo.  0, or -1 after printing
 * "FAIL: <what>: <why>" (daemons started are stopped).
 */
int st_test_serve_open(struct st_test_serve *t, const char *fixture,
		       const struct es_convert_opts *o, const char *tag,
		       const char *const *es_args, const char *const *kv_args,
		       const struct cw_model_opts *mo);

/* Closes the model and clients, stops the daemons and removes the temp
 * store (a zeroed or failed t is fine). */
void st_test_serve_close(struct st_test_serve *t);

#endif

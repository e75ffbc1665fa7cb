/*
 * serve_setup.c — see serve_setup.h.
 */
#include "serve_setup.h"

#include <stdio.h>
#include <string.h>

#include "es_client.h"
#include "es_convert.h"
#include "kv_client.h"
#include "st_util.h"
#include "test_util.h"

int st_test_serve_open(struct st_test_serve *t, const char *fixture,
		       const struct es_convert_opts *o, const char *tag,
		       const char *const *es_args, const char *const *kv_args,
		       const struct cw_model_opts *mo)
{
	const char *args[16] = { "--store", t->store };
	const char *none[1] = { NULL };
	struct es_convert_opts def;
	struct st_diag diag = { "" };
	int n = 2, r;

	memset(t, 0, sizeof(*t));
	for (int i = 0; es_args && es_args[i] && n < 15; i++)
		args[n++] = es_args[i];
	args[n] = NULL;
	st_test_fixture_model(fixture, t->model_dir, sizeof(t->model_dir));
	st_test_tmpdir(t->tmp, sizeof(t->tmp));
	snprintf(t->store, sizeof(t->store), "%s/store", t->tmp);
	if (!o) {
		es_convert_opts_init(&def);
		o = &def;
	}
	r = es_convert(t->model_dir, t->store, o, &diag);
	if (r < 0) {
		printf("FAIL: convert %s: %s\n", fixture, diag.msg);
		return -1;
	}
	st_test_inst_init(&t->inst, tag);
	if (st_test_daemon_start(&t->inst, "expertd", args, 30) < 0 ||
	    st_test_daemon_start(&t->inst, "kvd", kv_args ? kv_args : none,
				 30) < 0) {
		printf("FAIL: setup: a daemon did not start\n");
		st_test_serve_close(t);
		return -1;
	}
	r = es_client_open(t->inst.run_dir, t->inst.name, "test", 10000,
			   &t->es, &diag);
	if (!r)
		r = kv_client_open(t->inst.run_dir, t->inst.name, "test",
				   10000, &t->kv, &diag);
	if (!r)
		r = cw_model_open(t->store, t->es, t->kv, mo, &t->m, &diag);
	if (r < 0) {
		printf("FAIL: setup: %s\n", diag.msg);
		st_test_serve_close(t);
		return -1;
	}
	return 0;
}

void st_test_serve_close(struct st_test_serve *t)
{
	cw_model_close(t->m);
	kv_client_close(t->kv);
	es_client_close(t->es);
	t->m = NULL;
	t->kv = NULL;
	t->es = NULL;
	if (t->inst.run_dir[0]) {
		st_test_inst_stop(&t->inst);
		st_rm_rf(t->inst.run_dir);
	}
	if (t->tmp[0])
		st_rm_rf(t->tmp);
	t->tmp[0] = 0;
	t->inst.run_dir[0] = 0;
}

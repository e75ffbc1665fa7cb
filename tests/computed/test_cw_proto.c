/*
 * test_cw_proto.c — computed answers malformed messages of every type with
 * an error reply and keeps serving: after the garbage, a valid generation
 * through the same daemon gives the reference greedy tokens.
 * Real expertd, kvd and computed on a private instance (tiny-mixtral,
 * experts BF16, reference mode).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_client.h"
#include "cw_gen.h"
#include "cw_proto.h"
#include "es_convert.h"
#include "st_daemon.h"
#include "st_msg.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define CHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "FAIL: " __VA_ARGS__);                 \
			fputc('\n', stderr);                                   \
			n_fail++;                                              \
		}                                                              \
	} while (0)

/* Sends raw bytes, returns the reply's status (or a transport error). */
static int raw_call(struct st_sock *s, const void *buf, size_t len)
{
	struct st_msg_header h;
	void *rep;
	size_t rl;
	int r = st_sock_send(s, buf, len);

	if (r < 0)
		return r;
	r = st_sock_recv(s, &rep, &rl);
	if (r < 0)
		return r;
	r = st_proto_decode_header(rep, rl, &h);
	free(rep);
	return r < 0 ? r : h.status;
}

static int call_payload(struct st_sock *s, uint16_t type, const void *p,
			size_t n)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	st_proto_encode(&w, type, 99, 0, 0, p, n);
	r = raw_call(s, w.data, w.len);
	st_wbuf_fini(&w);
	return r;
}

static void gen_start_payload(struct st_wbuf *w, uint32_t max_tokens,
			      float temp, float top_p, uint32_t flags,
			      uint32_t n_stop, const char *prompt)
{
	st_wbuf_init(w);
	st_wbuf_u32(w, max_tokens);
	st_wbuf_f32(w, temp);
	st_wbuf_i32(w, 0);
	st_wbuf_f32(w, top_p);
	st_wbuf_u64(w, 1);
	st_wbuf_u32(w, flags);
	st_wbuf_u32(w, n_stop);
	for (uint32_t i = 0; i < n_stop && i < 8; i++)
		st_wbuf_str(w, "x");
	st_wbuf_str(w, prompt);
}

int main(void)
{
	char model[4096], tmp[4096], store[4200], ctl[4400], refp[4200];
	struct st_test_inst t;
	struct es_convert_opts o;
	struct st_diag diag = { "" };
	struct st_sock s;
	struct st_wbuf w;
	json_t *ref;
	const char *es_args[] = { "--store", store, NULL };
	const char *cw_args[] = { "--store", store, NULL };
	uint8_t buf[64];
	int r;

	st_test_fixture_model("tiny-mixtral", model, sizeof(model));
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(store, sizeof(store), "%s/store", tmp);
	es_convert_opts_init(&o);
	o.expert_dtype = ST_DTYPE_BF16;
	if (es_convert(model, store, &o, &diag) < 0) {
		fprintf(stderr, "convert: %s\n", diag.msg);
		return 1;
	}
	st_test_inst_init(&t, "cwp");
	if (st_test_daemon_start(&t, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&t, "kvd", NULL, 30) < 0 ||
	    st_test_daemon_start(&t, "computed", cw_args, 60) < 0) {
		st_test_inst_stop(&t);
		return 1;
	}
	st_run_path(t.run_dir, "computed", "ctl", ctl, sizeof(ctl));
	if (st_sock_open(&s, ST_SOCK_REQ, ctl, 5000, 10000) < 0) {
		st_test_inst_stop(&t);
		return 1;
	}

	/* header-level garbage */
	memset(buf, 0xab, sizeof(buf));
	r = raw_call(&s, buf, 10);
	CHECK(r < 0, "truncated header: status %d", r);
	st_wbuf_init(&w);
	st_proto_encode(&w, ST_MSG_PING, 1, 0, 0, NULL, 0);
	w.data[0] ^= 0xff; /* magic */
	CHECK(raw_call(&s, w.data, w.len) == -ST_E_BADMAGIC, "bad magic");
	w.data[0] ^= 0xff;
	w.data[4] = 9; /* version */
	CHECK(raw_call(&s, w.data, w.len) == -ST_E_VERSION, "bad version");
	w.data[4] = ST_PROTO_VERSION;
	w.data[24] = 5; /* payload_len lies */
	CHECK(raw_call(&s, w.data, w.len) == -ST_E_PROTO, "payload length lie");
	st_wbuf_fini(&w);
	CHECK(call_payload(&s, 0x03ff, NULL, 0) == -ST_E_PROTO, "unknown type");

	/* GEN_START: truncated, out-of-range fields, trailing bytes */
	gen_start_payload(&w, 4, 0, 1, CW_GEN_F_ADD_SPECIAL, 0, "hello");
	for (size_t cut = 0; cut < w.len; cut += 3)
		CHECK(call_payload(&s, CW_MSG_GEN_START, w.data, cut) == -ST_E_PROTO,
		      "GEN_START truncated to %zu bytes accepted", cut);
	st_wbuf_u8(&w, 0);
	CHECK(call_payload(&s, CW_MSG_GEN_START, w.data, w.len) == -ST_E_PROTO,
	      "GEN_START with a trailing byte accepted");
	st_wbuf_fini(&w);
	gen_start_payload(&w, 4, NAN, 1, 0, 0, "hello");
	CHECK(call_payload(&s, CW_MSG_GEN_START, w.data, w.len) == -ST_E_PROTO,
	      "NaN temperature accepted");
	st_wbuf_fini(&w);
	gen_start_payload(&w, 4, 0, 2.0f, 0, 0, "hello");
	CHECK(call_payload(&s, CW_MSG_GEN_START, w.data, w.len) == -ST_E_PROTO,
	      "top_p 2 accepted");
	st_wbuf_fini(&w);
	gen_start_payload(&w, 4, 0, 1, 0x80, 0, "hello");
	CHECK(call_payload(&s, CW_MSG_GEN_START, w.data, w.len) == -ST_E_PROTO,
	      "unknown flag accepted");
	st_wbuf_fini(&w);
	/* a draft length past CW_PROTO_MAX_DRAFT (field D + 1) */
	gen_start_payload(&w, 4, 0, 1,
			  (CW_PROTO_MAX_DRAFT + 2u) << CW_GEN_F_DRAFT_SHIFT, 0,
			  "hello");
	CHECK(call_payload(&s, CW_MSG_GEN_START, w.data, w.len) == -ST_E_PROTO,
	      "draft length %d accepted", CW_PROTO_MAX_DRAFT + 1);
	st_wbuf_fini(&w);
	gen_start_payload(&w, 4, 0, 1, 0, 5, "hello");
	CHECK(call_payload(&s, CW_MSG_GEN_START, w.data, w.len) == -ST_E_PROTO,
	      "5 stop strings accepted");
	st_wbuf_fini(&w);
	gen_start_payload(&w, 4, 0, 1, 0, 0, "");
	CHECK(call_payload(&s, CW_MSG_GEN_START, w.data, w.len) == -EINVAL,
	      "empty prompt (no tokens without BOS) not refused with EINVAL");
	st_wbuf_fini(&w);
	{
		/* "a a a ...": about 200000 tokens, beyond tiny-mixtral's
		 * context of 32768 */
		size_t nb = 400000;
		char *big = malloc(nb + 1);

		for (size_t i = 0; i < nb; i++)
			big[i] = i % 2 ? ' ' : 'a';
		big[nb] = 0;
		gen_start_payload(&w, 4, 0, 1, 0, 0, big);
		r = call_payload(&s, CW_MSG_GEN_START, w.data, w.len);
		CHECK(r == -ST_E_LIMIT, "prompt beyond the context: status %d", r);
		st_wbuf_fini(&w);
		free(big);
	}

	/* GEN_NEXT / GEN_END */
	CHECK(call_payload(&s, CW_MSG_GEN_NEXT, NULL, 0) == -ST_E_PROTO,
	      "GEN_NEXT without id");
	memset(buf, 0, 8);
	buf[0] = 77;
	CHECK(call_payload(&s, CW_MSG_GEN_NEXT, buf, 4) == -ST_E_NOTFOUND,
	      "GEN_NEXT unknown id");
	CHECK(call_payload(&s, CW_MSG_GEN_NEXT, buf, 6) == -ST_E_PROTO,
	      "GEN_NEXT 6-byte payload");
	CHECK(call_payload(&s, CW_MSG_GEN_END, buf, 2) == -ST_E_PROTO,
	      "GEN_END 2-byte payload");
	CHECK(call_payload(&s, CW_MSG_GEN_END, buf, 4) == 0,
	      "GEN_END of an unknown id is idempotent");
	st_sock_close(&s);

	/* still serving: a greedy generation equals the reference */
	snprintf(refp, sizeof(refp), "%s/reference.json", model);
	ref = json_load_file(refp, 0, NULL);
	{
		json_t *p0 = json_array_get(json_object_get(ref, "prompts"), 0);
		json_t *greedy = json_object_get(p0, "greedy_f32");
		struct cw_client *c;
		struct cw_gen_start_msg m = { 0 };
		uint32_t id, n_prompt;

		m.max_tokens = 8;
		m.top_p = 1;
		m.flags = CW_GEN_F_ADD_SPECIAL | CW_GEN_F_IGNORE_EOS;
		m.prompt = (char *)json_string_value(json_object_get(p0, "text"));
		r = cw_client_open(t.run_dir, 30000, &c, &diag);
		CHECK(r == 0, "client open: %s", diag.msg);
		r = cw_client_gen_start(c, &m, &id, &n_prompt, NULL, &diag);
		CHECK(r == 0, "valid GEN_START after garbage: %s", diag.msg);
		CHECK(n_prompt == json_array_size(json_object_get(p0, "ids")),
		      "prompt tokens %u", n_prompt);
		for (int i = 0; r == 0 && i < 8; i++) {
			int32_t tok;
			uint32_t fin;
			char *text;

			r = cw_client_gen_next(c, id, &tok, &fin, &text, &diag);
			CHECK(r == 0, "GEN_NEXT: %s", diag.msg);
			if (r)
				break;
			CHECK(tok == json_integer_value(json_array_get(greedy, i)),
			      "step %d: token %d vs reference %lld", i, tok,
			      (long long)json_integer_value(json_array_get(greedy, i)));
			CHECK((fin == CW_FINISH_LENGTH) == (i == 7),
			      "finish %u at step %d", fin, i);
			free(text);
		}
		cw_client_gen_end(c, id);
		cw_client_close(c);
	}
	json_decref(ref);
	st_test_inst_stop(&t);
	CHECK(st_test_count_segments(t.name) == 0, "segments left behind");
	st_rm_rf(tmp);
	st_rm_rf(t.run_dir);
	if (n_fail)
		fprintf(stderr, "%d check(s) failed\n", n_fail);
	else
		printf("computed answered every malformed message and kept "
		       "serving\n");
	return n_fail ? 1 : 0;
}

/*
 * test_kv_proto.c — kvd's wire messages (suite unit): every message
 * survives an encode/decode round trip with its values; every shorter or
 * longer payload, and every field out of range, is refused with the right
 * code instead of being read past its end.  Also the prefix-cache key
 * chain (kv_prefix_keys) against an independent computation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <stdio.h>

#include "kv_proto.h"
#include "kv_session_proto.h"
#include "st_util.h"

/* Every prefix of a valid payload is refused (and never read past). */
static void check_prefixes(const struct st_wbuf *w,
			   int (*dec)(const uint8_t *, size_t, void *),
			   void *out)
{
	for (size_t n = 0; n < w->len; n++) {
		uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan-able */

		memcpy(copy, w->data, n);
		assert_true(dec(copy, n, out) < 0);
		free(copy);
	}
}

static int dec_hello(const uint8_t *p, size_t n, void *o)
{
	return kv_proto_decode_hello(p, n, o, NULL);
}

static int dec_declare(const uint8_t *p, size_t n, void *o)
{
	return kv_proto_decode_declare(p, n, o, NULL);
}

static int dec_fork(const uint8_t *p, size_t n, void *o)
{
	return kv_proto_decode_fork(p, n, o, NULL);
}

static int dec_truncate(const uint8_t *p, size_t n, void *o)
{
	return kv_proto_decode_truncate(p, n, o, NULL);
}

static int dec_demand(const uint8_t *p, size_t n, void *o)
{
	return kv_proto_decode_demand(p, n, o, NULL);
}

static int dec_stats(const uint8_t *p, size_t n, void *o)
{
	return kv_proto_decode_stats(p, n, o);
}

static int dec_reserve(const uint8_t *p, size_t n, void *o)
{
	struct kv_reserve_entry *e = NULL;
	int r = kv_proto_decode_reserve(p, n, o, &e, NULL);

	free(e);
	return r;
}

static void test_hello(void **state)
{
	struct kv_msg_hello m = { .pid = 4242, .proto_version = ST_PROTO_VERSION,
				  .name = "computed-0",
				  .start_ticks = 0x123456789ull }, o;
	struct kv_msg_hello_reply rr = { 77, 5, 0x5eed }, ro;
	struct kv_msg_ping_reply pr = { 9, 3, 1 }, po;
	struct st_wbuf w;
	struct st_diag d;

	(void)state;
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &m);
	assert_int_equal(w.len, 48);
	assert_int_equal(kv_proto_decode_hello(w.data, w.len, &o, &d), 0);
	assert_int_equal(o.pid, 4242);
	assert_int_equal(o.start_ticks, 0x123456789ull);
	assert_string_equal(o.name, "computed-0");
	assert_int_equal(o.resume_client_id, 0);
	check_prefixes(&w, dec_hello, &o);
	st_wbuf_fini(&w);
	/* with a resume id; a full 32-character name */
	m.resume_client_id = 31;
	memset(m.name, 'n', 32);
	m.name[32] = 0;
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &m);
	assert_int_equal(w.len, 52);
	assert_int_equal(kv_proto_decode_hello(w.data, w.len, &o, &d), 0);
	assert_int_equal(o.resume_client_id, 31);
	assert_int_equal(strlen(o.name), 32);
	/* two extra bytes, a bad byte after the NUL, a control character */
	st_wbuf_u16(&w, 0);
	assert_int_equal(kv_proto_decode_hello(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	w.len -= 2;
	w.data[8 + 5] = 0;
	w.data[8 + 6] = 'x';
	assert_int_equal(kv_proto_decode_hello(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "byte 6"));
	memset(w.data + 8 + 5, 0, 32 - 5);
	assert_int_equal(kv_proto_decode_hello(w.data, w.len, &o, &d), 0);
	assert_string_equal(o.name, "nnnnn");
	w.data[8] = 0x07;
	assert_int_equal(kv_proto_decode_hello(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	w.data[8] = 'n';
	w.data[4] = ST_PROTO_VERSION + 1; /* protocol version */
	assert_int_equal(kv_proto_decode_hello(w.data, w.len, &o, &d),
			 -ST_E_VERSION);
	w.data[4] = ST_PROTO_VERSION;
	memset(w.data, 0, 4); /* pid 0 */
	assert_int_equal(kv_proto_decode_hello(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	kv_proto_encode_hello_reply(&w, &rr);
	assert_int_equal(kv_proto_decode_hello_reply(w.data, w.len, &ro), 0);
	assert_int_equal(ro.client_id, 77);
	assert_int_equal(ro.epoch, 5);
	assert_int_equal(ro.pool_id, 0x5eed);
	assert_int_equal(kv_proto_decode_hello_reply(w.data, w.len - 1, &ro),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	kv_proto_encode_ping_reply(&w, &pr);
	assert_int_equal(kv_proto_decode_ping_reply(w.data, w.len, &po), 0);
	assert_int_equal(po.pid, 9);
	assert_int_equal(po.epoch, 3);
	assert_int_equal(po.ready, 1);
	st_wbuf_u8(&w, 0);
	assert_int_equal(kv_proto_decode_ping_reply(w.data, w.len, &po),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
}

static void test_declare(void **state)
{
	struct kv_msg_declare *m = calloc(1, sizeof(*m)), *o = malloc(sizeof(*o));
	struct kv_msg_declare_reply r = { 0x1122334455667788ull, 4, 1 << 22,
					      0x600d },
				    ro;
	struct st_wbuf w;
	struct st_diag d;

	(void)state;
	m->n_streams = 3;
	m->page_rows = 16;
	m->streams[0] = (struct kv_stream_decl){ 576, 1, 0, 0 };
	m->streams[1] = (struct kv_stream_decl){ 128, 4, 128, 0 };
	m->streams[2] = (struct kv_stream_decl){ 1, 1, 0, 1 };
	st_wbuf_init(&w);
	kv_proto_encode_declare(&w, m);
	assert_int_equal(w.len, 8 + 3 * 16);
	/* the wire decoder passes supported-or-not fields through */
	assert_int_equal(kv_proto_decode_declare(w.data, w.len, o, &d), 0);
	assert_int_equal(o->n_streams, 3);
	assert_int_equal(o->page_rows, 16);
	assert_memory_equal(o->streams, m->streams, 3 * 16);
	check_prefixes(&w, dec_declare, o);
	st_wbuf_u32(&w, 0);
	assert_int_equal(kv_proto_decode_declare(w.data, w.len, o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	/* field ranges */
	m->streams[2].row_bytes = 0;
	st_wbuf_init(&w);
	kv_proto_encode_declare(&w, m);
	assert_int_equal(kv_proto_decode_declare(w.data, w.len, o, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "stream 2"));
	st_wbuf_fini(&w);
	m->streams[2].row_bytes = KV_MAX_ROW_BYTES + 1;
	st_wbuf_init(&w);
	kv_proto_encode_declare(&w, m);
	assert_int_equal(kv_proto_decode_declare(w.data, w.len, o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	m->streams[2].row_bytes = 8;
	m->page_rows = 0;
	st_wbuf_init(&w);
	kv_proto_encode_declare(&w, m);
	assert_int_equal(kv_proto_decode_declare(w.data, w.len, o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	m->page_rows = 16;
	m->n_streams = KV_MAX_STREAMS + 1; /* encoder writes 256 streams */
	st_wbuf_init(&w);
	kv_proto_encode_declare(&w, m);
	assert_int_equal(kv_proto_decode_declare(w.data, w.len, o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	kv_proto_encode_declare_reply(&w, &r);
	assert_int_equal(kv_proto_decode_declare_reply(w.data, w.len, &ro), 0);
	assert_int_equal(ro.layout_hash, r.layout_hash);
	assert_int_equal(ro.epoch, 4);
	assert_int_equal(ro.pool_bytes, 1 << 22);
	assert_int_equal(ro.pool_id, 0x600d);
	assert_int_equal(kv_proto_decode_declare_reply(w.data, 23, &ro),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	free(m);
	free(o);
}

static void test_seq_messages(void **state)
{
	struct kv_reserve_entry e[3] = { { 0x100001, 9 }, { 0x200002, 0 },
					 { 0x100001, 4096 } },
				*out = NULL;
	struct kv_msg_fork f = { 0x300005, 17 }, fo;
	struct st_wbuf w;
	struct st_diag d;
	uint32_t n, seq;

	(void)state;
	st_wbuf_init(&w);
	kv_proto_encode_reserve(&w, 3, e);
	assert_int_equal(w.len, 4 + 3 * 8);
	assert_int_equal(kv_proto_decode_reserve(w.data, w.len, &n, &out, &d), 0);
	assert_int_equal(n, 3);
	assert_memory_equal(out, e, sizeof(e));
	free(out);
	check_prefixes(&w, dec_reserve, &n);
	st_wbuf_u32(&w, 1);
	assert_int_equal(kv_proto_decode_reserve(w.data, w.len, &n, &out, &d),
			 -ST_E_PROTO);
	assert_null(out);
	st_wbuf_fini(&w);
	e[1].seq = 0;
	st_wbuf_init(&w);
	kv_proto_encode_reserve(&w, 3, e);
	assert_int_equal(kv_proto_decode_reserve(w.data, w.len, &n, &out, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "entry 1"));
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	st_wbuf_u32(&w, KV_PROTO_MAX_RESERVE + 1);
	assert_int_equal(kv_proto_decode_reserve(w.data, w.len, &n, &out, &d),
			 -ST_E_LIMIT);
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	kv_proto_encode_fork(&w, &f);
	assert_int_equal(kv_proto_decode_fork(w.data, w.len, &fo, &d), 0);
	assert_int_equal(fo.src, 0x300005);
	assert_int_equal(fo.n_rows, 17);
	check_prefixes(&w, dec_fork, &fo);
	st_wbuf_fini(&w);

	{
		struct kv_msg_truncate t = { 0x400007, 33 }, to;

		st_wbuf_init(&w);
		kv_proto_encode_truncate(&w, &t);
		assert_int_equal(w.len, 8);
		assert_int_equal(kv_proto_decode_truncate(w.data, w.len, &to,
							  &d), 0);
		assert_int_equal(to.seq, 0x400007);
		assert_int_equal(to.n_rows, 33);
		check_prefixes(&w, dec_truncate, &to);
		st_wbuf_fini(&w);
		t.seq = 0;
		st_wbuf_init(&w);
		kv_proto_encode_truncate(&w, &t);
		assert_int_equal(kv_proto_decode_truncate(w.data, w.len, &to,
							  &d), -ST_E_PROTO);
		st_wbuf_fini(&w);
	}

	{
		/* DEMAND: u64 pages, u32 requests, u64 grow; longer is refused */
		struct kv_msg_demand dm = { 0x1234567890ull, 7, 0x55 }, dmo;

		st_wbuf_init(&w);
		kv_proto_encode_demand(&w, &dm);
		assert_int_equal(w.len, 20);
		assert_int_equal(kv_proto_decode_demand(w.data, w.len, &dmo,
							&d), 0);
		assert_true(dmo.pages == 0x1234567890ull);
		assert_int_equal(dmo.n_reqs, 7);
		assert_true(dmo.grow == 0x55);
		check_prefixes(&w, dec_demand, &dmo);
		st_wbuf_u8(&w, 0);
		assert_int_equal(kv_proto_decode_demand(w.data, w.len, &dmo,
							&d), -ST_E_PROTO);
		st_wbuf_fini(&w);
	}

	st_wbuf_init(&w);
	kv_proto_encode_seq(&w, 0xabc00001);
	assert_int_equal(kv_proto_decode_seq(w.data, w.len, &seq, &d), 0);
	assert_int_equal(seq, 0xabc00001);
	assert_int_equal(kv_proto_decode_seq(w.data, 3, &seq, &d), -ST_E_PROTO);
	st_wbuf_u8(&w, 1);
	assert_int_equal(kv_proto_decode_seq(w.data, w.len, &seq, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	assert_int_equal(kv_proto_decode_empty(NULL, 0, &d), 0);
	assert_int_equal(kv_proto_decode_empty((const uint8_t *)"x", 1, &d),
			 -ST_E_PROTO);
}

static void test_stats_and_text(void **state)
{
	struct kv_msg_stats s = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 111, -12, 13,
				  14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,
				  25, 26, 27, 28, 29, 30, 31, 32, 33, 1, 35,
				  /* remote tier: on, reserved 0, counters */
				  1, 0, 36, 37, 38, 39, 40, 41, 42,
				  /* queued requests' prefixes */
				  43, 44, 45, 46 },
			    o;
	struct st_wbuf w;
	struct st_diag d;
	char long_text[2000];
	struct st_msg_header h;
	uint8_t hdr[20];

	(void)state;
	st_wbuf_init(&w);
	kv_proto_encode_stats(&w, &s);
	assert_int_equal(kv_proto_decode_stats(w.data, w.len, &o), 0);
	assert_memory_equal(&o, &s, sizeof(s));
	check_prefixes(&w, dec_stats, &o);
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	kv_proto_encode_text(&w, "pool\texhausted");
	assert_int_equal(kv_proto_decode_text(w.data, w.len, &d), 0);
	assert_string_equal(d.msg, "pool?exhausted");
	assert_int_equal(kv_proto_decode_text(w.data, w.len - 1, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	memset(long_text, 'x', sizeof(long_text) - 1);
	long_text[sizeof(long_text) - 1] = 0;
	st_wbuf_init(&w);
	kv_proto_encode_text(&w, long_text);
	assert_int_equal(w.len, 4 + KV_PROTO_MAX_TEXT);
	assert_int_equal(kv_proto_decode_text(w.data, w.len, &d), 0);
	assert_int_equal(strlen(d.msg), KV_PROTO_MAX_TEXT);
	st_wbuf_fini(&w);

	/* a header cut after the request id still names type and id */
	st_wbuf_init(&w);
	st_proto_encode(&w, KV_MSG_SEQ_FORK | ST_MSG_REPLY, 0x0102030405060708ull,
			9, 0, NULL, 0);
	memcpy(hdr, w.data, sizeof(hdr));
	st_wbuf_fini(&w);
	kv_proto_salvage_header(hdr, 16, &h);
	assert_int_equal(h.type, KV_MSG_SEQ_FORK); /* reply bit stripped */
	assert_int_equal(h.request_id, 0x0102030405060708ull);
	assert_int_equal(h.client_id, 0);
	kv_proto_salvage_header(hdr, 3, &h);
	assert_int_equal(h.magic, 0);
	assert_int_equal(h.type, 0);
}

static int dec_prefix0(const uint8_t *p, size_t n, void *o)
{
	int r = kv_proto_decode_prefix(p, n, 0, o, NULL);

	kv_msg_prefix_fini(o);
	return r;
}

static int dec_prefix1(const uint8_t *p, size_t n, void *o)
{
	int r = kv_proto_decode_prefix(p, n, 1, o, NULL);

	kv_msg_prefix_fini(o);
	return r;
}

static int dec_residency(const uint8_t *p, size_t n, void *o)
{
	struct kv_msg_residency *m = o;
	int r = kv_proto_decode_residency(p, n, m, NULL);

	free(m->seqs);
	m->seqs = NULL;
	return r;
}

static int dec_prefix_ahead(const uint8_t *p, size_t n, void *o)
{
	int r = kv_proto_decode_prefix_ahead(p, n, o, NULL);

	kv_msg_prefix_ahead_fini(o);
	return r;
}

/* PREFIX_AHEAD: chains of keys round-trip; truncations, an empty chain, a
 * key 0, bytes after the last chain and too many keys are refused; no
 * chain at all (the plan dropped) is valid. */
static void test_prefix_ahead_message(void **state)
{
	uint32_t len[2] = { 3, 1 };
	uint64_t keys[4] = { 0x1111222233334444ull, 5, UINT64_MAX, 9 };
	struct kv_msg_prefix_ahead m = { 2, len, 4, keys }, o;
	struct st_wbuf w;
	struct st_diag d;

	(void)state;
	st_wbuf_init(&w);
	kv_proto_encode_prefix_ahead(&w, &m);
	assert_int_equal(w.len, 4 + 2 * 4 + 4 * 8);
	assert_int_equal(kv_proto_decode_prefix_ahead(w.data, w.len, &o, &d),
			 0);
	assert_int_equal(o.n_chains, 2);
	assert_int_equal(o.n_keys, 4);
	assert_memory_equal(o.chain_len, len, sizeof(len));
	assert_memory_equal(o.keys, keys, sizeof(keys));
	kv_msg_prefix_ahead_fini(&o);
	check_prefixes(&w, dec_prefix_ahead, &o);
	st_wbuf_u8(&w, 0);
	assert_int_equal(kv_proto_decode_prefix_ahead(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "after the last chain"));
	st_wbuf_fini(&w);

	keys[2] = 0;
	st_wbuf_init(&w);
	kv_proto_encode_prefix_ahead(&w, &m);
	assert_int_equal(kv_proto_decode_prefix_ahead(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "key 2 is 0"));
	st_wbuf_fini(&w);
	keys[2] = 3;

	/* an empty chain */
	st_wbuf_init(&w);
	st_wbuf_u32(&w, 2);
	st_wbuf_u32(&w, 1);
	st_wbuf_u64(&w, 7);
	st_wbuf_u32(&w, 0);
	st_wbuf_u64(&w, 8);
	assert_int_equal(kv_proto_decode_prefix_ahead(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "chain 1 of 2: no keys"));
	st_wbuf_fini(&w);

	/* no chain: valid, the plan dropped */
	m.n_chains = 0;
	st_wbuf_init(&w);
	kv_proto_encode_prefix_ahead(&w, &m);
	assert_int_equal(w.len, 4);
	assert_int_equal(kv_proto_decode_prefix_ahead(w.data, w.len, &o, &d),
			 0);
	assert_int_equal(o.n_chains, 0);
	assert_int_equal(o.n_keys, 0);
	kv_msg_prefix_ahead_fini(&o);
	st_wbuf_fini(&w);

	/* one key more than a request takes */
	st_wbuf_init(&w);
	st_wbuf_u32(&w, 1);
	st_wbuf_u32(&w, KV_PROTO_MAX_AHEAD_KEYS + 1);
	for (uint32_t i = 0; i <= KV_PROTO_MAX_AHEAD_KEYS; i++)
		st_wbuf_u64(&w, i + 1);
	assert_int_equal(kv_proto_decode_prefix_ahead(w.data, w.len, &o, &d),
			 -ST_E_LIMIT);
	st_wbuf_fini(&w);
}

static void test_prefix_messages(void **state)
{
	int32_t ids[5] = { 7, -1, 0, 2147483647, 42 };
	struct kv_msg_prefix m = { 0x100003, 0x1122334455667788ull, 5, ids,
				   0 }, o;
	struct kv_msg_prefix_reply pr = { 0x200001, 48 }, pro;
	uint32_t seqs[3] = { 0x100001, 0x100002, 0x300004 }, u;
	struct kv_msg_residency rm = { KV_RESIDENCY_PIN, 3, seqs }, ro;
	int32_t status[3] = { 0, -ST_E_CHECKSUM, -ST_E_NOTFOUND }, so[3];
	struct st_wbuf w;
	struct st_diag d;

	(void)state;
	/* PUBLISH: seq, model, ids; CREATE_PREFIX: the same without seq */
	for (int has_seq = 0; has_seq <= 1; has_seq++) {
		st_wbuf_init(&w);
		kv_proto_encode_prefix(&w, has_seq, &m);
		assert_int_equal(w.len, (has_seq ? 4 : 0) + 8 + 4 + 5 * 4);
		assert_int_equal(kv_proto_decode_prefix(w.data, w.len, has_seq,
							&o, &d),
				 0);
		assert_int_equal(o.seq, has_seq ? 0x100003 : 0);
		assert_true(o.model_id == 0x1122334455667788ull);
		assert_int_equal(o.n_ids, 5);
		assert_memory_equal(o.ids, ids, sizeof(ids));
		kv_msg_prefix_fini(&o);
		check_prefixes(&w, has_seq ? dec_prefix1 : dec_prefix0, &o);
		/* one id too many (PUBLISH: two, one more u32 is its flags) */
		st_wbuf_i32(&w, 1);
		if (has_seq)
			st_wbuf_i32(&w, 1);
		assert_int_equal(kv_proto_decode_prefix(w.data, w.len, has_seq,
							&o, &d),
				 -ST_E_PROTO);
		assert_null(o.ids);
		st_wbuf_fini(&w);
	}
	/* PUBLISH's optional flags: sent when set, 0 when absent, unknown
	 * bits refused */
	m.flags = KV_PUBLISH_F_PRIVATE;
	st_wbuf_init(&w);
	kv_proto_encode_prefix(&w, 1, &m);
	assert_int_equal(w.len, 4 + 8 + 4 + 5 * 4 + 4);
	assert_int_equal(kv_proto_decode_prefix(w.data, w.len, 1, &o, &d), 0);
	assert_int_equal(o.flags, KV_PUBLISH_F_PRIVATE);
	assert_memory_equal(o.ids, ids, sizeof(ids));
	kv_msg_prefix_fini(&o);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	kv_proto_encode_prefix(&w, 0, &m); /* CREATE_PREFIX: no flags */
	assert_int_equal(w.len, 8 + 4 + 5 * 4);
	st_wbuf_fini(&w);
	m.flags = 0x80;
	st_wbuf_init(&w);
	kv_proto_encode_prefix(&w, 1, &m);
	assert_int_equal(kv_proto_decode_prefix(w.data, w.len, 1, &o, &d),
			 -ST_E_PROTO);
	assert_null(o.ids);
	st_wbuf_fini(&w);
	m.flags = 0;
	m.n_ids = 0;
	st_wbuf_init(&w);
	kv_proto_encode_prefix(&w, 0, &m);
	assert_int_equal(kv_proto_decode_prefix(w.data, w.len, 0, &o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	st_wbuf_u64(&w, 1);
	st_wbuf_u32(&w, KV_PROTO_MAX_IDS + 1);
	assert_int_equal(kv_proto_decode_prefix(w.data, w.len, 0, &o, &d),
			 -ST_E_LIMIT);
	st_wbuf_fini(&w);
	m.n_ids = 1;
	m.seq = 0;
	st_wbuf_init(&w);
	kv_proto_encode_prefix(&w, 1, &m);
	assert_int_equal(kv_proto_decode_prefix(w.data, w.len, 1, &o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	kv_proto_encode_prefix_reply(&w, &pr);
	assert_int_equal(kv_proto_decode_prefix_reply(w.data, w.len, &pro), 0);
	assert_int_equal(pro.seq, 0x200001);
	assert_int_equal(pro.n_cached, 48);
	assert_int_equal(kv_proto_decode_prefix_reply(w.data, 7, &pro),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	kv_proto_encode_u32(&w, 77);
	assert_int_equal(kv_proto_decode_u32(w.data, w.len, &u), 0);
	assert_int_equal(u, 77);
	st_wbuf_u8(&w, 0);
	assert_int_equal(kv_proto_decode_u32(w.data, w.len, &u), -ST_E_PROTO);
	st_wbuf_fini(&w);

	/* SEQ_RESIDENCY and its reply */
	st_wbuf_init(&w);
	kv_proto_encode_residency(&w, &rm);
	assert_int_equal(kv_proto_decode_residency(w.data, w.len, &ro, &d), 0);
	assert_int_equal(ro.op, KV_RESIDENCY_PIN);
	assert_int_equal(ro.n, 3);
	assert_memory_equal(ro.seqs, seqs, sizeof(seqs));
	free(ro.seqs);
	check_prefixes(&w, dec_residency, &ro);
	st_wbuf_fini(&w);
	for (uint32_t op = 0; op <= KV_RESIDENCY_AHEAD + 1;
	     op += KV_RESIDENCY_AHEAD + 1) {
		rm.op = op;
		st_wbuf_init(&w);
		kv_proto_encode_residency(&w, &rm);
		assert_int_equal(kv_proto_decode_residency(w.data, w.len, &ro,
							   &d),
				 -ST_E_PROTO);
		assert_non_null(strstr(d.msg, "operation"));
		st_wbuf_fini(&w);
	}
	rm.op = KV_RESIDENCY_RESTORE;
	seqs[2] = 0;
	st_wbuf_init(&w);
	kv_proto_encode_residency(&w, &rm);
	assert_int_equal(kv_proto_decode_residency(w.data, w.len, &ro, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "entry 2"));
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	kv_proto_encode_status_list(&w, 3, status, NULL);
	assert_int_equal(kv_proto_decode_status_list(w.data, w.len, 3, so, &d),
			 0);
	assert_memory_equal(so, status, sizeof(status));
	assert_int_equal(kv_proto_decode_status_list(w.data, w.len, 2, so, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	kv_proto_encode_status_list(&w, 3, status, "sequence 0x100002 failed");
	memset(&d, 0, sizeof(d));
	assert_int_equal(kv_proto_decode_status_list(w.data, w.len, 3, so, &d),
			 0);
	assert_string_equal(d.msg, "sequence 0x100002 failed");
	assert_int_equal(kv_proto_decode_status_list(w.data, w.len - 1, 3, so,
						     &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	status[0] = 5; /* a positive status is not a status */
	st_wbuf_init(&w);
	kv_proto_encode_status_list(&w, 3, status, NULL);
	assert_int_equal(kv_proto_decode_status_list(w.data, w.len, 3, so, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
}

/* key = XXH3-64(parent u64 LE | ids i32 LE | model u64 LE), built here
 * byte by byte, independently of kv_prefix_keys' loop. */
static uint64_t ref_key(uint64_t parent, const int32_t *ids, uint32_t n,
			uint64_t model)
{
	uint8_t buf[8 + 64 * 4 + 8];
	size_t o = 0;
	uint64_t h;

	assert_true(n <= 64);
	for (int b = 0; b < 8; b++)
		buf[o++] = (uint8_t)(parent >> (8 * b));
	for (uint32_t i = 0; i < n; i++)
		for (int b = 0; b < 4; b++)
			buf[o++] = (uint8_t)((uint32_t)ids[i] >> (8 * b));
	for (int b = 0; b < 8; b++)
		buf[o++] = (uint8_t)(model >> (8 * b));
	h = st_xxh3(buf, o);
	return h ? h : 1;
}

/* KV_MSG_SESSION (kv_session_proto.h): round trip, every cut refused, the
 * ids only with SAVE, bad names, the LIST reply. */
static void test_session_messages(void **state)
{
	int32_t ids[3] = { 5, -7, 1 << 30 };
	struct kv_msg_session m = { .op = KV_SESSION_SAVE, .name = "chat-1",
				    .ident = { 0x1111222233334444ull,
					       0x5555666677778888ull, 3, 16,
					       "kjv-moe" },
				    .n_ids = 3, .ids = ids }, o;
	struct kv_session_info v[2] = {
		{ "a", 32, 4096, "kjv", "" },
		{ "b.v2", 0, 144, "", "header checksum mismatch" } }, vo[2];
	struct st_wbuf w;
	struct st_diag d;
	uint32_t n;

	(void)state;
	st_wbuf_init(&w);
	kv_proto_encode_session(&w, &m);
	/* op, name, 2 x u64, 2 x u32, model, n_ids, ids */
	assert_int_equal(w.len, 4 + 4 + 6 + 16 + 8 + 4 + 7 + 4 + 12);
	assert_int_equal(kv_proto_decode_session(w.data, w.len, &o, &d), 0);
	assert_int_equal(o.op, KV_SESSION_SAVE);
	assert_string_equal(o.name, "chat-1");
	assert_true(o.ident.model_id == 0x1111222233334444ull);
	assert_true(o.ident.store_id == 0x5555666677778888ull);
	assert_int_equal(o.ident.kv_dtype, 3);
	assert_int_equal(o.ident.page_rows, 16);
	assert_string_equal(o.ident.model, "kjv-moe");
	assert_int_equal(o.n_ids, 3);
	assert_memory_equal(o.ids, ids, sizeof(ids));
	kv_msg_session_fini(&o);
	for (size_t cut = 0; cut < w.len; cut++)
		assert_int_not_equal(kv_proto_decode_session(w.data, cut, &o,
							     &d), 0);
	st_wbuf_fini(&w);
	/* a LOAD with ids, a SAVE without, a path as a name */
	m.op = KV_SESSION_LOAD;
	st_wbuf_init(&w);
	kv_proto_encode_session(&w, &m);
	assert_int_equal(kv_proto_decode_session(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	m.op = KV_SESSION_SAVE;
	m.n_ids = 0;
	st_wbuf_init(&w);
	kv_proto_encode_session(&w, &m);
	assert_int_equal(kv_proto_decode_session(w.data, w.len, &o, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	m.op = KV_SESSION_REMOVE;
	snprintf(m.name, sizeof(m.name), "../etc");
	st_wbuf_init(&w);
	kv_proto_encode_session(&w, &m);
	assert_int_equal(kv_proto_decode_session(w.data, w.len, &o, &d),
			 -EINVAL);
	assert_non_null(strstr(d.msg, "starts with '.'"));
	st_wbuf_fini(&w);
	/* LIST reply */
	st_wbuf_init(&w);
	kv_proto_encode_session_list(&w, 2, v);
	assert_int_equal(kv_proto_decode_session_list(w.data, w.len, 2, vo,
						      &n), 0);
	assert_int_equal(n, 2);
	assert_string_equal(vo[1].name, "b.v2");
	assert_int_equal(vo[0].n_rows, 32);
	assert_true(vo[0].file_bytes == 4096);
	assert_string_equal(vo[0].model, "kjv");
	assert_string_equal(vo[0].bad, "");
	assert_string_equal(vo[1].bad, "header checksum mismatch");
	assert_int_equal(kv_proto_decode_session_list(w.data, w.len, 1, vo,
						      &n), -ST_E_PROTO);
	st_wbuf_fini(&w);
	assert_int_equal(kv_session_name_ok("a/b", NULL), 0);
	assert_int_equal(kv_session_name_ok("A-z_0.9", NULL), 1);
}

static void test_prefix_keys(void **state)
{
	enum { B = 4, P = 5 };
	int32_t a[B * P], b[B * P];
	uint64_t ka[P], kb[P], kc[P], parent = 0;

	(void)state;
	for (int i = 0; i < B * P; i++)
		a[i] = b[i] = 1000 + i * 37 - (i % 3) * 5000;
	assert_int_equal(kv_prefix_keys(a, B, 99, P, ka), 0);
	/* the chain, against the independent computation */
	for (int i = 0; i < P; i++) {
		assert_true(ka[i] != 0);
		assert_true(ka[i] == ref_key(parent, a + i * B, B, 99));
		parent = ka[i];
	}
	/* same prefix, same keys (also when asked for fewer pages) */
	assert_int_equal(kv_prefix_keys(b, B, 99, 3, kb), 0);
	assert_memory_equal(ka, kb, 3 * sizeof(uint64_t));
	/* one token different in page 2: pages 0, 1 equal, 2.. all differ */
	b[2 * B + 3] ^= 1;
	assert_int_equal(kv_prefix_keys(b, B, 99, P, kb), 0);
	assert_true(kb[0] == ka[0] && kb[1] == ka[1]);
	for (int i = 2; i < P; i++)
		assert_true(kb[i] != ka[i]);
	/* a change in page 0 changes every key, even with later pages equal */
	memcpy(b, a, sizeof(a));
	b[0] = -b[0];
	assert_int_equal(kv_prefix_keys(b, B, 99, P, kb), 0);
	for (int i = 0; i < P; i++)
		assert_true(kb[i] != ka[i]);
	/* another model: every key differs */
	assert_int_equal(kv_prefix_keys(a, B, 100, P, kc), 0);
	for (int i = 0; i < P; i++)
		assert_true(kc[i] != ka[i]);
	/* page size is part of it: 8-token pages are not two 4-token ones */
	assert_int_equal(kv_prefix_keys(a, 2 * B, 99, 2, kc), 0);
	assert_true(kc[0] != ka[0] && kc[0] != ka[1] && kc[1] != ka[3]);
	/* the same ids moved one page later do not give the same key */
	assert_int_equal(kv_prefix_keys(a + B, B, 99, 1, kc), 0);
	assert_true(kc[0] != ka[1]);
	assert_int_equal(kv_prefix_keys(a, B, 99, 0, kc), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello),
		cmocka_unit_test(test_declare),
		cmocka_unit_test(test_seq_messages),
		cmocka_unit_test(test_stats_and_text),
		cmocka_unit_test(test_prefix_messages),
		cmocka_unit_test(test_prefix_ahead_message),
		cmocka_unit_test(test_prefix_keys),
		cmocka_unit_test(test_session_messages),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

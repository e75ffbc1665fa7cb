/*
 * fuzz_proto.c — the wire protocol (proto/): the message header and every
 * payload decoder a daemon or client runs on bytes from a socket.
 *
 * Input: the whole input goes through st_proto_decode_header; byte 0 then
 * picks a payload decoder (mod the table) and the rest is its payload, so
 * the fuzzer reaches each decoder without first guessing a header.  Checks:
 * a decoded header's payload_len is what the buffer holds; every decoded
 * array that borrows the payload lies inside it (read in full, so ASan sees
 * an overrun); owned arrays are freed (LeakSanitizer sees a leak).
 */
#include <string.h>

#include "cw_proto.h"
#include "es_engram_proto.h"
#include "es_proto.h"
#include "fuzz.h"
#include "kv_devpage.h"
#include "kv_proto.h"
#include "st_devpool.h"
#include "st_proto.h"

/* Sums n bytes of a borrowed array after checking it lies in [p, p+len). */
static unsigned touch(const uint8_t *arr, uint64_t n, const uint8_t *p,
		      size_t len, const char *what)
{
	unsigned s = 0;

	if (n == 0)
		return 0;
	FUZZ_CHECK(arr >= p && (uint64_t)(arr - p) <= len &&
		   n <= len - (size_t)(arr - p),
		   "%s: %llu bytes at offset %td of %zu", what,
		   (unsigned long long)n, arr - p, len);
	for (uint64_t i = 0; i < n; i++)
		s += arr[i];
	return s;
}

static void fuzz_es(int which, const uint8_t *p, size_t len)
{
	static const struct es_acquire_limits lim = { 8, 64, 16 };
	struct st_diag diag;
	union {
		struct es_hello_req hq;
		struct es_hello_rep hp;
		struct es_ping_rep pr;
		struct es_stats_rep sr;
		struct es_acquire_req aq;
		struct es_route_req rq;
	} u;
	struct es_acquire_ent ents[64];
	char text[64];
	uint32_t pid;
	uint64_t epoch;

	switch (which) {
	case 0: es_hello_req_decode(p, len, &u.hq, &diag); break;
	case 1: es_hello_rep_decode(p, len, &u.hp, &diag); break;
	case 2: es_ping_rep_decode(p, len, &u.pr, &diag); break;
	case 3: es_stats_rep_decode(p, len, &u.sr, &diag); break;
	case 4:
		if (es_acquire_req_decode(p, len, &lim, &u.aq, &diag) == 0)
			touch(u.aq.experts_le, 4ull * u.aq.n, p, len, "acquire");
		break;
	case 5:
		if (es_route_req_decode(p, len, &lim, &u.rq, &diag) == 0) {
			touch(u.rq.experts_le,
			      4ull * u.rq.n_tokens * u.rq.k, p, len, "route");
			touch(u.rq.hints_le, 8ull * u.rq.n_hint, p, len,
			      "hints");
		}
		break;
	case 6:
		es_acquire_rep_decode(p, len, len ? p[0] % 65 : 0, 16, ents,
				      &diag);
		break;
	case 7:
		if (es_error_decode(p, len, text, sizeof(text)) == 0)
			FUZZ_CHECK(memchr(text, 0, sizeof(text)),
				   "error text not terminated");
		break;
	default: es_event_decode(p, len, &pid, &epoch); break;
	}
}

static void fuzz_kv(int which, const uint8_t *p, size_t len)
{
	struct st_diag diag;
	union {
		struct kv_msg_hello h;
		struct kv_msg_hello_reply hr;
		struct kv_msg_ping_reply pr;
		struct kv_msg_declare d;
		struct kv_msg_declare_reply dr;
		struct kv_msg_fork f;
		struct kv_msg_prefix_reply pfr;
		struct kv_msg_stats st;
	} u;
	struct kv_reserve_entry *ents = NULL;
	struct kv_msg_prefix pf;
	struct kv_msg_residency res;
	struct kv_msg_prefix_ahead pa;
	int32_t status[64];
	uint32_t n, v;

	switch (which) {
	case 0:
		if (kv_proto_decode_hello(p, len, &u.h, &diag) == 0)
			FUZZ_CHECK(memchr(u.h.name, 0, sizeof(u.h.name)),
				   "hello name not terminated");
		break;
	case 1: kv_proto_decode_hello_reply(p, len, &u.hr); break;
	case 2: kv_proto_decode_ping_reply(p, len, &u.pr); break;
	case 3: kv_proto_decode_declare(p, len, &u.d, &diag); break;
	case 4: kv_proto_decode_declare_reply(p, len, &u.dr); break;
	case 5:
	case 6:
	case 7:
		if ((which == 5 ? kv_proto_decode_reserve(p, len, &n, &ents,
							  &diag) :
		     which == 6 ? kv_proto_decode_entries("fuzz", p, len, &n,
							  &ents, &diag) :
				  kv_devpage_decode_req(p, len, &n, &ents,
							&diag)) == 0) {
			for (uint32_t i = 0; i < n; i++)
				v = ents[i].seq + ents[i].n_rows;
			free(ents);
		}
		break;
	case 8: kv_proto_decode_fork(p, len, &u.f, &diag); break;
	case 9: kv_proto_decode_seq(p, len, &n, &diag); break;
	case 10:
	case 11:
		if (kv_proto_decode_prefix(p, len, which == 11, &pf, &diag) ==
		    0) {
			for (uint32_t i = 0; i < pf.n_ids; i++)
				v = (uint32_t)pf.ids[i];
			kv_msg_prefix_fini(&pf);
		}
		break;
	case 12: kv_proto_decode_prefix_reply(p, len, &u.pfr); break;
	case 13:
		if (kv_proto_decode_residency(p, len, &res, &diag) == 0) {
			for (uint32_t i = 0; i < res.n; i++)
				v = res.seqs[i];
			free(res.seqs);
		}
		/* the other list of a client's plan (PREFIX_AHEAD), on the
		 * same bytes: the seed corpus keeps its decoder numbers */
		if (kv_proto_decode_prefix_ahead(p, len, &pa, &diag) == 0) {
			uint32_t k = 0;

			for (uint32_t c = 0; c < pa.n_chains; c++)
				k += pa.chain_len[c];
			FUZZ_CHECK(k == pa.n_keys &&
				   k <= KV_PROTO_MAX_AHEAD_KEYS,
				   "%u keys in chains, %u counted", k,
				   pa.n_keys);
			for (uint32_t i = 0; i < pa.n_keys; i++)
				FUZZ_CHECK(pa.keys[i] != 0, "key %u is 0", i);
			kv_msg_prefix_ahead_fini(&pa);
		}
		break;
	case 14:
		kv_proto_decode_status_list(p, len, len ? p[0] % 65 : 0, status,
					    &diag);
		break;
	case 15: kv_proto_decode_u32(p, len, &v); break;
	case 16: kv_proto_decode_stats(p, len, &u.st); break;
	case 17: kv_proto_decode_empty(p, len, &diag); break;
	default:
		if (kv_proto_decode_text(p, len, &diag) == 0)
			FUZZ_CHECK(memchr(diag.msg, 0, sizeof(diag.msg)),
				   "text not terminated");
		break;
	}
	(void)v;
}

static void fuzz_other(int which, const uint8_t *p, size_t len)
{
	static const int64_t rows[4] = { 100, 1, (int64_t)1 << 40, 0 };
	struct st_diag diag;
	struct cw_gen_start_msg gs;
	struct cw_stats_wire sw;
	struct es_engram_open_rep eo;
	struct es_engram_req er;
	struct kv_devpage pages[64];
	struct st_devpool_export ex;
	struct st_devpool_revoke rv;
	struct st_devpool_rep dr;
	uint64_t epoch;

	switch (which) {
	case 0:
		if (cw_gen_start_msg_decode(p, len, &gs) == 0) {
			FUZZ_CHECK(gs.prompt && gs.n_stop <= CW_PROTO_MAX_NSTOP,
				   "prompt %p, %u stops", (void *)gs.prompt,
				   gs.n_stop);
			for (uint32_t i = 0; i < gs.n_stop; i++)
				FUZZ_CHECK(gs.stop[i], "stop %u NULL", i);
			cw_gen_start_msg_free(&gs);
		}
		break;
	case 1: cw_stats_wire_decode(p, len, &sw); break;
	case 2: es_engram_open_rep_decode(p, len, &eo, &diag); break;
	case 3:
		if (es_engram_req_decode(p, len, 4, 16, rows, &er, &diag) == 0)
			for (uint32_t i = 0; i < er.n; i++)
				FUZZ_CHECK(es_engram_req_row(&er, i) >= 0 &&
					   es_engram_req_row(&er, i) <
						   rows[er.li],
					   "row %u out of range", i);
		break;
	case 4:
		kv_devpage_decode_rep(p, len, len ? p[0] % 65 : 0, &epoch,
				      pages, &diag);
		break;
	case 5:
		if (st_devpool_export_decode(p, len, &ex, &diag) == 0)
			touch(ex.events,
			      (uint64_t)ex.n_events * ST_DEVPOOL_HANDLE_BYTES,
			      p, len, "events");
		break;
	case 6: st_devpool_revoke_decode(p, len, &rv, &diag); break;
	default: st_devpool_rep_decode(p, len, &dr, &diag); break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_msg_header h;
	int which;

	if (st_proto_decode_header(data, size, &h) == 0)
		FUZZ_CHECK((uint64_t)h.payload_len + ST_PROTO_HEADER_BYTES ==
			   size, "payload_len %u in a %zu-byte message",
			   h.payload_len, size);
	(void)st_proto_type_name(size >= 8 ? (uint16_t)(data[6] |
							data[7] << 8) : 0);
	if (size < 1)
		return 0;
	/* 9 expertd, 19 kvd, 8 other decoders */
	which = data[0] % 36;
	data++;
	size--;
	if (which < 9)
		fuzz_es(which, data, size);
	else if (which < 28)
		fuzz_kv(which - 9, data, size);
	else
		fuzz_other(which - 28, data, size);
	return 0;
}

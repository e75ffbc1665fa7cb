/* cw_proto.c — computed's messages, see cw_proto.h. */
#include "cw_proto.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "st_error.h"

void cw_gen_start_msg_free(struct cw_gen_start_msg *m)
{
	for (int i = 0; i < CW_PROTO_MAX_NSTOP; i++) {
		free(m->stop[i]);
		m->stop[i] = NULL;
	}
	free(m->prompt);
	m->prompt = NULL;
}

void cw_gen_start_msg_encode(struct st_wbuf *w, const struct cw_gen_start_msg *m)
{
	st_wbuf_u32(w, m->max_tokens);
	st_wbuf_f32(w, m->temperature);
	st_wbuf_i32(w, m->top_k);
	st_wbuf_f32(w, m->top_p);
	st_wbuf_u64(w, m->seed);
	st_wbuf_u32(w, m->flags);
	st_wbuf_u32(w, m->n_stop);
	for (uint32_t i = 0; i < m->n_stop && i < CW_PROTO_MAX_NSTOP; i++)
		st_wbuf_str(w, m->stop[i]);
	st_wbuf_str(w, m->prompt);
}

int cw_gen_start_msg_decode(const uint8_t *p, size_t len,
			    struct cw_gen_start_msg *m)
{
	struct st_rbuf r;
	int e = 0;

	memset(m, 0, sizeof(*m));
	st_rbuf_init(&r, p, len);
	e |= st_rbuf_u32(&r, &m->max_tokens);
	e |= st_rbuf_f32(&r, &m->temperature);
	e |= st_rbuf_i32(&r, &m->top_k);
	e |= st_rbuf_f32(&r, &m->top_p);
	e |= st_rbuf_u64(&r, &m->seed);
	e |= st_rbuf_u32(&r, &m->flags);
	e |= st_rbuf_u32(&r, &m->n_stop);
	if (e || m->n_stop > CW_PROTO_MAX_NSTOP || !isfinite(m->temperature) ||
	    m->temperature < 0 || m->temperature > 100 ||
	    !isfinite(m->top_p) || m->top_p < 0 || m->top_p > 1 ||
	    m->top_k < 0 || (m->flags & ~(31u | CW_GEN_F_DRAFT_MASK |
				       CW_GEN_F_DRAFT_PRICE |
				       CW_GEN_F_DRAFT_MTP)) ||
	    ((m->flags & CW_GEN_F_DRAFT_MASK) >> CW_GEN_F_DRAFT_SHIFT) >
		    CW_PROTO_MAX_DRAFT + 1 ||
	    m->max_tokens > (1u << 24))
		return -ST_E_PROTO;
	for (uint32_t i = 0; i < m->n_stop; i++) {
		e = st_rbuf_str(&r, CW_PROTO_MAX_STOP, &m->stop[i]);
		if (e < 0 || !m->stop[i][0]) {
			cw_gen_start_msg_free(m);
			return e < 0 ? e : -ST_E_PROTO;
		}
	}
	e = st_rbuf_str(&r, CW_PROTO_MAX_PROMPT, &m->prompt);
	if (e < 0 || st_rbuf_left(&r) != 0) {
		cw_gen_start_msg_free(m);
		return e < 0 ? e : -ST_E_PROTO;
	}
	return 0;
}

#define STATS_U64_FIELDS(X)                                                   \
	X(peak_rss_bytes) X(n_generations) X(prompt_tokens)                    \
	X(generated_tokens) X(prefill_ns) X(decode_ns) X(expert_bytes)         \
	X(dense_bytes) X(lm_head_bytes) X(expert_stall_ns) X(es_hits)          \
	X(es_misses) X(es_evictions) X(es_loads) X(es_load_bytes)              \
	X(es_n_slots) X(es_slots_used) X(es_pool_bytes) X(es_budget_bytes)     \
	X(kv_pages_used) X(kv_pages_peak) X(kv_n_pages) X(kv_page_bytes)       \
	X(kv_pool_bytes) X(kv_bytes_per_token) X(kv_formula_bytes_per_token)    \
	X(kv_prefix_lookups) X(kv_prefix_rows_reused) X(kv_spill_pages_total)     \
	X(kv_restore_pages_total)                                              \
	X(es_load_ns) X(es_prefetch_loads) X(es_prefetch_used)                 \
	X(es_prefetch_wasted) X(es_hints) X(es_hints_dropped) X(es_hot_slots)  \
	X(es_direct_io) X(la_pred1) X(la_hit1) X(la_pred2) X(la_hit2)          \
	X(la_pred3) X(la_hit3) X(es_io_busy_ns) X(en_lookups) X(en_hits)       \
	X(en_misses) X(en_read_bytes) X(en_lat_p50_ns) X(en_lat_p99_ns)        \
	X(spec_steps) X(spec_verify_steps) X(spec_drafted) X(spec_accepted)    \
	X(spec_bytes_verify) X(spec_bytes_plain) X(spec_tokens_verify)         \
	X(spec_limit_sum) X(spec_limit_off)                                    \
	X(kv_remote_on) X(kv_remote_hits) X(kv_remote_misses)                  \
	X(kv_remote_bytes_in) X(kv_remote_bytes_out) X(kv_remote_errors)      \
	X(dsv_math) X(io_on) X(io_bytes_demand) X(io_bytes_kv_restore)         \
	X(io_bytes_prefetch) X(io_bytes_kv_spill) X(io_wait_demand_ns)         \
	X(io_wait_kv_restore_ns) X(io_wait_prefetch_ns) X(io_wait_kv_spill_ns)

void cw_stats_wire_encode(struct st_wbuf *w, const struct cw_stats_wire *s)
{
	st_wbuf_i32(w, s->pid);
	st_wbuf_i32(w, s->es_pid);
	st_wbuf_i32(w, s->kv_pid);
#define ENC(f) st_wbuf_u64(w, s->f);
	STATS_U64_FIELDS(ENC)
#undef ENC
}

int cw_stats_wire_decode(const uint8_t *p, size_t len,
			 struct cw_stats_wire *s)
{
	struct st_rbuf r;
	int e = 0;

	memset(s, 0, sizeof(*s));
	st_rbuf_init(&r, p, len);
	e |= st_rbuf_i32(&r, &s->pid);
	e |= st_rbuf_i32(&r, &s->es_pid);
	e |= st_rbuf_i32(&r, &s->kv_pid);
#define DEC(f) e |= st_rbuf_u64(&r, &s->f);
	STATS_U64_FIELDS(DEC)
#undef DEC
	return e || st_rbuf_left(&r) ? -ST_E_PROTO : 0;
}

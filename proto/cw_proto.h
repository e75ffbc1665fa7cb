/*
 * cw_proto.h — computed's request messages (payloads after the st_proto.h
 * header).  All fields fixed-width little-endian; strings are u32 length +
 * bytes (no NUL on the wire).
 *
 * CW_MSG_GEN_START  request: u32 max_tokens, f32 temperature, i32 top_k,
 *                   f32 top_p, u64 seed, u32 flags (CW_GEN_F_*), u32 n_stop,
 *                   n_stop x str stop (each <= CW_PROTO_MAX_STOP bytes),
 *                   str prompt (<= CW_PROTO_MAX_PROMPT bytes)
 *                   reply:   u32 gen_id, u32 n_prompt_tokens, u32 max_tokens
 *                            (cut to what the model's context leaves)
 * CW_MSG_GEN_NEXT   request: u32 gen_id
 *                   reply:   i32 token (-1: none), u32 finish (enum cw_finish),
 *                            u32 n_generated, u64 step_ns, str text
 * CW_MSG_GEN_END    request: u32 gen_id  -> reply: (empty); frees it
 * CW_MSG_SCORE      request: u32 flags (CW_SCORE_F_*), str dump_name (a plain
 *                   file name in the run directory, or empty), u32 n,
 *                   n x i32 token ids (2 <= n <= CW_PROTO_MAX_SCORE)
 *                   reply:   f64 nll_sum (natural log, positions 1..n-1),
 *                            u32 n_scored (n - 1), n_scored x u32 argmax id
 *                   Runs the ids from position 0 in a fresh sequence.  With
 *                   CW_SCORE_F_DUMP the log-softmax of each scored position
 *                   (n_scored x vocab float32, row i predicts id i+1) is
 *                   written to <run_dir>/<dump_name> (bulk data never
 *                   travels in messages).
 * CW_MSG_SESSION    request: u32 op (KV_SESSION_*, kv_session_proto.h),
 *                   str name (empty for LIST), u32 flags (CW_GEN_F_ADD_SPECIAL,
 *                   CW_GEN_F_PARSE_SPECIAL: how SAVE encodes the prompt),
 *                   str prompt (SAVE: the conversation whose cached KV
 *                   pages are saved; else empty)
 *                   reply:   str JSON, as /v1/sessions answers (cw_session.h)
 * ST_MSG_STATS      reply:   struct cw_stats_wire (below, field by field)
 * Error replies carry status < 0 and a str message as payload.
 */
#ifndef CW_PROTO_H
#define CW_PROTO_H

#include <stdint.h>

#include "st_proto.h"

enum cw_msg_type {
	CW_MSG_GEN_START = ST_MSG_CW_FIRST + 1,
	CW_MSG_GEN_NEXT = ST_MSG_CW_FIRST + 2,
	CW_MSG_GEN_END = ST_MSG_CW_FIRST + 3,
	CW_MSG_SCORE = ST_MSG_CW_FIRST + 4,
	CW_MSG_SESSION = ST_MSG_CW_FIRST + 5, /* saved sessions */
};

#define CW_PROTO_MAX_SCORE 8192
#define CW_SCORE_F_DUMP 1u

#define CW_PROTO_MAX_PROMPT (512 * 1024)
#define CW_PROTO_MAX_STOP 256
#define CW_PROTO_MAX_NSTOP 4

#define CW_GEN_F_ADD_SPECIAL 1u   /* add BOS as tokenizer_config says */
#define CW_GEN_F_PARSE_SPECIAL 2u /* recognise special tokens in the prompt */
#define CW_GEN_F_IGNORE_EOS 4u
#define CW_GEN_F_NO_PREFIX_CACHE 8u /* compute the whole prompt */
#define CW_GEN_F_KV_PRIVATE 16u   /* keep the prompt's KV pages out of
				   * kvd's remote KV tier */
/* Bits 8..13: speculative decoding's draft length D: 0 = computed's
 * default (--speculate), D + 1 = D draft tokens per step (1: off). */
#define CW_GEN_F_DRAFT_SHIFT 8
#define CW_GEN_F_DRAFT_MASK (0x3fu << CW_GEN_F_DRAFT_SHIFT)
#define CW_PROTO_MAX_DRAFT 16 /* draft tokens at most (CW_DRAFT_MAX) */
/* With a draft length D >= 1 in bits 8..13: price it (up to D) in step
 * time and expert bytes (cw_draft_price.h) instead of the schedule. */
#define CW_GEN_F_DRAFT_PRICE (1u << 14)
/* With a draft length D >= 1: drafts from the model's MTP block
 * (cw_draft_parse_src "mtp[:K]") instead of prompt lookup. */
#define CW_GEN_F_DRAFT_MTP (1u << 15)

struct cw_gen_start_msg {
	uint32_t max_tokens;
	float temperature;
	int32_t top_k;
	float top_p;
	uint64_t seed;
	uint32_t flags;
	uint32_t n_stop;
	char *stop[CW_PROTO_MAX_NSTOP]; /* owned after decode */
	char *prompt;                   /* owned after decode */
};

/* Counters computed reports (STATS). */
struct cw_stats_wire {
	int32_t pid;
	int32_t es_pid, kv_pid;
	uint64_t peak_rss_bytes;
	uint64_t n_generations;
	uint64_t prompt_tokens, generated_tokens;
	uint64_t prefill_ns, decode_ns;
	uint64_t expert_bytes, dense_bytes, lm_head_bytes, expert_stall_ns;
	/* from expertd */
	uint64_t es_hits, es_misses, es_evictions, es_loads, es_load_bytes;
	uint64_t es_n_slots, es_slots_used, es_pool_bytes, es_budget_bytes;
	/* from kvd */
	uint64_t kv_pages_used, kv_pages_peak, kv_n_pages, kv_page_bytes;
	uint64_t kv_pool_bytes;
	/* KV bytes per token: as laid out (rows incl. FP8 scales, all layers)
	 * and by the formula 2 x layers x kv_heads x head_dim x bytes/elt */
	uint64_t kv_bytes_per_token, kv_formula_bytes_per_token;
	/* prefix cache and spill (from kvd) */
	uint64_t kv_prefix_lookups, kv_prefix_rows_reused;
	uint64_t kv_spill_pages_total, kv_restore_pages_total;
	/* expertd tiers (pool header counters) */
	uint64_t es_load_ns, es_prefetch_loads, es_prefetch_used;
	uint64_t es_prefetch_wasted, es_hints, es_hints_dropped;
	uint64_t es_hot_slots, es_direct_io;
	/* gate look-ahead of computed: for d = 1..3 layers ahead, experts
	 * predicted and how many of them the router then chose */
	uint64_t la_pred1, la_hit1, la_pred2, la_hit2, la_pred3, la_hit3;
	uint64_t es_io_busy_ns;
	/* expertd's Engram tier (DeepSeek-V4.1 stores; zeros otherwise) */
	uint64_t en_lookups, en_hits, en_misses, en_read_bytes;
	uint64_t en_lat_p50_ns, en_lat_p99_ns;
	/* speculative decoding of ended generations (cw_metrics_spec):
	 * decode steps, those that verified drafts, draft tokens verified
	 * and accepted */
	uint64_t spec_steps, spec_verify_steps, spec_drafted, spec_accepted;
	/* priced in bytes: expert bytes of decode steps with drafts and
	 * without, tokens of the former, the sum of the draft limits chosen
	 * per decode step and the steps whose limit was 0 */
	uint64_t spec_bytes_verify, spec_bytes_plain, spec_tokens_verify;
	uint64_t spec_limit_sum, spec_limit_off;
	/* kvd's remote KV tier (kv_remote_on 1 with --remote-kv; counters
	 * since kvd started: hit/miss lookups, value bytes, errors) */
	uint64_t kv_remote_on, kv_remote_hits, kv_remote_misses;
	uint64_t kv_remote_bytes_in, kv_remote_bytes_out, kv_remote_errors;
	/* DeepSeek-V4/V4.1 stores: the math the model computes
	 * (CW_STATS_MATH_*); 0 for other stores */
	uint64_t dsv_math;
	/* the instance's I/O queue (st_ioq.h), totals of expertd and kvd
	 * since the segment was made: per class (ST_IOQ_DEMAND, _KV_RESTORE,
	 * _PREFETCH, _KV_SPILL) bytes moved and ns deferred by the queue;
	 * io_on 0 when there is no segment, else its st_ioq_mode
	 * (ST_IOQ_MODE_ORDERED 1, _UNORDERED 2: STRATA_IOQ=off, _MIXED 3) */
	uint64_t io_on;
	uint64_t io_bytes_demand, io_bytes_kv_restore, io_bytes_prefetch;
	uint64_t io_bytes_kv_spill;
	uint64_t io_wait_demand_ns, io_wait_kv_restore_ns, io_wait_prefetch_ns;
	uint64_t io_wait_kv_spill_ns;
};

enum {
	CW_STATS_MATH_NONE = 0,     /* not a DeepSeek-V4/V4.1 store */
	CW_STATS_MATH_OFFICIAL = 1, /* the official round trips (default) */
	CW_STATS_MATH_EXACT = 2,    /* --exact-math: none */
	CW_STATS_MATH_CUSTOM = 3,   /* another set (tests) */
};

void cw_gen_start_msg_free(struct cw_gen_start_msg *m);
/* Encodes into w (appending).  Errors are sticky in w->err. */
void cw_gen_start_msg_encode(struct st_wbuf *w, const struct cw_gen_start_msg *m);
/* Decodes and validates every field; 0 or -ST_E_PROTO (+ -ENOMEM).  On error
 * nothing stays allocated. */
int cw_gen_start_msg_decode(const uint8_t *p, size_t len,
			    struct cw_gen_start_msg *ret);

void cw_stats_wire_encode(struct st_wbuf *w, const struct cw_stats_wire *s);
int cw_stats_wire_decode(const uint8_t *p, size_t len,
			 struct cw_stats_wire *ret);

#endif

/*
 * cw_metrics.h — serving figures of computed (DESIGN.md section 8) and
 * their Prometheus text exposition for GET /metrics.
 *
 * Counters and histograms are updated by the HTTP threads and the
 * scheduler thread under one lock; the tier figures (expert pool, KV
 * pages) are read from expertd and kvd at render time.
 */
#ifndef CW_METRICS_H
#define CW_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cw_draft_ngram.h"
#include "st_ioq.h"
#include "st_ledger.h"

#define CW_HIST_BUCKETS 14

/* A cumulative histogram with fixed upper bounds in seconds. */
struct cw_hist {
	uint64_t count[CW_HIST_BUCKETS + 1]; /* per bucket; last is +Inf */
	uint64_t n;
	double sum;
};

enum cw_metrics_endpoint {
	CW_EP_COMPLETIONS, CW_EP_CHAT, CW_EP_MODELS, CW_EP_HEALTH,
	CW_EP_METRICS, CW_EP_REQREP, CW_EP_OTHER, CW_EP_COUNT
};

#define CW_METRICS_CODES 12 /* distinct HTTP status codes tracked */

struct cw_metrics {
	pthread_mutex_t lock;
	uint64_t start_ns;
	/* HTTP responses per endpoint and status code */
	int codes[CW_METRICS_CODES];
	uint64_t responses[CW_EP_COUNT][CW_METRICS_CODES];
	/* generations */
	uint64_t gen_started, gen_finished[6]; /* by enum cw_finish */
	uint64_t gen_aborted;                  /* cancelled (disconnect) */
	uint64_t prompt_tokens, cached_prompt_tokens, generated_tokens;
	uint64_t steps, step_tokens, step_ns;
	uint64_t gen_prefill_ns, gen_decode_ns; /* summed over generations */
	/* speculative decoding (cw_gen_spec_stats of ended generations) */
	uint64_t spec_steps, spec_verify_steps, spec_drafted, spec_accepted;
	uint64_t spec_bytes_verify, spec_bytes_plain, spec_tokens_verify;
	uint64_t spec_limit_hist[CW_DRAFT_MAX + 1];
	struct cw_hist ttft, tpot, step_batch;
	/* a step's wait for kvd to pin its sequences (cw_sched.c):
	 * every pin, and the pins that found a sequence with spilled pages
	 * (the restore stall); sequences asked to restore ahead */
	uint64_t kv_pin_ns, kv_pins, kv_stall_ns, kv_stalls;
	uint64_t kv_stall_seqs, kv_ahead_seqs, kv_deferred_seqs;
	/* queued requests whose prefixes were named to kvd ahead of their
	 * admission (cw_kvahead_ask_prefix), and the groups kvd found
	 * spilled in those plans */
	uint64_t kv_admit_ahead_reqs, kv_admit_ahead_spilled;
	/* admission by KV pages without spilling (cw_sched.c): requests
	 * that waited in the queue for pages, and the pages the queue's
	 * head waits for now */
	uint64_t kv_admit_waits, kv_admit_wait_pages;
	/* tokens/s over a sliding window: two halves of window_ns */
	uint64_t win_start_ns, win_tokens, prev_win_tokens, prev_win_ns;
	/* the instance's run directory (not owned; NULL: none), where the
	 * supervisor's restart counts are read at render time */
	const char *run_dir;
};

void cw_metrics_init(struct cw_metrics *m);
void cw_metrics_fini(struct cw_metrics *m);

/* One HTTP response (or REQ/REP request) with its status code. */
void cw_metrics_response(struct cw_metrics *m, enum cw_metrics_endpoint ep,
			 int status);
/* A generation was admitted with n_prompt tokens, n_cached of them from
 * the prefix cache. */
void cw_metrics_gen_start(struct cw_metrics *m, int n_prompt, int n_cached);
/* A generation ended: finish reason (enum cw_finish), aborted by the
 * client, time to first token and mean time per output token in ns (0 =
 * none: fewer than 1 / 2 tokens). */
void cw_metrics_gen_end(struct cw_metrics *m, int finish, int aborted,
			uint64_t ttft_ns, uint64_t tpot_ns);
/* Prefill and decode time of one generation that ended (its steps' wall
 * time; batched steps count for each of their requests). */
void cw_metrics_gen_times(struct cw_metrics *m, uint64_t prefill_ns,
			  uint64_t decode_ns);
/* Speculative decoding figures of one generation that ended: decode
 * steps, those that verified drafts, draft tokens verified and accepted
 * (issue 22), and extra_tokens, the tokens it returned beyond one per
 * sampling step (added to the tokens generated: cw_metrics_step counts
 * one per sequence sampled). */
void cw_metrics_spec(struct cw_metrics *m, uint64_t steps,
		     uint64_t verify_steps, uint64_t drafted,
		     uint64_t accepted, uint64_t extra_tokens);
/* Speculation priced in bytes, of one generation that ended
 * (cw_gen_spec_stats): expert bytes of its decode steps with drafts and
 * without, the tokens the former produced, and limit_hist[k] the decode
 * steps whose chosen draft limit was k (CW_DRAFT_MAX + 1 counts). */
void cw_metrics_spec_price(struct cw_metrics *m, uint64_t bytes_verify,
			   uint64_t bytes_plain, uint64_t tokens_verify,
			   const uint64_t *limit_hist);
/* One forward step of n_tokens tokens, n_sampled of them sampled. */
void cw_metrics_step(struct cw_metrics *m, int n_tokens, int n_sampled,
		     uint64_t step_ns);

/*
 * One pin of a step's sequences (cw_sched.c): pin_ns its wall time,
 * n_missing the sequences that had spilled pages when it was sent (> 0:
 * the step stalled on restores, and pin_ns counts as stall).
 */
void cw_metrics_kv_pin(struct cw_metrics *m, uint64_t pin_ns, int n_missing);

/* n sequences were asked to restore ahead of the step that runs them. */
void cw_metrics_kv_ahead(struct cw_metrics *m, int n);

/* n_reqs queued requests were named to kvd ahead of their admission for
 * the first time, in a plan where kvd found n_spilled groups spilled. */
void cw_metrics_kv_admit_ahead(struct cw_metrics *m, int n_reqs,
			       int n_spilled);

/* n sequences were left to the next step: kvd was still restoring them. */
void cw_metrics_kv_deferred(struct cw_metrics *m, int n);

/* new_wait queued requests began waiting for KV pages (each counted
 * once); pages: what the queue waits for now (0: nothing). */
void cw_metrics_kv_admit_wait(struct cw_metrics *m, int new_wait,
			      uint64_t pages);

/* Figures read from outside at render time. */
struct cw_metrics_ext {
	int running, queued, max_running, max_queued;
	int es_ok, kv_ok;                   /* their stats calls answered */
	/* expertd */
	uint64_t es_hits, es_misses, es_evictions, es_loads, es_load_bytes;
	uint64_t es_slots, es_slots_used, es_pool_bytes, es_epoch;
	/* expertd prefetch (es_tier_stats) */
	uint64_t es_prefetch_loads, es_prefetch_used, es_prefetch_wasted;
	uint64_t es_hints, es_hints_dropped;
	/* kvd */
	uint64_t kv_pages_used, kv_pages_total, kv_pages_peak, kv_page_bytes;
	uint64_t kv_spilled_pages, kv_spill_total, kv_restore_total;
	uint64_t kv_prefix_lookups, kv_prefix_rows_reused, kv_epoch;
	/* queued requests' prefixes: groups (and bytes) kvd restored ahead
	 * of their admission; groups an admission's lookup restored itself,
	 * and the time it waited for them */
	uint64_t kv_prefix_ahead_groups, kv_prefix_ahead_bytes;
	uint64_t kv_admit_restores, kv_admit_restore_ns;
	/* kvd's remote KV tier (kv_remote_on: kvd runs with --remote-kv) */
	int kv_remote_on;
	uint64_t kv_remote_hits, kv_remote_misses, kv_remote_bytes_in;
	uint64_t kv_remote_bytes_out, kv_remote_errors;
	/* the instance's I/O queue (st_ioq.h); io_on 0: no segment */
	int io_on;
	struct st_ioq_totals io;
	/* the instance's shared memory budget (st_ledger.h); mem_on 0: the
	 * instance shares none (no ledger) */
	int mem_on;
	struct st_ledger_view mem;
	/* computed's model */
	uint64_t expert_bytes, dense_bytes, lm_head_bytes, expert_stall_ns;
	/* expertd's Engram tier (DeepSeek-V4.1 stores; engram_ok: read) */
	int engram_ok;
	uint64_t en_lookups, en_hits, en_merged, en_misses, en_reads;
	uint64_t en_read_bytes, en_lat_p50_ns, en_lat_p99_ns;
};

/*
 * Renders everything as Prometheus text format 0.0.4 into *ret (malloc'd,
 * NUL-terminated; caller frees).  0 or -ENOMEM.
 */
int cw_metrics_render(struct cw_metrics *m, const struct cw_metrics_ext *x,
		      char **ret);

#endif

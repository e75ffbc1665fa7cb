/* cw_metrics.c — serving figures and their Prometheus text; see
 * cw_metrics.h.  Exposition format: prometheus.io/docs/instrumenting/
 * exposition_formats (text format 0.0.4). */
#include "cw_metrics.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_gen.h"
#include "st_superv.h"
#include "st_util.h"

#define CW_WINDOW_NS (10ull * 1000000000ull) /* tokens/s window */

/* Upper bounds (seconds) of TTFT and TPOT buckets. */
static const double k_lat_bounds[CW_HIST_BUCKETS] = {
	0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
	10.0, 30.0,
};
/* Upper bounds of tokens per step. */
static const double k_batch_bounds[CW_HIST_BUCKETS] = {
	1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024,
};

static const char *const k_ep_names[CW_EP_COUNT] = {
	"/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
	"/metrics", "reqrep", "other",
};

static const char *const k_finish_names[6] = {
	"none", "eos", "length", "stop", "error", "context",
};

void cw_metrics_init(struct cw_metrics *m)
{
	memset(m, 0, sizeof(*m));
	pthread_mutex_init(&m->lock, NULL);
	m->start_ns = st_now_ns();
	m->win_start_ns = m->start_ns;
}

void cw_metrics_fini(struct cw_metrics *m)
{
	pthread_mutex_destroy(&m->lock);
}

static void hist_add(struct cw_hist *h, const double *bounds, double v)
{
	int i = 0;

	while (i < CW_HIST_BUCKETS && v > bounds[i])
		i++;
	h->count[i]++;
	h->n++;
	h->sum += v;
}

void cw_metrics_response(struct cw_metrics *m, enum cw_metrics_endpoint ep,
			 int status)
{
	int i;

	if (!m || ep < 0 || ep >= CW_EP_COUNT)
		return;
	pthread_mutex_lock(&m->lock);
	for (i = 0; i < CW_METRICS_CODES; i++)
		if (m->codes[i] == status || m->codes[i] == 0)
			break;
	if (i < CW_METRICS_CODES) {
		m->codes[i] = status;
		m->responses[ep][i]++;
	}
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_gen_start(struct cw_metrics *m, int n_prompt, int n_cached)
{
	pthread_mutex_lock(&m->lock);
	m->gen_started++;
	m->prompt_tokens += (uint64_t)n_prompt;
	m->cached_prompt_tokens += (uint64_t)n_cached;
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_gen_end(struct cw_metrics *m, int finish, int aborted,
			uint64_t ttft_ns, uint64_t tpot_ns)
{
	pthread_mutex_lock(&m->lock);
	if (aborted)
		m->gen_aborted++;
	else if (finish >= 0 && finish < 6)
		m->gen_finished[finish]++;
	if (ttft_ns)
		hist_add(&m->ttft, k_lat_bounds, (double)ttft_ns / 1e9);
	if (tpot_ns)
		hist_add(&m->tpot, k_lat_bounds, (double)tpot_ns / 1e9);
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_gen_times(struct cw_metrics *m, uint64_t prefill_ns,
			  uint64_t decode_ns)
{
	pthread_mutex_lock(&m->lock);
	m->gen_prefill_ns += prefill_ns;
	m->gen_decode_ns += decode_ns;
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_spec(struct cw_metrics *m, uint64_t steps,
		     uint64_t verify_steps, uint64_t drafted,
		     uint64_t accepted, uint64_t extra_tokens)
{
	pthread_mutex_lock(&m->lock);
	m->generated_tokens += extra_tokens;
	m->spec_steps += steps;
	m->spec_verify_steps += verify_steps;
	m->spec_drafted += drafted;
	m->spec_accepted += accepted;
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_spec_price(struct cw_metrics *m, uint64_t bytes_verify,
			   uint64_t bytes_plain, uint64_t tokens_verify,
			   const uint64_t *limit_hist)
{
	pthread_mutex_lock(&m->lock);
	m->spec_bytes_verify += bytes_verify;
	m->spec_bytes_plain += bytes_plain;
	m->spec_tokens_verify += tokens_verify;
	for (int k = 0; k <= CW_DRAFT_MAX; k++)
		m->spec_limit_hist[k] += limit_hist[k];
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_step(struct cw_metrics *m, int n_tokens, int n_sampled,
		     uint64_t step_ns)
{
	uint64_t now = st_now_ns();

	pthread_mutex_lock(&m->lock);
	m->steps++;
	m->step_tokens += (uint64_t)n_tokens;
	m->step_ns += step_ns;
	m->generated_tokens += (uint64_t)n_sampled;
	hist_add(&m->step_batch, k_batch_bounds, n_tokens);
	if (now - m->win_start_ns > CW_WINDOW_NS) {
		m->prev_win_tokens = m->win_tokens;
		m->prev_win_ns = now - m->win_start_ns;
		m->win_tokens = 0;
		m->win_start_ns = now;
	}
	m->win_tokens += (uint64_t)n_sampled;
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_kv_pin(struct cw_metrics *m, uint64_t pin_ns, int n_missing)
{
	pthread_mutex_lock(&m->lock);
	m->kv_pins++;
	m->kv_pin_ns += pin_ns;
	if (n_missing > 0) {
		m->kv_stalls++;
		m->kv_stall_ns += pin_ns;
		m->kv_stall_seqs += (uint64_t)n_missing;
	}
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_kv_ahead(struct cw_metrics *m, int n)
{
	pthread_mutex_lock(&m->lock);
	m->kv_ahead_seqs += (uint64_t)(n > 0 ? n : 0);
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_kv_admit_ahead(struct cw_metrics *m, int n_reqs,
			       int n_spilled)
{
	pthread_mutex_lock(&m->lock);
	m->kv_admit_ahead_reqs += (uint64_t)(n_reqs > 0 ? n_reqs : 0);
	m->kv_admit_ahead_spilled += (uint64_t)(n_spilled > 0 ? n_spilled : 0);
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_kv_deferred(struct cw_metrics *m, int n)
{
	pthread_mutex_lock(&m->lock);
	m->kv_deferred_seqs += (uint64_t)(n > 0 ? n : 0);
	pthread_mutex_unlock(&m->lock);
}

void cw_metrics_kv_admit_wait(struct cw_metrics *m, int new_wait,
			      uint64_t pages)
{
	pthread_mutex_lock(&m->lock);
	m->kv_admit_waits += (uint64_t)(new_wait > 0 ? new_wait : 0);
	m->kv_admit_wait_pages = pages;
	pthread_mutex_unlock(&m->lock);
}

/* A growing text buffer. */
struct tbuf {
	char *p;
	size_t len, cap;
	int err;
};

static void tb_printf(struct tbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->err)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->err = -EINVAL;
			return;
		}
		if ((size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		{
			size_t cap = (b->cap + (size_t)n + 1) * 2;
			char *p = realloc(b->p, cap);

			if (!p) {
				b->err = -ENOMEM;
				return;
			}
			b->p = p;
			b->cap = cap;
		}
	}
}

static void tb_head(struct tbuf *b, const char *name, const char *type,
		    const char *help)
{
	tb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One counter family of the I/O queue (st_ioq.h) with a sample per class:
 * v[k] as an integer, or with ns set as seconds (v in ns). */
static void tb_io_class(struct tbuf *b, const char *name, const char *help,
			const uint64_t v[ST_IOQ_N], int ns)
{
	tb_head(b, name, "counter", help);
	for (int k = 0; k < ST_IOQ_N; k++) {
		if (ns)
			tb_printf(b, "%s{class=\"%s\"} %.6f\n", name,
				  st_ioq_class_name(k), (double)v[k] / 1e9);
		else
			tb_printf(b, "%s{class=\"%s\"} %llu\n", name,
				  st_ioq_class_name(k),
				  (unsigned long long)v[k]);
	}
}

static void tb_metric(struct tbuf *b, const char *name, const char *type,
		      const char *help, double v)
{
	tb_head(b, name, type, help);
	tb_printf(b, "%s %.17g\n", name, v);
}

/* One family of the shared memory budget (st_ledger.h) with a sample per
 * side: v[s] of side s. */
static void tb_mem_side(struct tbuf *b, const char *name, const char *type,
			const char *help, const uint64_t v[ST_LEDGER_SIDES])
{
	tb_head(b, name, type, help);
	for (int s = 0; s < ST_LEDGER_SIDES; s++)
		tb_printf(b, "%s{side=\"%s\"} %llu\n", name,
			  st_ledger_side_name(s), (unsigned long long)v[s]);
}

/* One counter family of the budget's moves by direction: v[s] of the
 * moves whose donor was side s (two sides: from s to the other). */
static void tb_mem_dir(struct tbuf *b, const char *name, const char *help,
		       const uint64_t v[ST_LEDGER_SIDES])
{
	tb_head(b, name, "counter", help);
	for (int s = 0; s < ST_LEDGER_SIDES; s++)
		tb_printf(b, "%s{from=\"%s\",to=\"%s\"} %llu\n", name,
			  st_ledger_side_name(s),
			  st_ledger_side_name(ST_LEDGER_SIDES - 1 - s),
			  (unsigned long long)v[s]);
}

/* The shared memory budget's families (x->mem_on: the instance has one). */
static void tb_memory(struct tbuf *b, const struct st_ledger_view *v)
{
	uint64_t target[ST_LEDGER_SIDES], used[ST_LEDGER_SIDES];
	uint64_t pinned[ST_LEDGER_SIDES], moves[ST_LEDGER_SIDES];
	uint64_t bytes[ST_LEDGER_SIDES], cancelled[ST_LEDGER_SIDES];

	_Static_assert(ST_LEDGER_SIDES == 2, "tb_mem_dir: two sides");
	for (int s = 0; s < ST_LEDGER_SIDES; s++) {
		target[s] = v->side[s].target;
		used[s] = v->side[s].used;
		pinned[s] = v->side[s].pinned;
		moves[s] = v->side[s].moves_out;
		bytes[s] = v->side[s].bytes_out;
		cancelled[s] = v->side[s].cancelled;
	}
	tb_metric(b, "strata_memory_budget_bytes", "gauge",
		  "host memory shared by expertd's expert slots and kvd's KV "
		  "pages (--memory-budget)", (double)v->total);
	tb_mem_side(b, "strata_memory_target_bytes", "gauge",
		    "bytes each side may hold now (the arbiter's split)",
		    target);
	tb_mem_side(b, "strata_memory_used_bytes", "gauge",
		    "bytes of each side's slots or pages that hold data",
		    used);
	tb_mem_side(b, "strata_memory_pinned_bytes", "gauge",
		    "of those, bytes pinned now (cannot be given up)", pinned);
	tb_head(b, "strata_memory_value", "gauge",
		"each side's marginal value of one step of bytes, ns of stall "
		"per second per GiB: gain (one step more), loss (one step "
		"less)");
	for (int s = 0; s < ST_LEDGER_SIDES; s++)
		tb_printf(b, "strata_memory_value{side=\"%s\",kind=\"gain\"} "
			  "%.17g\nstrata_memory_value{side=\"%s\","
			  "kind=\"loss\"} %.17g\n", st_ledger_side_name(s),
			  v->side[s].gain, st_ledger_side_name(s),
			  v->side[s].loss);
	tb_mem_dir(b, "strata_memory_moves_total", "completed moves of the "
		   "budget from one side to the other", moves);
	tb_mem_dir(b, "strata_memory_moved_bytes_total", "bytes those moves "
		   "gave from one side to the other", bytes);
	tb_mem_side(b, "strata_memory_moves_cancelled_total", "counter",
		    "moves from each side cancelled: it could not free the "
		    "bytes in time (pinned)", cancelled);
}

static void tb_hist(struct tbuf *b, const char *name, const char *help,
		    const struct cw_hist *h, const double *bounds)
{
	uint64_t cum = 0;

	tb_head(b, name, "histogram", help);
	for (int i = 0; i < CW_HIST_BUCKETS; i++) {
		cum += h->count[i];
		tb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i],
			  (unsigned long long)cum);
	}
	cum += h->count[CW_HIST_BUCKETS];
	tb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name,
		  (unsigned long long)cum);
	tb_printf(b, "%s_sum %.17g\n%s_count %llu\n", name, h->sum, name,
		  (unsigned long long)h->n);
}

int cw_metrics_render(struct cw_metrics *m, const struct cw_metrics_ext *x,
		      char **ret)
{
	struct tbuf b = { 0 };
	uint64_t now = st_now_ns(), kv_pin[11];
	double tps;

	b.cap = 16384;
	b.p = malloc(b.cap);
	if (!b.p)
		return -ENOMEM;
	b.p[0] = 0;
	pthread_mutex_lock(&m->lock);
	tb_head(&b, "strata_http_responses_total", "counter",
		"HTTP responses (and REQ/REP requests) by endpoint and status "
		"code");
	for (int e = 0; e < CW_EP_COUNT; e++)
		for (int i = 0; i < CW_METRICS_CODES && m->codes[i]; i++)
			if (m->responses[e][i])
				tb_printf(&b, "strata_http_responses_total{"
					  "endpoint=\"%s\",code=\"%d\"} %llu\n",
					  k_ep_names[e], m->codes[i],
					  (unsigned long long)m->responses[e][i]);
	tb_metric(&b, "strata_requests_started_total", "counter",
		  "generations admitted by the scheduler", (double)m->gen_started);
	tb_head(&b, "strata_requests_finished_total", "counter",
		"generations ended, by finish reason (aborted: the client "
		"disconnected or cancelled)");
	for (int i = 1; i < 6; i++)
		tb_printf(&b, "strata_requests_finished_total{reason=\"%s\"} "
			  "%llu\n", k_finish_names[i],
			  (unsigned long long)m->gen_finished[i]);
	tb_printf(&b, "strata_requests_finished_total{reason=\"aborted\"} "
		  "%llu\n", (unsigned long long)m->gen_aborted);
	tb_metric(&b, "strata_prompt_tokens_total", "counter",
		  "prompt tokens of admitted generations",
		  (double)m->prompt_tokens);
	tb_metric(&b, "strata_prefix_cache_prompt_tokens_total", "counter",
		  "prompt tokens whose KV rows came from the prefix cache",
		  (double)m->cached_prompt_tokens);
	tb_metric(&b, "strata_generation_tokens_total", "counter",
		  "tokens sampled", (double)m->generated_tokens);
	tps = 0.0;
	if (m->prev_win_ns)
		tps = (double)m->prev_win_tokens * 1e9 / (double)m->prev_win_ns;
	if (now - m->win_start_ns > 1000000000ull)
		tps = (double)m->win_tokens * 1e9 /
		      (double)(now - m->win_start_ns);
	tb_metric(&b, "strata_generation_tokens_per_second", "gauge",
		  "tokens sampled per second over the last window (10 s)", tps);
	tb_metric(&b, "strata_spec_decode_steps_total", "counter",
		  "decode steps of ended generations (one per sequence and "
		  "forward step)", (double)m->spec_steps);
	tb_metric(&b, "strata_spec_verify_steps_total", "counter",
		  "of them steps that verified prompt-lookup drafts",
		  (double)m->spec_verify_steps);
	tb_metric(&b, "strata_spec_draft_tokens_total", "counter",
		  "draft tokens verified", (double)m->spec_drafted);
	tb_metric(&b, "strata_spec_accepted_tokens_total", "counter",
		  "draft tokens accepted (tokens per decode step = 1 + "
		  "accepted / decode steps)", (double)m->spec_accepted);
	tb_metric(&b, "strata_spec_verify_step_tokens_total", "counter",
		  "tokens produced by decode steps that verified drafts "
		  "(accepted drafts + 1 each)", (double)m->spec_tokens_verify);
	tb_head(&b, "strata_spec_expert_bytes_total", "counter",
		"expert bytes read by decode steps with drafts (steps=verify; "
		"per accepted token: / strata_spec_verify_step_tokens_total) "
		"and without (steps=plain; one token each)");
	tb_printf(&b, "strata_spec_expert_bytes_total{steps=\"verify\"} "
		  "%llu\nstrata_spec_expert_bytes_total{steps=\"plain\"} "
		  "%llu\n", (unsigned long long)m->spec_bytes_verify,
		  (unsigned long long)m->spec_bytes_plain);
	tb_head(&b, "strata_spec_draft_limit_steps_total", "counter",
		"decode steps by the draft length chosen for them (0: none)");
	for (int k = 0; k <= CW_DRAFT_MAX; k++)
		tb_printf(&b, "strata_spec_draft_limit_steps_total"
			  "{limit=\"%d\"} %llu\n", k,
			  (unsigned long long)m->spec_limit_hist[k]);
	tb_metric(&b, "strata_steps_total", "counter",
		  "forward steps of the scheduler", (double)m->steps);
	tb_metric(&b, "strata_step_tokens_total", "counter",
		  "tokens computed in forward steps (prefill and decode)",
		  (double)m->step_tokens);
	tb_metric(&b, "strata_step_seconds_total", "counter",
		  "time in forward steps", (double)m->step_ns / 1e9);
	tb_hist(&b, "strata_time_to_first_token_seconds",
		"TTFT: from the request's arrival to its first token",
		&m->ttft, k_lat_bounds);
	tb_hist(&b, "strata_time_per_output_token_seconds",
		"TPOT: mean time between a request's tokens after the first",
		&m->tpot, k_lat_bounds);
	tb_hist(&b, "strata_step_batch_tokens",
		"tokens per forward step (continuous batching)",
		&m->step_batch, k_batch_bounds);
	pthread_mutex_unlock(&m->lock);

	tb_metric(&b, "strata_sequences_running", "gauge",
		  "sequences admitted and not finished", x->running);
	tb_metric(&b, "strata_requests_queued", "gauge",
		  "requests waiting for admission", x->queued);
	tb_metric(&b, "strata_sequences_running_max", "gauge",
		  "--max-running", x->max_running);
	tb_metric(&b, "strata_requests_queued_max", "gauge", "--max-queued",
		  x->max_queued);
	tb_head(&b, "strata_daemon_up", "gauge",
		"1 when the daemon answered its last stats request");
	tb_printf(&b, "strata_daemon_up{daemon=\"computed\"} 1\n"
		  "strata_daemon_up{daemon=\"expertd\"} %d\n"
		  "strata_daemon_up{daemon=\"kvd\"} %d\n", x->es_ok, x->kv_ok);
	{
		/* the supervisor's counts (st_superv.h), when one runs */
		struct st_superv_state sv;
		int have = m->run_dir &&
			   st_superv_state_read(m->run_dir, &sv) == 0;

		tb_metric(&b, "strata_supervised", "gauge",
			  "1 when a supervisor (strata up) restarts the "
			  "instance's daemons", have);
		if (have) {
			tb_head(&b, "strata_daemon_restarts_total", "counter",
				"restarts of the daemon by the supervisor after "
				"it died");
			for (int i = 0; i < ST_SUPERV_DAEMONS; i++)
				tb_printf(&b, "strata_daemon_restarts_total"
					  "{daemon=\"%s\"} %u\n", sv.d[i].name,
					  sv.d[i].restarts);
			tb_head(&b, "strata_daemon_gave_up", "gauge",
				"1 when the supervisor stopped restarting the "
				"daemon (crash loop)");
			for (int i = 0; i < ST_SUPERV_DAEMONS; i++)
				tb_printf(&b, "strata_daemon_gave_up"
					  "{daemon=\"%s\"} %d\n", sv.d[i].name,
					  !strcmp(sv.d[i].state, "gave-up"));
		}
	}
	tb_head(&b, "strata_daemon_epoch", "gauge",
		"epoch of the daemon's shared segment; it rises when the "
		"daemon was restarted and re-validated it");
	tb_printf(&b, "strata_daemon_epoch{daemon=\"expertd\"} %llu\n"
		  "strata_daemon_epoch{daemon=\"kvd\"} %llu\n",
		  (unsigned long long)x->es_epoch,
		  (unsigned long long)x->kv_epoch);
	/* experts: T1 host pool only in a CPU build (no T0 device tier) */
	tb_head(&b, "strata_expert_hits_total", "counter",
		"expert acquires served from a resident slot, per tier");
	tb_printf(&b, "strata_expert_hits_total{tier=\"host\"} %llu\n",
		  (unsigned long long)x->es_hits);
	tb_head(&b, "strata_expert_misses_total", "counter",
		"expert acquires that needed a load from the next tier");
	tb_printf(&b, "strata_expert_misses_total{tier=\"host\"} %llu\n",
		  (unsigned long long)x->es_misses);
	tb_metric(&b, "strata_expert_evictions_total", "counter",
		  "experts evicted from the host pool", (double)x->es_evictions);
	tb_head(&b, "strata_bytes_moved_total", "counter",
		"bytes moved between tiers, per link");
	tb_printf(&b, "strata_bytes_moved_total{link=\"nvme_to_host\","
		  "kind=\"expert\"} %llu\n", (unsigned long long)x->es_load_bytes);
	tb_printf(&b, "strata_bytes_moved_total{link=\"host_to_nvme\","
		  "kind=\"kv\"} %llu\n",
		  (unsigned long long)(x->kv_spill_total * x->kv_page_bytes));
	tb_printf(&b, "strata_bytes_moved_total{link=\"nvme_to_host\","
		  "kind=\"kv\"} %llu\n",
		  (unsigned long long)(x->kv_restore_total * x->kv_page_bytes));
	tb_head(&b, "strata_weight_bytes_read_total", "counter",
		"weight bytes read by computed's kernels, by kind");
	tb_printf(&b, "strata_weight_bytes_read_total{kind=\"expert\"} %llu\n"
		  "strata_weight_bytes_read_total{kind=\"dense\"} %llu\n"
		  "strata_weight_bytes_read_total{kind=\"lm_head\"} %llu\n",
		  (unsigned long long)x->expert_bytes,
		  (unsigned long long)x->dense_bytes,
		  (unsigned long long)x->lm_head_bytes);
	tb_metric(&b, "strata_expert_stall_seconds_total", "counter",
		  "time computed waited for experts to become resident",
		  (double)x->expert_stall_ns / 1e9);
	tb_head(&b, "strata_expert_slots", "gauge",
		"expert slots of the host pool (state=used|total)");
	tb_printf(&b, "strata_expert_slots{tier=\"host\",state=\"used\"} %llu\n"
		  "strata_expert_slots{tier=\"host\",state=\"total\"} %llu\n",
		  (unsigned long long)x->es_slots_used,
		  (unsigned long long)x->es_slots);
	tb_head(&b, "strata_kv_pages", "gauge",
		"KV pages per tier (host: used, total, peak; nvme: spilled)");
	tb_printf(&b, "strata_kv_pages{tier=\"host\",state=\"used\"} %llu\n"
		  "strata_kv_pages{tier=\"host\",state=\"total\"} %llu\n"
		  "strata_kv_pages{tier=\"host\",state=\"peak\"} %llu\n"
		  "strata_kv_pages{tier=\"nvme\",state=\"spilled\"} %llu\n",
		  (unsigned long long)x->kv_pages_used,
		  (unsigned long long)x->kv_pages_total,
		  (unsigned long long)x->kv_pages_peak,
		  (unsigned long long)x->kv_spilled_pages);
	tb_metric(&b, "strata_kv_page_bytes", "gauge", "bytes of one KV page",
		  (double)x->kv_page_bytes);
	pthread_mutex_lock(&m->lock);
	kv_pin[0] = m->kv_pin_ns;
	kv_pin[1] = m->kv_pins;
	kv_pin[2] = m->kv_stall_ns;
	kv_pin[3] = m->kv_stalls;
	kv_pin[4] = m->kv_stall_seqs;
	kv_pin[5] = m->kv_ahead_seqs;
	kv_pin[6] = m->kv_deferred_seqs;
	kv_pin[7] = m->kv_admit_ahead_reqs;
	kv_pin[8] = m->kv_admit_ahead_spilled;
	kv_pin[9] = m->kv_admit_waits;
	kv_pin[10] = m->kv_admit_wait_pages;
	pthread_mutex_unlock(&m->lock);
	tb_metric(&b, "strata_kv_pin_seconds_total", "counter",
		  "time steps waited for kvd to pin their sequences",
		  (double)kv_pin[0] / 1e9);
	tb_metric(&b, "strata_kv_pins_total", "counter",
		  "pins of a step's sequences", (double)kv_pin[1]);
	tb_metric(&b, "strata_kv_restore_stall_seconds_total", "counter",
		  "time steps waited on pins that had spilled pages to "
		  "restore (the KV restore stall)",
		  (double)kv_pin[2] / 1e9);
	tb_metric(&b, "strata_kv_restore_stalls_total", "counter",
		  "pins that found a sequence with spilled pages",
		  (double)kv_pin[3]);
	tb_metric(&b, "strata_kv_restore_stall_seqs_total", "counter",
		  "sequences a step found with spilled pages",
		  (double)kv_pin[4]);
	tb_metric(&b, "strata_kv_restore_ahead_seqs_total", "counter",
		  "sequences with spilled pages in the restore-ahead plans "
		  "sent to kvd",
		  (double)kv_pin[5]);
	tb_metric(&b, "strata_kv_restore_deferred_seqs_total", "counter",
		  "sequences left to the next step while kvd restored them",
		  (double)kv_pin[6]);
	tb_metric(&b, "strata_kv_admission_waits_total", "counter",
		  "requests that waited in the queue for KV pages (kvd "
		  "without spilling: admitted once its free pages cover the "
		  "prompt and max_tokens)", (double)kv_pin[9]);
	tb_metric(&b, "strata_kv_admission_wait_pages", "gauge",
		  "KV pages the queued requests the free places would take "
		  "wait for now, beyond the room kvd has",
		  (double)kv_pin[10]);
	tb_metric(&b, "strata_kv_admit_ahead_requests_total", "counter",
		  "queued requests whose cached prefixes were named to kvd to "
		  "restore ahead of their admission", (double)kv_pin[7]);
	tb_metric(&b, "strata_kv_admit_ahead_spilled_groups_total", "counter",
		  "prefix-cache groups kvd found spilled in those plans",
		  (double)kv_pin[8]);
	tb_metric(&b, "strata_kv_prefix_restore_ahead_groups_total", "counter",
		  "prefix-cache groups of queued requests kvd restored ahead "
		  "of their admission", (double)x->kv_prefix_ahead_groups);
	tb_metric(&b, "strata_kv_prefix_restore_ahead_bytes_total", "counter",
		  "spill-file bytes of those groups",
		  (double)x->kv_prefix_ahead_bytes);
	tb_metric(&b, "strata_kv_admission_restore_groups_total", "counter",
		  "prefix-cache groups a request's admission found spilled "
		  "and restored itself (the admission waited)",
		  (double)x->kv_admit_restores);
	tb_metric(&b, "strata_kv_admission_restore_stall_seconds_total",
		  "counter", "time admissions waited for those restores (kvd)",
		  (double)x->kv_admit_restore_ns / 1e9);
	tb_metric(&b, "strata_prefix_cache_lookups_total", "counter",
		  "prefix-cache lookups (kvd)", (double)x->kv_prefix_lookups);
	tb_metric(&b, "strata_prefix_cache_rows_reused_total", "counter",
		  "KV rows mapped from the prefix cache (kvd)",
		  (double)x->kv_prefix_rows_reused);
	if (x->kv_remote_on) {
		/* kvd's remote KV tier (kvd --remote-kv, kv_remote.h) */
		tb_head(&b, "strata_kv_remote_lookups_total", "counter",
			"prefix-cache groups looked up in the remote KV tier "
			"(result=hit: restored; miss: a lookup that found none)");
		tb_printf(&b, "strata_kv_remote_lookups_total{result=\"hit\"} "
			  "%llu\n"
			  "strata_kv_remote_lookups_total{result=\"miss\"} "
			  "%llu\n",
			  (unsigned long long)x->kv_remote_hits,
			  (unsigned long long)x->kv_remote_misses);
		tb_head(&b, "strata_kv_remote_bytes_total", "counter",
			"value bytes read from (in) and written to (out) the "
			"remote KV tier");
		tb_printf(&b, "strata_kv_remote_bytes_total{dir=\"in\"} %llu\n"
			  "strata_kv_remote_bytes_total{dir=\"out\"} %llu\n",
			  (unsigned long long)x->kv_remote_bytes_in,
			  (unsigned long long)x->kv_remote_bytes_out);
		tb_metric(&b, "strata_kv_remote_errors_total", "counter",
			  "remote KV tier failures (connect, timeout, refused "
			  "write, rejected value): each a local recompute",
			  (double)x->kv_remote_errors);
	}
	if (x->io_on) {
		/* the NVMe queue shared by expertd and kvd (st_ioq.h) */
		tb_io_class(&b, "strata_io_bytes_total",
			    "bytes read or written on the NVMe tier by I/O "
			    "class (demand, kv-restore, prefetch, kv-spill; "
			    "expertd and kvd)", x->io.bytes, 0);
		tb_io_class(&b, "strata_io_wait_seconds_total",
			    "time I/Os were deferred behind more urgent "
			    "classes, by class", x->io.wait_ns, 1);
		tb_io_class(&b, "strata_io_ops_total",
			    "I/Os (reads or writes of up to 8 MiB) by class",
			    x->io.ops, 0);
		tb_io_class(&b, "strata_io_seconds_total",
			    "time from the start of each I/O to its end (after "
			    "any wait; an expert record's includes its "
			    "checksum), by class", x->io.io_ns, 1);
		tb_metric(&b, "strata_io_ordered", "gauge",
			  "1: every live expertd and kvd orders its I/O by "
			  "class; 0: some run with STRATA_IOQ=off (counted, "
			  "not ordered)",
			  st_ioq_mode(&x->io) == ST_IOQ_MODE_ORDERED ? 1 : 0);
	}
	if (x->mem_on)
		tb_memory(&b, &x->mem);
	/* prefetch (gate look-ahead hints, expertd): precision = used /
	 * loaded by a hint, recall = used / (used + demand misses), as in
	 * the run summary (cli_tiers.c) */
	tb_head(&b, "strata_expert_prefetch_total", "counter",
		"expert loads started by look-ahead hints, by outcome "
		"(loaded, used before eviction, evicted unused)");
	tb_printf(&b, "strata_expert_prefetch_total{outcome=\"loaded\"} %llu\n"
		  "strata_expert_prefetch_total{outcome=\"used\"} %llu\n"
		  "strata_expert_prefetch_total{outcome=\"wasted\"} %llu\n",
		  (unsigned long long)x->es_prefetch_loads,
		  (unsigned long long)x->es_prefetch_used,
		  (unsigned long long)x->es_prefetch_wasted);
	tb_head(&b, "strata_expert_hints_total", "counter",
		"(layer, expert) look-ahead hints received (state=all) and "
		"dropped as stale or superseded (state=dropped)");
	tb_printf(&b, "strata_expert_hints_total{state=\"all\"} %llu\n"
		  "strata_expert_hints_total{state=\"dropped\"} %llu\n",
		  (unsigned long long)x->es_hints,
		  (unsigned long long)x->es_hints_dropped);
	tb_metric(&b, "strata_expert_prefetch_precision", "gauge",
		  "prefetched experts that were used, since expertd's pool "
		  "was made (0 before any prefetch)",
		  x->es_prefetch_loads ? (double)x->es_prefetch_used /
					 (double)x->es_prefetch_loads : 0.0);
	tb_metric(&b, "strata_expert_prefetch_recall", "gauge",
		  "used experts that had been prefetched: used / (used + "
		  "demand misses)",
		  x->es_prefetch_used + x->es_misses ?
			  (double)x->es_prefetch_used /
				  (double)(x->es_prefetch_used + x->es_misses) :
			  0.0);
	if (x->engram_ok) {
		/* DeepSeek-V4.1 Engram rows (expertd's Engram tier) */
		tb_metric(&b, "strata_engram_lookups_total", "counter",
			  "Engram rows asked of expertd (fetches and "
			  "prefetches)", (double)x->en_lookups);
		tb_head(&b, "strata_engram_rows_total", "counter",
			"Engram row lookups by outcome (served from the host "
			"cache, joined a read in flight, read from the store)");
		tb_printf(&b, "strata_engram_rows_total{result=\"hit\"} %llu\n"
			  "strata_engram_rows_total{result=\"merged\"} %llu\n"
			  "strata_engram_rows_total{result=\"miss\"} %llu\n",
			  (unsigned long long)x->en_hits,
			  (unsigned long long)x->en_merged,
			  (unsigned long long)x->en_misses);
		tb_metric(&b, "strata_engram_hit_rate", "gauge",
			  "Engram lookups served from the host cache (0 "
			  "before any)", x->en_lookups ?
			  (double)x->en_hits / (double)x->en_lookups : 0.0);
		tb_metric(&b, "strata_engram_read_bytes_total", "counter",
			  "bytes of Engram blocks read from the store",
			  (double)x->en_read_bytes);
		tb_metric(&b, "strata_engram_reads_total", "counter",
			  "Engram 4 KiB block reads", (double)x->en_reads);
		tb_head(&b, "strata_engram_read_latency_seconds", "gauge",
			"Engram block read latency quantiles since expertd "
			"started (+-6 %)");
		tb_printf(&b, "strata_engram_read_latency_seconds{quantile=\"0.5\"} %.9f\n"
			  "strata_engram_read_latency_seconds{quantile=\"0.99\"} %.9f\n",
			  (double)x->en_lat_p50_ns / 1e9,
			  (double)x->en_lat_p99_ns / 1e9);
	}
	pthread_mutex_lock(&m->lock);
	tb_metric(&b, "strata_uptime_seconds", "gauge",
		  "seconds since computed started",
		  (double)(now - m->start_ns) / 1e9);
	pthread_mutex_unlock(&m->lock);
	if (b.err) {
		free(b.p);
		return b.err;
	}
	*ret = b.p;
	return 0;
}

/* cw_sched.c — continuous batching; see cw_sched.h. */
#include "cw_sched.h"
#include "cw_session.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cw_kvahead.h"
#include "cw_timeline.h"
#include "st_log.h"
#include "st_util.h"

/* Steps a window of sequences runs before the rotation moves on, when
 * not all running sequences fit kvd's pool: each move restores a window's
 * pages, so a longer one moves fewer bytes per token (and gives a restore
 * ahead that many steps to bring the next window back), at the price of
 * the others' wait. */
#define CW_SCHED_KV_WINDOW_STEPS 8

struct cw_sched_req {
	struct cw_sched *s;
	int32_t *ids;                /* prompt, owned (freed at admission) */
	size_t n_ids;
	struct cw_gen_params p;
	char *stop[CW_GEN_MAX_STOP]; /* owned copies of p.stop */
	int max_pending;
	struct cw_gen *gen;          /* scheduler thread only */
	/* under s->lock: */
	struct cw_sched_event *ev;   /* events not yet popped, ev_head.. */
	int ev_head, ev_n, ev_cap;
	int done;                    /* the last event was posted */
	int cancelled, released;
	int refs;                    /* consumer + scheduler */
	int n_prompt, n_gen, max_tokens, n_cached;
	struct cw_sched_save save;   /* written before the last event */
	/* scheduler thread only: */
	uint64_t t_submit, t_first, t_last;
	int in_step;                 /* picked for the step being built */
	/* queued: its prompt's prefix-cache keys, named to kvd ahead of
	 * its admission (ask_admit; computed once) */
	uint64_t *pkeys;
	int n_pkeys, pkeys_done, named;
	uint64_t named_turn;         /* the ask_admit that first named it */
	int kv_waited;               /* waited for KV pages (counted once) */
	struct cw_sched_req *next;   /* queue or running list */
};

struct cw_sched {
	struct cw_model *model;
	const struct st_tokenizer *tok;
	struct kv_client *kv;
	struct cw_metrics *metrics;
	struct cw_sched_opts o;
	int vocab;
	pthread_t thread;
	int have_thread;
	pthread_mutex_t lock;        /* queue, events, counts, stop */
	pthread_cond_t cond_work;    /* scheduler: work or room appeared */
	pthread_cond_t cond_out;     /* consumers: events appeared */
	pthread_mutex_t model_lock;  /* the forward pass */
	struct cw_sched_req *queue_head, *queue_tail;
	int n_queued, n_running;
	/* kvd's pool as admission by KV pages last read it (pages, rows a
	 * page, streams; pool 0: unknown or not by pages), for refusing at
	 * submission a request not even the whole pool holds */
	uint64_t kv_pool_pages;
	uint32_t kv_page_rows, kv_streams;
	int stop;
	/* scheduler thread only */
	struct cw_sched_req *running; /* in admission order */
	struct cw_batch_tok *toks;
	struct cw_sched_req **breq;   /* per request in the step */
	int *bn;                      /* its token count */
	uint32_t *pins;
	int n_tl_steps;               /* steps written to o.timeline */
	/* KV pages of a step when kvd may spill (cw_kvahead.h): the
	 * running list rotated by rr, so that sequences left out of a step
	 * for the cap come first in the next */
	struct cw_kvahead kva;
	struct cw_sched_req **order;  /* max_running */
	int rr;
	int win_steps;                /* steps since the rotation moved */
	uint32_t *next_seqs;          /* the next step's, to restore ahead */
	int n_next;                   /* sent after this step's pin */
	/* queued requests' prefixes named ahead (ask_admit) */
	struct cw_sched_req **adm;    /* max_running */
	uint32_t *adm_chain;          /* max_running */
	uint64_t *adm_keys;           /* KV_PROTO_MAX_AHEAD_KEYS */
	uint64_t admit_turn;          /* ask_admit calls */
};

static void abs_deadline(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static void req_free(struct cw_sched_req *r)
{
	for (int i = r->ev_head; i < r->ev_head + r->ev_n; i++)
		free(r->ev[i].text);
	free(r->ev);
	for (int i = 0; i < CW_GEN_MAX_STOP; i++)
		free(r->stop[i]);
	free(r->ids);
	free(r->pkeys);
	free(r);
}

/* Drops one reference (under s->lock); frees at zero. */
static void req_unref_locked(struct cw_sched_req *r)
{
	if (--r->refs == 0)
		req_free(r);
}

/* Appends an event (under s->lock).  text is copied. */
static int post_locked(struct cw_sched *s, struct cw_sched_req *r,
		       const struct cw_sched_event *e, const char *text)
{
	struct cw_sched_event *ne;

	if (r->ev_head > 0 && r->ev_head + r->ev_n == r->ev_cap) {
		memmove(r->ev, r->ev + r->ev_head, sizeof(*r->ev) * r->ev_n);
		r->ev_head = 0;
	}
	if (r->ev_head + r->ev_n == r->ev_cap) {
		int cap = r->ev_cap ? r->ev_cap * 2 : 8;
		struct cw_sched_event *p = realloc(r->ev, sizeof(*p) * cap);

		if (!p)
			return -ENOMEM;
		r->ev = p;
		r->ev_cap = cap;
	}
	ne = &r->ev[r->ev_head + r->ev_n];
	*ne = *e;
	ne->text = strdup(text ? text : "");
	if (!ne->text)
		return -ENOMEM;
	r->ev_n++;
	if (e->finish != CW_FINISH_NONE)
		r->done = 1;
	pthread_cond_broadcast(&s->cond_out);
	return 0;
}

/* The last event of a request that failed with err. */
static struct cw_sched_event error_event(int err, const char *msg)
{
	struct cw_sched_event e = { .token = -1, .finish = CW_FINISH_ERROR,
				    .err = err };

	snprintf(e.err_msg, sizeof(e.err_msg), "%s", msg);
	return e;
}

/* Tokens of generation g beyond one per sampling step: the accepted
 * drafts it returned (cw_metrics_step counted one token per step). */
static uint64_t spec_extra_tokens(const struct cw_gen *g,
				  const struct cw_gen_spec_stats *sp)
{
	uint64_t n = (uint64_t)cw_gen_n_generated(g);
	uint64_t sampled = sp->steps + (n > 0); /* + the prefill's sample */

	return n > sampled ? n - sampled : 0;
}

/* Saves the conversation of r's generation (still alive) as session
 * r->p.session_save into r->save (saved, or why not: a failed save does
 * not take the finished completion away, the client reads the outcome
 * beside it). */
static void session_save(struct cw_sched *s, struct cw_sched_req *r)
{
	struct st_diag diag = { "" };
	const int n_prompt = cw_gen_n_prompt(r->gen);
	const int n_gen = cw_gen_n_generated(r->gen);
	const int dsv = cw_model_is_dsv4(s->model);
	/* rows written: every token fed; the last sampled one never was (a
	 * V4 state published their full pages itself as it went) */
	const int n_rows = n_prompt + (n_gen > 0 ? n_gen - 1 : 0);
	struct cw_sched_save *v = &r->save;
	int rc = s->o.session ?
		cw_session_save(s->kv, s->o.session, r->p.session_save,
				cw_gen_seq(r->gen), cw_gen_prompt_ids(r->gen),
				n_prompt + n_gen, n_rows, !dsv, &v->rows,
				&v->replaced, &diag) :
		st_diag_set(&diag, -ST_E_UNSUPPORTED, "session '%s': sessions "
			    "need kvd", r->p.session_save);

	v->state = rc == 0 ? 1 : -1;
	v->err = rc;
	if (rc < 0) {
		st_warn("%s", diag.msg);
		snprintf(v->msg, sizeof(v->msg), "%s", diag.msg);
	}
}

/* Loads session r->p.session_load before r starts.  0 or the error. */
static int session_load(struct cw_sched *s, struct cw_sched_req *r,
			struct st_diag *diag)
{
	if (!s->o.session)
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "session '%s': "
				   "sessions need kvd", r->p.session_load);
	return cw_session_load(s->kv, s->o.session, r->p.session_load, NULL,
			       diag);
}

/* Removes r from the running list (scheduler thread), frees its
 * generation (and so its KV sequence), then posts its last event (so a
 * client that sees the end finds the pages already freed) and drops the
 * scheduler's ref. */
static void retire(struct cw_sched *s, struct cw_sched_req *r,
		   enum cw_finish fin, int aborted,
		   const struct cw_sched_event *last, const char *text)
{
	struct cw_sched_req **pp = &s->running;
	uint64_t ttft = 0, tpot = 0;

	while (*pp && *pp != r)
		pp = &(*pp)->next;
	if (*pp)
		*pp = r->next;
	if (r->gen) {
		r->n_gen = cw_gen_n_generated(r->gen);
		if (s->metrics) {
			struct cw_gen_spec_stats sp;

			cw_metrics_gen_times(s->metrics,
					     cw_gen_prefill_ns(r->gen),
					     cw_gen_decode_ns(r->gen));
			cw_gen_spec_stats(r->gen, &sp);
			cw_metrics_spec(s->metrics, sp.steps, sp.spec_steps,
					sp.drafted, sp.accepted,
					spec_extra_tokens(r->gen, &sp));
			cw_metrics_spec_price(s->metrics, sp.bytes_verify,
					      sp.bytes_plain, sp.tokens_verify,
					      sp.limit_hist);
		}
		if (r->p.session_save[0] && fin != CW_FINISH_ERROR &&
		    !aborted && last)
			session_save(s, r);
		cw_gen_free(r->gen);
		r->gen = NULL;
	}
	if (r->t_first)
		ttft = r->t_first - r->t_submit;
	if (r->n_gen > 1)
		tpot = (r->t_last - r->t_first) / (uint64_t)(r->n_gen - 1);
	if (s->metrics)
		cw_metrics_gen_end(s->metrics, (int)fin, aborted, ttft, tpot);
	pthread_mutex_lock(&s->lock);
	if (last && post_locked(s, r, last, text) < 0)
		r->done = 1; /* the consumer sees the end by time-out */
	s->n_running--;
	req_unref_locked(r);
	pthread_cond_broadcast(&s->cond_out);
	pthread_mutex_unlock(&s->lock);
}

/* Starts the generation of an admitted request (its KV sequence, prefix
 * cache lookup) and appends it to the running list. */
static void admit(struct cw_sched *s, struct cw_sched_req *r)
{
	struct st_diag diag = { "" };
	struct cw_sched_req **pp = &s->running;
	int rc;

	rc = r->p.session_load[0] ? session_load(s, r, &diag) : 0;
	if (rc == 0)
		rc = cw_gen_start_ids(s->model, s->tok, s->kv, r->ids,
				      r->n_ids, &r->p, &r->gen, &diag);
	while (*pp)
		pp = &(*pp)->next;
	r->next = NULL;
	*pp = r;
	if (rc < 0) {
		struct cw_sched_event e = error_event(rc, diag.msg);

		r->gen = NULL;
		retire(s, r, CW_FINISH_ERROR, 0, &e, "");
		return;
	}
	free(r->ids);
	r->ids = NULL;
	r->max_tokens = cw_gen_max_tokens(r->gen);
	pthread_mutex_lock(&s->lock);
	r->n_cached = cw_gen_n_cached(r->gen);
	pthread_mutex_unlock(&s->lock);
	if (s->metrics)
		cw_metrics_gen_start(s->metrics, cw_gen_n_prompt(r->gen),
				     cw_gen_n_cached(r->gen));
	if (r->max_tokens == 0) {
		/* nothing to generate: no step would ever pick it up
		 * (cw_gen_next_input offers no input), so it ends here */
		struct cw_sched_event e = { .token = -1,
					    .finish = CW_FINISH_LENGTH };

		retire(s, r, CW_FINISH_LENGTH, 0, &e, "");
	}
}

/* Room for one more event (under s->lock)? */
static int has_room(const struct cw_sched_req *r)
{
	return r->ev_n < r->max_pending;
}

/* Posts one result of cw_gen_advance / cw_gen_emit_pending (len: its
 * return); 1 while the request goes on, 0 once retired. */
static int post_result(struct cw_sched *s, struct cw_sched_req *r, int len,
		       const struct cw_sched_event *pe, const char *text,
		       const struct st_diag *diag, uint64_t now)
{
	struct cw_sched_event e = *pe;

	if (len < 0) {
		struct cw_sched_event ee = error_event(len, diag->msg);

		retire(s, r, CW_FINISH_ERROR, 0, &ee, "");
		return 0;
	}
	if (e.token < 0 && e.finish == CW_FINISH_NONE)
		return 1; /* a prefill chunk that did not end the prompt */
	if (e.token >= 0) {
		e.lp = *cw_gen_last_logprob(r->gen);
		if (!r->t_first)
			r->t_first = now;
		r->t_last = now;
	}
	if (e.finish != CW_FINISH_NONE) {
		retire(s, r, e.finish, 0, &e, text);
		return 0;
	}
	pthread_mutex_lock(&s->lock);
	r->n_gen = cw_gen_n_generated(r->gen);
	post_locked(s, r, &e, text);
	pthread_mutex_unlock(&s->lock);
	return 1;
}

/* Feeds one request's evaluated tokens back to its generation and posts
 * what it produced (a step that verified drafts may produce several
 * tokens: one event each); retires it when it finished. */
static void advance(struct cw_sched *s, struct cw_sched_req *r, int n,
		    uint64_t step_ns, uint64_t now)
{
	struct st_diag diag = { "" };
	struct cw_sched_event e = { .token = -1 };
	char text[2048];
	int len;

	len = cw_gen_advance(r->gen, n, step_ns, text, sizeof(text), &e.token,
			     &e.finish, &diag);
	while (post_result(s, r, len, &e, text, &diag, now) &&
	       cw_gen_n_pending(r->gen) > 0) {
		e = (struct cw_sched_event){ .token = -1 };
		len = cw_gen_emit_pending(r->gen, text, sizeof(text), &e.token,
					  &e.finish, &diag);
	}
}

/* Asks kvd to restore the next step's sequences (s->next_seqs) while
 * this one computes; a failure only costs the next pin its wait. */
static void ask_ahead(struct cw_sched *s)
{
	struct st_diag d = { "" };
	int r;

	if (s->n_next <= 0)
		return;
	r = cw_kvahead_ask(&s->kva, s->n_next, s->next_seqs, &d);
	s->n_next = 0;
	if (r < 0)
		st_debug("restore ahead: %s", d.msg);
	else if (r > 0 && s->metrics)
		cw_metrics_kv_ahead(s->metrics, r);
}

/* Running requests that may end within a window of steps (their token
 * limit that close): each makes a place for a queued request. */
static int n_ending(const struct cw_sched *s)
{
	int n = 0;

	for (const struct cw_sched_req *q = s->running; q; q = q->next)
		n += q->gen && q->max_tokens - cw_gen_n_generated(q->gen) <=
				       CW_SCHED_KV_WINDOW_STEPS;
	return n;
}

/* The prefix-cache keys of queued request r's prompt (scheduler thread;
 * r->ids stays until its admission, which is this thread's). */
static void req_prefix_keys(struct cw_sched *s, struct cw_sched_req *r)
{
	uint32_t B = kv_client_page_rows(s->kv);
	size_t cap = B ? r->n_ids / B + 1 : 0;
	int n;

	r->pkeys_done = 1;
	if (!cap || !r->p.prefix_cache)
		return;
	r->pkeys = malloc(sizeof(*r->pkeys) * cap);
	if (!r->pkeys)
		return; /* its admission's lookup restores what it needs */
	n = kv_client_prefix_keys(s->kv, r->ids, (uint32_t)r->n_ids, r->pkeys,
				  (uint32_t)ST_MIN(cap, (size_t)UINT32_MAX));
	r->n_pkeys = n > 0 ? n : 0;
}

/*
 * Names to kvd the prefix-cache chains of the queued requests the next
 * admissions will take (cw_kvahead_ask_prefix): as many as there are free
 * places and running requests that may end within a window, at least the
 * head of the queue, within the KV pages of one step (the first always),
 * so that kvd restores their spilled groups while steps compute and
 * their admission's lookup maps them without waiting.  The plan goes
 * (n_chains 0) once no request waits.  Returns the groups kvd found
 * spilled in a plan it was sent now (0: none, or the plan unchanged);
 * requests first named by this call get named_turn = s->admit_turn.
 */
static int ask_admit(struct cw_sched *s)
{
	uint64_t cap = cw_kvahead_cap(&s->kva), pages = 0;
	uint32_t ns = s->kva.n_streams, n_keys = 0;
	int want, n = 0, n_chains = 0, fresh = 0, r;
	struct st_diag d = { "" };

	if (!s->kva.on || s->kva.pfx_off || !s->kva.known ||
	    cw_model_is_dsv4(s->model))
		return 0;
	s->admit_turn++;
	want = n_ending(s);
	pthread_mutex_lock(&s->lock);
	want = ST_MAX(1, want + s->o.max_running - s->n_running);
	for (struct cw_sched_req *q = s->queue_head; q && n < want;
	     q = q->next)
		if (!q->cancelled && q->p.prefix_cache && q->ids) {
			q->refs++; /* kept while named (a cancel unlinks it) */
			s->adm[n++] = q;
		}
	pthread_mutex_unlock(&s->lock);
	for (int i = 0; i < n; i++) {
		struct cw_sched_req *q = s->adm[i];
		uint32_t k;

		if (!q->pkeys_done)
			req_prefix_keys(s, q);
		k = (uint32_t)ST_MIN((uint32_t)q->n_pkeys,
				     KV_PROTO_MAX_AHEAD_KEYS - n_keys);
		if (k && cap != UINT64_MAX && n_chains &&
		    pages + (uint64_t)k * ns > cap)
			break; /* one step's pages at most */
		if (!k)
			continue;
		memcpy(s->adm_keys + n_keys, q->pkeys, sizeof(uint64_t) * k);
		s->adm_chain[n_chains++] = k;
		n_keys += k;
		pages += (uint64_t)k * ns;
		if (!q->named)
			q->named_turn = s->admit_turn;
		fresh += !q->named;
		q->named = 1;
	}
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < n; i++)
		req_unref_locked(s->adm[i]);
	pthread_mutex_unlock(&s->lock);
	r = cw_kvahead_ask_prefix(&s->kva, (uint32_t)n_chains, s->adm_chain,
				  s->adm_keys, &d);
	if (r < 0)
		st_debug("restore ahead of queued requests: %s", d.msg);
	else if ((r > 0 || fresh) && s->metrics)
		cw_metrics_kv_admit_ahead(s->metrics, fresh, r);
	return r > 0 ? r : 0;
}

/* KV rows a generation of n_prompt prompt tokens and max_tokens (cut to
 * the context) writes by its end: the prompt and each sampled token but
 * the last, which is never evaluated (cw_gen: a step's drafts stop one
 * short of max_tokens too).  Counting the last one refused, at a page
 * boundary, a request the pool holds (issue atk). */
static uint64_t kv_rows_at_end(uint64_t n_prompt, uint64_t max_tokens)
{
	return n_prompt + (max_tokens > 0 ? max_tokens - 1 : 0);
}

/* max_tokens of queued request r as cw_gen_start cuts it to the
 * context. */
static int64_t req_max_tokens_cut(const struct cw_sched *s,
				  const struct cw_sched_req *r)
{
	const int ctx = cw_model_config(s->model)->max_position_embeddings;
	int64_t mt = ST_MAX(r->p.max_tokens, 0);

	if (mt > (int64_t)ctx - (int64_t)r->n_ids)
		mt = ST_MAX((int64_t)ctx - (int64_t)r->n_ids, 0);
	return mt;
}

/* KV pages queued request r takes by its end: kv_rows_at_end of its
 * prompt and max_tokens (cut to the context), prefix-cache hits
 * ignored (counted as new pages: an upper bound). */
static uint64_t req_kv_pages(const struct cw_sched *s,
			     const struct cw_sched_req *r)
{
	return cw_kvahead_pages(
		&s->kva, kv_rows_at_end(r->n_ids,
					(uint64_t)req_max_tokens_cut(s, r)));
}

/* A request without max_tokens (r->p.max_tokens_auto: a chat's "the
 * rest of the context") that kvd's whole pool of pool pages (geometry
 * geo) would not hold: its max_tokens cut to what the pool holds for one
 * sequence, so that it runs as with a context that short (finish_reason
 * "length" there) instead of being refused.  Nothing when the prompt
 * alone does not fit (refused as before); a prompt that fills the
 * sequence's rows exactly gets one token. */
static void cut_auto_max_tokens(const struct cw_sched *s,
				struct cw_sched_req *r,
				const struct cw_kvahead *geo, uint64_t pool)
{
	const uint64_t fit = pool / ST_MAX(geo->n_streams, 1) *
			     geo->page_rows; /* rows of one sequence */

	/* fit == n_ids: the prompt fills the rows, one token (its row
	 * never written, kv_rows_at_end) still fits */
	if (!r->p.max_tokens_auto || fit < r->n_ids ||
	    cw_kvahead_pages(geo, kv_rows_at_end(r->n_ids, (uint64_t)
				     req_max_tokens_cut(s, r))) <= pool)
		return;
	r->p.max_tokens = (int)ST_MIN((uint64_t)ST_MAX(r->p.max_tokens, 1),
				      fit - r->n_ids + 1);
}

/* The refusal of queued request r, whose need KV pages not even kvd's
 * pool of pool pages (geometry geo) holds (spilling off), into msg; a
 * prompt that alone needs more than the pool is named as such (lowering
 * max_tokens cannot help it). */
static void too_big_msg(const struct cw_sched *s, const struct cw_sched_req *r,
			const struct cw_kvahead *geo, uint64_t need,
			uint64_t pool, char *msg, size_t cap)
{
	const int64_t mt = req_max_tokens_cut(s, r);
	const uint64_t prompt_need = cw_kvahead_pages(geo, r->n_ids);

	if (prompt_need > pool) {
		snprintf(msg, cap,
			 "KV pool exhausted: the prompt (%zu tokens) alone "
			 "needs %llu KV pages, kvd's pool holds %llu and "
			 "spilling is off: shorten the prompt or raise kvd "
			 "--budget (strata: --kv-budget, or --memory-budget)",
			 r->n_ids, (unsigned long long)prompt_need,
			 (unsigned long long)pool);
		return;
	}
	snprintf(msg, cap,
		 "KV pool exhausted: the prompt (%zu tokens) and max_tokens "
		 "(%lld%s) need %llu KV pages, kvd's pool holds %llu and "
		 "spilling is off: lower max_tokens or raise kvd --budget "
		 "(strata: --kv-budget, or --memory-budget)",
		 r->n_ids, (long long)mt,
		 mt < r->p.max_tokens ? ", cut to the context" : "",
		 (unsigned long long)need, (unsigned long long)pool);
}

/* Does admission by KV pages apply (kvd known and without a spill file,
 * not a V4 model, whose windowed and compressed streams it does not
 * count)?  Scheduler thread. */
static int kv_by_pages(struct cw_sched *s)
{
	(void)cw_kvahead_cap(&s->kva); /* kvd's geometry and spill budget */
	return s->kv && s->kva.known && !s->kva.spill &&
	       !cw_model_is_dsv4(s->model);
}

/* The KV pages the running requests may still take: per request, the
 * pages of kv_rows_at_end of its prompt and max_tokens less those its
 * sequence holds now (shared prefix pages count in both, so they
 * cancel). */
static uint64_t kv_growth(struct cw_sched *s)
{
	uint64_t growth = 0;

	for (const struct cw_sched_req *q = s->running; q; q = q->next) {
		int64_t rows;
		uint64_t end, held;

		if (!q->gen)
			continue;
		rows = kv_client_seq_rows(s->kv, cw_gen_seq(q->gen));
		end = cw_kvahead_pages(
			&s->kva,
			kv_rows_at_end((uint64_t)cw_gen_n_prompt(q->gen),
				       (uint64_t)ST_MAX(q->max_tokens, 0)));
		held = cw_kvahead_pages(&s->kva,
					rows > 0 ? (uint64_t)rows : 0);
		growth += end > held ? end - held : 0;
	}
	return growth;
}

/*
 * Admission by KV pages when kvd never spills (issue 24): the pages a
 * queued request may take now, kvd's limit less the pages in use less
 * `growth` (kv_growth), and in *ret_pool the pool's pages.  1 with
 * *ret_room, or 0 when kvd cannot be read (admissions as before: kvd's
 * own error speaks).  Scheduler thread.
 */
static int kv_room(struct cw_sched *s, uint64_t growth, uint64_t *ret_room,
		   uint64_t *ret_pool)
{
	uint64_t limit, used;

	if (cw_kvahead_room(&s->kva, &limit, &used, ret_pool) <= 0)
		return 0;
	*ret_room = limit > used + growth ? limit - used - growth : 0;
	return 1;
}

/* Fails queued request r (under s->lock), unlinked by the caller, with
 * err and msg: its last event, and the scheduler's reference dropped. */
static void fail_queued_locked(struct cw_sched *s, struct cw_sched_req *r,
			       int err, const char *msg)
{
	struct cw_sched_event e = error_event(err, msg);

	if (post_locked(s, r, &e, "") < 0)
		r->done = 1; /* the consumer sees the end by time-out */
	req_unref_locked(r);
	pthread_cond_broadcast(&s->cond_out);
}

/* Evaluates the step's tokens; pins the sequences kvd may spill. */
static int eval_step(struct cw_sched *s, struct cw_batch_tok *toks, int n,
		     struct cw_sched_req **reqs, int n_reqs,
		     struct st_diag *diag)
{
	int n_pins = 0, r;

	for (int i = 0; i < n_reqs; i++)
		if (cw_gen_pin_steps(reqs[i]->gen))
			s->pins[n_pins++] = cw_gen_seq(reqs[i]->gen);
	if (n_pins) {
		int missing = 0;
		uint64_t t0;

		/* sequences with spilled pages now: this pin restores them
		 * while the step waits (from shared memory, no message) */
		for (int i = 0; i < n_pins; i++)
			missing += kv_client_seq_resident(s->kv,
							  s->pins[i]) == 0;
		cw_steptime_phase(s->o.tl, CW_PHASE_KV);
		t0 = st_now_ns();
		r = kv_client_seq_pin(s->kv, n_pins, s->pins, NULL, diag);
		if (s->metrics)
			cw_metrics_kv_pin(s->metrics, st_now_ns() - t0,
					  missing);
		cw_steptime_phase(s->o.tl, CW_PHASE_NONE);
		if (r < 0)
			return r;
	}
	ask_ahead(s);
	(void)ask_admit(s);
	pthread_mutex_lock(&s->model_lock);
	r = cw_model_eval_batch(s->model, toks, n, diag);
	pthread_mutex_unlock(&s->model_lock);
	if (n_pins) {
		int u;

		cw_steptime_phase(s->o.tl, CW_PHASE_KV);
		u = kv_client_seq_unpin(s->kv, n_pins, s->pins,
					r < 0 ? NULL : diag);
		cw_steptime_phase(s->o.tl, CW_PHASE_NONE);
		if (r == 0)
			r = u;
	}
	return r;
}

/* The step timeline's row of one step (o.timeline set): decode, prefill
 * or mixed tokens of n_reqs sequences. */
static void timeline_row(struct cw_sched *s, const struct cw_tl_snap *a,
			 int n_reqs, int n_prefill)
{
	struct cw_tl_snap b;
	struct cw_tl_row row;
	char run[32];

	cw_tl_snap_take(&b, s->o.tl, s->o.es);
	cw_tl_row_make(a, &b, &row);
	snprintf(run, sizeof(run), "seqs=%d", n_reqs);
	if (cw_tl_write_row(s->o.timeline, run, !n_prefill ? "decode" :
			    n_prefill == n_reqs ? "prefill" : "mixed",
			    s->n_tl_steps++, &row) < 0 ||
	    fflush(s->o.timeline) != 0) {
		st_warn("cannot write the step timeline: %s (stopped)",
			strerror(errno));
		s->o.timeline = NULL;
	}
}

/* Sequences of the running list that are decoding. */
static int n_decoding(const struct cw_sched *s)
{
	int n = 0;

	for (const struct cw_sched_req *q = s->running; q; q = q->next)
		n += cw_gen_n_generated(q->gen) > 0;
	return n;
}

/* Tokens a decoding sequence may take of the step's budget: its own and
 * drafts, leaving one for each of the *dec_left decoding sequences after
 * it (drafts never crowd another sequence's token out of a step). */
static int draft_budget(int budget, int *dec_left)
{
	if (*dec_left > 0)
		(*dec_left)--;
	return ST_MAX(1, budget - *dec_left);
}

/* Fills s->order with the running list rotated by s->rr (which it keeps
 * below the count).  Returns the count. */
static int order_running(struct cw_sched *s)
{
	struct cw_sched_req *q;
	int n = 0, k = 0;

	for (q = s->running; q && n < s->o.max_running; q = q->next)
		n++;
	if (n == 0)
		return 0;
	s->rr %= n;
	for (q = s->running; q && k < n; q = q->next, k++)
		s->order[(k - s->rr + n) % n] = q;
	return n;
}

/*
 * Picks a step from s->order[0..n_order): one decode token of every
 * sequence first, then prefill chunks, at most max_step_tokens tokens and,
 * for sequences kvd may spill, at most `cap` KV pages (the pages of the
 * rows each holds after the step; the first sequence always goes).
 * step = 1: the step to run: marks its requests in_step and fills s->toks,
 * s->breq, s->bn; *ret_n gets its tokens, *ret_prefill its prefilling
 * requests, *ret_skip the order index of the first decode left out, else
 * of the first prefill left out (or -1); returns the number of requests.
 * step = 2: the same, but a sequence with spilled pages, unless first in
 * the order, is left out (deferred, counted in *ret_deferred): kvd is
 * restoring it ahead.
 * step = 0: the step after it, as far as it can be told now (the rotation
 * moved on, consumers' room not checked, requests in_step counted at
 * their present input): fills s->next_seqs with its sequences that kvd
 * may spill and that are not in_step (those are pinned) and returns their
 * count.
 */
static int pick_one(struct cw_sched *s, int n_order, uint64_t cap, int step,
		    int *ret_n, int *ret_prefill, int *ret_skip,
		    int *ret_deferred)
{
	int budget = s->o.max_step_tokens, n = 0, n_reqs = 0;
	int dec_left = n_decoding(s);
	int skip[2] = { -1, -1 }; /* per pass */
	uint64_t used = 0;

	for (int pass = 0; pass < 2; pass++) {
		for (int j = 0; j < n_order && budget > 0; j++) {
			struct cw_sched_req *q = s->order[j];
			const int32_t *ids;
			uint32_t pos;
			int want, room = 1, k, spills;

			if (!q->gen ||
			    (cw_gen_n_generated(q->gen) == 0) != pass)
				continue;
			if (step) {
				pthread_mutex_lock(&s->lock);
				room = has_room(q);
				pthread_mutex_unlock(&s->lock);
			}
			if (!room)
				continue;
			k = cw_gen_next_input(q->gen, pass ? budget :
					      draft_budget(budget, &dec_left),
					      &pos, &ids, &want);
			if (k <= 0)
				continue;
			spills = cw_gen_pin_steps(q->gen);
			if (spills && cap != UINT64_MAX) {
				uint64_t pg = cw_kvahead_pages(
					&s->kva, pos + (uint64_t)k);

				if ((n_reqs || used) && used + pg > cap) {
					if (skip[pass] < 0)
						skip[pass] = j;
					continue;
				}
				used += pg;
			}
			budget -= k;
			/* a step pins what is back: a sequence kvd is still
			 * restoring waits for the next step, where it comes
			 * first (and the step waits for it if it must); its
			 * pages and tokens stay counted, so that no sequence
			 * past the rotation's window takes its place */
			if (step == 2 && spills && j > 0 &&
			    kv_client_seq_resident(s->kv, cw_gen_seq(q->gen)) ==
				    0) {
				if (skip[pass] < 0)
					skip[pass] = j;
				(*ret_deferred)++;
				continue;
			}
			if (!step) {
				/* this step's are pinned now: nothing to
				 * restore, but they take their part */
				if (spills && !q->in_step)
					s->next_seqs[n_reqs++] =
						cw_gen_seq(q->gen);
				continue;
			}
			for (int i = 0; i < k; i++) {
				s->toks[n + i].seq = cw_gen_seq(q->gen);
				s->toks[n + i].pos = pos + (uint32_t)i;
				s->toks[n + i].id = ids[i];
				s->toks[n + i].logits =
					cw_gen_input_logits(q->gen, i, k, want);
			}
			q->in_step = 1;
			s->breq[n_reqs] = q;
			s->bn[n_reqs++] = k;
			*ret_prefill += pass;
			n += k;
		}
	}
	if (step) {
		/* the rotation moves past the decodes that ran; prefills
		 * move it only when every decode ran */
		*ret_n = n;
		*ret_skip = skip[0] >= 0 ? skip[0] : skip[1];
	}
	return n_reqs;
}

/* pick_one, and when step = 2 deferred every sequence, again with
 * step = 1. */
static int pick(struct cw_sched *s, int n_order, uint64_t cap, int step,
		int *ret_n, int *ret_prefill, int *ret_skip, int *ret_deferred)
{
	int n_reqs = pick_one(s, n_order, cap, step, ret_n, ret_prefill,
			      ret_skip, ret_deferred);

	/* everything deferred: run what there is rather than nothing */
	if (step == 2 && n_reqs == 0 && *ret_deferred) {
		*ret_deferred = 0;
		n_reqs = pick_one(s, n_order, cap, 1, ret_n, ret_prefill,
				  ret_skip, ret_deferred);
	}
	return n_reqs;
}

/*
 * Builds the next step.  When the KV cap left sequences out, the rotation
 * starts at the first of them after CW_SCHED_KV_WINDOW_STEPS steps, and
 * s->next_seqs / n_next name the sequences of that next window, for
 * eval_step to ask kvd to restore ahead once this step's are pinned
 * (before, a restore ahead could make room with them).  Returns the
 * step's request count (*ret_n tokens, *ret_sampled of them sampled,
 * *ret_prefill requests prefilling).
 */
static int build_step(struct cw_sched *s, int *ret_n, int *ret_sampled,
		      int *ret_prefill)
{
	int n_order = order_running(s), n_reqs, skip = -1, n_dummy, n_def = 0;
	uint64_t cap = cw_kvahead_cap(&s->kva);
	int rr;

	*ret_n = *ret_sampled = *ret_prefill = 0;
	s->n_next = 0;
	n_reqs = pick(s, n_order, cap, s->kva.on ? 2 : 1, ret_n, ret_prefill,
		      &skip, &n_def);
	if (n_def && s->metrics)
		cw_metrics_kv_deferred(s->metrics, n_def);
	for (int i = 0; i < *ret_n; i++)
		*ret_sampled += s->toks[i].logits != NULL;
	if (skip < 0 || !n_reqs) {
		s->win_steps = 0;
		return n_reqs;
	}
	/* the window of the rotation that comes next, from where this step
	 * left sequences out; the rotation moves there after
	 * CW_SCHED_KV_WINDOW_STEPS steps of this one */
	rr = s->rr;
	s->rr += skip;
	if (s->kva.on) {
		n_order = order_running(s);
		s->n_next = pick(s, n_order, cap, 0, &n_dummy, &n_dummy,
				 &n_dummy, &n_dummy);
	}
	if (++s->win_steps < CW_SCHED_KV_WINDOW_STEPS)
		s->rr = rr;
	else
		s->win_steps = 0;
	return n_reqs;
}

/* One scheduler step over the running list.  Returns the number of tokens
 * computed (0: nothing could run). */
static int step(struct cw_sched *s)
{
	struct st_diag diag = { "" };
	int n = 0, n_reqs = 0, n_sampled = 0;
	int n_prefill = 0;
	struct cw_tl_snap tl0;
	struct cw_read_stats rs0, rs1;
	uint64_t t0, dt;
	int r;

	n_reqs = build_step(s, &n, &n_sampled, &n_prefill);
	for (int i = 0; i < n_reqs; i++)
		s->breq[i]->in_step = 0;
	if (!n)
		return 0;
	if (s->o.timeline)
		cw_tl_snap_take(&tl0, s->o.tl, s->o.es);
	cw_model_read_stats(s->model, &rs0);
	t0 = st_now_ns();
	r = eval_step(s, s->toks, n, s->breq, n_reqs, &diag);
	dt = st_now_ns() - t0;
	if (s->o.timeline)
		timeline_row(s, &tl0, n_reqs, n_prefill);
	if (r < 0 && n_reqs > 1) {
		/* find the culprit: each request alone (rows written twice
		 * hold the same values) */
		int off = 0;

		st_warn("batch step of %d requests failed (%s); retrying "
			"them one by one", n_reqs, diag.msg);
		for (int i = 0; i < n_reqs; i++) {
			struct st_diag d1 = { "" };

			r = eval_step(s, s->toks + off, s->bn[i], &s->breq[i],
				      1, &d1);
			off += s->bn[i];
			if (r < 0) {
				struct cw_sched_event e = error_event(r, d1.msg);

				retire(s, s->breq[i], CW_FINISH_ERROR, 0, &e,
				       "");
				s->breq[i] = NULL;
			}
		}
		r = 0;
		dt = st_now_ns() - t0;
	} else if (r < 0) {
		struct cw_sched_event e = error_event(r, diag.msg);

		retire(s, s->breq[0], CW_FINISH_ERROR, 0, &e, "");
		return n;
	}
	/* tokens past the first of a step that verified drafts are counted
	 * when their generation ends (cw_metrics_spec) */
	if (s->metrics)
		cw_metrics_step(s->metrics, n, n_sampled, dt);
	/* the step's expert bytes, to every request in it: each waited for
	 * the whole step (speculation figures, priced draft length) */
	cw_model_read_stats(s->model, &rs1);
	for (int i = 0; i < n_reqs; i++)
		if (s->breq[i]) {
			cw_gen_note_step_bytes(s->breq[i]->gen,
					       rs1.expert_bytes -
						       rs0.expert_bytes);
			advance(s, s->breq[i], s->bn[i], dt, st_now_ns());
		}
	return n;
}

static void *sched_main(void *arg)
{
	struct cw_sched *s = arg;

	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		struct cw_sched_req *admits = NULL, **tail = &admits;
		struct cw_sched_req *cancels[64];
		int n_cancel = 0, hold = 0, by_pages = 0, new_wait = 0;
		int n_wait = 0, kv_pages;
		uint64_t room = UINT64_MAX, wait_pages = 0, growth = 0, pool = 0;
		struct st_diag dd = { "" };

		/* a request that would be admitted now while others run is
		 * named to kvd first: when its cached prefix is spilled, it
		 * waits one step (kvd restores the prefix meanwhile) instead
		 * of every running sequence waiting for its lookup's restore */
		if (s->running && s->queue_head &&
		    s->n_running < s->o.max_running && s->kva.on) {
			pthread_mutex_unlock(&s->lock);
			hold = ask_admit(s) > 0;
			pthread_mutex_lock(&s->lock);
		}
		/* without spilling, a request is admitted only when kvd's
		 * pool holds its pages beside the running ones' to their
		 * end; the others wait in the queue (issue 24) */
		pthread_mutex_unlock(&s->lock);
		kv_pages = kv_by_pages(s); /* may ask kvd: not under the lock */
		if (kv_pages)
			growth = kv_growth(s);
		pthread_mutex_lock(&s->lock);
		if (kv_pages && s->queue_head &&
		    s->n_running < s->o.max_running) {
			pthread_mutex_unlock(&s->lock);
			by_pages = kv_room(s, growth, &room, &pool);
			pthread_mutex_lock(&s->lock);
			s->kv_pool_pages = by_pages ? pool : 0;
			s->kv_page_rows = s->kva.page_rows;
			s->kv_streams = s->kva.n_streams;
		} else if (!kv_pages) {
			s->kv_pool_pages = 0;
		}
		/* admit */
		while (s->queue_head && s->n_running < s->o.max_running) {
			struct cw_sched_req *r = s->queue_head;
			uint64_t need = 0;

			if (by_pages) {
				cut_auto_max_tokens(s, r, &s->kva, pool);
				need = req_kv_pages(s, r);
			}

			if (hold && r->named && r->named_turn == s->admit_turn)
				break; /* the next turn admits it */
			if (by_pages && need > pool) {
				/* not even the whole pool would hold it */
				char msg[sizeof(((struct cw_sched_event *)0)
							->err_msg)];

				too_big_msg(s, r, &s->kva, need, pool, msg,
					    sizeof(msg));
				s->queue_head = r->next;
				if (!s->queue_head)
					s->queue_tail = NULL;
				s->n_queued--;
				r->next = NULL;
				fail_queued_locked(s, r, -ST_E_BUDGET, msg);
				continue;
			}
			/* alone (none running) it goes anyway: under a
			 * shared budget its reservation goes over kvd's
			 * share, which then grows */
			if (by_pages && need > room && s->n_running > 0) {
				/* the waiting demand: the queue's requests
				 * the free places would take */
				for (struct cw_sched_req *q = r;
				     q && n_wait < s->o.max_running -
							   s->n_running;
				     q = q->next, n_wait++) {
					wait_pages += req_kv_pages(s, q);
					new_wait += !q->kv_waited;
					q->kv_waited = 1;
				}
				wait_pages -= ST_MIN(wait_pages, room);
				break;
			}
			room -= ST_MIN(room, need);
			growth += need; /* admitted: its pages lie ahead */
			s->queue_head = r->next;
			if (!s->queue_head)
				s->queue_tail = NULL;
			s->n_queued--;
			s->n_running++;
			r->next = NULL;
			*tail = r;
			tail = &r->next;
		}
		pthread_mutex_unlock(&s->lock);
		if (kv_pages && s->metrics)
			cw_metrics_kv_admit_wait(s->metrics, new_wait,
						 wait_pages);
		if (kv_pages &&
		    cw_kvahead_demand(&s->kva, wait_pages, (uint32_t)n_wait,
				      growth, &dd) < 0)
			st_debug("KV demand of queued requests: %s", dd.msg);
		while (admits) {
			struct cw_sched_req *r = admits;

			admits = r->next;
			admit(s, r);
		}
		/* drop cancelled ones (their pages are freed now) */
		pthread_mutex_lock(&s->lock);
		for (struct cw_sched_req *q = s->running; q && n_cancel < 64;
		     q = q->next)
			if (q->cancelled)
				cancels[n_cancel++] = q;
		pthread_mutex_unlock(&s->lock);
		for (int i = 0; i < n_cancel; i++) {
			struct cw_sched_event e = error_event(-ECANCELED,
							      "cancelled");

			retire(s, cancels[i], CW_FINISH_ERROR, 1, &e, "");
		}
		if (step(s) == 0) {
			/* idle, or every running request waits for its
			 * consumer: sleep until something changes */
			struct timespec ts;

			abs_deadline(&ts, 100);
			pthread_mutex_lock(&s->lock);
			if (!s->stop && (wait_pages ||
					 !(s->queue_head &&
					   s->n_running < s->o.max_running)))
				pthread_cond_timedwait(&s->cond_work, &s->lock,
						       &ts);
			continue;
		}
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

int cw_sched_create(struct cw_model *model, const struct st_tokenizer *tok,
		    struct kv_client *kv, const struct cw_sched_opts *opts,
		    struct cw_metrics *metrics, struct cw_sched **ret)
{
	struct cw_sched *s = calloc(1, sizeof(*s));
	pthread_condattr_t ca;
	int r;

	if (!s)
		return -ENOMEM;
	s->model = model;
	s->tok = tok;
	s->kv = kv;
	s->metrics = metrics;
	s->o = *opts;
	if (s->o.max_running <= 0)
		s->o.max_running = 32;
	if (s->o.max_queued <= 0)
		s->o.max_queued = 256;
	if (s->o.max_step_tokens <= 0)
		s->o.max_step_tokens = 128;
	/* every running sequence's decode token fits in one step */
	if (s->o.max_step_tokens < s->o.max_running)
		s->o.max_step_tokens = s->o.max_running;
	s->vocab = cw_model_config(model)->vocab_size;
	s->toks = calloc((size_t)s->o.max_step_tokens, sizeof(*s->toks));
	s->breq = calloc((size_t)s->o.max_running, sizeof(*s->breq));
	s->bn = calloc((size_t)s->o.max_running, sizeof(*s->bn));
	s->pins = calloc((size_t)s->o.max_running, sizeof(*s->pins));
	s->order = calloc((size_t)s->o.max_running, sizeof(*s->order));
	s->next_seqs = calloc((size_t)s->o.max_running,
			      sizeof(*s->next_seqs));
	s->adm = calloc((size_t)s->o.max_running, sizeof(*s->adm));
	s->adm_chain = calloc((size_t)s->o.max_running,
			      sizeof(*s->adm_chain));
	s->adm_keys = kv ? calloc(KV_PROTO_MAX_AHEAD_KEYS,
				  sizeof(*s->adm_keys)) : NULL;
	if (!s->toks || !s->breq || !s->bn || !s->pins || !s->order ||
	    !s->next_seqs || !s->adm || !s->adm_chain ||
	    (kv && !s->adm_keys) ||
	    cw_kvahead_init(&s->kva, kv, s->o.kv_restore_ahead,
			    s->o.max_running) < 0) {
		free(s->toks); free(s->breq); free(s->bn); free(s->pins);
		free(s->order); free(s->next_seqs);
		free(s->adm); free(s->adm_chain); free(s->adm_keys);
		cw_kvahead_fini(&s->kva);
		free(s);
		return -ENOMEM;
	}
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->model_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cond_work, &ca);
	pthread_cond_init(&s->cond_out, &ca);
	pthread_condattr_destroy(&ca);
	r = pthread_create(&s->thread, NULL, sched_main, s);
	if (r) {
		cw_sched_destroy(s);
		return -r;
	}
	s->have_thread = 1;
	*ret = s;
	return 0;
}

void cw_sched_destroy(struct cw_sched *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->stop = 1;
	pthread_cond_broadcast(&s->cond_work);
	pthread_mutex_unlock(&s->lock);
	if (s->have_thread)
		pthread_join(s->thread, NULL);
	while (s->running) {
		struct cw_sched_event e = error_event(
			-ST_E_PEERGONE, "computed is shutting down");

		retire(s, s->running, CW_FINISH_ERROR, 0, &e, "");
	}
	pthread_mutex_lock(&s->lock);
	while (s->queue_head) {
		struct cw_sched_req *r = s->queue_head;
		struct cw_sched_event e = { .token = -1,
					    .finish = CW_FINISH_ERROR,
					    .err = -ST_E_PEERGONE };

		s->queue_head = r->next;
		snprintf(e.err_msg, sizeof(e.err_msg),
			 "computed is shutting down");
		post_locked(s, r, &e, "");
		req_unref_locked(r);
	}
	pthread_mutex_unlock(&s->lock);
	/* consumers still holding requests must have released them before
	 * the scheduler is freed (cw_main stops the HTTP server first) */
	pthread_cond_destroy(&s->cond_work);
	pthread_cond_destroy(&s->cond_out);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->model_lock);
	free(s->toks); free(s->breq); free(s->bn); free(s->pins);
	free(s->order); free(s->next_seqs);
	free(s->adm); free(s->adm_chain); free(s->adm_keys);
	cw_kvahead_fini(&s->kva);
	free(s);
}

int cw_sched_submit(struct cw_sched *s, const int32_t *ids, size_t n_ids,
		    const struct cw_gen_params *p, int max_pending,
		    struct cw_sched_req **ret, struct st_diag *diag)
{
	const struct st_model_config *c = cw_model_config(s->model);
	struct cw_sched_req *r;

	if (n_ids == 0)
		return st_diag_set(diag, -EINVAL, "the prompt encodes to no "
				   "tokens; give some text");
	if (n_ids >= (size_t)c->max_position_embeddings)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "prompt of %zu tokens does not fit the "
				   "model's context of %d tokens", n_ids,
				   c->max_position_embeddings);
	if (p->n_stop < 0 || p->n_stop > CW_GEN_MAX_STOP)
		return st_diag_set(diag, -EINVAL, "at most %d stop strings",
				   CW_GEN_MAX_STOP);
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->s = s;
	r->p = *p;
	if (r->p.draft_max == CW_DRAFT_DEFAULT) {
		r->p.draft_max = s->o.draft_max;
		r->p.draft_price = s->o.draft_price;
		r->p.draft_mtp = s->o.draft_mtp;
	}
	r->max_pending = max_pending > 0 ? max_pending : 1;
	r->ids = malloc(sizeof(int32_t) * n_ids);
	if (!r->ids) {
		free(r);
		return -ENOMEM;
	}
	memcpy(r->ids, ids, sizeof(int32_t) * n_ids);
	r->n_ids = n_ids;
	r->n_prompt = (int)n_ids;
	for (int i = 0; i < p->n_stop; i++) {
		r->stop[i] = strdup(p->stop[i] ? p->stop[i] : "");
		if (!r->stop[i]) {
			req_free(r);
			return -ENOMEM;
		}
		r->p.stop[i] = r->stop[i];
	}
	r->refs = 2;
	r->t_submit = st_now_ns();
	pthread_mutex_lock(&s->lock);
	if (s->stop) {
		pthread_mutex_unlock(&s->lock);
		req_free(r);
		return st_diag_set(diag, -ST_E_PEERGONE,
				   "computed is shutting down");
	}
	if (s->kv_pool_pages && s->kv_page_rows) {
		/* not even kvd's whole pool holds it: refused now, not
		 * after its wait in the queue (a stream gets the HTTP
		 * status, not an error event after 200) */
		struct cw_kvahead geo = { .page_rows = s->kv_page_rows,
					  .n_streams = s->kv_streams };
		uint64_t need;

		cut_auto_max_tokens(s, r, &geo, s->kv_pool_pages);
		need = cw_kvahead_pages(
			&geo, kv_rows_at_end(r->n_ids, (uint64_t)
					     req_max_tokens_cut(s, r)));
		if (need > s->kv_pool_pages) {
			char msg[sizeof(diag->msg)];

			too_big_msg(s, r, &geo, need, s->kv_pool_pages, msg,
				    sizeof(msg));
			pthread_mutex_unlock(&s->lock);
			req_free(r);
			return st_diag_set(diag, -ST_E_BUDGET, "%s", msg);
		}
	}
	if (s->n_queued >= s->o.max_queued) {
		pthread_mutex_unlock(&s->lock);
		req_free(r);
		return st_diag_set(diag, -ST_E_BUSY,
				   "the request queue is full (%d waiting); "
				   "retry later", s->o.max_queued);
	}
	if (s->queue_tail)
		s->queue_tail->next = r;
	else
		s->queue_head = r;
	s->queue_tail = r;
	s->n_queued++;
	pthread_cond_signal(&s->cond_work);
	pthread_mutex_unlock(&s->lock);
	*ret = r;
	return 0;
}

int cw_sched_next_event(struct cw_sched_req *req, int timeout_ms,
			struct cw_sched_event *ev)
{
	struct cw_sched *s = req->s;
	struct timespec ts;
	int got = 0;

	if (timeout_ms >= 0)
		abs_deadline(&ts, timeout_ms);
	pthread_mutex_lock(&s->lock);
	for (;;) {
		if (req->ev_n) {
			*ev = req->ev[req->ev_head++];
			req->ev_n--;
			if (!req->ev_n)
				req->ev_head = 0;
			got = 1;
			/* room for the scheduler to step it again */
			pthread_cond_signal(&s->cond_work);
			break;
		}
		if (req->done)
			break;
		if (timeout_ms < 0)
			pthread_cond_wait(&s->cond_out, &s->lock);
		else if (pthread_cond_timedwait(&s->cond_out, &s->lock,
						&ts) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&s->lock);
	return got;
}

int cw_sched_req_n_prompt(const struct cw_sched_req *req)
{
	return req->n_prompt;
}

int cw_sched_req_n_cached(const struct cw_sched_req *req)
{
	int n;

	pthread_mutex_lock(&req->s->lock);
	n = req->n_cached;
	pthread_mutex_unlock(&req->s->lock);
	return n;
}

void cw_sched_req_save(const struct cw_sched_req *req,
		       struct cw_sched_save *ret)
{
	pthread_mutex_lock(&req->s->lock);
	*ret = req->save;
	pthread_mutex_unlock(&req->s->lock);
}

int cw_sched_req_n_generated(const struct cw_sched_req *req)
{
	int n;

	pthread_mutex_lock(&req->s->lock);
	n = req->n_gen;
	pthread_mutex_unlock(&req->s->lock);
	return n;
}

int cw_sched_req_max_tokens(const struct cw_sched_req *req)
{
	int n;

	pthread_mutex_lock(&req->s->lock);
	n = req->max_tokens;
	pthread_mutex_unlock(&req->s->lock);
	return n;
}

void cw_sched_cancel(struct cw_sched_req *req)
{
	struct cw_sched *s = req->s;

	pthread_mutex_lock(&s->lock);
	if (!req->done && !req->cancelled) {
		struct cw_sched_req **pp = &s->queue_head, *prev = NULL;

		req->cancelled = 1;
		/* still queued: drop it here */
		while (*pp && *pp != req) {
			prev = *pp;
			pp = &(*pp)->next;
		}
		if (*pp) {
			struct cw_sched_event e = { .token = -1,
						    .finish = CW_FINISH_ERROR,
						    .err = -ECANCELED };

			*pp = req->next;
			if (s->queue_tail == req)
				s->queue_tail = prev;
			s->n_queued--;
			snprintf(e.err_msg, sizeof(e.err_msg), "cancelled");
			post_locked(s, req, &e, "");
			req->done = 1;
			if (s->metrics)
				cw_metrics_gen_end(s->metrics, CW_FINISH_ERROR,
						   1, 0, 0);
			req_unref_locked(req); /* the scheduler's */
		}
		pthread_cond_signal(&s->cond_work);
	}
	pthread_mutex_unlock(&s->lock);
}

void cw_sched_release(struct cw_sched_req *req)
{
	struct cw_sched *s;

	if (!req)
		return;
	s = req->s;
	cw_sched_cancel(req);
	pthread_mutex_lock(&s->lock);
	req->released = 1;
	req_unref_locked(req);
	pthread_mutex_unlock(&s->lock);
}

void cw_sched_counts(struct cw_sched *s, int *ret_running, int *ret_queued)
{
	pthread_mutex_lock(&s->lock);
	*ret_running = s->n_running;
	*ret_queued = s->n_queued;
	pthread_mutex_unlock(&s->lock);
}

void cw_sched_model_lock(struct cw_sched *s)
{
	pthread_mutex_lock(&s->model_lock);
}

void cw_sched_model_unlock(struct cw_sched *s)
{
	pthread_mutex_unlock(&s->model_lock);
}

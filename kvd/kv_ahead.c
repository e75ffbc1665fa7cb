/*
 * kv_ahead.c — restores ahead of the step (KV_RESIDENCY_AHEAD, issue 24
 * item 1): computed's scheduler names the sequences its next step will run
 * while the current step computes, and kvd brings their spilled pages back
 * between requests, 4 MiB per loop turn, so that the next step's pin
 * finds them in the pool.
 *
 * Unlike KV_RESIDENCY_PREFETCH (free pages only), a restore ahead may make
 * room: it spills pages of sequences that are neither pinned (the current
 * step's: kv_pool_make_room never takes those) nor queued ahead
 * themselves, least recently used first.  It keeps 1/KV_AHEAD_HEADROOM of
 * the pool (and a page per stream) free for the current step's
 * reservations, and gives a sequence up (its pin restores it, counted as
 * a stall by computed) when no room can be made without touching what is
 * pinned.  A restored sequence is
 * touched (most recently used), so that a reservation that must spill
 * takes other pages first.  Each new request of a client replaces that
 * client's queue: it is the plan for the next step.  Entries restored stay
 * in the queue (done) until then, so that restoring the plan's last
 * sequences never spills its first ones.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kv_daemon.h"
#include "st_log.h"
#include "st_util.h"

/* Bytes restored per loop turn: a request (the step's pin or reservation)
 * that comes meanwhile waits for at most one turn, and each turn is a few
 * I/O requests (on the VM of docs/BENCHMARKS.md, 512 KiB turns cost kvd
 * 1.4-1.7x the CPU per byte of 4 MiB ones, in system calls and device
 * notifications). */
#define KV_AHEAD_STEP_BYTES (4u << 20)

uint64_t kv_ahead_headroom(struct kv_pool *p)
{
	uint64_t lim;

	pthread_mutex_lock(&p->lock);
	lim = kv_pool_limit_locked(p);
	pthread_mutex_unlock(&p->lock);
	return kv_ahead_headroom_pages(lim, p->lay.n_streams);
}

/* Drops queue entry q (order kept). */
static void ahead_drop(struct kv_server *s, uint32_t q)
{
	if (!s->ahead[q].done)
		s->n_ahead_pending--;
	s->n_ahead--;
	memmove(s->ahead + q, s->ahead + q + 1,
		sizeof(*s->ahead) * (s->n_ahead - q));
}

int kv_ahead_queue(struct kv_server *s, uint32_t client, uint32_t n,
		   const uint32_t *seqs, int32_t *status, struct st_diag *diag)
{
	struct kv_pool *p = &s->pool;
	int first = 0;

	/* the client's earlier plan is over (and entries of sequences
	 * freed since, a dead client's too, go) */
	for (uint32_t q = 0; q < s->n_ahead;)
		if (s->ahead[q].client == client ||
		    kv_seq_lookup(p, s->ahead[q].seq) < 0)
			ahead_drop(s, q);
		else
			q++;
	for (uint32_t i = 0; i < n; i++) {
		int idx = kv_seq_check_owned(p, seqs[i], client, 1,
					     first ? NULL : diag);
		int r = idx < 0 ? idx : 0, dup = 0;

		status[i] = r;
		if (r < 0) {
			first = first ? first : r;
			continue;
		}
		for (uint32_t q = 0; q < s->n_ahead; q++)
			dup |= s->ahead[q].seq == seqs[i];
		if (dup)
			continue;
		if (s->n_ahead == s->cap_ahead) {
			/* at most one entry per sequence (deduplicated) */
			uint32_t cap = ST_MIN(s->cap_ahead ? 2 * s->cap_ahead :
							     64,
					      p->lay.max_seqs);
			struct kv_ahead_entry *a;

			if (cap <= s->n_ahead)
				continue; /* cannot happen */
			a = realloc(s->ahead, sizeof(*a) * cap);
			if (!a)
				continue; /* the pin will restore it */
			s->ahead = a;
			s->cap_ahead = cap;
		}
		/* one already whole is kept (done) as part of the plan */
		s->ahead[s->n_ahead++] = (struct kv_ahead_entry){
			.seq = seqs[i], .client = client,
			.done = p->seqs[idx].n_spilled == 0 };
		s->n_ahead_pending += p->seqs[idx].n_spilled != 0;
	}
	return first;
}

void kv_ahead_step(struct kv_server *s)
{
	struct kv_pool *p = &s->pool;
	uint32_t q0 = 0, handle, stamp, want;
	uint64_t free_now, head = kv_ahead_headroom(p);
	struct st_diag d = { "" };
	int idx, done = 1;

	while (q0 < s->n_ahead && s->ahead[q0].done)
		q0++;
	if (q0 == s->n_ahead)
		return;
	handle = s->ahead[q0].seq;
	idx = kv_seq_lookup(p, handle);

	if (idx >= 0 && p->seqs[idx].n_spilled &&
	    !(atomic_load(&p->seqs[idx].flags) & KV_SEQ_F_FAILED)) {
		want = (uint32_t)ST_MAX(1u, KV_AHEAD_STEP_BYTES /
						    p->lay.slot_bytes);
		want = ST_MIN(want, p->seqs[idx].n_spilled);
		/* every sequence of the plans queued is kept, those already
		 * back too: none makes room for another (nor do pinned ones:
		 * make_room skips them) */
		stamp = kv_mark_begin(p);
		for (uint32_t q = 0; q < s->n_ahead; q++) {
			int j = kv_seq_lookup(p, s->ahead[q].seq);

			if (j >= 0)
				p->mark[2 * (uint32_t)j] = stamp;
		}
		free_now = kv_pool_free_pages(p);
		if (free_now < want + head &&
		    kv_pool_make_room(p, want + head, stamp,
				      "restoring ahead of the step", &d) < 0) {
			/* no room without what runs now: the pin will do it */
			st_debug("restore ahead of 0x%x given up: %s", handle,
				 d.msg);
		} else if (kv_seq_restore_some(p, (uint32_t)idx, stamp, want,
					       &d) < 0) {
			st_debug("restore ahead of 0x%x: %s", handle, d.msg);
		} else {
			kv_seq_touch(p, (uint32_t)idx);
			done = p->seqs[idx].n_spilled == 0;
		}
	}
	if (done) {
		/* kept, marked done, until the client's next plan */
		s->ahead[q0].done = 1;
		s->n_ahead_pending--;
	}
}

void kv_ahead_fini(struct kv_server *s)
{
	free(s->ahead);
	s->ahead = NULL;
	s->n_ahead = s->cap_ahead = s->n_ahead_pending = 0;
}

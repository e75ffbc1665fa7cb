/*
 * es_pool.c — expertd's side of the host expert pool (layout and pin
 * protocol: proto/es_pool.h).  Sizing from the budget, creation or adoption
 * of the segment after a killed expertd (PITFALLS P17), and every slot
 * state transition the daemon makes.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/mman.h>

#include "es_daemon.h"
#include "st_hugemem.h"
#include "st_log.h"
#include "st_util.h"

int es_pool_geom_from_budget(const struct st_store *s, uint64_t store_id,
			     const char *budget_text, struct es_pool_geom *ret,
			     struct st_diag *diag)
{
	uint64_t n_keys = (uint64_t)s->n_layers * s->n_experts;
	uint64_t bytes = 0, n_slots, min_bytes;
	double pct = 0;
	char b1[32];

	memset(ret, 0, sizeof(*ret));
	if (s->n_layers <= 0 || s->n_experts <= 0 || !s->record_bytes ||
	    s->cfg.top_k <= 0 || s->cfg.top_k > s->n_experts)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "store %s: geometry %d layers x %d experts, "
				   "top-k %d, records of %" PRIu64 " bytes is "
				   "not usable", s->dir, s->n_layers,
				   s->n_experts, s->cfg.top_k, s->record_bytes);
	if (!budget_text)
		budget_text = "100%";
	if (st_parse_budget(budget_text, &bytes, &pct) < 0 || pct > 100.0 ||
	    (!bytes && pct <= 0.0))
		return st_diag_set(diag, -EINVAL,
				   "--host-budget '%s' is neither a byte size "
				   "(e.g. 8GiB, 512MiB, 1048576) nor a "
				   "share of all experts from 0%% to 100%% "
				   "(e.g. 25%%)",
				   budget_text);
	if (pct > 0.0)
		n_slots = (uint64_t)((double)n_keys * pct / 100.0 + 1e-9);
	else
		n_slots = bytes / s->record_bytes;
	min_bytes = (uint64_t)s->cfg.top_k * s->record_bytes;
	if (n_slots < (uint64_t)s->cfg.top_k)
		return st_diag_set(
			diag, -ST_E_BUDGET,
			"--host-budget must hold at least %d experts = %" PRIu64
			" bytes (%s; one layer's top-k of %" PRIu64
			"-byte records); '%s' holds only %" PRIu64,
			s->cfg.top_k, min_bytes,
			st_format_bytes(min_bytes, b1, sizeof(b1)),
			s->record_bytes, budget_text, n_slots);
	if (n_slots > n_keys)
		n_slots = n_keys; /* more than the whole model is pointless */
	if (n_slots > INT32_MAX)
		n_slots = INT32_MAX;
	ret->n_layers = (uint32_t)s->n_layers;
	ret->n_experts = (uint32_t)s->n_experts;
	ret->n_slots = (uint32_t)n_slots;
	ret->top_k = (uint32_t)s->cfg.top_k;
	ret->record_bytes = s->record_bytes;
	ret->store_id = store_id;
	return 0;
}

/* Seqlock write section around a multi-field change of slot s. */
static void seq_begin(struct es_slot *sl)
{
	atomic_fetch_add(&sl->version, 1); /* odd: changing */
}

static void seq_end(struct es_slot *sl)
{
	atomic_fetch_add(&sl->version, 1); /* even: stable */
}

void es_pool_slot_assign(struct es_pool *p, uint32_t s, uint64_t key)
{
	struct es_slot *sl = &p->v.slots[s];

	seq_begin(sl);
	atomic_store(&sl->key, key);
	atomic_fetch_add(&sl->gen, 1);
	atomic_store(&sl->error, 0);
	atomic_store(&sl->last_use_ns, st_now_ns());
	atomic_store(&sl->state, ES_SLOT_LOADING);
	seq_end(sl);
	atomic_store(&p->v.slot_of[es_pool_index(&p->v, es_key_layer(key),
						 es_key_expert(key))],
		     (int32_t)s);
}

void es_pool_slot_clear(struct es_pool *p, uint32_t s)
{
	struct es_slot *sl = &p->v.slots[s];
	uint64_t key = atomic_load(&sl->key);

	if (key != ES_KEY_NONE && es_key_layer(key) < p->v.n_layers &&
	    es_key_expert(key) < p->v.n_experts) {
		_Atomic int32_t *ix = &p->v.slot_of[es_pool_index(
			&p->v, es_key_layer(key), es_key_expert(key))];

		if (atomic_load(ix) == (int32_t)s)
			atomic_store(ix, -1);
	}
	seq_begin(sl);
	atomic_store(&sl->key, ES_KEY_NONE);
	atomic_fetch_add(&sl->gen, 1);
	atomic_store(&sl->state, ES_SLOT_EMPTY);
	seq_end(sl);
}

void es_pool_slot_publish(struct es_pool *p, uint32_t s, int err)
{
	struct es_slot *sl = &p->v.slots[s];

	atomic_store(&sl->error, err);
	atomic_store(&sl->last_use_ns, st_now_ns());
	/* seq_cst store: orders the record bytes written by this thread
	 * before READY for every reader that sees READY. */
	atomic_store(&sl->state, err ? ES_SLOT_FAILED : ES_SLOT_READY);
	atomic_fetch_add(&sl->version, 2);
}

int es_pool_slot_try_evict(struct es_pool *p, uint32_t s)
{
	struct es_slot *sl = &p->v.slots[s];
	uint32_t expect = ES_SLOT_READY;

	/* PIN PROTOCOL, evictor side (es_pool.h): the CAS must come before
	 * the pin reads, both seq_cst. */
	if (!atomic_compare_exchange_strong(&sl->state, &expect,
					    ES_SLOT_EVICTING))
		return -EBUSY;
	atomic_fetch_add(&sl->version, 2);
	if (es_slot_pin_sum(sl) != 0) {
		atomic_store(&sl->state, ES_SLOT_READY);
		atomic_fetch_add(&sl->version, 2);
		return -EBUSY;
	}
	return 0;
}

int es_pool_alloc_slot(struct es_pool *p, int need, int *ret_evicted)
{
	struct es_pool_view *v = &p->v;
	uint32_t allowed = p->allowed ? p->allowed : v->n_slots;
	uint64_t used = 0;
	uint8_t *skip = NULL;
	int r = -ST_E_BUSY, empty = -1;

	*ret_evicted = 0;
	for (uint32_t s = 0; s < v->n_slots; s++) {
		struct es_slot *sl = &v->slots[s];

		if (atomic_load(&sl->state) != ES_SLOT_EMPTY)
			used++;
		else if (empty < 0 && es_slot_pin_sum(sl) == 0) {
			empty = (int)s;
			if (!p->allowed)
				return empty; /* no memory target */
		}
	}
	/* below the memory target: an EMPTY slot costs nothing to take */
	if (empty >= 0 && used < allowed)
		return empty;
	for (uint32_t s = 0; s < v->n_slots; s++) {
		struct es_slot *sl = &v->slots[s];

		/* Only the server thread leaves FAILED, so with no pins the
		 * slot is ours; waiters that pinned it have seen FAILED. */
		if (atomic_load(&sl->state) == ES_SLOT_FAILED &&
		    es_slot_pin_sum(sl) == 0) {
			es_pool_slot_clear(p, s);
			if (es_slot_pin_sum(sl) == 0)
				return (int)s;
		}
	}
	/* A victim can be lost to a client that pins it between the choice
	 * and the CAS; then choose again without it. */
	for (int tries = 0; tries < 8; tries++) {
		int hot;
		int s = es_policy_pick(p->ev, v, skip, &hot);

		if (s < 0)
			break;
		if (es_pool_slot_try_evict(p, (uint32_t)s) == 0) {
			*ret_evicted = 1;
			r = s;
			break;
		}
		if (!skip) {
			skip = calloc(v->n_slots, 1);
			if (!skip) {
				r = -ENOMEM;
				break;
			}
		}
		skip[s] = 1;
	}
	free(skip);
	/* every used slot is pinned or loading: a demand load goes over the
	 * memory target rather than fail (the owner reports it as `over`) */
	if (r == -ST_E_BUSY && need && empty >= 0 &&
	    es_slot_pin_sum(&v->slots[empty]) == 0) {
		p->went_over = 1;
		r = empty;
	}
	return r;
}

int es_pool_release_record(struct es_pool *p, uint32_t s)
{
	void *rec = es_pool_record(&p->v, s);

	/* records are 4 KiB multiples at a 2 MiB-aligned offset (es_pool.h),
	 * so the range is whole pages */
	if (madvise(rec, p->v.record_bytes, MADV_REMOVE) < 0)
		return -errno;
	return 0;
}

void es_pool_clear_pins(struct es_pool *p, int c)
{
	for (uint32_t s = 0; s < p->v.n_slots; s++)
		atomic_store(&p->v.slots[s].pins[c], 0);
}

uint64_t es_pool_slots_used(const struct es_pool *p)
{
	uint64_t n = 0;

	for (uint32_t s = 0; s < p->v.n_slots; s++)
		n += atomic_load(&p->v.slots[s].state) != ES_SLOT_EMPTY;
	return n;
}

/*
 * Takes over the tables a killed expertd left (DESIGN.md section 6):
 * clients whose pid is gone lose their entries and pins; the index is
 * rebuilt from the slots.  A READY slot is kept when its key is valid, no
 * other slot claims the key and (unless no_verify) its record still has the
 * store's checksum.  An EVICTING slot is kept the same way, back in READY:
 * the evictor writes nothing before it has won the slot, so its record is
 * intact, and a client may be reading it under a pin (discarding it would
 * let a new load overwrite a pinned record, PITFALLS P12).  LOADING and
 * FAILED slots (and READY ones that fail the checks) are discarded to EMPTY
 * with a new generation and their pins cleared: no client has read them,
 * and a client waiting on one sees the generation change and forgets its
 * pin (es_client.c).  Returns the number of slots kept.
 */
static uint32_t pool_recover(struct es_pool *p, const struct st_store *store,
			     int no_verify)
{
	struct es_pool_view *v = &p->v;
	uint64_t n_keys = (uint64_t)v->n_layers * v->n_experts;
	uint32_t kept = 0, discarded = 0, dropped = 0;

	for (int c = 0; c < ES_MAX_CLIENTS; c++) {
		int32_t pid = atomic_load(&v->clients[c].pid);

		if (pid > 0) {
			es_clients_watch(p, c);
			if (!es_clients_alive(p, c)) {
				es_clients_unregister(p, c);
				dropped++;
			}
		} else if (pid < 0) {
			es_clients_unregister(p, c);
		}
	}
	for (uint64_t i = 0; i < n_keys; i++)
		atomic_store(&v->slot_of[i], -1);
	for (uint32_t s = 0; s < v->n_slots; s++) {
		struct es_slot *sl = &v->slots[s];
		uint64_t key = atomic_load(&sl->key);
		uint32_t st = atomic_load(&sl->state);
		uint32_t layer = es_key_layer(key), expert = es_key_expert(key);
		int ok = (st == ES_SLOT_READY || st == ES_SLOT_EVICTING) &&
			 key != ES_KEY_NONE && layer < v->n_layers &&
			 expert < v->n_experts;
		size_t ix = ok ? es_pool_index(v, layer, expert) : 0;

		if (atomic_load(&sl->version) & 1)
			atomic_fetch_add(&sl->version, 1); /* killed mid-write */
		if (ok && atomic_load(&v->slot_of[ix]) >= 0)
			ok = 0; /* two slots claim one key */
		/* a record's checksum covers its layer's record size (layers
		 * may be smaller than the slot: st_store.h) */
		if (ok && !no_verify &&
		    st_xxh3(es_pool_record(v, s),
			    store->layers[layer].record_bytes) !=
			    store->expert_xxh3[ix])
			ok = 0;
		if (ok) {
			if (st == ES_SLOT_EVICTING) {
				atomic_store(&sl->state, ES_SLOT_READY);
				atomic_fetch_add(&sl->version, 2);
			}
			atomic_store(&v->slot_of[ix], (int32_t)s);
			kept++;
		} else if (st != ES_SLOT_EMPTY || key != ES_KEY_NONE) {
			for (int c = 0; c < ES_MAX_CLIENTS; c++)
				atomic_store(&sl->pins[c], 0);
			es_pool_slot_clear(p, s);
			discarded++;
		}
	}
	st_info("adopted pool: %u experts kept, %u slots discarded, %u dead "
		"clients dropped", kept, discarded, dropped);
	return kept;
}

#ifdef MADV_POPULATE_WRITE
#define ES_MADV_POPULATE_WRITE MADV_POPULATE_WRITE
#else
#define ES_MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* The slots are in 4 KiB pages because /dev/shm is mounted without
 * huge=: said once, as a warning where it costs (a pool of 1 GiB or more),
 * else at info level. */
#define ES_SMALL_PAGES_FMT                                                    \
	"the expert pool (%.2f GiB) is in 4 KiB pages: /dev/shm is mounted "  \
	"without huge=advise; CPU expert kernels stream faster from huge "    \
	"pages (as root: mount -o remount,huge=advise /dev/shm; "             \
	"docs/TROUBLESHOOTING.md)"

static void pool_note_small_pages(uint64_t bytes)
{
	if (bytes >= (1ull << 30))
		st_warn(ES_SMALL_PAGES_FMT, (double)bytes / (1ull << 30));
	else
		st_info(ES_SMALL_PAGES_FMT, (double)bytes / (1ull << 30));
}

int es_pool_open(struct es_pool *p, const char *instance,
		 const struct es_pool_geom *g, const struct st_store *store,
		 int no_verify, int sparse, struct st_diag *diag)
{
	int r, adopted;

	memset(p, 0, sizeof(*p));
	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		p->pidfd[c] = -1;
	p->geom = *g;
	r = es_pool_layout_compute(g, &p->layout);
	if (r < 0)
		return st_diag_set(diag, r, "expert pool geometry impossible "
				   "(%u x %u experts, %u slots of %" PRIu64
				   " bytes)", g->n_layers, g->n_experts,
				   g->n_slots, g->record_bytes);
	r = st_shm_open_owner(&p->shm, instance, ES_POOL_KIND,
			      ES_POOL_LAYOUT_VERSION, p->layout.layout_hash,
			      p->layout.total_bytes, diag);
	if (r < 0)
		return r;
	adopted = r;
	if (adopted) {
		r = es_pool_view_init(p->shm.base, p->shm.size, g->store_id,
				      &p->v, diag);
		if (r < 0) {
			/* Killed before the tables were formatted, or
			 * scribbled on: start afresh. */
			st_warn("%s: cannot adopt (%s); recreating it",
				p->shm.name, diag ? diag->msg : "");
			st_shm_destroy(&p->shm);
			r = st_shm_create(&p->shm, instance, ES_POOL_KIND,
					  ES_POOL_LAYOUT_VERSION,
					  p->layout.layout_hash,
					  p->layout.total_bytes);
			if (r < 0)
				return st_diag_set(diag, r, "cannot create "
						   "shm %s: %s", p->shm.name,
						   st_strerror(r));
			adopted = 0;
		}
	}
	if (!adopted) {
		r = es_pool_format(p->shm.base, p->shm.size, g, &p->layout);
		if (r == 0)
			r = es_pool_view_init(p->shm.base, p->shm.size,
					      g->store_id, &p->v, diag);
		if (r < 0) {
			st_shm_destroy(&p->shm);
			return st_diag_set(diag, r, "cannot format the expert "
					   "pool: %s", st_strerror(r));
		}
		/* Huge pages where /dev/shm's tmpfs gives them (mount option
		 * huge=advise, always or within_size; st_hugemem.h): fewer
		 * pages for every O_DIRECT read to pin and for every client
		 * to map, and the CPU expert kernels stream faster (the
		 * hardware prefetchers stop at 4 KiB page boundaries:
		 * docs/BENCHMARKS.md "Weights in huge pages").  Best effort:
		 * 4 KiB pages where the mount says never (its default). */
		if (!sparse) {
			if (madvise(p->v.data, p->layout.data_bytes,
				    MADV_HUGEPAGE) < 0)
				st_debug("no huge pages for the pool's slots: "
					 "%s", strerror(errno));
			else if (st_hugemem_shm_policy(NULL) == 0)
				pool_note_small_pages(p->layout.data_bytes);
		}
		/* Allocate the slots' pages now, so an O_DIRECT read into a
		 * slot does not also fault in and zero its pages (measured:
		 * twice the time of a read into resident memory).  Best
		 * effort: older kernels lack MADV_POPULATE_WRITE.  A sparse
		 * pool (--memory-budget: sized for its cap, only slots that
		 * hold data may cost memory) does neither: a huge page would
		 * outlive the hole punched in one of its records. */
		if (!sparse && madvise(p->v.data, p->layout.data_bytes,
				       ES_MADV_POPULATE_WRITE) < 0)
			st_debug("cannot pre-fault the pool's slots: %s",
				 strerror(errno));
	} else {
		pool_recover(p, store, no_verify);
	}
	p->adopted = adopted;
	p->sparse = sparse;
	return adopted;
}

void es_pool_close(struct es_pool *p, int destroy)
{
	for (int c = 0; c < ES_MAX_CLIENTS; c++) {
		if (p->pidfd[c] >= 0)
			close(p->pidfd[c]);
		p->pidfd[c] = -1;
	}
	if (destroy)
		st_shm_destroy(&p->shm);
	else
		st_shm_detach(&p->shm);
	memset(&p->v, 0, sizeof(p->v));
}

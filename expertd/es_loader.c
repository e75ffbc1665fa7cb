/*
 * es_loader.c — loader threads of expertd: read a store record straight
 * into its LOADING slot (st_store_read_record verifies the XXH3 checksum),
 * then publish READY, or FAILED with the error.  The server thread only
 * queues work here, so a handler never blocks on I/O (DESIGN.md section 4).
 *
 * Two queues: demand misses (a client waits) and prefetches (hinted by
 * the gate look-ahead); a free thread always takes a demand miss first.
 * Each holds at most one entry per slot (a slot is queued when it turns
 * LOADING and leaves LOADING only here), so rings of n_slots entries never
 * overflow.
 *
 * The NVMe tier: expert files are opened with O_DIRECT, so reads bypass
 * the page cache (records are 4 KiB-aligned in the file, record sizes are
 * multiples of 4 KiB and pool slots are 4 KiB-aligned, as O_DIRECT wants)
 * and the figures are those of the device, not of cached pages.  The
 * threads are the I/O engine: n_threads reads in flight.  A slot becomes
 * READY only after its whole record is read and its checksum matched
 * (es_pool_slot_publish after st_store_read_record), so a half-filled
 * slot is never visible to a client.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "es_daemon.h"
#include "st_ioq.h"
#include "st_log.h"
#include "st_util.h"

struct es_load {
	uint32_t slot;
	uint64_t key;
};

struct es_loader {
	struct es_pool *pool;            /* borrowed */
	const struct st_store *store;    /* borrowed */
	struct st_ioq *ioq;              /* borrowed, NULL: none */
	int *fds;                        /* [n_layers] expert files */
	int delay_ms;
	int nice;                        /* > 0: each thread's own nice */
	int n_started;                   /* threads named and niced (mu) */
	pthread_cond_t started_cv;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct es_load *ring;            /* [cap] demand misses */
	uint32_t cap, head, n;
	struct es_load *pring;           /* [cap] prefetches */
	uint32_t phead, pn;
	int p_active;                    /* prefetches being read */
	int direct;                      /* files opened with O_DIRECT */
	int reading;                     /* reads in flight (under mu) */
	uint64_t busy_since;             /* when reading went 0 -> 1 */
	int stopping;
	int n_threads;
	pthread_t *threads;
	/* failed records: err per key, message per key (lazily allocated),
	 * guarded by mu.  Kept for the daemon's life: a corrupt record is
	 * reported to every client at once and logged once. */
	int *fail_err;
	char **fail_msg;
};

/* CPU time of the calling thread, ns (0 if the clock fails). */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) < 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One read of a record into its slot, through the I/O queue as class cls
 * (its bytes counted when the read returned them, checksum or not). */
static int read_record(struct es_loader *l, uint32_t layer, uint32_t expert,
		       uint32_t slot, int cls, uint64_t *sum_ns,
		       struct st_diag *diag)
{
	struct st_ioq_op op;
	int r;

	st_ioq_begin(l->ioq, cls, &op);
	/* tests: a slow device (inside the I/O, so that a kill -9 meanwhile
	 * leaves it in flight in the I/O queue) */
	if (l->delay_ms > 0)
		st_sleep_ns((uint64_t)l->delay_ms * 1000000ull);
	r = st_store_read_record_timed(l->store, l->fds[layer], (int)layer,
				       (int)expert,
				       es_pool_record(&l->pool->v, slot),
				       sum_ns, diag);
	st_ioq_end(l->ioq, &op, r == 0 || r == -ST_E_CHECKSUM ?
		   l->store->layers[layer].record_bytes : 0);
	return r;
}

static void load_one(struct es_loader *l, const struct es_load *job,
		     int cls)
{
	struct es_pool *p = l->pool;
	uint32_t layer = es_key_layer(job->key);
	uint32_t expert = es_key_expert(job->key);
	size_t ix = es_pool_index(&p->v, layer, expert);
	struct st_diag diag = { "" };
	uint64_t t0 = st_now_ns(), sum_ns = 0, cpu0 = thread_cpu_ns();
	struct rusage ru0, ru1;
	/* the faults of this load, when the kernel tells (it always does
	 * on Linux >= 2.6.26; without, the counters just stay put) */
	int have_ru = getrusage(RUSAGE_THREAD, &ru0) == 0;
	int r;

	pthread_mutex_lock(&l->mu);
	if (l->reading++ == 0)
		l->busy_since = st_now_ns();
	pthread_mutex_unlock(&l->mu);
	t0 = st_now_ns();
	r = read_record(l, layer, expert, job->slot, cls, &sum_ns, &diag);
	if (r == -ST_E_CHECKSUM) {
		/* A transient bad read (or a bad cached page) passes the second
		 * time; a corrupt record fails again and is refused. */
		atomic_fetch_add(&p->v.hdr->c.rereads, 1);
		st_warn("layer %u expert %u: %s; reading it again", layer,
			expert, diag.msg);
		r = read_record(l, layer, expert, job->slot, cls, &sum_ns,
				&diag);
	}
	atomic_fetch_add(&p->v.hdr->c.loads, 1);
	atomic_fetch_add(&p->v.hdr->c.load_ns, st_now_ns() - t0);
	atomic_fetch_add(&p->v.hdr->c.checksum_ns, sum_ns);
	atomic_fetch_add(&p->v.hdr->c.loader_cpu_ns, thread_cpu_ns() - cpu0);
	if (have_ru && getrusage(RUSAGE_THREAD, &ru1) == 0) {
		atomic_fetch_add(&p->v.hdr->c.loader_minflt,
				 (uint64_t)(ru1.ru_minflt - ru0.ru_minflt));
		atomic_fetch_add(&p->v.hdr->c.loader_majflt,
				 (uint64_t)(ru1.ru_majflt - ru0.ru_majflt));
	}
	pthread_mutex_lock(&l->mu);
	if (--l->reading == 0)
		atomic_fetch_add(&p->v.hdr->c.io_busy_ns,
				 st_now_ns() - l->busy_since);
	pthread_mutex_unlock(&l->mu);
	if (r == 0) {
		/* bytes read: the layer's record, which may be smaller than
		 * the slot (layers of different formats) */
		atomic_fetch_add(&p->v.hdr->c.load_bytes,
				 l->store->layers[layer].record_bytes);
	} else {
		if (r == -ST_E_CHECKSUM)
			atomic_fetch_add(&p->v.hdr->c.checksum_failures, 1);
		pthread_mutex_lock(&l->mu);
		if (!l->fail_err[ix]) {
			l->fail_err[ix] = r;
			l->fail_msg[ix] = strdup(diag.msg);
			/* Logged once per record; later requests get the
			 * message in their error reply. */
			st_err("layer %u expert %u: %s", layer, expert,
			       diag.msg);
		}
		pthread_mutex_unlock(&l->mu);
	}
	es_pool_slot_publish(p, job->slot, r);
}

static void *loader_main(void *arg)
{
	struct es_loader *l = arg;

	/* named, so top -H, perf and the tests tell them from the server
	 * thread (cosmetic: a name that does not take changes nothing) */
	(void)pthread_setname_np(pthread_self(), "es-loader");
	/* Linux: a thread's nice is its own (setpriority on its tid);
	 * relative to the daemon's, which may run niced already */
	if (l->nice > 0) {
		int cur;

		errno = 0;
		cur = getpriority(PRIO_PROCESS, (id_t)gettid());
		if ((cur == -1 && errno) ||
		    setpriority(PRIO_PROCESS, (id_t)gettid(),
				ST_MIN(cur + l->nice, 19)) < 0)
			st_warn("loader thread: cannot lower its priority by "
				"%d: %s", l->nice, strerror(errno));
	}
	pthread_mutex_lock(&l->mu);
	l->n_started++;
	pthread_cond_broadcast(&l->started_cv);
	pthread_mutex_unlock(&l->mu);

	for (;;) {
		struct es_load job;
		int pre = 0;

		pthread_mutex_lock(&l->mu);
		while (!l->n && !l->pn && !l->stopping)
			pthread_cond_wait(&l->cv, &l->mu);
		if (l->stopping) {
			pthread_mutex_unlock(&l->mu);
			return NULL;
		}
		if (l->n) {
			job = l->ring[l->head];
			l->head = (l->head + 1) % l->cap;
			l->n--;
		} else {
			job = l->pring[l->phead];
			l->phead = (l->phead + 1) % l->cap;
			l->pn--;
			l->p_active++;
			pre = 1;
		}
		pthread_mutex_unlock(&l->mu);
		load_one(l, &job, pre ? ST_IOQ_PREFETCH : ST_IOQ_DEMAND);
		if (pre) {
			pthread_mutex_lock(&l->mu);
			l->p_active--;
			pthread_mutex_unlock(&l->mu);
		}
	}
}

static void loader_free(struct es_loader *l)
{
	uint64_t n_keys;

	if (!l)
		return;
	n_keys = (uint64_t)l->store->n_layers * l->store->n_experts;
	if (l->fds)
		for (int i = 0; i < l->store->n_layers; i++)
			if (l->fds[i] >= 0)
				close(l->fds[i]);
	if (l->fail_msg)
		for (uint64_t i = 0; i < n_keys; i++)
			free(l->fail_msg[i]);
	free(l->fail_msg);
	free(l->fail_err);
	free(l->fds);
	free(l->ring);
	free(l->pring);
	free(l->threads);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	pthread_cond_destroy(&l->started_cv);
	free(l);
}

int es_loader_start(struct es_loader **ret, struct es_pool *p,
		    const struct st_store *store, int n_threads, int delay_ms,
		    int direct, int nice, struct st_ioq *ioq,
		    struct st_diag *diag)
{
	uint64_t n_keys = (uint64_t)store->n_layers * store->n_experts;
	struct es_loader *l = calloc(1, sizeof(*l));
	int r = 0;

	*ret = NULL;
	if (!l)
		return -ENOMEM;
	l->pool = p;
	l->store = store;
	l->ioq = ioq;
	l->delay_ms = delay_ms;
	l->nice = nice;
	l->cap = p->v.n_slots;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	pthread_cond_init(&l->started_cv, NULL);
	l->fds = malloc(sizeof(int) * (size_t)store->n_layers);
	l->ring = calloc(l->cap, sizeof(*l->ring));
	l->pring = calloc(l->cap, sizeof(*l->pring));
	l->threads = calloc((size_t)n_threads, sizeof(pthread_t));
	l->fail_err = calloc(n_keys, sizeof(int));
	l->fail_msg = calloc(n_keys, sizeof(char *));
	if (!l->fds || !l->ring || !l->pring || !l->threads || !l->fail_err ||
	    !l->fail_msg) {
		free(l->fds);
		l->fds = NULL;
		loader_free(l);
		return -ENOMEM;
	}
	for (int i = 0; i < store->n_layers; i++)
		l->fds[i] = -1;
	for (int i = 0; i < store->n_layers && !r; i++) {
		char path[4096];

		r = st_store_path(store, store->expert_files[i], path,
				  sizeof(path));
		if (r == 0 && direct) {
			/* tmpfs and some FUSE file systems refuse O_DIRECT */
			l->fds[i] = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
			if (l->fds[i] < 0 && errno != EINVAL)
				r = st_diag_set(diag, -errno,
						"cannot open expert file %s: "
						"%s", path, strerror(errno));
		}
		if (r == 0 && l->fds[i] < 0) {
			if (direct && i == 0)
				st_warn("%s: the file system refuses O_DIRECT; "
					"expert reads go through the page cache",
					path);
			l->fds[i] = open(path, O_RDONLY | O_CLOEXEC);
			if (l->fds[i] < 0)
				r = st_diag_set(diag, -errno,
						"cannot open expert file %s: "
						"%s", path, strerror(errno));
		}
	}
	if (r == 0) {
		l->direct = direct;
		for (int i = 0; i < store->n_layers && l->direct; i++) {
			int fl = fcntl(l->fds[i], F_GETFL);

			if (fl < 0 || !(fl & O_DIRECT))
				l->direct = 0;
		}
		atomic_store(&p->v.hdr->c.direct_io, (uint64_t)l->direct);
	}
	for (int i = 0; i < n_threads && !r; i++) {
		r = -pthread_create(&l->threads[i], NULL, loader_main, l);
		if (r == 0)
			l->n_threads++;
		else
			st_diag_set(diag, r, "cannot start loader thread: %s",
				    st_strerror(r));
	}
	if (r < 0) {
		es_loader_stop(l);
		return r;
	}
	/* the daemon serves once every loader runs as it should (name,
	 * priority) */
	pthread_mutex_lock(&l->mu);
	while (l->n_started < l->n_threads)
		pthread_cond_wait(&l->started_cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
	*ret = l;
	return 0;
}

int es_loader_queue(struct es_loader *l, uint32_t s, uint64_t key)
{
	pthread_mutex_lock(&l->mu);
	if (l->n == l->cap) {
		pthread_mutex_unlock(&l->mu);
		return -ST_E_BUSY; /* cannot happen: one entry per slot */
	}
	l->ring[(l->head + l->n) % l->cap] = (struct es_load){ s, key };
	l->n++;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int es_loader_queue_prefetch(struct es_loader *l, uint32_t s, uint64_t key)
{
	pthread_mutex_lock(&l->mu);
	if (l->pn == l->cap) {
		pthread_mutex_unlock(&l->mu);
		return -ST_E_BUSY;
	}
	l->pring[(l->phead + l->pn) % l->cap] = (struct es_load){ s, key };
	l->pn++;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
	return 0;
}

int es_loader_promote(struct es_loader *l, uint32_t s)
{
	int moved = 0;

	pthread_mutex_lock(&l->mu);
	for (uint32_t i = 0; i < l->pn; i++) {
		uint32_t at = (l->phead + i) % l->cap;
		struct es_load job = l->pring[at];

		if (job.slot != s)
			continue;
		/* close the gap, keeping the order of the others */
		for (uint32_t j = i; j + 1 < l->pn; j++)
			l->pring[(l->phead + j) % l->cap] =
				l->pring[(l->phead + j + 1) % l->cap];
		l->pn--;
		if (l->n < l->cap) {
			l->ring[(l->head + l->n) % l->cap] = job;
			l->n++;
		}
		moved = 1;
		break;
	}
	pthread_mutex_unlock(&l->mu);
	return moved;
}

int es_loader_prefetch_inflight(struct es_loader *l)
{
	int n;

	pthread_mutex_lock(&l->mu);
	n = (int)l->pn + l->p_active;
	pthread_mutex_unlock(&l->mu);
	return n;
}

int es_loader_direct(const struct es_loader *l)
{
	return l->direct;
}

int es_loader_failure(struct es_loader *l, uint64_t key, char *buf,
		      size_t len)
{
	size_t ix = es_pool_index(&l->pool->v, es_key_layer(key),
				  es_key_expert(key));
	int r;

	pthread_mutex_lock(&l->mu);
	r = l->fail_err[ix];
	if (r && buf && len)
		snprintf(buf, len, "%s", l->fail_msg[ix] ? l->fail_msg[ix] :
			 st_strerror(r));
	pthread_mutex_unlock(&l->mu);
	return r;
}

void es_loader_stop(struct es_loader *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->stopping = 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	for (int i = 0; i < l->n_threads; i++)
		pthread_join(l->threads[i], NULL);
	loader_free(l);
}

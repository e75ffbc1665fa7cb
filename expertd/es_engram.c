/*
 * es_engram.c — expertd's Engram tier for DeepSeek-V4.1 stores: a bounded
 * host cache of Engram table rows in front of the store's engram.bin
 * (st_engram_file.h), filled by many small direct reads in flight, rows
 * delivered through the "engram" shared-memory segment
 * (es_engram_proto.h).
 *
 * Why rows, not blocks: lookups are random (n-gram hashes), so the other
 * rows of a 4 KiB block are almost never wanted; caching the 264-byte row
 * keeps 15x more rows in the same budget.  A miss still reads its whole
 * aligned block (one O_DIRECT read) and checks the block's checksum.
 *
 * Threads: the server thread decodes and validates a request, queues it
 * and answers at once (no handler blocks on I/O, es_server.c); one engine
 * thread owns the cache and the I/O: it looks the rows up, copies hits
 * into the client's region, queues misses (a row already being read gets
 * one more waiter, not a second read), keeps up to EG_QD reads in flight
 * (io_uring through liburing when built with it and the kernel allows it,
 * else preads one at a time), and on each completion copies the row to
 * every waiting request; the last row of a FETCH publishes its done_seq.
 * Eviction: CLOCK (second chance) over READY rows; rows being read are
 * never evicted.  A FETCH row that finds no free or evictable entry (the
 * cache full of rows in flight) is read synchronously and not cached.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>
#ifdef ST_HAVE_LIBURING
#include <liburing.h>
#endif

#include "es_daemon.h"
#include "es_engram_proto.h"
#include "st_engram_file.h"
#include "st_ioq.h"
#include "st_log.h"
#include "st_util.h"

#define EG_QD 128                 /* reads in flight */
#define EG_WAIT_NS 50000          /* completion wait slice */
#define EG_MIN_ROWS (2 * EG_QD)   /* smallest cache */
#define EG_DEFAULT_CACHE (256ull << 20)
#define EG_KEY(li, row) (((uint64_t)(li) << 40) | (uint64_t)(row))
#define EG_KEY_LI(k) ((int)((k) >> 40))
#define EG_KEY_ROW(k) ((int64_t)((k) & ((1ull << 40) - 1)))

enum { EG_FREE = 0, EG_QUEUED, EG_READING, EG_READY };

struct eg_req;

struct eg_waiter {
	struct eg_req *req;
	uint32_t idx;
	struct eg_waiter *next;
};

struct eg_entry {
	uint64_t key;
	int32_t hnext;               /* hash chain, -1 ends */
	uint8_t state, ref, retried;
	struct eg_waiter *waiters;
};

struct eg_req {
	struct eg_req *next;
	int client, prefetch, li;
	uint64_t seq;
	uint32_t n, pending;
	int status;
	char msg[240];
	uint8_t *dst;                /* the client's region (FETCH) */
	int64_t *rows;               /* [n] */
	struct eg_waiter *w;         /* [n] */
};

struct eg_inflight {
	int32_t entry;               /* -1: free */
	uint8_t *buf;                /* 4 KiB aligned */
	uint64_t t0;
	struct st_ioq_op op;         /* its place in the I/O queue */
};

#define EG_ENTRY_OVERHEAD (sizeof(struct eg_entry) + 2 * sizeof(int32_t))

struct es_engram {
	const struct st_store *store;
	int fd, direct, engine;
	struct st_shm shm;
	struct es_engram_shm *hdr;
	uint8_t *regions;
	/* cache (engine thread only) */
	uint32_t cap, row_bytes_max;
	uint8_t *mem;
	struct eg_entry *ent;
	int32_t *bucket;
	uint32_t nbucket;
	int32_t *freel;
	uint32_t nfree, hand;
	uint32_t *readq;             /* ring of entry indexes, cap */
	uint32_t rq_head, rq_len;
	struct eg_inflight inf[EG_QD];
	int n_inflight;
	uint8_t *bounce;             /* synchronous reads */
	/* the instance's I/O queue (borrowed, NULL: none): a read is of
	 * class DEMAND when a FETCH waits for its row, else PREFETCH; the
	 * head of readq waits in head_op while the queue defers it */
	struct st_ioq *ioq;
	struct st_ioq_op head_op;
	int deferred;                /* submit stopped at a deferred head */
#ifdef ST_HAVE_LIBURING
	struct io_uring ring;
	int have_ring;
#endif
	/* hand-off from the server thread */
	pthread_t th;
	int th_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;
	struct eg_req *in_head, *in_tail;
};

/* ---- cache ------------------------------------------------------------ */

static uint32_t hslot(const struct es_engram *e, uint64_t key)
{
	return (uint32_t)(XXH3_64bits(&key, sizeof(key)) & (e->nbucket - 1));
}

static int32_t lookup(const struct es_engram *e, uint64_t key)
{
	for (int32_t i = e->bucket[hslot(e, key)]; i >= 0; i = e->ent[i].hnext)
		if (e->ent[i].key == key)
			return i;
	return -1;
}

static void unlink_entry(struct es_engram *e, int32_t x)
{
	int32_t *p = &e->bucket[hslot(e, e->ent[x].key)];

	while (*p >= 0 && *p != x)
		p = &e->ent[*p].hnext;
	if (*p == x)
		*p = e->ent[x].hnext;
	e->ent[x].state = EG_FREE;
	e->ent[x].waiters = NULL;
	e->freel[e->nfree++] = (uint32_t)x;
	atomic_fetch_sub_explicit(&e->hdr->cache_used, 1, memory_order_relaxed);
}

/* A free entry, else a READY one by CLOCK; -1 when every entry is being
 * read. */
static int32_t alloc_entry(struct es_engram *e, uint64_t key)
{
	int32_t x = -1;

	if (e->nfree) {
		x = (int32_t)e->freel[--e->nfree];
	} else {
		for (uint32_t n = 0; n < 2 * e->cap; n++) {
			uint32_t i = e->hand;

			e->hand = (e->hand + 1) % e->cap;
			if (e->ent[i].state != EG_READY)
				continue;
			if (e->ent[i].ref) {
				e->ent[i].ref = 0;
				continue;
			}
			unlink_entry(e, (int32_t)i);
			x = (int32_t)e->freel[--e->nfree];
			atomic_fetch_add_explicit(&e->hdr->evictions, 1,
						  memory_order_relaxed);
			break;
		}
		if (x < 0)
			return -1;
	}
	e->ent[x].key = key;
	e->ent[x].state = EG_QUEUED;
	e->ent[x].ref = 1;
	e->ent[x].retried = 0;
	e->ent[x].waiters = NULL;
	e->ent[x].hnext = e->bucket[hslot(e, key)];
	e->bucket[hslot(e, key)] = x;
	atomic_fetch_add_explicit(&e->hdr->cache_used, 1, memory_order_relaxed);
	return x;
}

static const struct st_engram_layout *lay(const struct es_engram *e, int li)
{
	return &e->store->engram[li];
}

/* ---- requests ----------------------------------------------------------- */

static void finish(struct es_engram *e, struct eg_req *q)
{
	struct es_engram_slot *s = &e->hdr->slot[q->client];

	if (!q->prefetch) {
		atomic_store_explicit(&s->status, q->status,
				      memory_order_relaxed);
		s->n_rows = q->n;
		snprintf(s->msg, sizeof(s->msg), "%s", q->msg);
		atomic_store_explicit(&s->done_seq, q->seq,
				      memory_order_release);
	}
	free(q->rows);
	free(q->w);
	free(q);
}

static void req_fail(struct eg_req *q, int err, const char *msg)
{
	if (!q->status) {
		q->status = err;
		snprintf(q->msg, sizeof(q->msg), "%s", msg);
	}
}

static void deliver(struct es_engram *e, struct eg_req *q, uint32_t idx,
		    const uint8_t *row)
{
	uint32_t rb = lay(e, q->li)->row_bytes;

	memcpy(q->dst + (size_t)idx * rb, row, rb);
}

/* Reads file block `blk` into buf (4 KiB) synchronously and checks it
 * (once more on a checksum failure). */
static int read_block_sync(struct es_engram *e, uint64_t blk, uint8_t *buf)
{
	for (int tries = 0; tries < 2; tries++) {
		uint64_t t0 = st_now_ns();
		struct st_ioq_op op;
		ssize_t n;

		st_ioq_begin(e->ioq, ST_IOQ_DEMAND, &op);
		n = pread(e->fd, buf, ST_ENGRAM_BLOCK_BYTES,
			  (off_t)(blk * ST_ENGRAM_BLOCK_BYTES));
		st_ioq_end(e->ioq, &op, n == ST_ENGRAM_BLOCK_BYTES ? (uint64_t)n
								     : 0);

		atomic_fetch_add_explicit(&e->hdr->reads, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&e->hdr->lat_hist[es_engram_lat_bucket(
					  st_now_ns() - t0)], 1,
					  memory_order_relaxed);
		if (n != ST_ENGRAM_BLOCK_BYTES)
			return n < 0 ? -errno : -EIO;
		atomic_fetch_add_explicit(&e->hdr->read_bytes,
					  ST_ENGRAM_BLOCK_BYTES,
					  memory_order_relaxed);
		if (!st_engram_block_check(buf, blk))
			return 0;
		atomic_fetch_add_explicit(&e->hdr->rereads, 1,
					  memory_order_relaxed);
	}
	return -ST_E_CHECKSUM;
}

static void block_error(struct es_engram *e, int err, int li, uint64_t blk,
			char *msg, size_t len)
{
	atomic_fetch_add_explicit(&e->hdr->read_errors, 1, memory_order_relaxed);
	if (err == -ST_E_CHECKSUM)
		snprintf(msg, len, "%s/%s: Engram layer %d block %" PRIu64
			 " checksum mismatch (read twice); the store is damaged: "
			 "re-run strata convert", e->store->dir, ST_ENGRAM_FILE,
			 lay(e, li)->layer, blk);
	else
		snprintf(msg, len, "%s/%s: Engram layer %d block %" PRIu64
			 ": read failed: %s", e->store->dir, ST_ENGRAM_FILE,
			 lay(e, li)->layer, blk, st_strerror(err));
}

static void process(struct es_engram *e, struct eg_req *q)
{
	const struct st_engram_layout *l = lay(e, q->li);

	atomic_fetch_add_explicit(&e->hdr->lookups, q->n, memory_order_relaxed);
	if (q->prefetch)
		atomic_fetch_add_explicit(&e->hdr->prefetch_rows, q->n,
					  memory_order_relaxed);
	q->pending = 1; /* held while queuing, dropped below */
	for (uint32_t i = 0; i < q->n; i++) {
		uint64_t key = EG_KEY(q->li, q->rows[i]);
		int32_t x = lookup(e, key);

		if (x >= 0 && e->ent[x].state == EG_READY) {
			e->ent[x].ref = 1;
			atomic_fetch_add_explicit(&e->hdr->hits, 1,
						  memory_order_relaxed);
			if (!q->prefetch)
				deliver(e, q, i, e->mem + (size_t)x *
						 e->row_bytes_max);
			continue;
		}
		if (x >= 0) {
			atomic_fetch_add_explicit(&e->hdr->merged, 1,
						  memory_order_relaxed);
		} else {
			x = alloc_entry(e, key);
			if (x < 0) {
				/* every entry is being read: a prefetch
				 * row is dropped, a FETCH row read now */
				uint64_t blk = st_engram_row_block(l, q->rows[i]);
				int r;

				if (q->prefetch)
					continue;
				atomic_fetch_add_explicit(&e->hdr->misses, 1,
							  memory_order_relaxed);
				r = read_block_sync(e, blk, e->bounce);
				if (r) {
					char m[240];

					block_error(e, r, q->li, blk, m, sizeof(m));
					req_fail(q, r, m);
				} else {
					deliver(e, q, i, e->bounce +
						st_engram_row_offset(l, q->rows[i]));
				}
				continue;
			}
			atomic_fetch_add_explicit(&e->hdr->misses, 1,
						  memory_order_relaxed);
			e->readq[(e->rq_head + e->rq_len++) % e->cap] = (uint32_t)x;
		}
		if (!q->prefetch) {
			struct eg_waiter *w = &q->w[i];

			w->req = q;
			w->idx = i;
			w->next = e->ent[x].waiters;
			e->ent[x].waiters = w;
			q->pending++;
		}
	}
	if (--q->pending == 0)
		finish(e, q);
}

/* A read of entry x's block finished with `res` bytes (or -errno) into
 * buf. */
static void complete(struct es_engram *e, int32_t x, int res,
		     const uint8_t *buf, uint64_t t0)
{
	struct eg_entry *en = &e->ent[x];
	int li = EG_KEY_LI(en->key);
	int64_t row = EG_KEY_ROW(en->key);
	const struct st_engram_layout *l = lay(e, li);
	uint64_t blk = st_engram_row_block(l, row);
	struct eg_waiter *w, *next;
	int err = 0;

	atomic_fetch_add_explicit(&e->hdr->reads, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&e->hdr->lat_hist[es_engram_lat_bucket(
				  st_now_ns() - t0)], 1, memory_order_relaxed);
	if (res != ST_ENGRAM_BLOCK_BYTES) {
		err = res < 0 ? res : -EIO;
	} else {
		atomic_fetch_add_explicit(&e->hdr->read_bytes,
					  ST_ENGRAM_BLOCK_BYTES,
					  memory_order_relaxed);
		if (st_engram_block_check(buf, blk))
			err = -ST_E_CHECKSUM;
	}
	if (err == -ST_E_CHECKSUM && !en->retried) {
		en->retried = 1;
		en->state = EG_QUEUED;
		atomic_fetch_add_explicit(&e->hdr->rereads, 1,
					  memory_order_relaxed);
		e->readq[(e->rq_head + e->rq_len++) % e->cap] = (uint32_t)x;
		return;
	}
	if (err) {
		char m[240];

		block_error(e, err, li, blk, m, sizeof(m));
		for (w = en->waiters; w; w = next) {
			next = w->next;
			req_fail(w->req, err, m);
			if (--w->req->pending == 0)
				finish(e, w->req);
		}
		unlink_entry(e, x);
		return;
	}
	memcpy(e->mem + (size_t)x * e->row_bytes_max,
	       buf + st_engram_row_offset(l, row), l->row_bytes);
	en->state = EG_READY;
	for (w = en->waiters; w; w = next) {
		next = w->next;
		deliver(e, w->req, w->idx, buf + st_engram_row_offset(l, row));
		if (--w->req->pending == 0)
			finish(e, w->req);
	}
	en->waiters = NULL;
}

/* ---- I/O ----------------------------------------------------------------- */

static void submit(struct es_engram *e)
{
	e->deferred = 0;
	while (e->rq_len && e->n_inflight < EG_QD) {
		uint32_t x = e->readq[e->rq_head];
		struct eg_entry *en = &e->ent[x];
		const struct st_engram_layout *l = lay(e, EG_KEY_LI(en->key));
		uint64_t off = st_engram_row_block(l, EG_KEY_ROW(en->key)) *
			       ST_ENGRAM_BLOCK_BYTES;
		int k, cls = en->waiters ? ST_IOQ_DEMAND : ST_IOQ_PREFETCH;

		/* a prefetch row a FETCH now waits for is demand: it stops
		 * waiting as a prefetch */
		if (e->head_op.state && e->head_op.cls != cls)
			st_ioq_cancel(e->ioq, &e->head_op);
		if (st_ioq_try_begin(e->ioq, cls, &e->head_op) == -EAGAIN) {
			e->deferred = 1; /* rows behind it wait too */
			break;
		}
		e->rq_head = (e->rq_head + 1) % e->cap;
		e->rq_len--;
		for (k = 0; k < EG_QD && e->inf[k].entry >= 0; k++)
			;
		en->state = EG_READING;
		e->inf[k].entry = (int32_t)x;
		e->inf[k].t0 = st_now_ns();
		e->inf[k].op = e->head_op;
		e->head_op.state = 0;
#ifdef ST_HAVE_LIBURING
		if (e->have_ring) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);

			if (sqe) {
				io_uring_prep_read(sqe, e->fd, e->inf[k].buf,
						   ST_ENGRAM_BLOCK_BYTES, off);
				io_uring_sqe_set_data64(sqe, (uint64_t)k);
				e->n_inflight++;
				continue;
			}
		}
#endif
		{
			ssize_t n = pread(e->fd, e->inf[k].buf,
					  ST_ENGRAM_BLOCK_BYTES, (off_t)off);

			st_ioq_end(e->ioq, &e->inf[k].op,
				   n == ST_ENGRAM_BLOCK_BYTES ? (uint64_t)n : 0);
			e->inf[k].entry = -1;
			complete(e, (int32_t)x, n < 0 ? -errno : (int)n,
				 e->inf[k].buf, e->inf[k].t0);
		}
	}
#ifdef ST_HAVE_LIBURING
	if (e->have_ring && e->n_inflight)
		io_uring_submit(&e->ring);
#endif
}

#ifdef ST_HAVE_LIBURING
static void reap(struct es_engram *e, int wait)
{
	struct io_uring_cqe *cqe;
	struct __kernel_timespec ts = { 0, EG_WAIT_NS };
	int r = wait ? io_uring_wait_cqe_timeout(&e->ring, &cqe, &ts) :
		       io_uring_peek_cqe(&e->ring, &cqe);

	while (r == 0 && cqe) {
		int k = (int)io_uring_cqe_get_data64(cqe);
		int res = cqe->res;
		int32_t x = e->inf[k].entry;

		io_uring_cqe_seen(&e->ring, cqe);
		st_ioq_end(e->ioq, &e->inf[k].op,
			   res == ST_ENGRAM_BLOCK_BYTES ? (uint64_t)res : 0);
		e->inf[k].entry = -1;
		e->n_inflight--;
		complete(e, x, res, e->inf[k].buf, e->inf[k].t0);
		r = io_uring_peek_cqe(&e->ring, &cqe);
	}
}
#endif

static void *engine_main(void *arg)
{
	struct es_engram *e = arg;

	for (;;) {
		struct eg_req *q;

		pthread_mutex_lock(&e->mu);
		while (!e->stop && !e->in_head && !e->n_inflight && !e->rq_len)
			pthread_cond_wait(&e->cv, &e->mu);
		q = e->in_head;
		e->in_head = e->in_tail = NULL;
		if (e->stop) {
			pthread_mutex_unlock(&e->mu);
			while (q) {
				struct eg_req *n = q->next;

				free(q->rows);
				free(q->w);
				free(q);
				q = n;
			}
			break;
		}
		pthread_mutex_unlock(&e->mu);
		while (q) {
			struct eg_req *n = q->next;

			process(e, q);
			q = n;
		}
		submit(e);
#ifdef ST_HAVE_LIBURING
		if (e->n_inflight)
			reap(e, 1);
#endif
		/* the I/O queue defers the head and nothing is in flight to
		 * wait for: poll it again shortly (bounded by st_ioq) */
		if (e->deferred && !e->n_inflight)
			st_sleep_ns(ST_IOQ_POLL_NS);
	}
	st_ioq_cancel(e->ioq, &e->head_op);
	return NULL;
}

/* ---- set-up ------------------------------------------------------------- */

static int open_file(struct es_engram *e, int direct, struct st_diag *diag)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", e->store->dir, ST_ENGRAM_FILE);
	e->fd = -1;
	if (direct) {
		e->fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
		e->direct = e->fd >= 0;
	}
	if (e->fd < 0)
		e->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (e->fd < 0)
		return st_diag_set(diag, -errno, "%s: %s", path, strerror(errno));
	return 0;
}

static int open_shm(struct es_engram *e, const char *instance,
		    struct st_diag *diag)
{
	const struct st_store *s = e->store;
	struct es_engram_shm g;
	uint64_t regions_off, region_bytes, total;
	int r;

	memset(&g, 0, sizeof(g));
	g.n_layers = (uint32_t)s->n_engram;
	g.max_rows = ES_ENGRAM_MAX_ROWS;
	g.row_bytes_max = e->row_bytes_max;
	g.n_regions = ES_MAX_CLIENTS;
	for (int i = 0; i < s->n_engram; i++) {
		g.layer_id[i] = s->engram[i].layer;
		g.dim[i] = (uint32_t)s->engram[i].dim;
		g.row_bytes[i] = s->engram[i].row_bytes;
		g.rows[i] = s->engram[i].rows;
	}
	region_bytes = ST_ALIGN_UP((uint64_t)g.max_rows * g.row_bytes_max, 4096);
	regions_off = ST_ALIGN_UP(ES_ENGRAM_SHM_OFFSET + sizeof(g), 4096);
	total = regions_off + region_bytes * ES_MAX_CLIENTS;
	g.regions_offset = regions_off;
	g.region_bytes = region_bytes;
	/* the layout hash covers the geometry fields above the counters */
	r = st_shm_open_owner(&e->shm, instance, ES_ENGRAM_SHM_KIND,
			      ES_ENGRAM_SHM_LAYOUT,
			      XXH3_64bits(&g, offsetof(struct es_engram_shm,
						       cache_rows)) | 1,
			      total, diag);
	if (r < 0)
		return r;
	e->hdr = (struct es_engram_shm *)((uint8_t *)e->shm.base +
					  ES_ENGRAM_SHM_OFFSET);
	memcpy(e->hdr, &g, offsetof(struct es_engram_shm, cache_rows));
	e->hdr->cache_rows = e->cap;
	e->hdr->cache_bytes = (uint64_t)e->cap * (e->row_bytes_max +
						 EG_ENTRY_OVERHEAD);
	e->hdr->io_engine = (uint32_t)e->engine;
	e->hdr->direct = (uint32_t)e->direct;
	atomic_store(&e->hdr->cache_used, 0);
	e->regions = (uint8_t *)e->shm.base + regions_off;
	return 0;
}

int es_engram_start(struct es_daemon *d, struct st_diag *diag)
{
	const struct st_store *s = d->store;
	struct es_engram *e;
	uint64_t bytes = EG_DEFAULT_CACHE;
	int r;

	if (!s->is_dsv41 || !s->n_engram)
		return 0;
	if (d->opt.engram_cache_text &&
	    st_parse_size(d->opt.engram_cache_text, &bytes) < 0)
		return st_diag_set(diag, -EINVAL, "--engram-cache '%s' is not a "
				   "size (e.g. 512MiB, 8GiB)",
				   d->opt.engram_cache_text);
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->store = s;
	e->ioq = d->ioq;
	e->fd = -1;
	for (int i = 0; i < s->n_engram; i++)
		e->row_bytes_max = ST_MAX(e->row_bytes_max, s->engram[i].row_bytes);
	if (bytes / (e->row_bytes_max + EG_ENTRY_OVERHEAD) < EG_MIN_ROWS) {
		uint64_t per = e->row_bytes_max + EG_ENTRY_OVERHEAD;

		free(e);
		return st_diag_set(diag, -ST_E_BUDGET, "--engram-cache %s holds "
				   "fewer than %d Engram rows (%llu bytes "
				   "each with the index); give at least %llu "
				   "bytes", d->opt.engram_cache_text,
				   EG_MIN_ROWS, (unsigned long long)per,
				   (unsigned long long)(EG_MIN_ROWS * per));
	}
	e->cap = (uint32_t)ST_MIN(bytes / (e->row_bytes_max + EG_ENTRY_OVERHEAD),
				  (uint64_t)INT32_MAX / 2);
	for (e->nbucket = 1; e->nbucket < e->cap; e->nbucket <<= 1)
		;
	e->mem = malloc((size_t)e->cap * e->row_bytes_max);
	e->ent = calloc(e->cap, sizeof(*e->ent));
	e->bucket = malloc(e->nbucket * sizeof(int32_t));
	e->freel = malloc(e->cap * sizeof(int32_t));
	e->readq = malloc(e->cap * sizeof(uint32_t));
	d->engram = e;
	if (!e->mem || !e->ent || !e->bucket || !e->freel || !e->readq ||
	    posix_memalign((void **)&e->bounce, 4096, ST_ENGRAM_BLOCK_BYTES))
		return st_diag_set(diag, -ENOMEM, "Engram cache: out of memory");
	memset(e->bucket, 0xff, e->nbucket * sizeof(int32_t));
	for (uint32_t i = 0; i < e->cap; i++)
		e->freel[i] = e->cap - 1 - i;
	e->nfree = e->cap;
	for (int k = 0; k < EG_QD; k++) {
		e->inf[k].entry = -1;
		if (posix_memalign((void **)&e->inf[k].buf, 4096,
				   ST_ENGRAM_BLOCK_BYTES))
			return st_diag_set(diag, -ENOMEM, "out of memory");
	}
	if ((r = open_file(e, !d->opt.no_direct_io, diag)))
		return r;
	e->engine = ES_ENGRAM_IO_PREAD;
#ifdef ST_HAVE_LIBURING
	r = io_uring_queue_init(EG_QD, &e->ring, 0);
	if (r == 0) {
		e->have_ring = 1;
		e->engine = ES_ENGRAM_IO_URING;
	} else {
		st_warn("io_uring unavailable (%s): Engram reads use pread",
			st_strerror(r));
	}
#endif
	if ((r = open_shm(e, d->opt.instance, diag)) < 0)
		return r;
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	r = pthread_create(&e->th, NULL, engine_main, e);
	if (r)
		return st_diag_set(diag, -r, "Engram engine thread: %s",
				   strerror(r));
	e->th_started = 1;
	st_info("Engram tier: %d tables, cache %u rows (%s), reads %s%s, "
		"%d in flight", s->n_engram, e->cap,
		st_format_bytes(e->hdr->cache_bytes, (char[32]){ 0 }, 32),
		e->engine == ES_ENGRAM_IO_URING ? "io_uring" : "pread",
		e->direct ? " O_DIRECT" : " buffered",
		e->engine == ES_ENGRAM_IO_URING ? EG_QD : 1);
	return 0;
}

void es_engram_stop(struct es_daemon *d, int destroy)
{
	struct es_engram *e = d->engram;

	if (!e)
		return;
	if (e->hdr) {
		struct es_engram_shm *h = e->hdr;
		uint64_t hist[ES_ENGRAM_LAT_BUCKETS];
		uint64_t lk = atomic_load(&h->lookups);

		for (int b = 0; b < ES_ENGRAM_LAT_BUCKETS; b++)
			hist[b] = atomic_load(&h->lat_hist[b]);
		st_info("Engram tier: %" PRIu64 " rows looked up, hit rate "
			"%.1f %% (+%.1f %% joined a read), %" PRIu64 " block "
			"reads (%" PRIu64 " bytes), read latency p50 %" PRIu64
			" ns p99 %" PRIu64 " ns, %" PRIu64 " read errors",
			lk, lk ? 100.0 * (double)atomic_load(&h->hits) /
			(double)lk : 0.0, lk ? 100.0 *
			(double)atomic_load(&h->merged) / (double)lk : 0.0,
			atomic_load(&h->reads), atomic_load(&h->read_bytes),
			es_engram_lat_quantile(hist, 0.5),
			es_engram_lat_quantile(hist, 0.99),
			atomic_load(&h->read_errors));
	}
	if (e->th_started) {
		pthread_mutex_lock(&e->mu);
		e->stop = 1;
		pthread_cond_signal(&e->cv);
		pthread_mutex_unlock(&e->mu);
		pthread_join(e->th, NULL);
		pthread_mutex_destroy(&e->mu);
		pthread_cond_destroy(&e->cv);
	}
#ifdef ST_HAVE_LIBURING
	if (e->have_ring)
		io_uring_queue_exit(&e->ring);
#endif
	if (e->shm.base) {
		if (destroy)
			st_shm_destroy(&e->shm);
		else
			st_shm_detach(&e->shm);
	}
	if (e->fd >= 0)
		close(e->fd);
	for (int k = 0; k < EG_QD; k++)
		free(e->inf[k].buf);
	free(e->bounce);
	free(e->mem);
	free(e->ent);
	free(e->bucket);
	free(e->freel);
	free(e->readq);
	free(e);
	d->engram = NULL;
}

/* ---- messages (server thread) ------------------------------------------ */

int es_engram_handle(struct es_daemon *d, const struct st_msg_header *h,
		     const uint8_t *p, struct st_wbuf *w, struct st_diag *diag)
{
	struct es_engram *e = d->engram;
	struct es_engram_req req;
	struct eg_req *q;
	int c, r;

	if (!e)
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "this expertd serves "
				   "no Engram tables (the store %s is not a "
				   "DeepSeek-V4.1 store)", d->store->dir);
	if (h->type == ES_MSG_ENGRAM_OPEN) {
		struct es_engram_open_rep rep;
		uint32_t pid;

		if (h->payload_len != 4)
			return st_diag_set(diag, -ST_E_PROTO, "ENGRAM_OPEN: %u "
					   "payload bytes, expected 4 (pid)",
					   h->payload_len);
		memcpy(&pid, p, 4);
		c = es_clients_lookup(&d->pool, h->client_id, (int32_t)pid, diag);
		if (c < 0)
			return c;
		rep.region = (uint32_t)c;
		rep.n_layers = e->hdr->n_layers;
		rep.max_rows = e->hdr->max_rows;
		rep.region_offset = e->hdr->regions_offset +
				    (uint64_t)c * e->hdr->region_bytes;
		rep.region_bytes = e->hdr->region_bytes;
		es_engram_open_rep_encode(w, &rep);
		return 0;
	}
	r = es_engram_req_decode(p, h->payload_len, e->hdr->n_layers,
				 e->hdr->max_rows, e->hdr->rows, &req, diag);
	if (r < 0)
		return r;
	c = es_clients_lookup(&d->pool, h->client_id, (int32_t)req.pid, diag);
	if (c < 0)
		return c;
	q = calloc(1, sizeof(*q));
	if (q) {
		q->rows = malloc(req.n * sizeof(int64_t));
		q->w = req.flags ? NULL : calloc(req.n, sizeof(*q->w));
	}
	if (!q || !q->rows || (!req.flags && !q->w)) {
		if (q) {
			free(q->rows);
			free(q->w);
		}
		free(q);
		return st_diag_set(diag, -ENOMEM, "ENGRAM: out of memory");
	}
	q->client = c;
	q->prefetch = (req.flags & ES_ENGRAM_PREFETCH) != 0;
	q->li = (int)req.li;
	q->seq = req.seq;
	q->n = req.n;
	q->dst = e->regions + (size_t)c * e->hdr->region_bytes;
	for (uint32_t i = 0; i < req.n; i++)
		q->rows[i] = es_engram_req_row(&req, i);
	pthread_mutex_lock(&e->mu);
	if (e->in_tail)
		e->in_tail->next = q;
	else
		e->in_head = q;
	e->in_tail = q;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
	return 0;
}

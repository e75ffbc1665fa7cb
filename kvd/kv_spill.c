/*
 * kv_spill.c — kvd's second tier for KV pages (DESIGN.md section 1, T2):
 * when the host pool runs out, pages of idle sequences (not pinned as
 * running, least recently used first) and unused prefix-cache groups are
 * written to the spill file, and brought back, verified, before a sequence
 * is used again.
 *
 * The file: slot i at byte i x slot_bytes (page_bytes rounded up to 4 KiB),
 * opened with O_DIRECT where the filesystem allows it.  Contiguous slots
 * move in one preadv/pwritev of up to KV_SPILL_IO_BYTES; a page whose
 * address and size are 4 KiB multiples moves straight between the segment
 * and the file, any other through an aligned bounce buffer.  Each slot's
 * record (kv_spill_slot, in the segment, so a restarted kvd still knows
 * what the file holds) names its owner (sequence handle and position, or a
 * cached group's key), the stream, the length and XXH3-64 of the bytes; a
 * restored page is used only when all of them match.
 *
 * Order of a spill (what a kill -9 can cut): bytes written, then the slot
 * record, then the table entry switched to the slot, then the page freed.
 * Adoption frees records that no table or group names, and recounts pages
 * from the tables.  Single writer (kvd's loop).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kv_daemon.h"
#include "st_ioq.h"
#include "st_log.h"
#include "st_util.h"

#define IOV_CAP 1024
#define KV_TMPFS_MAGIC 0x01021994

/* ---- the file ----------------------------------------------------------- */

static size_t bounce_bytes(const struct kv_pool *p)
{
	return ST_MAX((size_t)KV_SPILL_IO_BYTES, (size_t)p->lay.slot_bytes);
}

/*
 * An adopted pool whose spill file was removed while no kvd held it open
 * (a cleaned /tmp or run directory): what its slot records describe is
 * gone.  Every spilled entry of a sequence becomes KV_PAGE_LOST (the
 * sequence FAILED, as adoption does with a record that does not match),
 * spilled cached groups are dropped and every slot is freed, now rather
 * than at each restore as a checksum mismatch.  Needs the free slot list.
 * Logs what was lost.
 */
static void spill_lost_all(struct kv_pool *p, const char *path)
{
	uint64_t pages = 0, groups = 0;
	uint32_t seqs = 0;

	for (uint32_t idx = 0; idx < p->lay.max_seqs; idx++) {
		struct kv_seq_entry *e = &p->seqs[idx];
		uint32_t n = 0;

		if (atomic_load(&e->state) != KV_SEQ_LIVE)
			continue;
		for (uint32_t s = 0; s < p->lay.n_streams; s++)
			for (uint32_t pi = 0; pi < p->lay.max_pages_per_seq;
			     pi++)
				if (kv_entry_is_spilled(
					    kv_table_get(p, idx, s, pi))) {
					kv_table_set(p, idx, s, pi,
						     KV_PAGE_LOST);
					n++;
				}
		if (n) {
			e->n_spilled = 0;
			atomic_fetch_or(&e->flags, KV_SEQ_F_FAILED);
			pages += n;
			seqs++;
		}
	}
	while (kv_cache_drop_spilled_lru(p))
		groups++;
	for (uint64_t i = 0; i < p->lay.n_slots; i++)
		kv_spill_slot_free(p, (uint32_t)i);
	if (pages || groups)
		st_warn("spill file %s was removed since the kv pool spilled "
			"to it (a removed run directory or a cleaned /tmp?): "
			"%llu spilled pages of %u sequences and %llu cached "
			"prefix groups are lost; those sequences failed (free "
			"them); keep --spill-file where nothing else cleans up",
			path, (unsigned long long)pages, seqs,
			(unsigned long long)groups);
}

int kv_spill_open(struct kv_pool *p, const char *path, int adopted,
		  struct st_diag *diag)
{
	struct kv_spill *sp = &p->spill;
	uint64_t size = p->lay.n_slots * p->lay.slot_bytes;
	int flags = O_RDWR | O_CREAT | O_CLOEXEC | (adopted ? 0 : O_TRUNC);
	struct stat st;
	int fd, r, lost = 0;

	if (p->lay.n_slots == 0)
		return 0;
	if (strlen(path) >= sizeof(sp->path))
		return st_diag_set(diag, -ENAMETOOLONG,
				   "spill file path too long: %s", path);
	/* an adopted pool's file must still be there (one cut short keeps
	 * what it still holds: the pages past its end fail their checks) */
	if (adopted && stat(path, &st) < 0 && errno == ENOENT)
		lost = 1;
	sp->direct = 1;
	fd = open(path, flags | O_DIRECT, 0600);
	if (fd < 0 && errno == EINVAL) {
		/* tmpfs and a few others refuse O_DIRECT */
		sp->direct = 0;
		fd = open(path, flags, 0600);
	}
	if (fd < 0)
		return st_diag_set(diag, -errno, "spill file %s: %s", path,
				   strerror(errno));
	if (fstat(fd, &st) < 0) {
		r = -errno;
		close(fd);
		return st_diag_set(diag, r, "spill file %s: %s", path,
				   st_strerror(r));
	}
	if ((uint64_t)st.st_size < size) {
		r = posix_fallocate(fd, 0, (off_t)size);
		if (r == EOPNOTSUPP || r == EINVAL)
			r = ftruncate(fd, (off_t)size) < 0 ? errno : 0;
		if (r) {
			char b[32];

			close(fd);
			if (!adopted)
				unlink(path);
			return st_diag_set(diag, -r,
					   "spill file %s: cannot reserve %s: "
					   "%s; lower kvd --spill-budget or use "
					   "another --spill-file", path,
					   st_format_bytes(size, b, sizeof(b)),
					   strerror(r));
		}
	}
	sp->bounce = aligned_alloc(KV_SLOT_ALIGN, bounce_bytes(p));
	sp->free_slots = malloc(sizeof(uint32_t) * p->lay.n_slots);
	if (!sp->bounce || !sp->free_slots) {
		free(sp->bounce);
		free(sp->free_slots);
		sp->bounce = NULL;
		sp->free_slots = NULL;
		close(fd);
		return -ENOMEM;
	}
	{
		struct statfs fs;

		if (fstatfs(fd, &fs) == 0 &&
		    (unsigned long)fs.f_type == KV_TMPFS_MAGIC)
			st_warn("spill file %s is on tmpfs (memory): spilling "
				"there saves no memory; put it on NVMe (kvd "
				"--spill-file PATH, or a --run-dir on NVMe for "
				"strata up/run)", path);
	}
	sp->n_free_slots = 0;
	for (uint64_t i = p->lay.n_slots; i-- > 0;)
		if (atomic_load(&sp->slots[i].state) == KV_SLOT_FREE)
			sp->free_slots[sp->n_free_slots++] = (uint32_t)i;
	sp->fd = fd;
	snprintf(sp->path, sizeof(sp->path), "%s", path);
	if (lost)
		spill_lost_all(p, path);
	return 0;
}

void kv_spill_close(struct kv_pool *p, int remove_file)
{
	struct kv_spill *sp = &p->spill;

	if (sp->fd >= 0) {
		close(sp->fd);
		if (remove_file)
			unlink(sp->path);
	}
	sp->fd = -1;
	st_ioq_close(sp->ioq);
	sp->ioq = NULL;
	free(sp->bounce);
	free(sp->free_slots);
	sp->bounce = NULL;
	sp->free_slots = NULL;
	sp->n_free_slots = 0;
}

uint64_t kv_spill_used_slots(const struct kv_pool *p)
{
	uint64_t n = 0;

	if (p->spill.fd >= 0)
		return p->lay.n_slots - p->spill.n_free_slots;
	for (uint64_t i = 0; i < p->lay.n_slots; i++)
		n += atomic_load(&p->spill.slots[i].state) == KV_SLOT_USED;
	return n;
}

void kv_spill_slot_free(struct kv_pool *p, uint32_t slot)
{
	struct kv_spill *sp = &p->spill;

	if (slot >= p->lay.n_slots)
		return;
	if (atomic_exchange(&sp->slots[slot].state, KV_SLOT_FREE) ==
		    KV_SLOT_FREE)
		return; /* never twice on the free list */
	if (sp->free_slots)
		sp->free_slots[sp->n_free_slots++] = slot;
}

static int u32_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Takes n free slots, in ascending order (so that a fresh file is written
 * in long runs).  -ST_E_BUDGET when fewer are free. */
static int slots_take(struct kv_pool *p, uint32_t n, uint32_t *ret)
{
	struct kv_spill *sp = &p->spill;

	if (sp->fd < 0 || sp->n_free_slots < n)
		return -ST_E_BUDGET;
	for (uint32_t i = 0; i < n; i++)
		ret[i] = sp->free_slots[--sp->n_free_slots];
	qsort(ret, n, sizeof(*ret), u32_cmp);
	return 0;
}

/* Puts back slots taken but never recorded. */
static void slots_untake(struct kv_pool *p, uint32_t n, const uint32_t *s)
{
	for (uint32_t i = n; i-- > 0;)
		p->spill.free_slots[p->spill.n_free_slots++] = s[i];
}

/* ---- I/O ---------------------------------------------------------------- */

/* One page moving between the pool and a slot. */
struct kv_spill_io {
	uint32_t slot;
	uint32_t page;
	uint32_t length;     /* bytes that matter: rows per page x row_bytes */
	int32_t status;      /* read: 0 or the error of this page */
	uint64_t checksum;   /* of the page's `length` bytes */
	uint32_t owner;      /* what the record says / must say */
	uint32_t stream;
	uint32_t page_index;
	uint32_t idx;        /* sequence index (restore) */
	uint64_t key;
};

static int io_cmp(const void *a, const void *b)
{
	const struct kv_spill_io *x = a, *y = b;

	return x->slot < y->slot ? -1 : x->slot > y->slot;
}

static int page_direct(const struct kv_pool *p, uint32_t page)
{
	return p->lay.slot_bytes == p->lay.page_bytes &&
	       ((uintptr_t)kv_page_data(p, page) % KV_SLOT_ALIGN) == 0;
}

/* The whole of iov at `off`, looping over short transfers. */
static int io_full_raw(int fd, struct iovec *iov, int cnt, off_t off,
		       int write)
{
	while (cnt > 0) {
		ssize_t n = write ? pwritev(fd, iov, cnt, off) :
				    preadv(fd, iov, cnt, off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -ST_E_CHECKSUM; /* past the end: truncated */
		off += n;
		while (cnt > 0 && (size_t)n >= iov->iov_len) {
			n -= (ssize_t)iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + n;
			iov->iov_len -= (size_t)n;
		}
	}
	return 0;
}

/* The whole of iov at `off`, looping over short transfers, as one I/O
 * of the instance's queue (q, NULL: none): a write is a spill, a read a
 * restore; its bytes counted when it succeeded.  A spill a request waits
 * for (!background) waits only for what a restore waits for. */
static int io_full(struct st_ioq *q, int background, int fd,
		   struct iovec *iov, int cnt, off_t off, int write)
{
	struct st_ioq_op op;
	uint64_t bytes = 0;
	int r;

	for (int i = 0; i < cnt; i++)
		bytes += iov[i].iov_len;
	st_ioq_begin_prio(q, write ? ST_IOQ_KV_SPILL : ST_IOQ_KV_RESTORE,
			  write && background ? ST_IOQ_KV_SPILL :
						ST_IOQ_KV_RESTORE, &op);
	r = io_full_raw(fd, iov, cnt, off, write);
	st_ioq_end(q, &op, r == 0 ? bytes : 0);
	return r;
}

/* The iovecs of run v[0..cnt): a page straight from the segment when it
 * can be, else its place in the bounce buffer (filled for a write). */
static void run_iov(struct kv_pool *p, const struct kv_spill_io *v,
		    uint32_t cnt, int write, struct iovec *iov)
{
	const uint64_t sb = p->lay.slot_bytes;
	size_t used = 0;

	for (uint32_t i = 0; i < cnt; i++) {
		uint8_t *pg = kv_page_data(p, v[i].page);

		if (page_direct(p, v[i].page)) {
			iov[i].iov_base = pg;
		} else {
			uint8_t *bb = p->spill.bounce + used;

			if (write) {
				memcpy(bb, pg, v[i].length);
				memset(bb + v[i].length, 0, sb - v[i].length);
			}
			iov[i].iov_base = bb;
			used += sb;
		}
		iov[i].iov_len = sb;
	}
}

/*
 * The transfers of v[0..n) (sorted by slot), run by run, without
 * checksums: a write stops at the first error (returned); a read sets the
 * status of every page of a run that failed and goes on.  After each run,
 * *done (under mu, when given) is the number of pages finished, so that
 * another thread can check them meanwhile.
 */
struct mover {
	struct kv_pool *p;
	struct kv_spill_io *v;
	uint32_t n;
	int write;
	int err;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t done;
	int threaded;
};

static void mover_progress(struct mover *m, uint32_t done)
{
	if (!m->threaded) {
		m->done = done;
		return;
	}
	pthread_mutex_lock(&m->mu);
	m->done = done;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
}

static void *mover_run(void *arg)
{
	struct mover *m = arg;
	struct kv_pool *p = m->p;
	struct kv_spill *sp = &p->spill;
	struct kv_spill_io *v = m->v;
	const uint64_t sb = p->lay.slot_bytes;
	const size_t cap = bounce_bytes(p);
	struct iovec iov[IOV_CAP];

	for (uint32_t a = 0; a < m->n;) {
		uint32_t b = a + 1;
		size_t used = page_direct(p, v[a].page) ? 0 : sb;
		off_t off = (off_t)(v[a].slot * sb);
		int e;

		/* a run: consecutive slots, within IOV_CAP iovecs, the I/O
		 * size and the bounce buffer */
		while (b < m->n && v[b].slot == v[b - 1].slot + 1 &&
		       (b - a) < IOV_CAP && (uint64_t)(b - a + 1) * sb <= cap) {
			if (!page_direct(p, v[b].page)) {
				if (used + sb > cap)
					break;
				used += sb;
			}
			b++;
		}
		run_iov(p, v + a, b - a, m->write, iov);
		e = io_full(sp->ioq, sp->background, sp->fd, iov,
			    (int)(b - a), off, m->write);
		if (e == -EINVAL && sp->direct) {
			/* the filesystem took O_DIRECT at open but refuses
			 * this transfer: go on buffered */
			int fl = fcntl(sp->fd, F_GETFL);

			if (fl >= 0 &&
			    fcntl(sp->fd, F_SETFL, fl & ~O_DIRECT) == 0) {
				sp->direct = 0;
				run_iov(p, v + a, b - a, m->write, iov);
				e = io_full(sp->ioq, sp->background, sp->fd,
					    iov, (int)(b - a), off, m->write);
			}
		}
		if (e < 0 && m->write) {
			m->err = e;
			mover_progress(m, m->n);
			return NULL;
		}
		used = 0;
		for (uint32_t i = a; i < b; i++) {
			if (e < 0) {
				v[i].status = e;
				continue;
			}
			v[i].status = 0;
			if (!m->write && !page_direct(p, v[i].page)) {
				memcpy(kv_page_data(p, v[i].page),
				       sp->bounce + used, v[i].length);
				used += sb;
			}
		}
		mover_progress(m, b);
		a = b;
	}
	return NULL;
}

/* Below this many bytes a batch moves in the calling thread only. */
#define KV_SPILL_THREAD_BYTES (2u << 20)

/*
 * Moves v[0..n) (sorted by slot here): write = 1 writes each page's bytes
 * to its slot, 0 reads each slot into its page; v[i].checksum is XXH3 of
 * the page's `length` bytes (before the write, after the read).  A large
 * batch moves in a helper thread while this one computes the checksums
 * (of pages being written, or of pages already read), so the checksums
 * cost no time next to the disk.  Returns a write's first error (nothing
 * to record then); a read's errors are in the statuses.
 */
static int spill_move(struct kv_pool *p, struct kv_spill_io *v, uint32_t n,
		      int write)
{
	struct mover m = { .p = p, .v = v, .n = n, .write = write };
	pthread_t th;

	if (n == 0)
		return 0;
	if (write) /* rows written on the device reach the page first */
		for (uint32_t i = 0; i < n; i++)
			kv_pool_page_sync(p, v[i].page);
	qsort(v, n, sizeof(*v), io_cmp);
	m.threaded = (uint64_t)n * p->lay.slot_bytes >= KV_SPILL_THREAD_BYTES;
	if (m.threaded) {
		pthread_mutex_init(&m.mu, NULL);
		pthread_cond_init(&m.cv, NULL);
		if (pthread_create(&th, NULL, mover_run, &m) != 0) {
			pthread_mutex_destroy(&m.mu);
			pthread_cond_destroy(&m.cv);
			m.threaded = 0;
		}
	}
	if (!m.threaded) {
		if (write)
			for (uint32_t i = 0; i < n; i++)
				v[i].checksum = st_xxh3(
					kv_page_data(p, v[i].page),
					v[i].length);
		mover_run(&m);
		if (!write)
			for (uint32_t i = 0; i < n; i++)
				if (v[i].status == 0)
					v[i].checksum = st_xxh3(
						kv_page_data(p, v[i].page),
						v[i].length);
		return m.err;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (!write) {
			/* wait until page i arrived */
			pthread_mutex_lock(&m.mu);
			while (m.done <= i)
				pthread_cond_wait(&m.cv, &m.mu);
			pthread_mutex_unlock(&m.mu);
			if (v[i].status < 0)
				continue;
		}
		v[i].checksum = st_xxh3(kv_page_data(p, v[i].page),
					v[i].length);
	}
	pthread_join(th, NULL);
	pthread_mutex_destroy(&m.mu);
	pthread_cond_destroy(&m.cv);
	return m.err;
}

static uint32_t stream_length(const struct kv_pool *p, uint32_t s)
{
	return kv_stream_page_capacity(&p->streams[s], p->lay.page_rows) *
	       p->streams[s].row_bytes;
}

/* p->test_cut at `step` (0: go on). */
static int spill_cut(const struct kv_pool *p, int restore, uint64_t step)
{
	return p->test_cut &&
	       p->test_cut(p->test_cut_ctx, restore, (uint32_t)step);
}

static void slot_record(struct kv_pool *p, const struct kv_spill_io *v)
{
	struct kv_spill_slot *r = &p->spill.slots[v->slot];

	r->stream = v->stream;
	r->owner_seq = v->owner;
	r->page_index = v->page_index;
	r->key = v->key;
	r->checksum = v->checksum;
	r->length = v->length;
	r->write_ns = st_now_ns();
	atomic_store_explicit(&r->state, KV_SLOT_USED, memory_order_release);
}

/* Why a restored page may not be used, or NULL when it may. */
static const char *slot_check(const struct kv_pool *p,
			      const struct kv_spill_io *v)
{
	const struct kv_spill_slot *r = &p->spill.slots[v->slot];

	if (v->status < 0)
		return v->status == -ST_E_CHECKSUM ? "the file is too short" :
						     st_strerror(v->status);
	if (atomic_load(&r->state) != KV_SLOT_USED)
		return "the slot is not in use";
	if (r->owner_seq != v->owner || r->stream != v->stream ||
	    r->page_index != v->page_index)
		return "the slot belongs to another page";
	if (r->key != v->key)
		return "the slot's prefix key differs";
	if (r->length != v->length)
		return "the slot's length differs";
	if (r->checksum != v->checksum)
		return "checksum mismatch";
	return NULL;
}

/* ---- making room -------------------------------------------------------- */

struct cand {
	uint64_t last_use;
	uint32_t idx;
	uint32_t n;      /* spillable pages */
};

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;

	if (x->last_use != y->last_use)
		return x->last_use < y->last_use ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* A page of a sequence that may be spilled: resident and only this
 * sequence's (a published one loses its key first). */
static int page_spillable(const struct kv_pool *p, uint32_t ent)
{
	return ent < p->lay.n_pages &&
	       atomic_load(&p->pages[ent].refcount) == 1;
}

static int seq_candidate(const struct kv_pool *p, uint32_t i, uint32_t stamp)
{
	const struct kv_seq_entry *e = &p->seqs[i];

	return atomic_load(&e->state) == KV_SEQ_LIVE &&
	       !(atomic_load(&e->flags) &
		 (KV_SEQ_F_PINNED | KV_SEQ_F_FAILED)) &&
	       !(stamp && p->mark[2 * i] == stamp);
}

/* Spills up to k idle cached groups while slots are free without taking
 * any from elsewhere. */
static void spill_idle_groups(struct kv_pool *p, uint32_t k)
{
	const uint32_t ns = p->lay.n_streams;
	struct kv_spill_io *v;
	uint32_t *gs, *slots, ng = 0;
	uint64_t t0 = st_now_ns();

	k = (uint32_t)ST_MIN((uint64_t)k, p->spill.n_free_slots / ns);
	if (k == 0)
		return;
	v = malloc(sizeof(*v) * k * ns);
	gs = malloc(sizeof(uint32_t) * k);
	slots = malloc(sizeof(uint32_t) * k * ns);
	if (!v || !gs || !slots)
		goto out;
	for (; ng < k; ng++) {
		uint32_t pages[KV_MAX_STREAMS];
		uint32_t g = kv_cache_take_idle_lru(p, pages);

		if (g == UINT32_MAX)
			break;
		gs[ng] = g;
		for (uint32_t s = 0; s < ns; s++)
			v[ng * ns + s] = (struct kv_spill_io){
				.page = pages[s], .length = stream_length(p, s),
				.owner = 0, .stream = s, .page_index = 0,
				.key = p->cache.key[g] };
	}
	if (ng == 0 || slots_take(p, ng * ns, slots) < 0)
		goto undo;
	for (uint32_t i = 0; i < ng * ns; i++)
		v[i].slot = slots[i];
	if (spill_move(p, v, ng * ns, 1) < 0) {
		slots_untake(p, ng * ns, slots);
		goto undo;
	}
	/* v is sorted by slot now: record, then hand each group its slots */
	for (uint32_t i = 0; i < ng * ns; i++)
		slot_record(p, &v[i]);
	for (uint32_t a = 0; a < ng; a++) {
		uint32_t gslots[KV_MAX_STREAMS];

		for (uint32_t i = 0; i < ng * ns; i++)
			if (v[i].key == p->cache.key[gs[a]])
				gslots[v[i].stream] = v[i].slot;
		kv_cache_spilled(p, gs[a], gslots);
	}
	p->stats.spill_pages_total += (uint64_t)ng * ns;
	p->stats.spill_bytes_total += (uint64_t)ng * ns * p->lay.slot_bytes;
	p->stats.spill_ns_total += st_now_ns() - t0;
	goto out;
undo:
	for (uint32_t a = 0; a < ng; a++)
		kv_cache_unbusy(p, gs[a]);
out:
	free(v);
	free(gs);
	free(slots);
}

static int make_room_once(struct kv_pool *p, uint64_t need, uint32_t stamp,
			  const char *what, struct st_diag *diag)
{
	const uint32_t ns = p->lay.n_streams;
	uint64_t free_now, idle, short_, spillable = 0, usable, count = 0;
	uint64_t hidden, t0 = st_now_ns();
	struct cand *cand = NULL;
	struct kv_spill_io *v = NULL;
	uint32_t *slots = NULL, n_cand = 0;
	int r = 0;

	/* free pages past the memory target's limit (kv_budget.c) are not
	 * free: they count as wanted too (need 0 just shrinks the pool) */
	pthread_mutex_lock(&p->lock);
	hidden = p->lay.n_pages - kv_pool_limit_locked(p);
	free_now = p->n_free;
	idle = p->cache.idle_pages;
	pthread_mutex_unlock(&p->lock);
	if (free_now >= need + hidden)
		return 0;
	short_ = need + hidden - free_now;
	free_now = free_now > hidden ? free_now - hidden : 0;
	if (short_ <= idle) {
		/* idle cached groups cover it: spill them while the file
		 * has room, the allocation drops the rest */
		if (p->spill.fd >= 0)
			spill_idle_groups(p, (uint32_t)((short_ + ns - 1) /
							ns));
		return 0;
	}
	short_ -= idle; /* every idle group goes; pages of sequences too */
	if (p->spill.fd < 0)
		return kv_budget_error(p, need, free_now + idle, what, diag);
	cand = malloc(sizeof(*cand) * p->lay.max_seqs);
	if (!cand)
		return -ENOMEM;
	for (uint32_t i = 0; i < p->lay.max_seqs; i++) {
		uint32_t n = 0, np;

		if (!seq_candidate(p, i, stamp))
			continue;
		np = kv_pages_for_rows(atomic_load(&p->seqs[i].n_rows),
				       p->lay.page_rows);
		for (uint32_t s = 0; s < ns; s++)
			for (uint32_t pi = 0; pi < np; pi++)
				n += page_spillable(p, kv_table_get(p, i, s,
								    pi));
		if (n) {
			cand[n_cand++] = (struct cand){
				atomic_load(&p->seqs[i].last_use_ns), i, n };
			spillable += n;
		}
	}
	usable = p->spill.n_free_slots +
		 p->cache.spilled_groups * (uint64_t)ns;
	if (ST_MIN(spillable, usable) < short_) {
		r = kv_budget_error(p, need,
				    free_now + idle + ST_MIN(spillable, usable),
				    what, diag);
		goto out;
	}
	/* the least recently used sequences' pages, short_ of them */
	qsort(cand, n_cand, sizeof(*cand), cand_cmp);
	v = malloc(sizeof(*v) * short_);
	slots = malloc(sizeof(uint32_t) * short_);
	if (!v || !slots) {
		r = -ENOMEM;
		goto out;
	}
	/* pages that are not published first: a published page that goes
	 * to the file leaves the prefix cache */
	for (int keyed = 0; keyed <= 1; keyed++)
		for (uint32_t c = 0; c < n_cand && count < short_; c++) {
			uint32_t i = cand[c].idx;
			uint32_t handle = kv_seq_handle(
				i, atomic_load(&p->seqs[i].generation));
			uint32_t np = kv_pages_for_rows(
				atomic_load(&p->seqs[i].n_rows),
				p->lay.page_rows);

			for (uint32_t pi = 0; pi < np && count < short_; pi++)
				for (uint32_t s = 0; s < ns && count < short_;
				     s++) {
					uint32_t ent = kv_table_get(p, i, s, pi);

					if (!page_spillable(p, ent) ||
					    (atomic_load(&p->pages[ent].key) !=
					     0) != keyed)
						continue;
					v[count++] = (struct kv_spill_io){
						.page = ent,
						.length = stream_length(p, s),
						.owner = handle, .stream = s,
						.page_index = pi, .idx = i };
				}
		}
	while (p->spill.n_free_slots < count && kv_cache_drop_spilled_lru(p))
		;
	if (slots_take(p, (uint32_t)count, slots) < 0) {
		r = kv_budget_error(p, need, free_now + idle, what, diag);
		goto out;
	}
	for (uint64_t i = 0; i < count; i++) {
		v[i].slot = slots[i];
		/* a published page stops being findable: its bytes leave */
		if (p->cache.page_group[v[i].page] != UINT32_MAX)
			kv_cache_forget_page(p, v[i].page);
	}
	r = spill_move(p, v, (uint32_t)count, 1);
	if (r < 0) {
		slots_untake(p, (uint32_t)count, slots);
		r = st_diag_set(diag, r, "spill file %s: write failed: %s; "
				"nothing was spilled", p->spill.path,
				st_strerror(r));
		goto out;
	}
	for (uint64_t i = 0; i < count; i++) {
		if (spill_cut(p, 0, 3 * i))
			goto cut;
		slot_record(p, &v[i]);
		if (spill_cut(p, 0, 3 * i + 1))
			goto cut;
		kv_table_set(p, v[i].idx, v[i].stream, v[i].page_index,
			     KV_PAGE_SPILLED | v[i].slot);
		__atomic_add_fetch(&p->seqs[v[i].idx].n_spilled, 1,
				   __ATOMIC_RELEASE);
		if (spill_cut(p, 0, 3 * i + 2))
			goto cut;
		kv_page_unref(p, v[i].page);
	}
	p->stats.spill_pages_total += count;
	p->stats.spill_bytes_total += count * p->lay.slot_bytes;
	p->stats.spill_ns_total += st_now_ns() - t0;
	goto out;
cut:
	r = -ECANCELED;
out:
	free(cand);
	free(v);
	free(slots);
	return r;
}

int kv_pool_make_room(struct kv_pool *p, uint64_t need, uint32_t stamp,
		      const char *what, struct st_diag *diag)
{
	int r = make_room_once(p, need, stamp, what, diag);

	/* the groups held for queued requests (kv_cache_ahead.c) never cost
	 * a request its room: they go, then the room is looked for again */
	if (r == -ST_E_BUDGET && p->pfx.held_pages &&
	    kv_pfx_ahead_release_all(p)) {
		st_debug("%s: queued requests' prefixes released for room",
			 what);
		r = make_room_once(p, need, stamp, what, diag);
	}
	return r;
}

/* ---- restoring ---------------------------------------------------------- */

int kv_seq_restore_idx(struct kv_pool *p, uint32_t idx, uint32_t stamp,
		       struct st_diag *diag)
{
	return kv_seq_restore_some(p, idx, stamp, UINT32_MAX, diag);
}

int kv_seq_restore_some(struct kv_pool *p, uint32_t idx, uint32_t stamp,
			uint32_t max_pages, struct st_diag *diag)
{
	struct kv_seq_entry *e = &p->seqs[idx];
	uint32_t n = ST_MIN(e->n_spilled, max_pages), k = 0, handle, np;
	struct kv_spill_io *v;
	uint64_t t0;
	int r = 0;

	if (n == 0)
		return 0;
	handle = kv_seq_handle(idx, atomic_load(&e->generation));
	if (n > kv_pool_free_pages(p)) {
		char what[64];

		snprintf(what, sizeof(what), "restoring sequence 0x%x", handle);
		r = kv_pool_make_room(p, n, stamp, what, diag);
		if (r < 0)
			return r;
	}
	v = malloc(sizeof(*v) * n);
	if (!v)
		return -ENOMEM;
	t0 = st_now_ns();
	np = kv_pages_for_rows(atomic_load(&e->n_rows), p->lay.page_rows);
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = 0; pi < np && k < n; pi++) {
			uint32_t ent = kv_table_get(p, idx, s, pi), page;

			if (!kv_entry_is_spilled(ent))
				continue;
			r = kv_page_alloc(p, s, &page);
			if (r < 0)
				goto nomem;
			v[k++] = (struct kv_spill_io){
				.slot = kv_entry_slot(ent), .page = page,
				.length = stream_length(p, s), .owner = handle,
				.stream = s, .page_index = pi, .idx = idx };
		}
	for (uint32_t i = 0; i < k; i++)
		if (v[i].slot >= p->lay.n_slots)
			v[i].status = -ST_E_CHECKSUM;
	/* slots out of range were never read: move only the others */
	{
		uint32_t m = 0;

		for (uint32_t i = 0; i < k; i++)
			if (v[i].status == 0) {
				struct kv_spill_io t = v[m];

				v[m++] = v[i];
				v[i] = t;
			}
		spill_move(p, v, m, 0);
	}
	r = 0;
	for (uint32_t i = 0; i < k; i++) {
		const char *why = slot_check(p, &v[i]);

		if (spill_cut(p, 1, 3 * (uint64_t)i))
			goto cut;
		if (!why) {
			kv_table_set(p, idx, v[i].stream, v[i].page_index,
				     v[i].page);
			p->stats.restore_pages_total++;
			p->stats.restore_bytes_total += p->lay.slot_bytes;
		} else {
			kv_page_unref(p, v[i].page);
			kv_table_set(p, idx, v[i].stream, v[i].page_index,
				     KV_PAGE_LOST);
			atomic_fetch_or(&e->flags, KV_SEQ_F_FAILED);
			p->stats.restore_failures++;
			if (r == 0)
				r = st_diag_set(diag, -ST_E_CHECKSUM,
						"sequence 0x%x: spilled page "
						"%u of stream %u (slot %u of "
						"%s) cannot be restored: %s; "
						"the sequence failed (free it)",
						handle, v[i].page_index,
						v[i].stream, v[i].slot,
						p->spill.path, why);
		}
		if (spill_cut(p, 1, 3 * (uint64_t)i + 1))
			goto cut;
		kv_spill_slot_free(p, v[i].slot);
		if (spill_cut(p, 1, 3 * (uint64_t)i + 2))
			goto cut;
		__atomic_store_n(&e->n_spilled, e->n_spilled - 1,
				 __ATOMIC_RELEASE);
	}
	p->stats.restore_ns_total += st_now_ns() - t0;
	free(v);
	return r;
cut:
	free(v);
	return -ECANCELED;
nomem:
	for (uint32_t i = 0; i < k; i++)
		kv_page_unref(p, v[i].page);
	free(v);
	return kv_budget_error(p, n, kv_pool_avail_pages(p),
			       "restoring a sequence", diag);
}

int kv_cache_restore_group(struct kv_pool *p, uint32_t g, uint32_t stamp,
			   uint32_t *ret_pages, struct st_diag *diag)
{
	const uint32_t ns = p->lay.n_streams;
	struct kv_spill_io v[KV_MAX_STREAMS];
	uint64_t t0 = st_now_ns();
	uint32_t k = 0;
	int r, bad = 0;

	if (ns > kv_pool_free_pages(p)) {
		r = kv_pool_make_room(p, ns, stamp, "restoring a cached prefix",
				      diag);
		if (r < 0)
			goto drop;
	}
	for (; k < ns; k++) {
		uint32_t ent = p->cache.ent[(size_t)g * ns + k], page;

		r = kv_page_alloc(p, k, &page);
		if (r < 0)
			goto drop;
		v[k] = (struct kv_spill_io){
			.slot = kv_entry_slot(ent), .page = page,
			.length = stream_length(p, k), .owner = 0, .stream = k,
			.page_index = 0, .key = p->cache.key[g] };
		if (!kv_entry_is_spilled(ent) || v[k].slot >= p->lay.n_slots) {
			k++;
			r = -ST_E_CHECKSUM;
			goto drop;
		}
	}
	spill_move(p, v, ns, 0);
	for (uint32_t i = 0; i < ns; i++)
		if (slot_check(p, &v[i])) {
			bad++;
			p->stats.restore_failures++;
		}
	p->stats.restore_ns_total += st_now_ns() - t0;
	if (bad) {
		r = st_diag_set(diag, -ST_E_CHECKSUM, "a spilled prefix-cache "
				"page failed its checks; dropped from the "
				"cache");
		goto drop;
	}
	for (uint32_t i = 0; i < ns; i++)
		ret_pages[v[i].stream] = v[i].page;
	kv_cache_restored(p, g, ret_pages);
	p->stats.restore_pages_total += ns;
	p->stats.restore_bytes_total += (uint64_t)ns * p->lay.slot_bytes;
	return 0;
drop:
	for (uint32_t i = 0; i < k; i++)
		kv_page_unref(p, v[i].page);
	kv_cache_drop_busy(p, g);
	return r;
}

int kv_seq_residency(struct kv_pool *p, uint32_t client, uint32_t op,
		     uint32_t n, const uint32_t *seqs, int32_t *status,
		     struct st_diag *diag)
{
	uint32_t stamp = kv_mark_begin(p);
	uint64_t need = 0;
	int first = 0;

	for (uint32_t i = 0; i < n; i++) {
		/* an unpin is allowed on a failed sequence (it is being
		 * given up) */
		int idx = kv_seq_check_owned(p, seqs[i], client,
					     op != KV_RESIDENCY_UNPIN,
					     first ? NULL : diag);
		int r = idx < 0 ? idx : 0;

		status[i] = r;
		if (r < 0) {
			first = first ? first : r;
			continue;
		}
		if (p->mark[2 * idx] != stamp) {
			p->mark[2 * idx] = stamp;
			need += p->seqs[idx].n_spilled;
		}
	}
	if (op == KV_RESIDENCY_UNPIN) {
		/* a count, not a flag: a sequence pinned twice (two steps
		 * of one client in flight) stays pinned until both unpin */
		for (uint32_t i = 0; i < n; i++) {
			struct kv_seq_entry *e;

			if (status[i] < 0)
				continue;
			e = &p->seqs[kv_seq_index(seqs[i])];
			if (atomic_load(&e->pins) > 0 &&
			    atomic_fetch_sub(&e->pins, 1) == 1)
				atomic_fetch_and(&e->flags, ~KV_SEQ_F_PINNED);
		}
		return first;
	}
	if (need > kv_pool_free_pages(p)) {
		struct st_diag d;
		/* a pin is a step's: over the memory target rather than
		 * fail (kv_budget.c) */
		int r = op == KV_RESIDENCY_PIN ?
				kv_pool_make_room_pinned(
					p, need, stamp,
					"pinning these sequences", &d) :
				kv_pool_make_room(p, need, stamp,
						  "restoring these sequences",
						  &d);

		if (r < 0) {
			for (uint32_t i = 0; i < n; i++)
				if (status[i] == 0)
					status[i] = r;
			if (diag)
				*diag = d;
			return r;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t idx;
		int r;

		if (status[i] < 0)
			continue;
		idx = kv_seq_index(seqs[i]);
		kv_seq_touch(p, idx);
		r = kv_seq_restore_idx(p, idx, stamp, first ? NULL : diag);
		if (r == 0 && op == KV_RESIDENCY_PIN) {
			atomic_fetch_add(&p->seqs[idx].pins, 1);
			atomic_fetch_or(&p->seqs[idx].flags, KV_SEQ_F_PINNED);
		}
		status[i] = r;
		if (r < 0 && !first)
			first = r;
	}
	return first;
}

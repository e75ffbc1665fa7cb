/*
 * kv_daemon.h — kvd's internals: the page pool logic (kv_pool.c), the
 * registry of clients (kv_clients.c) and the request server (kv_server.c).
 * kv_main.c parses options and runs the loop.
 *
 * The pool logic works on any memory laid out by kv_layout_compute (the
 * shared segment in kvd, a plain buffer in unit tests).  kvd is the only
 * writer of the pool's metadata and page tables (single-threaded loop); the
 * page reference functions are also safe under threads.
 */
#ifndef KV_DAEMON_H
#define KV_DAEMON_H

#include <pthread.h>
#include <stdint.h>

#include "kv_pool.h"
#include "kv_proto.h"
#include "st_error.h"
#include "st_msg.h"
#include "st_shm.h"

/* ---- the page pool (kv_pool.c) ----------------------------------------- */

struct kv_pool {
	uint8_t *base;                   /* mapping (borrowed) */
	size_t size;
	struct kv_layout lay;            /* validated private copy */
	struct kv_stream_decl streams[KV_MAX_STREAMS];
	struct kv_pool_info *info;
	struct kv_page_meta *pages;
	struct kv_seq_entry *seqs;
	uint32_t *table;
	uint8_t *data;

	pthread_mutex_t lock;            /* guards the free page list */
	uint32_t *free_pages;            /* stack of free page ids */
	uint64_t n_free;
	uint32_t *free_seqs;             /* stack of free sequence indices */
	uint32_t n_free_seqs;
	uint32_t *mark;                  /* per-seq scratch for batches */
	uint32_t mark_stamp;
};

/* What kv_pool_adopt found and repaired. */
struct kv_adopt_report {
	uint32_t seqs_kept;
	uint32_t seqs_dropped;   /* half-built or invalid entries */
	uint32_t seqs_truncated; /* missing pages: rows cut back */
	uint64_t entries_dropped;/* table entries past a sequence's rows */
	uint64_t refcounts_fixed;/* pages whose count disagreed with tables */
};

/*
 * Initialises a new pool in `base` (size bytes, zero-filled or not):
 * writes the layout, the declaration, empty metadata and tables (every
 * entry KV_PAGE_NONE), and builds the free lists.  Private memory of p is
 * owned by p (kv_pool_fini).  0, -ENOMEM, -EINVAL (size too small).
 */
int kv_pool_format(struct kv_pool *p, void *base, size_t size,
		   const struct kv_layout *lay,
		   const struct kv_stream_decl *streams);

/*
 * Takes over a pool left by a killed kvd (PITFALLS P17) whose layout was
 * validated (kv_layout_read): keeps every LIVE sequence whose entry and
 * page table are consistent, drops half-built ones (KV_SEQ_BUILDING) and
 * invalid ones, cuts back sequences whose table misses pages, drops table
 * entries past a sequence's rows, recomputes every page's reference count
 * from the tables (they are the truth) and rebuilds the free lists and
 * counters.  0 or -ENOMEM.
 */
int kv_pool_adopt(struct kv_pool *p, void *base, size_t size,
		  const struct kv_layout *lay,
		  const struct kv_stream_decl *streams,
		  struct kv_adopt_report *ret);

/* Frees p's private memory (not the mapping).  Safe on a zeroed struct. */
void kv_pool_fini(struct kv_pool *p);

/*
 * Pages.  kv_page_alloc takes a free page for `stream`: refcount 1, state
 * USED, generation bumped, key cleared; -ST_E_BUDGET when none is free.
 * kv_page_ref adds a reference to a used page and returns the new count;
 * -ST_E_STALE if the page is free (never resurrects one).  kv_page_unref
 * drops one and returns the new count, putting the page back on the free
 * list at 0; -ST_E_STALE when it is already 0 (the count never goes to
 * -1).  Both -EINVAL for an id out of range.  Thread-safe.
 */
int kv_page_alloc(struct kv_pool *p, uint32_t stream, uint32_t *ret_page);
int kv_page_ref(struct kv_pool *p, uint32_t page);
int kv_page_unref(struct kv_pool *p, uint32_t page);
/* Free pages now. */
uint64_t kv_pool_free_pages(struct kv_pool *p);
/* First byte of a page (no check; page < n_pages). */
uint8_t *kv_page_data(const struct kv_pool *p, uint32_t page);

/*
 * Sequences (single writer).  `client` is the caller's client id and `pid`
 * its pid (recorded so that a restarted kvd can still release a dead
 * client's sequences).  `request_id` is recorded in the new sequence; with
 * `dedupe` set, a LIVE sequence of the same client made by the same
 * request id is returned again instead of a new one (a request re-sent to
 * a restarted kvd; the scan costs O(max_seqs), so kvd asks for it only for
 * clients it adopted from a killed kvd's pool).
 *
 * kv_seq_create: an empty sequence.  -ST_E_LIMIT when max_seqs are live.
 *
 * kv_seq_reserve: makes each seqs[i] hold at least n_rows[i] rows in every
 * stream; all or nothing (on any error no page of this call stays
 * allocated and no sequence changes).  -ST_E_NOTFOUND (stale or unknown
 * handle), -EPERM (another client's sequence), -ST_E_LIMIT (over
 * max_rows_per_seq), -ST_E_BUDGET (not enough free pages: diag names the
 * budget and how far to raise it).  Duplicated sequences in a batch take
 * the largest n_rows.
 *
 * kv_seq_fork: a new sequence with the first n_rows rows of src (any
 * client's): full pages shared (refcount + 1), the partial last page copied
 * (its first kv_last_page_rows rows).  -ST_E_NOTFOUND, -ST_E_LIMIT (n_rows
 * more than src holds, or max_seqs live), -ST_E_BUDGET (no free page for the
 * copies).
 *
 * kv_seq_free: drops a sequence's references.  -ST_E_NOTFOUND, -EPERM.
 * kv_seq_free_client: frees every sequence of a client; returns how many.
 */
int kv_seq_create(struct kv_pool *p, uint32_t client, int32_t pid,
		  uint64_t request_id, int dedupe, uint32_t *ret_seq,
		  struct st_diag *diag);
int kv_seq_reserve(struct kv_pool *p, uint32_t client, uint32_t n,
		   const struct kv_reserve_entry *e, struct st_diag *diag);
int kv_seq_fork(struct kv_pool *p, uint32_t client, int32_t pid,
		uint64_t request_id, int dedupe, uint32_t src, uint32_t n_rows,
		uint32_t *ret_seq, struct st_diag *diag);
int kv_seq_free(struct kv_pool *p, uint32_t client, uint32_t seq,
		struct st_diag *diag);
int kv_seq_free_client(struct kv_pool *p, uint32_t client);

/* Index of a valid LIVE handle, or -ST_E_NOTFOUND. */
int kv_seq_lookup(const struct kv_pool *p, uint32_t seq);
/* Page id of (seq index, stream, page index), KV_PAGE_NONE if none. */
uint32_t kv_seq_page(const struct kv_pool *p, uint32_t idx, uint32_t stream,
		     uint32_t page_index);

/* ---- clients (kv_clients.c) -------------------------------------------- */

struct kv_client_entry {
	uint32_t id;
	int32_t pid;
	int pidfd;                       /* -1 when pidfd_open is unavailable */
	char name[KV_PROTO_NAME_BYTES + 1];
	/* the last reply, re-sent for a repeated request (idempotence) */
	uint64_t last_request_id;
	uint16_t last_type;
	uint8_t *last_reply;
	size_t last_reply_len;
	int adopted;                     /* rebuilt from a killed kvd's pool */
};

struct kv_clients {
	struct kv_client_entry *v;
	uint32_t n, cap;
	uint32_t next_id;
};

#define KV_MAX_CLIENTS 1024

/* Empty registry; ids start at a random value so that a client of an
 * earlier kvd is not mistaken for a new one. */
void kv_clients_init(struct kv_clients *cl);
/* Closes pidfds and frees everything. */
void kv_clients_fini(struct kv_clients *cl);

/*
 * Registers a client (pid, name).  resume_id != 0 asks for that id again
 * (a client re-registering after a kvd restart): granted when it is free
 * or already belongs to the same pid.  *ret_id is the id.  0, -ST_E_LIMIT
 * (KV_MAX_CLIENTS registered), -ENOMEM.
 */
int kv_clients_add(struct kv_clients *cl, int32_t pid, const char *name,
		   uint32_t resume_id, uint32_t *ret_id);
struct kv_client_entry *kv_clients_find(struct kv_clients *cl, uint32_t id);
void kv_clients_remove(struct kv_clients *cl, uint32_t id);
/* Ids are never handed out below this one again (kept in the pool). */
void kv_clients_bump_next(struct kv_clients *cl, uint32_t next_id);
/* True when the client's process has exited (pidfd or /proc). */
int kv_clients_dead(const struct kv_client_entry *e);
/* Keeps a copy of the reply to (request_id, type) of client e. */
void kv_clients_cache_reply(struct kv_client_entry *e, uint64_t request_id,
			    uint16_t type, const void *reply, size_t len);

/* ---- server (kv_server.c) ---------------------------------------------- */

struct kv_config {
	char instance[64];
	char run_dir[4096];
	uint64_t budget_bytes;
	uint32_t max_seqs;
	uint32_t max_rows_per_seq;
};

struct kv_server {
	struct kv_config cfg;
	struct st_sock rep, pub;
	char ctl_path[4200], evt_path[4200];
	struct st_shm shm;
	int have_pool;
	struct kv_pool pool;
	uint64_t layout_hash;
	struct kv_clients clients;
	uint64_t last_reap_ns;
	int stop;                       /* SHUTDOWN received */
};

/*
 * Starts kvd: adopts the pool segment of a killed kvd if one is there
 * (refusing to start, -EBUSY, when its owner lives), binds the sockets.
 * 0 or negative with diag.
 */
int kv_server_start(struct kv_server *s, const struct kv_config *cfg,
		    struct st_diag *diag);

/* Serves at most one request (waiting up to 100 ms for it), then, every
 * ~100 ms, releases the sequences of clients that died.  Returns 1 once a
 * SHUTDOWN was served, else 0. */
int kv_server_poll(struct kv_server *s);

/* Clean stop: event, sockets and their files, the segment. */
void kv_server_stop(struct kv_server *s);

#endif

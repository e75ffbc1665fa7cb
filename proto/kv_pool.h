/*
 * kv_pool.h — the layout of kvd's page pool segment /strata.<instance>.kv
 * (DESIGN.md sections 3 and 3a).  Shared by kvd (the only writer) and every
 * client (readers of page tables and writers of row bytes).
 *
 * The segment, offsets from its start (no pointers anywhere in it):
 *
 *   0                  struct st_shm_header (256 B, st_shm.h)
 *   256                struct kv_pool_info: the geometry (struct kv_layout,
 *                      hashed into the header's layout_hash) and counters
 *   streams_off = 512  struct kv_stream_decl[n_streams]: the declaration
 *   pages_off          struct kv_page_meta[n_pages]
 *   seqs_off           struct kv_seq_entry[max_seqs]
 *   table_off          uint32_t[max_seqs][n_streams][max_pages_per_seq]:
 *                      page table entries (below)
 *   slots_off          struct kv_spill_slot[n_slots]: what each slot of the
 *                      spill file holds (none when spilling is off)
 *   data_off           n_pages pages of page_bytes (2 MiB aligned)
 *
 * A page table entry is a page id (< n_pages), KV_PAGE_NONE (no page),
 * KV_PAGE_SPILLED | slot (the page's bytes are in slot `slot` of the spill
 * file, see kv_spill_slot) or KV_PAGE_LOST (the bytes were lost: a spilled
 * page failed its checks; the sequence is KV_SEQ_F_FAILED).
 *
 * Page size: every page is `page_bytes` = the largest kv_stream_page_capacity
 * x row_bytes of the declaration (page_rows x row_bytes for a stream of one
 * row per token), rounded up to 64 bytes, whatever stream it belongs to.
 * One page size keeps a single free list and lets any page serve any stream;
 * a stream with smaller rows leaves the tail of its pages unused.  Per-stream
 * page sizes (with one free list each) come with FP8/FP4 streams, when the
 * waste becomes worth a second allocator.  The byte budget counts page data
 * only: n_pages = budget_bytes / page_bytes (metadata and page tables come on
 * top and are reported in pool_bytes).
 *
 * Row r of stream s of a sequence lives in page table[seq][s][r / page_rows]
 * at byte (r % page_rows) * row_bytes[s] of that page for a stream of one
 * row per token (kv_stream_row_page / kv_stream_row_slot in general; a
 * sequence's n_rows counts tokens, its pages per stream are the same
 * ceil(n_rows / page_rows) for every stream) (PITFALLS P11: n rows
 * use ceil(n / page_rows) pages and the last holds ((n - 1) % page_rows) + 1
 * rows; 0 rows use no page).
 *
 * Sequence handles are (index, generation): handle = generation << 20 |
 * index, generation 1..4095 bumped each time an index is reused, so a stale
 * handle is detected and 0 is never a valid handle.
 *
 * Prefix cache: a full page of every stream covering the same rows of a
 * sequence forms a group, keyed by kv_prefix_key (kv_proto.h) of the token
 * ids those rows were computed from.  Every page of a published group holds
 * the group's key in kv_page_meta.key; a key is held by at most one group.
 * A keyed page is read-only (shared) even when one sequence uses it.  When
 * no sequence uses a group any more its pages stay (state KV_PAGE_CACHED,
 * refcount 0) until evicted (LRU) or spilled.  The index itself (key ->
 * group) is kvd's private memory, rebuilt from the keys on adoption.
 *
 * Spill: with a spill budget, pages of idle sequences (not pinned, oldest
 * use first) and unreferenced cached groups are written to the spill file
 * (slot i at byte i * slot_bytes, slot_bytes = page_bytes rounded up to
 * 4 KiB) and their table entries (or cache groups) name the slot.  A slot
 * record carries owner, stream, page index, key, length and XXH3-64 of the
 * bytes, checked before a restored page is used.
 *
 * Concurrency: kvd is the only writer of metadata and tables; clients read
 * them with atomic loads (kv_client_row) and write row bytes into pages of
 * their own sequences that they do not share (refcount 1, key 0).
 */
#ifndef KV_POOL_H
#define KV_POOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "st_shm.h"

#define KV_POOL_KIND "kv"
#define KV_POOL_LAYOUT_VERSION 3 /* 3: pool_id, owner start time */

#ifndef KV_MAX_STREAMS
#define KV_MAX_STREAMS 256
#endif
#define KV_MAX_PAGE_ROWS 65536u
#define KV_MAX_ROW_BYTES (1u << 20)          /* 1 MiB per row */
#define KV_MAX_PAGE_BYTES (64ull << 20)      /* 64 MiB per page */
#define KV_MAX_PAGES 0x7ffffff0u             /* below KV_PAGE_SPILLED */
#define KV_MAX_SLOTS 0x7ffffff0u             /* below KV_PAGE_LOST's slot */
#define KV_PAGE_ALIGN 64u                    /* page and table alignment */
#define KV_SLOT_ALIGN 4096u                  /* spill slots (O_DIRECT) */
#define KV_PAGE_NONE UINT32_MAX
#define KV_PAGE_LOST (UINT32_MAX - 1)
#define KV_PAGE_SPILLED 0x80000000u          /* | slot */

#define KV_SEQ_INDEX_BITS 20
#define KV_SEQ_INDEX_MASK ((1u << KV_SEQ_INDEX_BITS) - 1)
#define KV_SEQ_GEN_MAX 4095u
#define KV_MAX_SEQS KV_SEQ_INDEX_MASK        /* 1048575 */
#define KV_MAX_ROWS_PER_SEQ (1u << 30)
/* kvd --max-rows-per-seq when none is given (strata up/run give the
 * model's context: kv_rows_per_seq_for_context) */
#define KV_DEFAULT_ROWS_PER_SEQ 32768u

#define KV_POOL_INFO_OFF ST_SHM_HEADER_BYTES
#define KV_POOL_STREAMS_OFF (ST_SHM_HEADER_BYTES + 256)

/* Stream flags (kv_stream_decl.flags). */
#define KV_STREAM_STATE 0x1u /* one row per sequence, overwritten (later) */
#define KV_MAX_TOKENS_PER_ROW 65536u

/*
 * One KV stream of the model (DESIGN.md 3a).  16 bytes, identical on the wire
 * (little-endian) and in the segment.
 *
 * tokens_per_row T >= 1: row r of the stream covers tokens [rT, rT + T) and
 * is complete once token rT + T - 1 is written (a compressed row).  Pages
 * are by token for every stream: page p of any stream belongs to tokens
 * [p B, p B + B) (B = page_rows) and holds the rows those tokens complete,
 * rows [floor(pB / T), floor((p+1)B / T)), at most ceil(B / T) of them
 * (none when T > B and no row ends in the page: the page is still
 * allocated).  So a full page of every stream covers the same tokens, a
 * prefix-cache group is still "page p of every stream", and a full page
 * holds only complete rows.  (kv_stream_row_page and friends below.)
 *
 * window_rows W > 0 (with tokens_per_row 1): a sliding window, only the
 * last W rows are needed by the model.  When SEQ_RESERVE grows a sequence
 * from n to more rows, rows before n count as written, and every page of
 * the stream whose rows all lie before n - W (kv_window_dead_pages) is
 * freed, unless it is shared or published (then the other holders and the
 * prefix cache keep it): its table entry becomes KV_PAGE_NONE.  A client
 * that publishes its full pages after each chunk (before the next
 * reservation) keeps its whole chain in the prefix cache.
 * flags: KV_STREAM_STATE is refused with -ST_E_UNSUPPORTED (a model's
 * per-sequence state is declared as a windowed per-token stream instead).
 */
struct kv_stream_decl {
	uint32_t row_bytes;      /* bytes of one row, 1..KV_MAX_ROW_BYTES */
	uint32_t tokens_per_row; /* 1: a row per token; 4, 128: pooled rows */
	uint32_t window_rows;    /* 0: keep all rows; W: only the last W */
	uint32_t flags;          /* KV_STREAM_* */
};

/* Geometry of a pool.  Everything here is derived by kv_layout_compute()
 * from the declaration and kvd's options, so an attacher recomputes it and
 * compares.  No padding: the bytes are hashed. */
struct kv_layout {
	uint32_t n_streams;
	uint32_t page_rows;
	uint32_t max_seqs;
	uint32_t max_pages_per_seq;  /* table width per (seq, stream) */
	uint32_t max_rows_per_seq;   /* as configured (<= pages * page_rows) */
	uint32_t max_row_bytes;
	uint64_t page_bytes;
	uint64_t n_pages;
	uint64_t budget_bytes;
	uint64_t streams_off;
	uint64_t pages_off;
	uint64_t seqs_off;
	uint64_t table_off;
	uint64_t data_off;
	uint64_t total_bytes;        /* segment size, a multiple of 2 MiB */
	uint64_t spill_budget_bytes; /* as configured; 0 = no spilling */
	uint64_t slot_bytes;         /* page_bytes rounded up to 4 KiB */
	uint64_t n_slots;            /* spill_budget_bytes / slot_bytes */
	uint64_t slots_off;
};

_Static_assert(sizeof(struct kv_layout) == 128, "kv_layout has no padding");

/* Counters kept by kvd in the segment (rebuilt on adoption). */
struct kv_pool_counters {
	_Atomic uint64_t pages_used;     /* pages with refcount > 0 */
	_Atomic uint64_t pages_peak;
	_Atomic uint64_t pages_shared;   /* pages with refcount > 1 */
	_Atomic uint64_t n_seqs;         /* LIVE sequences */
	_Atomic uint32_t next_client_id; /* survives a kvd restart */
	uint32_t reserved0;
};

struct kv_pool_info {
	struct kv_layout layout;
	struct kv_pool_counters counters;
	uint8_t pad[256 - sizeof(struct kv_layout) -
		    sizeof(struct kv_pool_counters)];
};

_Static_assert(sizeof(struct kv_pool_info) == 256, "kv_pool_info is 256 B");

enum kv_page_state {
	KV_PAGE_FREE = 0,
	KV_PAGE_USED = 1,    /* referenced by refcount sequences */
	KV_PAGE_CACHED = 2,  /* refcount 0, keyed: kept for the prefix cache */
};

/* Per-page metadata, 32 bytes. */
struct kv_page_meta {
	_Atomic uint32_t refcount;   /* page-table entries naming this page */
	uint32_t stream;             /* stream the page belongs to */
	_Atomic uint32_t generation; /* bumped at every allocation */
	_Atomic uint32_t state;      /* enum kv_page_state */
	_Atomic uint64_t key;        /* key of the page's cached group, 0 = none */
	uint64_t reserved;
};

_Static_assert(sizeof(struct kv_page_meta) == 32, "kv_page_meta is 32 B");

enum kv_seq_state {
	KV_SEQ_FREE = 0,
	KV_SEQ_LIVE = 1,
	KV_SEQ_BUILDING = 2, /* being created/forked; discarded on adoption */
};

/* Sequence flags (kv_seq_entry.flags). */
#define KV_SEQ_F_PINNED 0x1u  /* running (pins > 0): its pages are never
			       * spilled */
#define KV_SEQ_F_FAILED 0x2u  /* a spilled page was lost: only free works */

/* Per-sequence entry, 64 bytes. */
struct kv_seq_entry {
	_Atomic uint32_t state;      /* enum kv_seq_state */
	_Atomic uint32_t generation; /* 1..KV_SEQ_GEN_MAX */
	uint32_t owner_client;       /* client id that created it */
	int32_t owner_pid;           /* pid of that client */
	_Atomic uint32_t n_rows;     /* rows reserved in every stream */
	uint32_t parent;             /* handle forked from, 0 = none */
	uint64_t request_id;         /* request that made it (idempotence) */
	_Atomic uint64_t last_use_ns;/* CLOCK_MONOTONIC of the last request */
	_Atomic uint32_t flags;      /* KV_SEQ_F_* */
	uint32_t n_spilled;          /* table entries that are spilled */
	uint64_t owner_start;        /* start time of owner_pid
				      * (st_pid_start_ticks), 0 unknown */
	_Atomic uint32_t pins;       /* RESIDENCY PINs not yet UNPINned;
				      * KV_SEQ_F_PINNED while > 0 */
	uint8_t pad[4];
};

_Static_assert(sizeof(struct kv_seq_entry) == 64, "kv_seq_entry is 64 B");

enum kv_slot_state {
	KV_SLOT_FREE = 0,
	KV_SLOT_USED = 1,
};

/* What one slot of the spill file holds, 64 bytes.  Written by kvd after
 * the slot's bytes reached the file and before any table names the slot. */
struct kv_spill_slot {
	_Atomic uint32_t state;      /* enum kv_slot_state */
	uint32_t stream;
	uint32_t owner_seq;          /* sequence handle; 0 = a cached group */
	uint32_t page_index;         /* position in the owner's table */
	uint64_t key;                /* prefix-cache key (cached groups) */
	uint64_t checksum;           /* XXH3-64 of the first `length` bytes */
	uint32_t length;             /* page_rows x row_bytes of the stream */
	uint32_t reserved0;
	uint64_t write_ns;           /* when it was written (diagnostics) */
	uint8_t pad[16];
};

_Static_assert(sizeof(struct kv_spill_slot) == 64, "kv_spill_slot is 64 B");

static inline int kv_entry_is_spilled(uint32_t e)
{
	return e != KV_PAGE_NONE && e != KV_PAGE_LOST &&
	       (e & KV_PAGE_SPILLED);
}

static inline uint32_t kv_entry_slot(uint32_t e)
{
	return e & ~KV_PAGE_SPILLED;
}

/* Pages used by n_rows rows: ceil(n_rows / page_rows); 0 rows -> 0 pages. */
static inline uint32_t kv_pages_for_rows(uint32_t n_rows, uint32_t page_rows)
{
	return (uint32_t)(((uint64_t)n_rows + page_rows - 1) / page_rows);
}

/* kvd --max-rows-per-seq that strata up/run give for a model whose
 * context is `context` tokens (config max_position_embeddings): a
 * sequence holds at most one row per token in each stream, so the
 * context, but at most KV_DEFAULT_ROWS_PER_SEQ (a longer context keeps
 * kvd's default: the KV floor under --memory-budget is one such sequence
 * in every stream, which at 1M tokens would be most of a machine);
 * KV_DEFAULT_ROWS_PER_SEQ when the context is unknown (0 or less). */
static inline uint32_t kv_rows_per_seq_for_context(int64_t context)
{
	if (context <= 0 || context > (int64_t)KV_DEFAULT_ROWS_PER_SEQ)
		return KV_DEFAULT_ROWS_PER_SEQ;
	return (uint32_t)context;
}

/* Bytes of page data one sequence of max_rows_per_seq rows holds in every
 * stream: ceil(max_rows_per_seq / page_rows) pages per stream, whatever
 * the budget (max_pages_per_seq is that clamped to the pool).  kvd's KV
 * floor under --memory-budget without --budget, and strata plan's. */
static inline uint64_t kv_layout_seq_bytes(const struct kv_layout *l)
{
	return (uint64_t)kv_pages_for_rows(l->max_rows_per_seq, l->page_rows) *
	       l->n_streams * l->page_bytes;
}

/* Rows held by the last page of n_rows rows: ((n - 1) % page_rows) + 1, so
 * a full last page holds page_rows (not 0); 0 when n_rows is 0 (P11). */
static inline uint32_t kv_last_page_rows(uint32_t n_rows, uint32_t page_rows)
{
	return n_rows ? ((n_rows - 1) % page_rows) + 1 : 0;
}

/* Most rows of stream s in one page of page_rows tokens: ceil(B / T). */
static inline uint32_t kv_stream_page_capacity(const struct kv_stream_decl *s,
					       uint32_t page_rows)
{
	return (page_rows + s->tokens_per_row - 1) / s->tokens_per_row;
}

/* Page index of row `row` of stream s: the page of its last token. */
static inline uint32_t kv_stream_row_page(const struct kv_stream_decl *s,
					  uint32_t page_rows, uint32_t row)
{
	return (uint32_t)((((uint64_t)row + 1) * s->tokens_per_row - 1) /
			  page_rows);
}

/* Place of row `row` of stream s within its page (rows before it in that
 * page). */
static inline uint32_t kv_stream_row_slot(const struct kv_stream_decl *s,
					  uint32_t page_rows, uint32_t row)
{
	uint64_t pg = kv_stream_row_page(s, page_rows, row);

	return row - (uint32_t)(pg * page_rows / s->tokens_per_row);
}

/* Bytes of stream s written in page `page` once the sequence holds n_rows
 * tokens (rows completed by tokens [page B, n_rows) of that page). */
static inline uint64_t kv_stream_page_used(const struct kv_stream_decl *s,
					   uint32_t page_rows, uint32_t page,
					   uint32_t n_rows)
{
	uint64_t t0 = (uint64_t)page * page_rows, t1 = n_rows;

	if (t1 > t0 + page_rows)
		t1 = t0 + page_rows;
	if (t1 <= t0)
		return 0;
	return (t1 / s->tokens_per_row - t0 / s->tokens_per_row) *
	       (uint64_t)s->row_bytes;
}

/* Leading page positions of a windowed stream that a sequence of n_rows
 * written rows no longer needs (rows before n_rows - W): their entries may
 * be KV_PAGE_NONE.  0 for a stream without a window. */
static inline uint32_t kv_window_dead_pages(const struct kv_stream_decl *s,
					    uint32_t page_rows, uint32_t n_rows)
{
	if (!s->window_rows || n_rows <= s->window_rows)
		return 0;
	return (n_rows - s->window_rows) / page_rows;
}

static inline uint32_t kv_seq_handle(uint32_t index, uint32_t generation)
{
	return (generation << KV_SEQ_INDEX_BITS) | index;
}

static inline uint32_t kv_seq_index(uint32_t handle)
{
	return handle & KV_SEQ_INDEX_MASK;
}

static inline uint32_t kv_seq_gen(uint32_t handle)
{
	return handle >> KV_SEQ_INDEX_BITS;
}

/* Index of the page-table entry of (seq index, stream, page index). */
static inline uint64_t kv_table_index(const struct kv_layout *l, uint32_t seq,
				      uint32_t stream, uint32_t page)
{
	return ((uint64_t)seq * l->n_streams + stream) * l->max_pages_per_seq +
	       page;
}

#endif

/*
 * es_proto.h — expertd's messages (type range 0x01xx, st_proto.h) and the
 * helpers that encode and validate their payloads.  Every decoder checks
 * the exact payload length and every field range before anything is used;
 * a failing decoder returns -ST_E_PROTO (or -ST_E_VERSION) with a message in
 * diag that the daemon sends back in its error reply.
 *
 * Payloads (little-endian, fixed width; the common ones extend st_proto.h):
 *
 *   ST_MSG_HELLO    req: u32 pid, u32 es_proto_version, char name[32]
 *                        (NUL-padded; printable ASCII), u64 start_ticks
 *                        (the client's start time, st_pid_start_ticks;
 *                        0 = unknown)
 *                        [, u32 resume_client_id]  (optional: a client
 *                        reconnecting to a restarted expertd asks to keep
 *                        its entry and pins; granted when that id is
 *                        still registered to the same pid, else a new id)
 *                   rep: u32 client_id, u64 epoch, u64 pool_id (st_shm.h),
 *                        u32 pid, u32 pool_layout,
 *                        u64 store_id, u64 layout_hash, u32 n_layers,
 *                        u32 n_experts, u32 n_slots, u32 top_k,
 *                        u64 record_bytes
 *   ST_MSG_BYE      req: -            rep: -
 *   ST_MSG_PING     req: -            rep: u32 pid, u64 epoch, u32 ready
 *   ST_MSG_STATS    req: -            rep: struct es_stats fields (below)
 *   ST_MSG_SHUTDOWN req: -            rep: -  (then expertd exits cleanly)
 *   ES_MSG_ACQUIRE  req: u32 pid, u32 layer, u32 n, u32 expert[n]
 *                        (1 <= n <= n_slots, ids distinct and < n_experts)
 *                   rep: u32 n, then n x { i32 status, u32 slot, u32 gen }
 *                        status ES_ACQ_READY (pinned, READY) or
 *                        ES_ACQ_PENDING (pinned, loading: wait for READY)
 *   ES_MSG_RELEASE  req: same as ACQUIRE;  rep: -  (drops one pin each)
 *   ES_MSG_ROUTE    req: u32 pid, u32 layer, u32 pos, u32 n_tokens, u32 k,
 *                        u32 n_hint, u32 expert[n_tokens * k] (the routing
 *                        of `layer` for tokens pos .. pos+n_tokens-1), then
 *                        n_hint x { u32 layer, u32 expert } (prefetch hint:
 *                        experts the gate look-ahead expects next, nearest
 *                        first)[, u32 hint_pos] (optional: the token
 *                        position, >= pos, the hints are for: a "step-
 *                        named" hint, e.g. the hash-routed layers' experts
 *                        of the next token as soon as it is sampled; see
 *                        es_tiers.c for how expertd keeps and ages them);
 *                        rep: -.  Feeds the activation statistics
 *                        and the prefetcher; n_tokens may be 0 (hint only).
 *
 * Any reply with status < 0 carries an error message instead: a u32 length
 * and that many bytes of text (es_error_encode / es_error_decode).
 *
 * Client ids: (generation << 8) | table index; generation >= 1, so 0 is
 * never a valid id.  An id is valid while the table entry keeps that
 * generation.
 *
 * Events on the PUB socket: a st_proto header with type ES_EVT_* and payload
 * u32 pid, u64 epoch.
 */
#ifndef ES_PROTO_H
#define ES_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "es_pool.h"
#include "st_error.h"
#include "st_proto.h"

/* Version of expertd's message set, exchanged in HELLO. */
#define ES_PROTO_VERSION 2 /* 2: HELLO start_ticks and pool_id */

enum es_msg_type {
	ES_MSG_ACQUIRE = ST_MSG_ES_FIRST + 1, /* 0x0101 */
	ES_MSG_RELEASE = ST_MSG_ES_FIRST + 2, /* 0x0102 */
	ES_MSG_ROUTE = ST_MSG_ES_FIRST + 3,   /* 0x0103 */
	/* events (PUB) */
	ES_EVT_READY = ST_MSG_ES_FIRST + 0x40,    /* serving */
	ES_EVT_EPOCH = ST_MSG_ES_FIRST + 0x41,    /* segment adopted, epoch bumped */
	ES_EVT_SHUTDOWN = ST_MSG_ES_FIRST + 0x42, /* exiting cleanly */
};

/* Per-expert status in an ACQUIRE reply. */
enum es_acq_status { ES_ACQ_READY = 0, ES_ACQ_PENDING = 1 };

#define ES_HELLO_REQ_BYTES (4 + 4 + ES_CLIENT_NAME_BYTES + 8)
#define ES_HELLO_REQ_RESUME_BYTES (ES_HELLO_REQ_BYTES + 4)
#define ES_HELLO_REP_BYTES (4 + 8 + 8 + 4 + 4 + 8 + 8 + 4 * 4 + 8)
#define ES_PING_REP_BYTES (4 + 8 + 4)
#define ES_STATS_REP_BYTES (12 * 8 + 8 + 4 + 4)
#define ES_ERROR_MAX_BYTES 1000

/* Largest n in one ACQUIRE/RELEASE that fits a message (the daemon also
 * bounds it by n_slots). */
#define ES_ACQUIRE_MAX_N ((ST_MSG_MAX_BYTES - ST_PROTO_HEADER_BYTES - 12) / 4)

struct es_hello_req {
	uint32_t pid;
	uint32_t version;
	char name[ES_CLIENT_NAME_BYTES + 1];
	uint64_t start_ticks;        /* 0: unknown */
	uint32_t resume_client_id;   /* 0: none (a new registration) */
};

struct es_hello_rep {
	uint32_t client_id;
	uint64_t epoch;
	uint64_t pool_id;
	uint32_t pid;
	uint32_t pool_layout;
	uint64_t store_id;
	uint64_t layout_hash;
	uint32_t n_layers, n_experts, n_slots, top_k;
	uint64_t record_bytes;
};

struct es_ping_rep {
	uint32_t pid;
	uint64_t epoch;
	uint32_t ready;
};

/* Mirrors struct es_stats of es_client.h field for field. */
struct es_stats_rep {
	uint64_t n_slots, slots_used, record_bytes, pool_bytes, budget_bytes;
	uint64_t hits, misses, evictions, loads, load_bytes, load_ns;
	uint64_t checksum_failures;
	uint64_t epoch;
	int32_t pid;
	uint32_t n_clients;
};

/* ACQUIRE / RELEASE request.  `experts` points into the decoded payload
 * (borrowed) on decode; into the caller's array on encode. */
struct es_acquire_req {
	uint32_t pid;
	uint32_t layer;
	uint32_t n;
	const uint8_t *experts_le; /* decode: n little-endian u32 (borrowed) */
};

struct es_acquire_ent {
	int32_t status;
	uint32_t slot;
	uint32_t gen;
};

/* Limits a receiver checks ACQUIRE/RELEASE against (the pool's geometry). */
struct es_acquire_limits {
	uint32_t n_layers, n_experts, n_slots;
};

/* ROUTE request (routing report + prefetch hint).  Arrays point into the
 * decoded payload (borrowed, little-endian u32) on decode. */
struct es_route_req {
	uint32_t pid, layer, pos, n_tokens, k, n_hint;
	uint32_t has_hint_pos;      /* 1: hint_pos was sent */
	uint32_t hint_pos;          /* token position the hints are for */
	const uint8_t *experts_le;  /* n_tokens * k u32 */
	const uint8_t *hints_le;    /* n_hint x (u32 layer, u32 expert) */
};

/* Most top-k and hint entries one ROUTE may carry. */
#define ES_ROUTE_MAX_K 64
#define ES_ROUTE_MAX_HINT 8192

/* --- encoders: append the payload to w (errors sticky in w->err) --- */
/* start_ticks: the client's st_pid_start_ticks, 0 when unknown. */
void es_hello_req_encode(struct st_wbuf *w, uint32_t pid, uint32_t version,
			 const char *name, uint64_t start_ticks);
void es_hello_rep_encode(struct st_wbuf *w, const struct es_hello_rep *r);
void es_ping_rep_encode(struct st_wbuf *w, const struct es_ping_rep *r);
/* HELLO of a client reconnecting after an expertd restart: asks to keep
 * client id resume_id (non-zero) and its pins. */
void es_hello_req_encode_resume(struct st_wbuf *w, uint32_t pid,
				uint32_t version, const char *name,
				uint64_t start_ticks, uint32_t resume_id);
void es_stats_rep_encode(struct st_wbuf *w, const struct es_stats_rep *r);
void es_acquire_req_encode(struct st_wbuf *w, uint32_t pid, uint32_t layer,
			   uint32_t n, const int *experts);
void es_acquire_rep_encode(struct st_wbuf *w, uint32_t n,
			   const struct es_acquire_ent *ents);
void es_error_encode(struct st_wbuf *w, const char *msg);
/* experts: n_tokens * k ids; hints: n_hint (layer, expert) pairs as
 * hint_layer[i], hint_expert[i]. */
void es_route_req_encode(struct st_wbuf *w, uint32_t pid, uint32_t layer,
			 uint32_t pos, uint32_t n_tokens, uint32_t k,
			 const int *experts, uint32_t n_hint,
			 const int *hint_layer, const int *hint_expert);
/* Appends the optional hint_pos to a ROUTE payload just encoded with
 * es_route_req_encode (the hints name token position hint_pos >= pos). */
void es_route_req_encode_hint_pos(struct st_wbuf *w, uint32_t hint_pos);
void es_event_encode(struct st_wbuf *w, uint32_t pid, uint64_t epoch);

/* --- decoders: 0, or -ST_E_PROTO / -ST_E_VERSION with diag --- */

/* Checks length (with or without the resume id), the name (printable
 * ASCII, NUL-padded), version equal to ES_PROTO_VERSION (else
 * -ST_E_VERSION) and pid > 0. */
int es_hello_req_decode(const uint8_t *p, size_t len, struct es_hello_req *ret,
			struct st_diag *diag);
int es_hello_rep_decode(const uint8_t *p, size_t len, struct es_hello_rep *ret,
			struct st_diag *diag);
int es_ping_rep_decode(const uint8_t *p, size_t len, struct es_ping_rep *ret,
		       struct st_diag *diag);
int es_stats_rep_decode(const uint8_t *p, size_t len, struct es_stats_rep *ret,
			struct st_diag *diag);

/*
 * Decodes an ACQUIRE/RELEASE request and validates it against lim: exact
 * length 12 + 4n, 1 <= n <= n_slots, layer < n_layers, every expert <
 * n_experts, ids distinct, pid > 0.  Expert ids are read with
 * es_acquire_req_expert().
 */
int es_acquire_req_decode(const uint8_t *p, size_t len,
			  const struct es_acquire_limits *lim,
			  struct es_acquire_req *ret, struct st_diag *diag);

/*
 * Decodes a ROUTE request and validates it against lim: exact length
 * 24 + 4 n_tokens k + 8 n_hint (+ 4 with hint_pos), k <= ES_ROUTE_MAX_K,
 * n_hint <= ES_ROUTE_MAX_HINT, every layer < n_layers and expert <
 * n_experts, pid > 0, hint_pos >= pos.
 */
int es_route_req_decode(const uint8_t *p, size_t len,
			const struct es_acquire_limits *lim,
			struct es_route_req *ret, struct st_diag *diag);

/* Decoded ROUTE arrays: routed expert i (< n_tokens k), hint i (< n_hint). */
uint32_t es_route_req_expert(const struct es_route_req *r, uint32_t i);
void es_route_req_hint(const struct es_route_req *r, uint32_t i,
		       uint32_t *ret_layer, uint32_t *ret_expert);

/* Expert id i of a decoded request (i < n). */
uint32_t es_acquire_req_expert(const struct es_acquire_req *r, uint32_t i);

/* Decodes an ACQUIRE reply of exactly `n` entries into ents[n]; checks
 * statuses are ES_ACQ_READY/PENDING and slots < n_slots. */
int es_acquire_rep_decode(const uint8_t *p, size_t len, uint32_t n,
			  uint32_t n_slots, struct es_acquire_ent *ents,
			  struct st_diag *diag);

/* Copies the error message of an error reply into buf (len bytes, always
 * NUL-terminated; "" when the payload has none).  Returns 0 or -ST_E_PROTO. */
int es_error_decode(const uint8_t *p, size_t len, char *buf, size_t buf_len);

int es_event_decode(const uint8_t *p, size_t len, uint32_t *ret_pid,
		    uint64_t *ret_epoch);

/* Client id of table index idx with generation gen (gen >= 1, < 2^24). */
static inline uint32_t es_client_id_make(uint32_t idx, uint32_t gen)
{
	return ((gen & 0xffffffu) << 8) | (idx & 0xffu);
}

static inline uint32_t es_client_id_index(uint32_t id) { return id & 0xffu; }
static inline uint32_t es_client_id_gen(uint32_t id) { return id >> 8; }

/* Readable name of an expertd message or event type (never NULL). */
const char *es_proto_type_name(uint16_t type);

#endif

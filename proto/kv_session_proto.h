/*
 * kv_session_proto.h — kvd's KV_MSG_SESSION (issue 23 item 4): save a
 * conversation's cached KV pages under a name, load them back into the
 * prefix cache (after any restart), list and remove saved sessions
 * (kvd/kv_session.h holds the file format and what is promised).
 *
 * Payload (after the 32-byte st_proto header), little-endian:
 *   u32 op (KV_SESSION_*), u32 length + name bytes (kv_session_name_ok),
 *   ident: u64 model_id, u64 store_id, u32 kv_dtype, u32 page_rows,
 *          u32 length + model name bytes (at most KV_SESSION_MODEL_BYTES),
 *   u32 n_ids, n_ids x i32 id   (SAVE: the conversation's ids, >= 1;
 *                                other ops: 0)
 * Replies:
 *   SAVE    u32 groups saved, u32 rows saved (groups x page_rows),
 *           i32 rows of the session it replaced (-1: none of that name;
 *           0: the old file was corrupt)
 *   LOAD    u32 groups placed in the prefix cache (not counting those
 *           already there), u32 rows the session holds, u32 n_ids,
 *           n_ids x i32 (the session's token ids)
 *   LIST    u32 n, n x {u32 length + name, u32 rows, u64 file bytes,
 *           u32 length + model name, u32 length + why the file is
 *           unusable (empty: a good session; else rows 0, no model)}
 *           (ident ignored; ops other than
 *           SAVE and LOAD send an empty name except REMOVE)
 *   REMOVE  -
 */
#ifndef KV_SESSION_PROTO_H
#define KV_SESSION_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_proto.h"

enum kv_session_op {
	KV_SESSION_SAVE = 1,
	KV_SESSION_LOAD = 2,
	KV_SESSION_LIST = 3,
	KV_SESSION_REMOVE = 4,
};

#define KV_SESSION_NAME_BYTES 64   /* a name's length at most */
#define KV_SESSION_MODEL_BYTES 63  /* a model name's length at most */
#define KV_SESSION_MAX_LIST 256    /* entries of a LIST reply at most */
#define KV_SESSION_WHY_BYTES 127   /* a LIST entry's reason at most */

/* What a session was computed with; a session loads only where every field
 * is the same (kvd names the first that differs). */
struct kv_session_ident {
	uint64_t model_id;       /* the prefix-cache model id (hash of all) */
	uint64_t store_id;       /* the weights and expert store */
	uint32_t kv_dtype;       /* enum st_dtype of the KV rows */
	uint32_t page_rows;      /* the KV page size in rows */
	char model[KV_SESSION_MODEL_BYTES + 1]; /* served model name */
};

/* One KV_MSG_SESSION request; ids owned after a successful decode
 * (kv_msg_session_fini). */
struct kv_msg_session {
	uint32_t op;
	char name[KV_SESSION_NAME_BYTES + 1];
	struct kv_session_ident ident;
	uint32_t n_ids;
	int32_t *ids;
};

/* One LIST entry. */
struct kv_session_info {
	char name[KV_SESSION_NAME_BYTES + 1];
	uint32_t n_rows;
	uint64_t file_bytes;
	char model[KV_SESSION_MODEL_BYTES + 1];
	/* "" for a good session, else why its file is unusable (corrupt,
	 * a symbolic link, another format: kv_session.h) */
	char bad[KV_SESSION_WHY_BYTES + 1];
};

/*
 * True when `name` may name a session: 1..KV_SESSION_NAME_BYTES bytes of
 * [A-Za-z0-9._-], not starting with '.' (so never "..", a path or a
 * hidden or temporary file).  Else 0 with the reason in diag (may be
 * NULL).
 */
int kv_session_name_ok(const char *name, struct st_diag *diag);

/* Encodes m (not reset; sticky w->err). */
void kv_proto_encode_session(struct st_wbuf *w, const struct kv_msg_session *m);
/*
 * Decodes a whole payload: op known, name valid (kv_session_name_ok; LIST
 * takes an empty one), SAVE with 1..KV_PROTO_MAX_IDS ids and no ids for
 * other ops, exact length.  0, -ST_E_PROTO or -ST_E_LIMIT with diag,
 * -ENOMEM.
 */
int kv_proto_decode_session(const uint8_t *p, size_t len,
			    struct kv_msg_session *ret, struct st_diag *diag);
void kv_msg_session_fini(struct kv_msg_session *m);

/* LIST reply: n entries (at most KV_SESSION_MAX_LIST). */
void kv_proto_encode_session_list(struct st_wbuf *w, uint32_t n,
				  const struct kv_session_info *v);
/* Fills ret[cap]; *ret_n gets the count (<= cap, else -ST_E_PROTO). */
int kv_proto_decode_session_list(const uint8_t *p, size_t len, uint32_t cap,
				 struct kv_session_info *ret,
				 uint32_t *ret_n);

#endif

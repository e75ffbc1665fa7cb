/*
 * kv_session.h — saved sessions (issue 23 item 4): a conversation's KV,
 * every stream of the declared model (DeepSeek-V4/V4.1's compressed,
 * indexer, window and compressor-input streams included), written to a
 * file under a name and loaded back into kvd's prefix cache, so that a
 * request whose prompt starts with the conversation's ids maps the rows
 * instead of recomputing them, after kvd, computed or the whole instance
 * restarted.
 *
 * What a session holds: the prefix-cache groups (full pages of every
 * stream, DESIGN.md 3a) of the conversation's ids, as far as their chain is
 * in the cache when saved; the rows of the last partial page are not in it
 * (a resumed request computes them again, fewer than page_rows tokens, and
 * always its last token: PITFALLS P10).  Because a group at a page
 * boundary carries everything a sequence needs to go on from there (V4's
 * window and compressor inputs are per-token windowed streams), no other
 * per-sequence state is needed.
 *
 * File (SESSION_DIR/NAME.kvs, little-endian), format KV_SESSION_FORMAT:
 *   0   "strataSS" magic
 *   8   u32 format, u32 n_streams
 *   16  u64 model_id, u64 store_id, u64 stream declaration hash
 *   40  u32 kv_dtype, u32 page_rows, u32 n_groups, u32 n_ids
 *   56  char model[64] (NUL-padded)
 *   120 u64 group value bytes (kv_group_value_len), u64 reserved 0
 *   136 u64 XXH3-64 of bytes [0, 136) and the ids
 *   144 n_ids x i32 token ids
 *   then n_groups group values (kv_remote.h's value: its own magic,
 *   format, prefix key, declaration hash, per stream length and XXH3-64).
 * Written with st_write_file_durable (temporary file, fsync, rename, fsync
 * of the directory): a crash leaves the old file or the new one.
 *
 * With kvd's remote KV tier (--remote-kv), a saved session's file bytes
 * also go to "strata:session:<format>:<name>" (KV_SESSION_REMOTE_TTL_S):
 * a load that finds no file here reads them there (another node saved
 * it) and checks them exactly as a file; rm removes both.  A failure of
 * the tier never fails a save (the file is written; logged).
 */
#ifndef KV_SESSION_H
#define KV_SESSION_H

#include <stdint.h>

#include "kv_session_proto.h"
#include "st_error.h"

struct kv_pool;
struct kv_remote;

#define KV_SESSION_FORMAT 1u
#define KV_SESSION_SUFFIX ".kvs"
/* Time to live of a session's copy in the remote tier (30 days; saving it
 * again renews it). */
#define KV_SESSION_REMOTE_TTL_S (30u * 24 * 3600)

/*
 * Saves the groups of ids[0..n_ids) of model id->model_id that are in
 * p's prefix cache (spilled ones restored first), in chain order up to the
 * first missing, as `dir`/name.kvs (dir created, mode 0700; an existing
 * session of that name replaced whole; also to the remote tier when p has
 * one).  *ret_groups gets the count; *ret_replaced (may be NULL) -1 when
 * there was no file of that name, else the rows of the session replaced
 * (0: it was corrupt).  Errors: -EINVAL (bad name, ident page_rows not the
 * pool's), -ST_E_NOTFOUND (not one group cached: publish the conversation
 * first), -EEXIST (the name is a symbolic link or not a regular file:
 * left alone), -ENOTDIR and other -errno of the directory or the write
 * (diag names the directory), -ENOMEM; diag says which.
 */
int kv_session_save(struct kv_pool *p, const char *dir, const char *name,
		    const struct kv_session_ident *id, const int32_t *ids,
		    uint32_t n_ids, uint32_t *ret_groups,
		    int32_t *ret_replaced, struct st_diag *diag);

/*
 * Loads `dir`/name.kvs (not through a symbolic link: -ELOOP; a regular
 * file only): the whole file is checked before anything is used
 * (magic, header checksum, format, size against the header, the ident field by field — model,
 * store, KV dtype, page size, model id — and the stream declaration
 * against pool p, each group's prefix key recomputed from the ids and its
 * value checked: lengths and XXH3 of every stream); then each group not
 * cached yet enters p's prefix cache as an idle group of fresh pages (room
 * made as for a restore).  *ret_placed gets the groups placed, *ret_rows
 * the rows the session holds, *ret_ids (malloc'd, the caller's) and
 * *ret_n_ids its token ids.  Errors: -ST_E_NOTFOUND (no such session),
 * -ST_E_CONFIG (another model, store, KV dtype, page size or declaration:
 * diag names it and both values), -ST_E_CHECKSUM or -ST_E_FORMAT (a
 * corrupt file: nothing used), -ST_E_VERSION (another format), -EINVAL,
 * -ST_E_BUDGET (no room: groups placed so far stay cached), -ENOMEM.
 */
int kv_session_load(struct kv_pool *p, const char *dir, const char *name,
		    const struct kv_session_ident *id, uint32_t *ret_placed,
		    uint32_t *ret_rows, int32_t **ret_ids,
		    uint32_t *ret_n_ids, struct st_diag *diag);

/* Lists the sessions in dir (by name, at most cap).  Each file is opened
 * without following links and its magic, header checksum, format and
 * size (against its header) checked: one that fails lists with
 * kv_session_info.bad saying why (a symbolic link, not a regular file,
 * "header checksum mismatch", "size N, header says M"...) and no rows or
 * model; the group values are checked by LOAD.  Returns the count (0 when
 * dir does not exist) or -errno (-ENOTDIR: dir is not a directory). */
int kv_session_list(const char *dir, struct kv_session_info *ret,
		    uint32_t cap);

/* Removes a session: its file, and its copy in the remote tier when
 * remote (may be NULL) is kvd's.  A symbolic link or other non-regular
 * file of that name is left alone (-ELOOP / -EPERM).  0, -EINVAL (bad
 * name), -ST_E_NOTFOUND (in neither), -errno, the tier's error. */
int kv_session_remove(struct kv_remote *remote, const char *dir,
		      const char *name, struct st_diag *diag);

#endif

/*
 * cw_session.h — computed's side of saved sessions (issue 23 item 4,
 * kvd/kv_session.h): what identifies this instance's KV (served model
 * name, store, KV dtype, page size, prefix-cache model id), saving a
 * finished generation's conversation, loading one before a request, and
 * the /v1/sessions endpoints.
 *
 * A request field "session": {"save": "NAME"} saves, after the response,
 * the KV of the prompt and the generated tokens (every full page of rows
 * computed: the rows of the last sampled token are not, it was never fed);
 * {"load": "NAME"} loads the session into kvd's prefix cache before the
 * request starts, so a prompt that begins with the conversation (as an
 * OpenAI client resends the whole history) maps its rows instead of
 * recomputing them.  Both may be given (load, continue, save again).
 * A save that fails (too few rows, kvd's directory) does not fail the
 * finished completion: its outcome, saved or why not, is reported beside
 * it (cw_sched_req_save, the response's "session" object).
 */
#ifndef CW_SESSION_H
#define CW_SESSION_H

#include <jansson.h>
#include <stdint.h>

#include "kv_client.h"
#include "st_error.h"

struct cw_model;

/*
 * Fills *ret for model m served as model_name with KV rows of kv_dtype
 * (enum st_dtype) through kv (declared): the store id is the XXH3 of the
 * store's config.json XOR its weights' id (st_store_id), as the prefix-cache
 * model id uses.  0, or st_store_id's error with diag.
 */
int cw_session_ident(const struct cw_model *m, struct kv_client *kv,
		     const char *model_name, uint32_t kv_dtype,
		     struct kv_session_ident *ret, struct st_diag *diag);

/*
 * Saves the conversation ids[0..n_ids) of sequence seq (n_rows of them
 * written to kvd: their full pages are published first, unless publish is
 * 0 — a DeepSeek-V4 state published them itself as it went) as session
 * `name`.
 * *ret_rows (may be NULL) gets the rows saved, *ret_replaced (may be
 * NULL) -1 or the rows of the old session of that name it replaced
 * (kv_client_session_save).  Errors as
 * kv_client_session_save and kv_client_seq_publish, diag naming the
 * session.
 */
int cw_session_save(struct kv_client *kv, const struct kv_session_ident *id,
		    const char *name, uint32_t seq, const int32_t *ids,
		    int n_ids, int n_rows, int publish, uint32_t *ret_rows,
		    int32_t *ret_replaced, struct st_diag *diag);

/*
 * The HTTP status of session error r: 400 for what the request named
 * wrongly (-EINVAL; another model, store, KV dtype, page size: -ST_E_CONFIG;
 * a corrupt or other-format file: -ST_E_CHECKSUM, -ST_E_FORMAT,
 * -ST_E_VERSION), 404 -ST_E_NOTFOUND, 503 -ST_E_PEERGONE / -ST_E_BUDGET,
 * 500 for the rest (the server's own faults: a session directory that is
 * not one, a link in it, I/O).
 */
int cw_session_status(int r);

/* Loads session `name` into kvd's prefix cache (kv_client_session_load);
 * *ret_rows (may be NULL) gets its rows.  0 or its error with diag. */
int cw_session_load(struct kv_client *kv, const struct kv_session_ident *id,
		    const char *name, uint32_t *ret_rows,
		    struct st_diag *diag);

/*
 * The /v1/sessions endpoints, for the HTTP front (thread-safe: kv's calls
 * are).  method "GET" with name NULL: {"object":"list","data":[{"id",
 * "object":"session","rows","bytes","model"[,"corrupt": why]}...]} (a
 * file kvd cannot load lists with "corrupt" and rows 0); "DELETE" name:
 * {"id","object":"session","deleted":true}; "POST" name/load (load 1):
 * {"id","object":"session","rows","prompt_tokens"}.  Returns the JSON (the
 * caller's) with *ret_status 200, or NULL with *ret_status 4xx/5xx and the
 * message in diag.
 */
json_t *cw_session_http(struct kv_client *kv,
			const struct kv_session_ident *id, const char *method,
			const char *name, int load, int *ret_status,
			struct st_diag *diag);

/* Saves the cached pages of the conversation ids[0..n_ids) (computed
 * before on this instance) as session `name` (CW_MSG_SESSION SAVE, strata
 * session save): {"id","object":"session","rows"}, or NULL with
 * *ret_status and diag as cw_session_http. */
json_t *cw_session_save_ids(struct kv_client *kv,
			    const struct kv_session_ident *id,
			    const char *name, const int32_t *ids, int n_ids,
			    int *ret_status, struct st_diag *diag);

#endif

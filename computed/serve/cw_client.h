/*
 * cw_client.h — the client side of computed's request socket, used by the
 * strata CLI and the tests.
 */
#ifndef CW_CLIENT_H
#define CW_CLIENT_H

#include <stdint.h>

#include "cw_proto.h"
#include "st_error.h"

struct cw_client;

/* Connects to <run_dir>/computed.ctl.  timeout_ms bounds each reply (a
 * prefill of a long prompt on a large model can take a while: pass a
 * generous value).  *ret owned by the caller. */
int cw_client_open(const char *run_dir, int timeout_ms, struct cw_client **ret,
		   struct st_diag *diag);
void cw_client_close(struct cw_client *c);

/*
 * Sets a function called every ST_RPC_POLL_MS while a reply is awaited;
 * when it returns a negative code the call ends with that code (the CLI
 * uses it to notice a dead computed or a Ctrl-C at once instead of waiting
 * out the time-out).  NULL removes it.
 */
void cw_client_set_watch(struct cw_client *c, int (*watch)(void *arg),
			 void *arg);

/* PING: 0 when computed answers (it answers only once ready). */
int cw_client_ping(struct cw_client *c, int32_t *ret_pid);

/* Starts a generation; the message is encoded from m (strings borrowed).
 * *ret_gen_id, *ret_n_prompt and (when non-NULL) *ret_max_tokens — the new
 * tokens the model's context leaves room for, at most m->max_tokens — on
 * success; errors carry computed's message in diag. */
int cw_client_gen_start(struct cw_client *c, const struct cw_gen_start_msg *m,
			uint32_t *ret_gen_id, uint32_t *ret_n_prompt,
			uint32_t *ret_max_tokens, struct st_diag *diag);

/* One step: *ret_token (-1 none), *ret_finish (enum cw_finish), text
 * (malloc'd, caller frees) in *ret_text. */
int cw_client_gen_next(struct cw_client *c, uint32_t gen_id, int32_t *ret_token,
		       uint32_t *ret_finish, char **ret_text,
		       struct st_diag *diag);

int cw_client_gen_end(struct cw_client *c, uint32_t gen_id);

/*
 * Scores ids[0..n) from position 0 (CW_MSG_SCORE): *ret_nll the summed
 * natural-log NLL of ids[1..n), ret_argmax[n-1] (caller's array) the argmax
 * at each scored position.  dump_name non-NULL: computed also writes the
 * (n-1) x vocab float32 log-softmax rows to <run_dir>/<dump_name>.
 */
int cw_client_score(struct cw_client *c, const int32_t *ids, uint32_t n,
		    const char *dump_name, double *ret_nll,
		    uint32_t *ret_argmax, struct st_diag *diag);

int cw_client_stats(struct cw_client *c, struct cw_stats_wire *ret);

/* CW_MSG_SESSION (cw_proto.h): op KV_SESSION_*, name ("" for LIST),
 * prompt and flags for SAVE ("" and 0 otherwise).  *ret_json (malloc'd,
 * the caller's) gets computed's JSON answer.  0, or the error with
 * computed's message in diag (-ST_E_NOTFOUND: no such session). */
int cw_client_session(struct cw_client *c, uint32_t op, const char *name,
		      uint32_t flags, const char *prompt, char **ret_json,
		      struct st_diag *diag);

int cw_client_shutdown(struct cw_client *c);

#endif

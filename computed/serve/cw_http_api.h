/*
 * cw_http_api.h — the OpenAI API objects of computed's HTTP server:
 * parsing and validating /v1/completions and /v1/chat/completions request
 * bodies into scheduler requests, and building responses, stream chunks
 * and error objects from the scheduler's events.  No I/O here (cw_http.c
 * does the HTTP side).
 */
#ifndef CW_HTTP_API_H
#define CW_HTTP_API_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "cw_chat.h"
#include "cw_model.h"
#include "cw_sched.h"

struct cw_api {
	struct cw_model *model;           /* borrowed */
	const struct st_tokenizer *tok;   /* borrowed */
	enum cw_chat_template chat;
	const char *model_name;           /* borrowed */
	long created;                     /* unix time of /v1/models */
	/* completion ids: "cmpl-" / "chatcmpl-" then id_prefix (random per
	 * computed start: st_random_id) and next_id (atomic), both as hex,
	 * so that no two starts or instances give the same id */
	uint64_t id_prefix;
	unsigned long next_id;
};

/* An OpenAI-style error: {"error": {message, type, param, code}}. */
struct cw_api_error {
	int status;                       /* HTTP status */
	char type[64];                    /* invalid_request_error, ... */
	char message[1280];
	char param[64];                   /* "" = null */
	char code[64];                    /* "" = null */
};

/* One generation as the API sees it. */
struct cw_api_gen {
	struct cw_sched_req *req;         /* owned: cw_sched_release */
	int chat, stream, logprobs, top_logprobs;
	int include_usage;                /* stream_options.include_usage */
	char id[64];
	int sent_role;                    /* chat stream: role chunk sent */
	int finished;
	enum cw_finish finish;
	int err;                          /* finish ERROR: its code */
	char err_msg[1024];               /* as cw_sched_event's */
	int n_prompt, n_completion;
	int n_cached;                     /* prompt rows from the prefix cache */
	char save_name[65];               /* "session": {"save"} or "" */
	/* whole (non-stream) response */
	char *text;
	size_t text_len;
	json_t *lp;                       /* logprobs collected (owned) */
};

/*
 * Parses body (len bytes of JSON) as a completion (chat = 0) or chat
 * completion request, encodes the prompt and submits it to sched.
 * Returns 0 with *g filled, or -1 with *err (400 malformed / invalid
 * field, 429 queue full, 503 shutting down).
 */
/*
 * The token ids of a conversation as a request body gives it: "messages"
 * rendered with the chat template (ending with the assistant's turn, as
 * /v1/chat/completions encodes them), else "prompt" (a string or token
 * ids, as /v1/completions).  *ret_ids malloc'd, the caller's.  0, or -1
 * with err filled (400).  (POST /v1/sessions/NAME, cw_session.h.)
 */
int cw_api_encode_conversation(struct cw_api *api, json_t *j,
			       int32_t **ret_ids, size_t *ret_n,
			       struct cw_api_error *err);

int cw_api_gen_start(struct cw_api *api, struct cw_sched *sched, int chat,
		     const char *body, size_t len, struct cw_api_gen *g,
		     struct cw_api_error *err);
void cw_api_gen_fini(struct cw_api_gen *g);

/* Stream: the chunk object for one event (new reference), or NULL when
 * there is nothing to send.  Sets g->finished on the last one (which
 * carries finish_reason, or an error object, and with a session save
 * "session": {"name","saved":true,"rows","replaced"[,"replaced_rows"]} or
 * {"name","saved":false,"error"}: a failed save does not fail the
 * completion).  With include_usage every chunk has "usage": null, as
 * OpenAI's, and the usage chunk repeats "session". */
json_t *cw_api_stream_event(struct cw_api *api, struct cw_api_gen *g,
			    const struct cw_sched_event *ev);

/* Stream, once g->finished: the extra last chunk of
 * stream_options.include_usage (empty choices, the usage counts; new
 * reference), or NULL when the request did not ask for it or failed. */
json_t *cw_api_stream_usage(struct cw_api *api, const struct cw_api_gen *g);

/* Whole response: collects one event into g. */
void cw_api_collect_event(struct cw_api *api, struct cw_api_gen *g,
			  const struct cw_sched_event *ev);

/* Whole response once g->finished: *ret the response object (new
 * reference; usage.prompt_tokens_details.cached_tokens the prompt rows
 * mapped from the prefix cache; "session" as the stream's last chunk when
 * the request saved one), or -1 with *err when the generation failed. */
int cw_api_final_json(struct cw_api *api, struct cw_api_gen *g, json_t **ret,
		      struct cw_api_error *err);

json_t *cw_api_error_json(const struct cw_api_error *e);
/* GET /v1/models: the list of the one served model (new reference). */
json_t *cw_api_models_json(const struct cw_api *api);
/* GET /v1/models/{id}: the model object (new reference), or NULL with
 * *err a 404 model_not_found when id is not the served model's name. */
json_t *cw_api_model_json(const struct cw_api *api, const char *id,
			  struct cw_api_error *err);

#endif

/*
 * cw_http_api.c — OpenAI request parsing and response objects; see
 * cw_http_api.h.  Field meanings follow the OpenAI API reference
 * (platform.openai.com/docs/api-reference/completions and /chat).
 */
#include "cw_http_api.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cw_session.h"
#include "kv_session_proto.h"
#include "st_util.h"

#define CW_API_DEFAULT_MAX_TOKENS 16   /* completions, as OpenAI's */

static int fail(struct cw_api_error *e, int status, const char *type,
		const char *param, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

static int fail(struct cw_api_error *e, int status, const char *type,
		const char *param, const char *code, const char *fmt, ...)
{
	va_list ap;

	memset(e, 0, sizeof(*e));
	e->status = status;
	snprintf(e->type, sizeof(e->type), "%s", type);
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
	return -1;
}

static int bad(struct cw_api_error *e, const char *param, const char *msg)
{
	return fail(e, 400, "invalid_request_error", param, NULL, "%s", msg);
}

json_t *cw_api_error_json(const struct cw_api_error *e)
{
	return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message",
			 e->message, "type", e->type, "param",
			 e->param[0] ? json_string(e->param) : json_null(),
			 "code", e->code[0] ? json_string(e->code) :
			 json_null());
}

/* The model object of /v1/models and /v1/models/{id}. */
static json_t *model_json(const struct cw_api *api)
{
	return json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", api->model_name,
			 "object", "model", "created", (json_int_t)api->created,
			 "owned_by", "strata", "max_model_len",
			 cw_model_config(api->model)->max_position_embeddings);
}

json_t *cw_api_models_json(const struct cw_api *api)
{
	return json_pack("{s:s,s:[o]}", "object", "list", "data",
			 model_json(api));
}

json_t *cw_api_model_json(const struct cw_api *api, const char *id,
			  struct cw_api_error *err)
{
	if (strcmp(id, api->model_name)) {
		fail(err, 404, "invalid_request_error", "model",
		     "model_not_found", "the model '%.200s' does not exist: "
		     "this server serves '%s' (GET /v1/models)", id,
		     api->model_name);
		return NULL;
	}
	return model_json(api);
}

/* The optional "model" field names the served model (as GET /v1/models
 * lists it, and as vLLM checks it): another name is 404 model_not_found,
 * a non-string 400.  0 or -1 with err set. */
static int check_model(const struct cw_api *api, json_t *x,
		       struct cw_api_error *e)
{
	if (!x || json_is_null(x))
		return 0;
	if (!json_is_string(x))
		return bad(e, "model", "'model' must be a string (the name GET "
			   "/v1/models lists)");
	if (strcmp(json_string_value(x), api->model_name))
		return fail(e, 404, "invalid_request_error", "model",
			    "model_not_found", "the model '%.200s' does not "
			    "exist: this server serves '%s' (GET /v1/models; "
			    "strata up --model-name sets it)",
			    json_string_value(x), api->model_name);
	return 0;
}

/* Optional number field in [lo, hi]. */
static int get_num(json_t *j, const char *key, double lo, double hi,
		   double *v, struct cw_api_error *e)
{
	json_t *x = json_object_get(j, key);

	if (!x || json_is_null(x))
		return 0;
	if (!json_is_number(x) || !isfinite(json_number_value(x)) ||
	    json_number_value(x) < lo || json_number_value(x) > hi)
		return fail(e, 400, "invalid_request_error", key, NULL,
			    "'%s' must be a number in [%g, %g]", key, lo, hi);
	*v = json_number_value(x);
	return 0;
}

/* Optional integer field in [lo, hi]. */
static int get_int(json_t *j, const char *key, long long lo, long long hi,
		   long long *v, struct cw_api_error *e)
{
	json_t *x = json_object_get(j, key);

	if (!x || json_is_null(x))
		return 0;
	if (!json_is_integer(x) || json_integer_value(x) < lo ||
	    json_integer_value(x) > hi)
		return fail(e, 400, "invalid_request_error", key, NULL,
			    "'%s' must be an integer in [%lld, %lld]", key,
			    lo, hi);
	*v = json_integer_value(x);
	return 0;
}

static int get_bool(json_t *j, const char *key, int *v,
		    struct cw_api_error *e)
{
	json_t *x = json_object_get(j, key);

	if (!x || json_is_null(x))
		return 0;
	if (!json_is_boolean(x))
		return fail(e, 400, "invalid_request_error", key, NULL,
			    "'%s' must be true or false", key);
	*v = json_is_true(x);
	return 0;
}

/*
 * "session": {"load": NAME, "save": NAME} (cw_session.h): names checked
 * here (kv_session_name_ok), unknown keys refused.  0 or -1.
 */
static int parse_session(json_t *j, struct cw_gen_params *gp,
			 struct cw_api_error *e)
{
	json_t *x = json_object_get(j, "session"), *v;
	const char *k;

	if (!x || json_is_null(x))
		return 0;
	if (!json_is_object(x))
		return bad(e, "session", "'session' must be an object: "
			   "{\"load\": NAME, \"save\": NAME}");
	json_object_foreach(x, k, v) {
		char *dst = !strcmp(k, "load") ? gp->session_load :
			    !strcmp(k, "save") ? gp->session_save : NULL;
		struct st_diag d = { "" };

		if (!dst)
			return fail(e, 400, "invalid_request_error", "session",
				    NULL, "'session' takes 'load' and 'save', "
				    "not '%.64s'", k);
		if (!json_is_string(v) ||
		    !kv_session_name_ok(json_string_value(v), &d))
			return fail(e, 400, "invalid_request_error", "session",
				    NULL, "'session.%s': %s", k,
				    json_is_string(v) ? d.msg :
				    "must be a string");
		snprintf(dst, sizeof(gp->session_save), "%s",
			 json_string_value(v));
	}
	return 0;
}

/*
 * Fields that ask for what strata does not do, answered with a 400
 * rather than silently ignored: several choices (n > 1) and tool /
 * function calling (a non-empty tools or functions list, or a
 * tool_choice / function_call other than none / auto).  0 or -1.
 */
static int parse_unsupported(json_t *j, long long n, struct cw_api_error *e)
{
	static const char *const lists[2] = { "tools", "functions" };
	static const char *const choices[2] = { "tool_choice",
						"function_call" };

	if (n > 1)
		return fail(e, 400, "invalid_request_error", "n", NULL,
			    "'n' %lld is not supported: strata returns one "
			    "choice per request (n = 1); send %lld requests "
			    "instead, they are batched on the server", n, n);
	for (int i = 0; i < 2; i++) {
		json_t *x = json_object_get(j, lists[i]);

		if (x && !json_is_null(x) && !(json_is_array(x) &&
					       !json_array_size(x)))
			return fail(e, 400, "invalid_request_error", lists[i],
				    NULL, "'%s' is not supported: strata does "
				    "not call tools or functions; send the "
				    "request without '%s'", lists[i],
				    lists[i]);
		x = json_object_get(j, choices[i]);
		if (x && !json_is_null(x) && !(json_is_string(x) &&
		    (!strcmp(json_string_value(x), "none") ||
		     !strcmp(json_string_value(x), "auto"))))
			return fail(e, 400, "invalid_request_error",
				    choices[i], NULL, "'%s' is not "
				    "supported: strata does not call tools or "
				    "functions (only \"none\" or \"auto\")",
				    choices[i]);
	}
	return 0;
}

/* stream_options: {"include_usage": bool}, only with stream true (as
 * OpenAI and vLLM).  0 or -1. */
static int parse_stream_options(json_t *j, struct cw_api_gen *g,
				struct cw_api_error *e)
{
	json_t *x = json_object_get(j, "stream_options");
	json_t *u;

	if (!x || json_is_null(x))
		return 0;
	if (!g->stream)
		return bad(e, "stream_options", "'stream_options' is only "
			   "allowed with \"stream\": true");
	if (!json_is_object(x))
		return bad(e, "stream_options", "'stream_options' must be an "
			   "object such as {\"include_usage\": true}");
	u = json_object_get(x, "include_usage");
	if (u && !json_is_null(u) && !json_is_boolean(u))
		return bad(e, "stream_options", "'stream_options."
			   "include_usage' must be true or false");
	g->include_usage = json_is_true(u);
	return 0;
}

/* Sampling, limits, stop strings, stream, logprobs. */
static int parse_params(struct cw_api *api, json_t *j, int chat,
			struct cw_gen_params *gp, struct cw_api_gen *g,
			struct cw_api_error *e)
{
	const int ctx = cw_model_config(api->model)->max_position_embeddings;
	double temp = 1.0, top_p = 1.0;
	long long max_tokens = chat ? ctx : CW_API_DEFAULT_MAX_TOKENS;
	long long top_k = 0, n = 1, lp = 0, seed = -1;
	json_t *x;

	x = json_object_get(j, "max_tokens");
	gp->max_tokens_auto = chat && (!x || json_is_null(x));
	x = json_object_get(j, "max_completion_tokens");
	gp->max_tokens_auto &= !x || json_is_null(x);
	if (get_int(j, "max_tokens", 1, 1 << 30, &max_tokens, e) ||
	    get_int(j, "max_completion_tokens", 1, 1 << 30, &max_tokens, e) ||
	    get_num(j, "temperature", 0.0, 2.0, &temp, e) ||
	    get_num(j, "top_p", 0.0, 1.0, &top_p, e) ||
	    get_int(j, "top_k", -1, 1 << 30, &top_k, e) ||
	    get_int(j, "n", 1, 1 << 30, &n, e) ||
	    get_int(j, "seed", INT64_MIN, INT64_MAX, &seed, e) ||
	    get_bool(j, "stream", &g->stream, e) ||
	    get_bool(j, "kv_private", &gp->kv_private, e) ||
	    parse_session(j, gp, e) ||
	    parse_unsupported(j, n, e) ||
	    parse_stream_options(j, g, e))
		return -1;
	if (json_object_get(j, "top_p") && top_p == 0.0)
		return bad(e, "top_p", "'top_p' must be above 0");
	if (!json_object_get(j, "seed") || json_is_null(json_object_get(j, "seed")))
		seed = (long long)(st_now_ns() ^ (uint64_t)(uintptr_t)g);
	x = json_object_get(j, "echo");
	if (x && json_is_true(x))
		return bad(e, "echo", "'echo' is not supported");
	/* sampling fields strata does not implement: refused rather than
	 * ignored when they would change the output */
	{
		static const char *const zero[] = { "presence_penalty",
						    "frequency_penalty" };

		for (size_t i = 0; i < 2; i++) {
			x = json_object_get(j, zero[i]);
			if (x && !json_is_null(x) && !(json_is_number(x) &&
						       json_number_value(x) == 0))
				return fail(e, 400, "invalid_request_error",
					    zero[i], NULL, "'%s' is not "
					    "supported (only 0)", zero[i]);
		}
		x = json_object_get(j, "logit_bias");
		if (x && !json_is_null(x) && !(json_is_object(x) &&
					       !json_object_size(x)))
			return bad(e, "logit_bias", "'logit_bias' is not "
				   "supported");
		x = json_object_get(j, "suffix");
		if (x && !json_is_null(x) && !(json_is_string(x) &&
					       !json_string_length(x)))
			return bad(e, "suffix", "'suffix' is not supported");
	}
	x = json_object_get(j, "best_of");
	if (x && !json_is_null(x) && !(json_is_integer(x) &&
				       json_integer_value(x) == 1))
		return bad(e, "best_of", "only best_of 1 is supported");
	if (chat) {
		if (get_bool(j, "logprobs", &g->logprobs, e) ||
		    get_int(j, "top_logprobs", 0, CW_GEN_MAX_TOP, &lp, e))
			return -1;
		if (lp && !g->logprobs)
			return bad(e, "top_logprobs", "'top_logprobs' needs "
				   "'logprobs': true");
	} else {
		x = json_object_get(j, "logprobs");
		if (x && !json_is_null(x)) {
			if (get_int(j, "logprobs", 0, CW_GEN_MAX_TOP, &lp, e))
				return -1;
			g->logprobs = 1;
		}
	}
	g->top_logprobs = (int)lp;
	x = json_object_get(j, "stop");
	if (json_is_string(x)) {
		if (!json_string_length(x))
			return bad(e, "stop", "'stop' strings must not be "
				   "empty");
		gp->stop[gp->n_stop++] = json_string_value(x);
	} else if (json_is_array(x)) {
		size_t i;
		json_t *s;

		if (json_array_size(x) > CW_GEN_MAX_STOP)
			return fail(e, 400, "invalid_request_error", "stop",
				    NULL, "at most %d stop strings",
				    CW_GEN_MAX_STOP);
		json_array_foreach(x, i, s) {
			if (!json_is_string(s) || !json_string_length(s))
				return bad(e, "stop", "'stop' must be a "
					   "string or an array of non-empty "
					   "strings");
			gp->stop[gp->n_stop++] = json_string_value(s);
		}
	} else if (x && !json_is_null(x)) {
		return bad(e, "stop", "'stop' must be a string or an array of "
			   "strings");
	}
	/* a plain-template answer ends where the dialogue's next turn
	 * would start (a base model does not end its turn by itself) */
	if (chat && api->chat == CW_CHAT_PLAIN && gp->n_stop < CW_GEN_MAX_STOP)
		gp->stop[gp->n_stop++] = CW_CHAT_PLAIN_STOP;
	gp->max_tokens = (int)max_tokens;
	gp->sampler.temperature = (float)temp;
	gp->sampler.top_p = (float)top_p;
	gp->sampler.top_k = top_k > 0 ? (int)top_k : 0;
	gp->sampler.seed = (uint64_t)seed;
	gp->prefix_cache = 1;
	gp->draft_max = CW_DRAFT_DEFAULT; /* computed --speculate */
	gp->logprobs = g->logprobs;
	gp->top_logprobs = g->logprobs ? g->top_logprobs : 0;
	return 0;
}

/* The prompt of a completion: a string, an array of one string, or an
 * array of token ids. */
static int encode_prompt(struct cw_api *api, json_t *j, int32_t **ret_ids,
			 size_t *ret_n, struct cw_api_error *e)
{
	const int vocab = cw_model_config(api->model)->vocab_size;
	json_t *p = json_object_get(j, "prompt");
	int r;

	if (json_is_array(p) && json_array_size(p) == 1 &&
	    json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0);
	if (json_is_array(p) && json_array_size(p) > 1 &&
	    (json_is_string(json_array_get(p, 0)) ||
	     json_is_array(json_array_get(p, 0))))
		return bad(e, "prompt", "one prompt per request: send each "
			   "prompt of a batch as its own request (they are "
			   "batched on the server)");
	if (json_is_string(p)) {
		/* a raw prompt: special tokens spelled in it count, as the
		 * caller writes the whole text (chat content never does) */
		r = st_tokenizer_encode(api->tok, json_string_value(p),
					json_string_length(p), 1, 1, ret_ids,
					ret_n);
		if (r < 0)
			return fail(e, 400, "invalid_request_error", "prompt",
				    NULL, "cannot encode the prompt: %s",
				    st_strerror(r));
		return 0;
	}
	if (json_is_array(p) && json_array_size(p) > 0) {
		size_t i, n = json_array_size(p);
		json_t *v;
		int32_t *ids = malloc(sizeof(*ids) * n);

		if (!ids)
			return fail(e, 503, "server_error", NULL, NULL,
				    "out of memory");
		json_array_foreach(p, i, v) {
			if (!json_is_integer(v) || json_integer_value(v) < 0 ||
			    json_integer_value(v) >= vocab) {
				free(ids);
				return fail(e, 400, "invalid_request_error",
					    "prompt", NULL, "prompt[%zu]: "
					    "token ids must be integers in "
					    "[0, %d)", i, vocab);
			}
			ids[i] = (int32_t)json_integer_value(v);
		}
		*ret_ids = ids;
		*ret_n = n;
		return 0;
	}
	return bad(e, "prompt", "'prompt' must be a string, an array of one "
		   "string, or an array of token ids");
}

/* Content of a chat message: a string or an array of text parts
 * (returned malloc'd). */
static char *message_text(json_t *c)
{
	size_t i, len = 0;
	json_t *part;
	char *s;

	if (json_is_string(c))
		return strdup(json_string_value(c));
	if (json_is_null(c))
		return strdup("");
	if (!json_is_array(c))
		return NULL;
	json_array_foreach(c, i, part) {
		json_t *t = json_object_get(part, "text");

		if (!json_is_string(t) ||
		    strcmp(json_string_value(json_object_get(part, "type")) ?
			   json_string_value(json_object_get(part, "type")) :
			   "", "text"))
			return NULL;
		len += json_string_length(t);
	}
	s = malloc(len + 1);
	if (!s)
		return NULL;
	s[0] = 0;
	json_array_foreach(c, i, part)
		strcat(s, json_string_value(json_object_get(part, "text")));
	return s;
}

static int encode_messages(struct cw_api *api, json_t *j, int32_t **ret_ids,
			   size_t *ret_n, struct cw_api_error *e)
{
	json_t *m = json_object_get(j, "messages"), *x;
	struct cw_chat_msg *msgs;
	char **texts;
	struct st_diag diag = { "" };
	size_t i, n;
	int r = 0;

	if (!json_is_array(m) || !json_array_size(m))
		return bad(e, "messages", "'messages' must be a non-empty "
			   "array of {role, content}");
	n = json_array_size(m);
	msgs = calloc(n, sizeof(*msgs));
	texts = calloc(n, sizeof(*texts));
	if (!msgs || !texts) {
		free(msgs);
		free(texts);
		return fail(e, 503, "server_error", NULL, NULL,
			    "out of memory");
	}
	json_array_foreach(m, i, x) {
		json_t *role = json_object_get(x, "role");

		if (!json_is_object(x) || !json_is_string(role)) {
			r = fail(e, 400, "invalid_request_error", "messages",
				 NULL, "messages[%zu] needs a string 'role'",
				 i);
			break;
		}
		texts[i] = message_text(json_object_get(x, "content"));
		if (!texts[i]) {
			r = fail(e, 400, "invalid_request_error", "messages",
				 NULL, "messages[%zu].content must be a "
				 "string or an array of text parts", i);
			break;
		}
		msgs[i].role = json_string_value(role);
		msgs[i].content = texts[i];
	}
	if (!r) {
		r = cw_chat_encode(api->chat, api->tok, msgs, (int)n, ret_ids,
				   ret_n, &diag);
		if (r < 0)
			r = fail(e, 400, "invalid_request_error", "messages",
				 NULL, "%s", diag.msg);
	}
	for (i = 0; i < n; i++)
		free(texts[i]);
	free(texts);
	free(msgs);
	return r < 0 ? -1 : 0;
}

int cw_api_encode_conversation(struct cw_api *api, json_t *j,
			       int32_t **ret_ids, size_t *ret_n,
			       struct cw_api_error *err)
{
	if (json_object_get(j, "messages"))
		return encode_messages(api, j, ret_ids, ret_n, err);
	return encode_prompt(api, j, ret_ids, ret_n, err);
}

int cw_api_gen_start(struct cw_api *api, struct cw_sched *sched, int chat,
		     const char *body, size_t len, struct cw_api_gen *g,
		     struct cw_api_error *err)
{
	struct cw_gen_params gp = { 0 };
	struct st_diag diag = { "" };
	json_error_t je;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	json_t *j;
	int r;

	memset(g, 0, sizeof(*g));
	g->chat = chat;
	if (!body || !len)
		return bad(err, NULL, "the request needs a JSON body");
	j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return fail(err, 400, "invalid_request_error", NULL, NULL,
			    "malformed JSON at line %d column %d: %s",
			    je.line, je.column, je.text);
	if (!json_is_object(j)) {
		json_decref(j);
		return bad(err, NULL, "the body must be a JSON object");
	}
	r = check_model(api, json_object_get(j, "model"), err);
	if (!r)
		r = parse_params(api, j, chat, &gp, g, err);
	if (!r)
		r = chat ? encode_messages(api, j, &ids, &n_ids, err) :
			   encode_prompt(api, j, &ids, &n_ids, err);
	if (!r) {
		r = cw_sched_submit(sched, ids, n_ids, &gp,
				    g->stream ? 64 : 1 << 30, &g->req, &diag);
		if (r == -ST_E_BUSY)
			fail(err, 429, "rate_limit_error", NULL,
			     "queue_full", "%s", diag.msg);
		else if (r == -ST_E_LIMIT)
			fail(err, 400, "invalid_request_error",
			     chat ? "messages" : "prompt",
			     "context_length_exceeded", "%s", diag.msg);
		else if (r == -EINVAL)
			fail(err, 400, "invalid_request_error", NULL, NULL,
			     "%s", diag.msg);
		else if (r < 0)
			fail(err, 503, "server_error", NULL, NULL, "%s: %s",
			     st_strerror(r), diag.msg);
		r = r < 0 ? -1 : 0;
	}
	free(ids);
	json_decref(j);
	if (r < 0)
		return -1;
	g->n_prompt = (int)n_ids;
	snprintf(g->save_name, sizeof(g->save_name), "%s", gp.session_save);
	snprintf(g->id, sizeof(g->id), "%s-%016llx%lx",
		 chat ? "chatcmpl" : "cmpl", (unsigned long long)api->id_prefix,
		 __atomic_add_fetch(&api->next_id, 1, __ATOMIC_RELAXED));
	return 0;
}

void cw_api_gen_fini(struct cw_api_gen *g)
{
	free(g->text);
	json_decref(g->lp);
	g->text = NULL;
	g->lp = NULL;
}

static const char *finish_name(enum cw_finish f)
{
	switch (f) {
	case CW_FINISH_EOS:
	case CW_FINISH_STOP:
		return "stop";
	case CW_FINISH_LENGTH:
	case CW_FINISH_CONTEXT:
		return "length";
	default:
		return NULL;
	}
}

/* A token's own text (for logprobs). */
static json_t *token_str(struct cw_api *api, int32_t id)
{
	char *t = NULL;
	json_t *s;

	if (st_tokenizer_decode(api->tok, &id, 1, 0, &t) < 0 || !t)
		return json_string("");
	s = json_string(t);
	free(t);
	return s ? s : json_string("");
}

static json_t *bytes_of(json_t *s)
{
	json_t *a = json_array();
	const unsigned char *p = (const unsigned char *)json_string_value(s);

	for (size_t i = 0; p && i < json_string_length(s); i++)
		json_array_append_new(a, json_integer(p[i]));
	return a;
}

/* Chat: one entry of logprobs.content. */
static json_t *chat_lp_entry(struct cw_api *api, const struct cw_api_gen *g,
			     const struct cw_sched_event *ev)
{
	json_t *tok = token_str(api, ev->token), *top = json_array();

	for (int i = 0; i < ev->lp.n_top && i < g->top_logprobs; i++) {
		json_t *t = token_str(api, ev->lp.top_id[i]);

		json_array_append_new(top, json_pack("{s:O,s:f,s:o}", "token",
						     t, "logprob",
						     (double)ev->lp.top_logprob[i],
						     "bytes", bytes_of(t)));
		json_decref(t);
	}
	return json_pack("{s:o,s:f,s:o,s:o}", "token", tok, "logprob",
			 (double)ev->lp.logprob, "bytes", bytes_of(tok),
			 "top_logprobs", top);
}

/* Completions: appends one token to {tokens, token_logprobs,
 * top_logprobs, text_offset}. */
static void cmpl_lp_append(struct cw_api *api, const struct cw_api_gen *g,
			   json_t *lp, const struct cw_sched_event *ev,
			   size_t offset)
{
	json_t *top = json_object();

	for (int i = 0; i < ev->lp.n_top && i < g->top_logprobs; i++) {
		json_t *t = token_str(api, ev->lp.top_id[i]);

		json_object_set_new(top, json_string_value(t),
				    json_real(ev->lp.top_logprob[i]));
		json_decref(t);
	}
	json_array_append_new(json_object_get(lp, "tokens"),
			      token_str(api, ev->token));
	json_array_append_new(json_object_get(lp, "token_logprobs"),
			      json_real(ev->lp.logprob));
	json_array_append_new(json_object_get(lp, "top_logprobs"), top);
	json_array_append_new(json_object_get(lp, "text_offset"),
			      json_integer((json_int_t)offset));
}

static json_t *new_cmpl_lp(void)
{
	return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs",
			 "top_logprobs", "text_offset");
}

/* usage, with OpenAI's prompt_tokens_details.cached_tokens: the prompt
 * rows mapped from kvd's prefix cache (a loaded session's among them). */
static json_t *usage_json(const struct cw_api_gen *g)
{
	return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens",
			 g->n_prompt, "completion_tokens", g->n_completion,
			 "total_tokens", g->n_prompt + g->n_completion,
			 "prompt_tokens_details", "cached_tokens",
			 g->n_cached);
}

/* The outcome of the request's session save (cw_sched_req_save):
 * {"name","saved":true,"rows","replaced"[,"replaced_rows"]} or
 * {"name","saved":false,"error"}; NULL when no save was asked (new
 * reference). */
static json_t *session_json(const struct cw_api_gen *g)
{
	struct cw_sched_save v;
	json_t *j;

	if (!g->save_name[0])
		return NULL;
	cw_sched_req_save(g->req, &v);
	if (v.state == 0)
		return NULL;
	if (v.state < 0)
		return json_pack("{s:s,s:b,s:s}", "name", g->save_name,
				 "saved", 0, "error", v.msg);
	j = json_pack("{s:s,s:b,s:I,s:b}", "name", g->save_name, "saved", 1,
		      "rows", (json_int_t)v.rows, "replaced",
		      v.replaced >= 0);
	if (j && v.replaced >= 0)
		json_object_set_new(j, "replaced_rows",
				    json_integer(v.replaced));
	return j;
}

/* Records the end of a generation from its last event. */
static void note_end(struct cw_api_gen *g, const struct cw_sched_event *ev)
{
	if (ev->finish == CW_FINISH_NONE)
		return;
	g->finished = 1;
	g->finish = ev->finish;
	g->err = ev->err;
	snprintf(g->err_msg, sizeof(g->err_msg), "%s", ev->err_msg);
	g->n_completion = cw_sched_req_n_generated(g->req);
	g->n_cached = cw_sched_req_n_cached(g->req);
}

static void error_of(const struct cw_api_gen *g, struct cw_api_error *e)
{
	int st = cw_session_status(g->err);

	if (!strncmp(g->err_msg, "session '", 9) && st < 500)
		/* a session named by the request: missing (404), refused
		 * (another model, store, KV dtype, page size; corrupt:
		 * 400); the message says why once */
		fail(e, st, "invalid_request_error", "session", NULL, "%s",
		     g->err_msg);
	else if (!strncmp(g->err_msg, "session '", 9))
		/* the server's fault (its session directory, kvd) */
		fail(e, st, "server_error", NULL, NULL, "%s", g->err_msg);
	else if (g->err == -ST_E_BUDGET || g->err == -ST_E_PEERGONE ||
	    g->err == -ST_E_BUSY)
		fail(e, 503, "server_error", NULL, NULL,
		     "the generation failed: %s (%s)", g->err_msg,
		     st_strerror(g->err));
	else
		fail(e, 500, "server_error", NULL, NULL,
		     "the generation failed: %s (%s)", g->err_msg,
		     st_strerror(g->err));
}

json_t *cw_api_stream_event(struct cw_api *api, struct cw_api_gen *g,
			    const struct cw_sched_event *ev)
{
	const char *fin;
	json_t *choice, *chunk, *lp = NULL;

	note_end(g, ev);
	if (g->finished && g->finish == CW_FINISH_ERROR) {
		struct cw_api_error e;

		error_of(g, &e);
		return cw_api_error_json(&e);
	}
	fin = finish_name(ev->finish);
	if (!ev->text[0] && !fin && !(g->logprobs && ev->token >= 0))
		return NULL; /* held back (stop string, split character) */
	if (g->logprobs && ev->token >= 0) {
		if (g->chat) {
			lp = json_pack("{s:[o]}", "content",
				       chat_lp_entry(api, g, ev));
		} else {
			lp = new_cmpl_lp();
			cmpl_lp_append(api, g, lp, ev, g->text_len);
		}
	}
	g->text_len += strlen(ev->text);
	if (g->chat) {
		json_t *delta = json_object();

		if (!g->sent_role) {
			json_object_set_new(delta, "role",
					    json_string("assistant"));
			g->sent_role = 1;
		}
		if (ev->text[0] || !fin)
			json_object_set_new(delta, "content",
					    json_string(ev->text));
		choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta",
				   delta, "logprobs", lp ? lp : json_null(),
				   "finish_reason", fin ? json_string(fin) :
				   json_null());
	} else {
		choice = json_pack("{s:i,s:s,s:o,s:o}", "index", 0, "text",
				   ev->text, "logprobs", lp ? lp : json_null(),
				   "finish_reason", fin ? json_string(fin) :
				   json_null());
	}
	chunk = json_pack("{s:s,s:s,s:I,s:s,s:[o]}", "id", g->id, "object",
			  g->chat ? "chat.completion.chunk" : "text_completion",
			  "created", (json_int_t)time(NULL), "model",
			  api->model_name, "choices", choice);
	if (chunk && g->include_usage)
		json_object_set_new(chunk, "usage", json_null());
	if (chunk && fin && g->save_name[0]) {
		json_t *sj = session_json(g);

		if (sj)
			json_object_set_new(chunk, "session", sj);
	}
	return chunk;
}

json_t *cw_api_stream_usage(struct cw_api *api, const struct cw_api_gen *g)
{
	if (!g->include_usage || !g->finished || g->finish == CW_FINISH_ERROR)
		return NULL;
	json_t *chunk = json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", g->id,
				  "object", g->chat ? "chat.completion.chunk" :
				  "text_completion", "created",
				  (json_int_t)time(NULL), "model",
				  api->model_name, "choices", "usage",
				  usage_json(g));
	json_t *sj = chunk ? session_json(g) : NULL;

	if (sj)
		json_object_set_new(chunk, "session", sj);
	return chunk;
}

void cw_api_collect_event(struct cw_api *api, struct cw_api_gen *g,
			  const struct cw_sched_event *ev)
{
	size_t n = strlen(ev->text);

	note_end(g, ev);
	if (g->logprobs && ev->token >= 0) {
		if (!g->lp)
			g->lp = g->chat ? json_pack("{s:[]}", "content") :
					  new_cmpl_lp();
		if (g->chat)
			json_array_append_new(json_object_get(g->lp, "content"),
					      chat_lp_entry(api, g, ev));
		else
			cmpl_lp_append(api, g, g->lp, ev, g->text_len);
	}
	if (n) {
		char *p = realloc(g->text, g->text_len + n + 1);

		if (!p)
			return;
		g->text = p;
		memcpy(g->text + g->text_len, ev->text, n + 1);
		g->text_len += n;
	}
}

int cw_api_final_json(struct cw_api *api, struct cw_api_gen *g, json_t **ret,
		      struct cw_api_error *err)
{
	const char *fin = finish_name(g->finish);
	json_t *choice, *lp;

	if (g->finish == CW_FINISH_ERROR || !fin) {
		error_of(g, err);
		return -1;
	}
	lp = g->lp ? json_incref(g->lp) : json_null();
	if (g->logprobs && !g->lp)
		lp = g->chat ? json_pack("{s:[]}", "content") : new_cmpl_lp();
	if (g->chat)
		choice = json_pack("{s:i,s:{s:s,s:s},s:o,s:s}", "index", 0,
				   "message", "role", "assistant", "content",
				   g->text ? g->text : "", "logprobs", lp,
				   "finish_reason", fin);
	else
		choice = json_pack("{s:i,s:s,s:o,s:s}", "index", 0, "text",
				   g->text ? g->text : "", "logprobs", lp,
				   "finish_reason", fin);
	*ret = json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o}", "id", g->id, "object",
			 g->chat ? "chat.completion" : "text_completion",
			 "created", (json_int_t)time(NULL), "model",
			 api->model_name, "choices", choice, "usage",
			 usage_json(g));
	if (*ret) {
		json_t *sj = session_json(g);

		if (sj)
			json_object_set_new(*ret, "session", sj);
	}
	return *ret ? 0 : -1;
}

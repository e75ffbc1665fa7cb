/* cw_chat.c — chat templates in C; see cw_chat.h.  The layouts follow the
 * families' tokenizer_config.json chat_template (Qwen2/3 ChatML without
 * tools; Mixtral-8x7B-Instruct v0.1; DeepSeek-V3). */
#include "cw_chat.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ids {
	int32_t *p;
	size_t n, cap;
};

static int ids_push(struct ids *v, const int32_t *a, size_t n)
{
	if (v->n + n > v->cap) {
		size_t cap = (v->n + n) * 2 + 16;
		int32_t *p = realloc(v->p, sizeof(*p) * cap);

		if (!p)
			return -ENOMEM;
		v->p = p;
		v->cap = cap;
	}
	memcpy(v->p + v->n, a, sizeof(*a) * n);
	v->n += n;
	return 0;
}

/* One special token of the scaffolding, by its exact string. */
static int push_special(struct ids *v, const struct st_tokenizer *tok,
			const char *name, struct st_diag *diag)
{
	int32_t id = st_tokenizer_token_id(tok, name);

	if (id < 0)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "the chat template needs the token %s, which "
				   "the vocabulary lacks; choose another "
				   "--chat-template", name);
	return ids_push(v, &id, 1);
}

/* Encodes len bytes of text (never parsed for special tokens: P3; BOS
 * and the like where add_special and the tokenizer adds them to any
 * prompt) and appends the ids. */
static int push_encoded(struct ids *v, const struct st_tokenizer *tok,
			const char *s, size_t len, int add_special,
			struct st_diag *diag)
{
	int32_t *out = NULL;
	size_t n = 0;
	int r = st_tokenizer_encode(tok, s, len, add_special, 0, &out, &n);

	if (r < 0)
		return st_diag_set(diag, r, "cannot encode a message: %s",
				   st_strerror(r));
	r = ids_push(v, out, n);
	free(out);
	return r;
}

/* Text of a segment: never parsed for special tokens (P3). */
static int push_text(struct ids *v, const struct st_tokenizer *tok,
		     const char *a, const char *b, const char *c,
		     struct st_diag *diag)
{
	size_t la = strlen(a), lb = b ? strlen(b) : 0, lc = c ? strlen(c) : 0;
	char *s = malloc(la + lb + lc + 1);
	int r;

	if (!s)
		return -ENOMEM;
	memcpy(s, a, la);
	if (b)
		memcpy(s + la, b, lb);
	if (c)
		memcpy(s + la + lb, c, lc);
	s[la + lb + lc] = 0;
	if (la + lb + lc == 0) {
		free(s);
		return 0;
	}
	r = push_encoded(v, tok, s, la + lb + lc, 0, diag);
	free(s);
	return r;
}

/*
 * Message content: ordinary text, never parsed for special tokens; and
 * where it spells one of the template's scaffolding tokens that is a
 * non-special added token (matched by any encode, as DeepSeek's
 * <｜User｜>), that spelling is encoded as two pieces of text (its first
 * byte, then the rest), so it cannot become the token (PITFALLS P3).
 */
static int push_content(struct ids *v, const struct st_tokenizer *tok,
			const char *text, const char *const *guards,
			int n_guards, struct st_diag *diag)
{
	const char *p = text;
	int r = 0;

	while (!r && *p) {
		const char *hit = NULL;
		size_t hit_len = 0;

		for (int g = 0; g < n_guards; g++) {
			int32_t id = st_tokenizer_token_id(tok, guards[g]);
			const char *h;

			/* special tokens are never matched in text encoded
			 * without parse_special: no need to split them */
			if (id < 0 || st_tokenizer_is_special(tok, id))
				continue;
			h = strstr(p, guards[g]);

			if (h && (!hit || h < hit)) {
				hit = h;
				hit_len = strlen(guards[g]);
			}
		}
		if (!hit) {
			r = push_text(v, tok, p, NULL, NULL, diag);
			break;
		}
		if (hit > p) {
			char *pre = strndup(p, (size_t)(hit - p));

			if (!pre)
				return -ENOMEM;
			r = push_text(v, tok, pre, NULL, NULL, diag);
			free(pre);
		}
		if (!r) {
			char first[2] = { hit[0], 0 };
			char *rest = strndup(hit + 1, hit_len - 1);

			if (!rest)
				return -ENOMEM;
			r = push_text(v, tok, first, NULL, NULL, diag);
			if (!r)
				r = push_text(v, tok, rest, NULL, NULL, diag);
			free(rest);
		}
		p = hit + hit_len;
	}
	return r;
}

enum cw_chat_template cw_chat_detect(const char *dir)
{
	char path[4200];
	json_t *j, *t;
	const char *s;
	enum cw_chat_template r = CW_CHAT_NONE;

	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	j = json_load_file(path, 0, NULL);
	if (!j)
		return CW_CHAT_NONE;
	t = json_object_get(j, "chat_template");
	s = json_string_value(t);
	if (s) {
		if (strstr(s, "<|im_start|>"))
			r = CW_CHAT_CHATML;
		else if (strstr(s, "[INST]"))
			r = CW_CHAT_MIXTRAL;
		else if (strstr(s, "<\xef\xbd\x9cUser\xef\xbd\x9c>"))
			r = CW_CHAT_DEEPSEEK;
	}
	json_decref(j);
	return r;
}

static const char *const k_names[] = { "none", "chatml", "mixtral",
				       "deepseek", "plain" };
#define N_TEMPLATES ((int)(sizeof(k_names) / sizeof(k_names[0])))

int cw_chat_parse(const char *name, enum cw_chat_template *ret)
{
	for (int i = 0; i < N_TEMPLATES; i++)
		if (!strcmp(name, k_names[i])) {
			*ret = (enum cw_chat_template)i;
			return 0;
		}
	return -EINVAL;
}

const char *cw_chat_name(enum cw_chat_template t)
{
	return (unsigned)t < (unsigned)N_TEMPLATES ? k_names[t] : "?";
}

static int role_of(const char *r)
{
	if (!strcmp(r, "system") || !strcmp(r, "developer"))
		return 0;
	if (!strcmp(r, "user"))
		return 1;
	if (!strcmp(r, "assistant"))
		return 2;
	return -1;
}

#define DS_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"

static int encode_chatml(const struct st_tokenizer *tok,
			 const struct cw_chat_msg *msgs, int n, struct ids *v,
			 struct st_diag *diag)
{
	static const char *const guards[2] = { "<|im_start|>", "<|im_end|>" };
	int r = 0;

	for (int i = 0; !r && i < n; i++) {
		const char *role = role_of(msgs[i].role) == 0 ? "system" :
				   msgs[i].role;

		r = push_special(v, tok, "<|im_start|>", diag);
		if (!r)
			r = push_text(v, tok, role, "\n", NULL, diag);
		if (!r)
			r = push_content(v, tok, msgs[i].content, guards, 2,
					 diag);
		if (!r)
			r = push_special(v, tok, "<|im_end|>", diag);
		if (!r)
			r = push_text(v, tok, "\n", NULL, NULL, diag);
	}
	if (!r)
		r = push_special(v, tok, "<|im_start|>", diag);
	if (!r)
		r = push_text(v, tok, "assistant\n", NULL, NULL, diag);
	return r;
}

/* "[INST] " + (system "\n\n")? + user + " [/INST]" as one text segment
 * (as the Mixtral-Instruct template renders it between its special
 * tokens), answers followed by EOS. */
static int encode_mixtral(const struct st_tokenizer *tok,
			  const struct cw_chat_msg *msgs, int n, struct ids *v,
			  struct st_diag *diag)
{
	static const char *const guards[2] = { "<s>", "</s>" };
	const char *system = NULL;
	int32_t bos = st_tokenizer_bos_id(tok), eos = st_tokenizer_eos_id(tok);
	int r = 0;

	if (bos < 0 || eos < 0)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "the [INST] template needs BOS and EOS "
				   "tokens, which tokenizer_config.json lacks");
	r = ids_push(v, &bos, 1);
	for (int i = 0; !r && i < n; i++) {
		int role = role_of(msgs[i].role);

		if (role == 0) {
			/* Mixtral has no system turn: it leads the next
			 * user message */
			system = msgs[i].content;
		} else if (role == 1) {
			size_t len = strlen(msgs[i].content) + 32 +
				     (system ? strlen(system) : 0);
			char *t = malloc(len);

			if (!t)
				return -ENOMEM;
			snprintf(t, len, "[INST] %s%s%s [/INST]",
				 system ? system : "", system ? "\n\n" : "",
				 msgs[i].content);
			system = NULL;
			r = push_content(v, tok, t, guards, 2, diag);
			free(t);
		} else {
			r = push_content(v, tok, msgs[i].content, guards, 2,
					 diag);
			if (!r)
				r = ids_push(v, &eos, 1);
		}
	}
	return r;
}

/* BOS, the system messages joined by blank lines, then <｜User｜>text and
 * <｜Assistant｜>text<｜end▁of▁sentence｜> turns, and <｜Assistant｜> (the
 * DeepSeek-V3 template without tool calls). */
static int encode_deepseek(const struct st_tokenizer *tok,
			   const struct cw_chat_msg *msgs, int n,
			   struct ids *v, struct st_diag *diag)
{
	static const char *const guards[4] = { DS_BOS, DS_EOS, DS_USER,
					       DS_ASSISTANT };
	int r = push_special(v, tok, DS_BOS, diag), first = 1;

	for (int i = 0; !r && i < n; i++) {
		if (role_of(msgs[i].role) != 0)
			continue;
		if (!first)
			r = push_text(v, tok, "\n\n", NULL, NULL, diag);
		if (!r)
			r = push_content(v, tok, msgs[i].content, guards, 4,
					 diag);
		first = 0;
	}
	for (int i = 0; !r && i < n; i++) {
		int role = role_of(msgs[i].role);

		if (role == 1) {
			r = push_special(v, tok, DS_USER, diag);
			if (!r)
				r = push_content(v, tok, msgs[i].content,
						 guards, 4, diag);
		} else if (role == 2) {
			r = push_special(v, tok, DS_ASSISTANT, diag);
			if (!r)
				r = push_content(v, tok, msgs[i].content,
						 guards, 4, diag);
			if (!r)
				r = push_special(v, tok, DS_EOS, diag);
		}
	}
	if (!r)
		r = push_special(v, tok, DS_ASSISTANT, diag);
	return r;
}

/* "System: s\n\nUser: u\n\nAssistant: a\n\n...Assistant:" encoded as one
 * text (never parsed for special tokens), with BOS where the tokenizer
 * adds one to any prompt (tokenizer_config.json add_bos_token): the
 * layout of plain-text dialogue a base model continues. */
static int encode_plain(const struct st_tokenizer *tok,
			const struct cw_chat_msg *msgs, int n, struct ids *v,
			struct st_diag *diag)
{
	static const char *const label[3] = { "System", "User", "Assistant" };
	size_t len = sizeof("Assistant:");
	char *s, *p;
	int r;

	for (int i = 0; i < n; i++)
		len += strlen(msgs[i].content) + 16;
	s = p = malloc(len);
	if (!s)
		return -ENOMEM;
	for (int i = 0; i < n; i++)
		p += sprintf(p, "%s: %s\n\n", label[role_of(msgs[i].role)],
			     msgs[i].content);
	strcpy(p, "Assistant:");
	r = push_encoded(v, tok, s, strlen(s), 1, diag);
	free(s);
	return r;
}

int cw_chat_encode(enum cw_chat_template t, const struct st_tokenizer *tok,
		   const struct cw_chat_msg *msgs, int n, int32_t **ret_ids,
		   size_t *ret_n, struct st_diag *diag)
{
	struct ids v = { 0 };
	int r;

	if (n <= 0)
		return st_diag_set(diag, -EINVAL, "messages must not be empty");
	for (int i = 0; i < n; i++)
		if (role_of(msgs[i].role) < 0)
			return st_diag_set(diag, -EINVAL,
					   "messages[%d].role '%s' is not "
					   "system, user or assistant", i,
					   msgs[i].role);
	switch (t) {
	case CW_CHAT_CHATML:
		r = encode_chatml(tok, msgs, n, &v, diag);
		break;
	case CW_CHAT_MIXTRAL:
		r = encode_mixtral(tok, msgs, n, &v, diag);
		break;
	case CW_CHAT_DEEPSEEK:
		r = encode_deepseek(tok, msgs, n, &v, diag);
		break;
	case CW_CHAT_PLAIN:
		r = encode_plain(tok, msgs, n, &v, diag);
		break;
	default:
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "this model has no chat template that "
				   "strata knows (tokenizer_config.json "
				   "chat_template); use /v1/completions, or "
				   "start computed with --chat-template "
				   "chatml|mixtral|deepseek|plain");
	}
	if (r < 0) {
		free(v.p);
		return r;
	}
	*ret_ids = v.p;
	*ret_n = v.n;
	return 0;
}

int cw_chat_check(enum cw_chat_template t, const struct st_tokenizer *tok,
		  struct st_diag *diag)
{
	/* every role, and an answer followed by another turn: each piece of
	 * scaffolding a template has is rendered at least once */
	static const struct cw_chat_msg probe[4] = {
		{ "system", "s" }, { "user", "u" }, { "assistant", "a" },
		{ "user", "v" },
	};
	int32_t *ids = NULL;
	size_t n = 0;
	int r;

	if (t == CW_CHAT_NONE)
		return 0;
	r = cw_chat_encode(t, tok, probe, 4, &ids, &n, diag);
	free(ids);
	return r;
}

int cw_chat_resolve(const char *dir, const char *name,
		    const struct st_tokenizer *tok,
		    enum cw_chat_template *ret, char *ret_note,
		    size_t note_cap, struct st_diag *diag)
{
	enum cw_chat_template t;
	struct st_diag d = { "" };
	int r;

	ret_note[0] = 0;
	if (name && name[0] && strcmp(name, "auto")) {
		if (cw_chat_parse(name, &t) < 0)
			return st_diag_set(diag, -EINVAL, "--chat-template must "
					   "be chatml, mixtral, deepseek, "
					   "plain or none, not '%s'", name);
		r = cw_chat_check(t, tok, &d);
		if (r < 0)
			return st_diag_set(diag, r, "--chat-template %s cannot "
					   "be used with this model: %s "
					   "(--chat-template plain needs no "
					   "special token)", name, d.msg);
		*ret = t;
		return 0;
	}
	t = cw_chat_detect(dir);
	if (t == CW_CHAT_NONE) {
		snprintf(ret_note, note_cap, "tokenizer_config.json has no "
			 "chat template strata knows: chat uses the plain "
			 "template (User: / Assistant: text)");
		*ret = CW_CHAT_PLAIN;
		return 0;
	}
	if (cw_chat_check(t, tok, &d) < 0) {
		snprintf(ret_note, note_cap, "tokenizer_config.json's chat "
			 "template (%s) cannot be used: %s; chat uses the plain "
			 "template (User: / Assistant: text)", cw_chat_name(t),
			 d.msg);
		*ret = CW_CHAT_PLAIN;
		return 0;
	}
	*ret = t;
	return 0;
}

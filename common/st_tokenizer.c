/*
 * st_tokenizer.c — loading a checkpoint's tokenizer.json and
 * tokenizer_config.json, and encoding text (see st_tokenizer.h).
 *
 * Encoding follows HF `tokenizers` (tokenizer/mod.rs, added_vocabulary.rs):
 *  1. invalid UTF-8 in the input is replaced by U+FFFD;
 *  2. added tokens with normalized = false are cut out of the raw text,
 *     leftmost first and longest at a position (special ones only when
 *     parse_special; non-special added tokens always, as HF and llama.cpp
 *     do), with their lstrip / rstrip / single_word rules;
 *  3. each text segment between them is normalized on its own (so a
 *     Prepend normalizer puts its "▁" after every special token too),
 *     added tokens with normalized = true are cut out of the result, and
 *     each remaining part is pre-tokenized into words;
 *  4. each word goes through the BPE model;
 *  5. add_special adds BOS / EOS as tokenizer_config.json's add_bos_token /
 *     add_eos_token say (transformers rebuilds the template from them), or,
 *     when the config has neither flag, as the post_processor's
 *     TemplateProcessing (or Roberta / Bert processing) says.
 */
#include "st_tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "st_tokenizer_int.h"
#include "st_util.h"

/* ---- loading ----------------------------------------------------------- */

static int load_json(const char *path, size_t flags, json_t **ret,
		     struct st_diag *diag)
{
	json_error_t err;
	char *buf;
	size_t len;
	int r = st_read_file(path, &buf, &len);

	if (r)
		return st_diag_set(diag, r, "%s: %s", path, st_strerror(r));
	*ret = json_loadb(buf, len, flags, &err);
	free(buf);
	if (!*ret || !json_is_object(*ret)) {
		json_decref(*ret);
		*ret = NULL;
		return st_diag_set(diag, -ST_E_TOKENIZER,
				   "%s: line %d: %s", path, err.line,
				   *err.text ? err.text : "not a JSON object");
	}
	return 0;
}

static int cmp_added(const void *a, const void *b)
{
	const struct stk_added *x = a, *y = b;
	uint8_t fx = (uint8_t)x->content[0], fy = (uint8_t)y->content[0];

	if (fx != fy)
		return fx < fy ? -1 : 1;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;        /* longest first */
	return x->id < y->id ? -1 : x->id > y->id;
}

static int load_added(struct st_tokenizer *t, json_t *list,
		      struct st_diag *diag)
{
	json_t *e;
	size_t i;

	if (!list || json_is_null(list))
		return 0;
	if (!json_is_array(list))
		return st_diag_set(diag, -ST_E_TOKENIZER,
				   "tokenizer.json: added_tokens is not a list");
	t->added = calloc(json_array_size(list) + 1, sizeof(*t->added));
	if (!t->added)
		return -ENOMEM;
	json_array_foreach(list, i, e) {
		struct stk_added *a = &t->added[t->n_added];
		json_t *c = json_object_get(e, "content");
		json_int_t id = json_integer_value(json_object_get(e, "id"));

		if (!json_is_string(c) || !json_string_length(c) ||
		    !json_is_integer(json_object_get(e, "id")) || id < 0 ||
		    id >= STK_MAX_ID)
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: added token %zu "
					   "has no content or id", i);
		a->len = json_string_length(c);
		a->content = malloc(a->len + 1);
		if (!a->content)
			return -ENOMEM;
		memcpy(a->content, json_string_value(c), a->len + 1);
		a->id = (int32_t)id;
		a->special = json_is_true(json_object_get(e, "special"));
		a->lstrip = json_is_true(json_object_get(e, "lstrip"));
		a->rstrip = json_is_true(json_object_get(e, "rstrip"));
		a->single_word = json_is_true(json_object_get(e,
							      "single_word"));
		/* HF's default: special tokens are not normalized */
		a->normalized = json_is_boolean(json_object_get(e, "normalized"))
				? json_is_true(json_object_get(e, "normalized"))
				: !a->special;
		t->n_added++;
	}
	qsort(t->added, (size_t)t->n_added, sizeof(*t->added), cmp_added);
	for (int k = 0; k <= 256; k++)
		t->added_first[k] = t->n_added;
	for (int k = t->n_added - 1; k >= 0; k--)
		t->added_first[(uint8_t)t->added[k].content[0]] = k;
	return 0;
}

static int set_id_str(struct st_tokenizer *t, int32_t id, const char *s,
		      size_t len)
{
	size_t off = t->id_arena.len;
	int r;

	if (off + len >= UINT32_MAX)
		return -ENOMEM;
	if ((r = stk_buf_put(&t->id_arena, s, len)))
		return r;
	t->id_off[id] = (uint32_t)off;
	t->id_len[id] = (uint32_t)len;
	return 0;
}

/* The id -> string table over the vocabulary and the added tokens. */
static int build_id_table(struct st_tokenizer *t)
{
	const struct stk_strmap *v = &t->bpe.vocab;
	int32_t max_id = t->bpe.max_id;
	int r;

	for (int i = 0; i < t->n_added; i++)
		if (t->added[i].id > max_id)
			max_id = t->added[i].id;
	t->n_ids = max_id + 1;
	t->id_off = calloc((size_t)t->n_ids + 1, sizeof(*t->id_off));
	t->id_len = malloc(((size_t)t->n_ids + 1) * sizeof(*t->id_len));
	t->id_special = calloc((size_t)t->n_ids + 1, 1);
	if (!t->id_off || !t->id_len || !t->id_special)
		return -ENOMEM;
	for (int32_t i = 0; i < t->n_ids; i++)
		t->id_len[i] = UINT32_MAX;
	for (size_t i = 0; i < v->cap; i++) {
		const struct stk_strmap_slot *s = &v->slots[i];

		if (s->len == UINT32_MAX)
			continue;
		if ((r = set_id_str(t, s->val, v->arena.p + s->off, s->len)))
			return r;
	}
	for (int i = 0; i < t->n_added; i++) {
		const struct stk_added *a = &t->added[i];

		if ((r = set_id_str(t, a->id, a->content, a->len)))
			return r;
		t->id_special[a->id] = (uint8_t)a->special;
	}
	return 0;
}

static int push_id(int32_t **list, int *n, int32_t id)
{
	int32_t *p = realloc(*list, (size_t)(*n + 1) * sizeof(*p));

	if (!p)
		return -ENOMEM;
	p[(*n)++] = id;
	*list = p;
	return 0;
}

/* ["<s>", 1] of Roberta/Bert processing: the id */
static int32_t pair_id(json_t *pair)
{
	json_int_t id = json_integer_value(json_array_get(pair, 1));

	return json_is_integer(json_array_get(pair, 1)) && id >= 0 &&
	       id < INT32_MAX ? (int32_t)id : -1;
}

static int load_post(struct st_tokenizer *t, json_t *pp, struct st_diag *diag)
{
	const char *type = json_string_value(json_object_get(pp, "type"));
	int r;

	if (!pp || json_is_null(pp))
		return 0;
	if (!type)
		type = "";
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(pp, "processors"), *e;
		size_t i;

		json_array_foreach(list, i, e)
			if ((r = load_post(t, e, diag)))
				return r;
		return 0;
	}
	if (!strcmp(type, "ByteLevel"))
		return 0;       /* offsets only */
	if (!strcmp(type, "RobertaProcessing") ||
	    !strcmp(type, "BertProcessing")) {
		int32_t cls = pair_id(json_object_get(pp, "cls"));
		int32_t sep = pair_id(json_object_get(pp, "sep"));

		if ((cls >= 0 && (r = push_id(&t->prefix_ids, &t->n_prefix,
					      cls))) ||
		    (sep >= 0 && (r = push_id(&t->suffix_ids, &t->n_suffix,
					      sep))))
			return r;
		return 0;
	}
	if (!strcmp(type, "TemplateProcessing")) {
		json_t *single = json_object_get(pp, "single"), *item;
		json_t *specials = json_object_get(pp, "special_tokens");
		int seen_seq = 0;
		size_t i;

		json_array_foreach(single, i, item) {
			json_t *sp = json_object_get(item, "SpecialToken");
			const char *name;
			json_t *ids, *v;
			size_t k;

			if (json_object_get(item, "Sequence")) {
				seen_seq = 1;
				continue;
			}
			name = json_string_value(json_object_get(sp, "id"));
			ids = json_object_get(json_object_get(specials,
						name ? name : ""), "ids");
			if (!name || !json_is_array(ids))
				return st_diag_set(diag, -ST_E_TOKENIZER,
						   "tokenizer.json: template "
						   "item %zu names no known "
						   "special token", i);
			json_array_foreach(ids, k, v) {
				json_int_t id = json_integer_value(v);

				if (!json_is_integer(v) || id < 0 ||
				    id >= STK_MAX_ID)
					return -ST_E_TOKENIZER;
				r = seen_seq ? push_id(&t->suffix_ids,
						       &t->n_suffix,
						       (int32_t)id)
					     : push_id(&t->prefix_ids,
						       &t->n_prefix,
						       (int32_t)id);
				if (r)
					return r;
			}
		}
		return 0;
	}
	return st_diag_set(diag, -ST_E_TOKENIZER,
			   "tokenizer.json: post_processor type \"%s\" is not "
			   "supported", type);
}

/* bos_token / eos_token as a string or {"content": ...}; -1 when absent */
static int32_t config_token(const struct st_tokenizer *t, json_t *v)
{
	const char *s = json_string_value(v);

	if (!s)
		s = json_string_value(json_object_get(v, "content"));
	return s ? st_tokenizer_token_id(t, s) : -1;
}

static int load_config(struct st_tokenizer *t, const char *dir,
		       struct st_diag *diag)
{
	char path[4096];
	json_t *cfg = NULL, *abos, *aeos;
	int r;

	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	t->bos_id = t->n_prefix ? t->prefix_ids[0] : -1;
	t->eos_id = -1;
	if (!st_path_exists(path))
		return 0;       /* optional */
	/* model_max_length is often 1e30, beyond json_int_t: no integer
	 * of this file is used, so every number is read as a real */
	if ((r = load_json(path, JSON_DECODE_INT_AS_REAL, &cfg, diag)))
		return r;
	if (json_object_get(cfg, "bos_token"))
		t->bos_id = config_token(t, json_object_get(cfg, "bos_token"));
	t->eos_id = config_token(t, json_object_get(cfg, "eos_token"));
	abos = json_object_get(cfg, "add_bos_token");
	aeos = json_object_get(cfg, "add_eos_token");
	if (json_is_boolean(abos) || json_is_boolean(aeos)) {
		/* the config's flags replace the template (transformers'
		 * update_post_processor does the same) */
		t->n_prefix = t->n_suffix = 0;
		if (json_is_true(abos) && t->bos_id >= 0)
			r = push_id(&t->prefix_ids, &t->n_prefix, t->bos_id);
		if (!r && json_is_true(aeos) && t->eos_id >= 0)
			r = push_id(&t->suffix_ids, &t->n_suffix, t->eos_id);
	}
	json_decref(cfg);
	return r;
}

int st_tokenizer_load(const char *dir, struct st_tokenizer **ret,
		      struct st_diag *diag)
{
	char path[4096];
	struct st_tokenizer *t;
	json_t *js = NULL, *model;
	int r;

	if (!dir || !ret)
		return -EINVAL;
	*ret = NULL;
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	if ((r = load_json(path, 0, &js, diag)))
		return r;
	t = calloc(1, sizeof(*t));
	if (!t) {
		json_decref(js);
		return -ENOMEM;
	}
	model = json_object_get(js, "model");
	if (!json_is_object(model)) {
		r = st_diag_set(diag, -ST_E_TOKENIZER,
				"%s: no model object", path);
		goto fail;
	}
	if ((r = stk_bpe_load(&t->bpe, model, diag)) ||
	    (r = stk_text_load(&t->text, json_object_get(js, "normalizer"),
			       json_object_get(js, "pre_tokenizer"), diag)) ||
	    (r = stk_decoder_load(&t->dec, json_object_get(js, "decoder"),
				  diag)) ||
	    (r = load_added(t, json_object_get(js, "added_tokens"), diag)) ||
	    (r = build_id_table(t)) ||
	    (r = load_post(t, json_object_get(js, "post_processor"), diag)) ||
	    (r = load_config(t, dir, diag)))
		goto fail;
	for (int i = 0; i < t->n_prefix; i++)
		if (t->prefix_ids[i] >= t->n_ids)
			r = -ST_E_TOKENIZER;
	for (int i = 0; i < t->n_suffix; i++)
		if (t->suffix_ids[i] >= t->n_ids)
			r = -ST_E_TOKENIZER;
	if (r) {
		st_diag_set(diag, r, "%s: post-processor id out of range", path);
		goto fail;
	}
	json_decref(js);
	*ret = t;
	return 0;
fail:
	if (r == -ENOMEM)
		st_diag_set(diag, r, "%s: out of memory", path);
	json_decref(js);
	st_tokenizer_free(t);
	return r;
}

void st_tokenizer_free(struct st_tokenizer *t)
{
	if (!t)
		return;
	stk_bpe_free(&t->bpe);
	stk_text_free(&t->text);
	stk_decoder_free(&t->dec);
	for (int i = 0; i < t->n_added; i++)
		free(t->added[i].content);
	free(t->added);
	free(t->id_off);
	free(t->id_len);
	free(t->id_special);
	stk_buf_free(&t->id_arena);
	free(t->prefix_ids);
	free(t->suffix_ids);
	free(t);
}

/* ---- accessors --------------------------------------------------------- */

int st_tokenizer_n_vocab(const struct st_tokenizer *t)
{
	return t ? t->n_ids : 0;
}

int st_tokenizer_bos_id(const struct st_tokenizer *t)
{
	return t ? t->bos_id : -1;
}

int st_tokenizer_eos_id(const struct st_tokenizer *t)
{
	return t ? t->eos_id : -1;
}

int st_tokenizer_token_id(const struct st_tokenizer *t, const char *token)
{
	size_t len;

	if (!t || !token)
		return -1;
	len = strlen(token);
	for (int i = 0; i < t->n_added; i++)
		if (t->added[i].len == len &&
		    !memcmp(t->added[i].content, token, len))
			return t->added[i].id;
	return stk_strmap_get(&t->bpe.vocab, token, len);
}

int st_tokenizer_is_special(const struct st_tokenizer *t, int32_t id)
{
	return t && id >= 0 && id < t->n_ids && t->id_special[id];
}

/* ---- added tokens ------------------------------------------------------ */

/* Unicode \w (UTS #18, Rust regex's \w, which HF's single_word uses):
 * letters, marks, decimal and letter numbers, connector punctuation. */
static int is_word_char(uint32_t cp)
{
	utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);

	return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_ME) ||
	       c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL ||
	       c == UTF8PROC_CATEGORY_PC;
}

/* Start of the character that ends at s[end] (exclusive), > from. */
static size_t char_before(const char *s, size_t from, size_t end,
			  uint32_t *cp)
{
	size_t st = end - 1;

	while (st > from && ((uint8_t)s[st] & 0xC0) == 0x80)
		st--;
	stk_utf8_get(s + st, end - st, cp);
	return st;
}

/*
 * Finds the first added token in s[from, len) that this pass may match:
 * normalized tokens on normalized text (pass 1) or raw ones on raw text
 * (pass 0); special ones only when parse_special.  On a match returns 1 with
 * [*ms, *me) the span to replace, lstrip/rstrip whitespace included.
 */
static int find_added(const struct st_tokenizer *t, const char *s, size_t len,
		      size_t from, int normalized, int parse_special,
		      size_t *ms, size_t *me, int32_t *id)
{
	for (size_t i = from; i < len; i++) {
		uint8_t c = (uint8_t)s[i];

		for (int k = t->added_first[c];
		     k < t->n_added && (uint8_t)t->added[k].content[0] == c;
		     k++) {
			const struct stk_added *a = &t->added[k];
			size_t st = i, en = i + a->len;
			uint32_t cp;

			if (a->normalized != normalized ||
			    (a->special && !parse_special) || a->len > len - i ||
			    memcmp(s + i, a->content, a->len))
				continue;
			if (a->single_word &&
			    ((i > from &&
			      (char_before(s, from, i, &cp), is_word_char(cp))) ||
			     (en < len && (stk_utf8_get(s + en, len - en, &cp),
					   is_word_char(cp)))))
				continue;
			while (a->lstrip && st > from) {
				size_t b = char_before(s, from, st, &cp);

				if (!stk_is_space(cp))
					break;
				st = b;
			}
			while (a->rstrip && en < len) {
				size_t l = stk_utf8_get(s + en, len - en, &cp);

				if (!stk_is_space(cp))
					break;
				en += l;
			}
			*ms = st;
			*me = en;
			*id = a->id;
			return 1;
		}
	}
	return 0;
}

/* ---- encoding ---------------------------------------------------------- */

struct enc {
	const struct st_tokenizer *t;
	int parse_special;
	struct stk_ids ids;
	struct stk_pieces pieces;
};

/* Pre-tokenizes and BPE-encodes one normalized part. */
static int encode_part(struct enc *e, const char *s, size_t len, int first)
{
	int r;

	if (!len)
		return 0;
	if ((r = stk_text_pretokenize(&e->t->text, s, len, first, &e->pieces)))
		return r;
	for (size_t i = 0; i < e->pieces.n; i++)
		if ((r = stk_bpe_word(&e->t->bpe,
				      e->pieces.text.p + e->pieces.p[i].off,
				      e->pieces.p[i].len, &e->ids)))
			return r;
	return 0;
}

/* One raw text segment between non-normalized added tokens. */
static int encode_segment(struct enc *e, const char *s, size_t len, int first)
{
	struct stk_buf n = { 0 };
	size_t pos = 0, ms, me;
	int32_t id;
	int r;

	if (!len)
		return 0;
	if ((r = stk_text_normalize(&e->t->text, s, len, &n)))
		goto out;
	while (find_added(e->t, n.p, n.len, pos, 1, e->parse_special, &ms,
			  &me, &id)) {
		if ((r = encode_part(e, n.p + pos, ms - pos, first && pos == 0)) ||
		    (r = stk_ids_push(&e->ids, id)))
			goto out;
		pos = me;
	}
	r = encode_part(e, n.p + pos, n.len - pos, first && pos == 0);
out:
	stk_buf_free(&n);
	return r;
}

int st_tokenizer_encode(const struct st_tokenizer *t, const char *text,
			size_t len, int add_special, int parse_special,
			int32_t **ret_ids, size_t *ret_n)
{
	struct enc e = { .t = t, .parse_special = parse_special };
	struct stk_buf clean = { 0 };
	size_t pos = 0, ms, me;
	int32_t id;
	int r;

	if (!t || !ret_ids || !ret_n || (len && !text))
		return -EINVAL;
	*ret_ids = NULL;
	*ret_n = 0;
	if ((r = stk_utf8_sanitize(text ? text : "", len, &clean)))
		goto out;
	for (int i = 0; add_special && i < t->n_prefix; i++)
		if ((r = stk_ids_push(&e.ids, t->prefix_ids[i])))
			goto out;
	while (find_added(t, clean.p, clean.len, pos, 0, parse_special, &ms,
			  &me, &id)) {
		if ((r = encode_segment(&e, clean.p + pos, ms - pos, pos == 0)) ||
		    (r = stk_ids_push(&e.ids, id)))
			goto out;
		pos = me;
	}
	if ((r = encode_segment(&e, clean.p + pos, clean.len - pos, pos == 0)))
		goto out;
	for (int i = 0; add_special && i < t->n_suffix; i++)
		if ((r = stk_ids_push(&e.ids, t->suffix_ids[i])))
			goto out;
	if (!e.ids.p && (r = stk_ids_push(&e.ids, 0)) == 0)
		e.ids.n = 0;    /* always hand back an allocation */
out:
	stk_buf_free(&clean);
	stk_pieces_free(&e.pieces);
	if (r) {
		free(e.ids.p);
		return r;
	}
	*ret_ids = e.ids.p;
	*ret_n = e.ids.n;
	return 0;
}

/*
 * st_tokenizer_bpe.c — the BPE model of a tokenizer.json (HF
 * models/bpe/model.rs and word.rs).
 *
 * A word (one pre-token) starts as one symbol per character (vocabulary
 * lookup; characters missing from the vocabulary become <0xXX> byte tokens
 * with byte_fallback, else the unk token, fused when fuse_unk), then the
 * adjacent pair with the lowest merge rank is merged, leftmost first on a
 * tie, until no pair merges.  The pairs wait in a heap keyed by
 * (rank, position) (st_tokenizer_heap.h) over a doubly linked list of
 * symbols, so a word of n symbols costs O(n log n); entries made stale by
 * an earlier merge are skipped when popped, exactly as HF's
 * Word::merge_all does (which matters: the order of merges decides the
 * result).
 */
#include "st_tokenizer_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_tokenizer_heap.h"
#include "st_util.h"

static char *opt_str(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_string(v) || json_string_length(v) == 0)
		return NULL;
	return strdup(json_string_value(v));
}

static int load_merges(struct stk_bpe *m, json_t *merges, struct st_diag *diag)
{
	size_t pl = m->cont_prefix ? strlen(m->cont_prefix) : 0;
	struct stk_buf cat = { 0 };
	json_t *e;
	size_t i;
	int r = 0;

	if ((r = stk_pairmap_init(&m->merges, json_array_size(merges))))
		return r;
	json_array_foreach(merges, i, e) {
		const char *a, *b;
		size_t al, bl;
		int32_t ia, ib, in;

		if (json_is_string(e)) {
			const char *s = json_string_value(e);
			const char *sp = strchr(s, ' ');

			if (!sp) {
				r = st_diag_set(diag, -ST_E_TOKENIZER,
						"tokenizer.json: merge %zu \"%s\" "
						"is not \"a b\"", i, s);
				break;
			}
			a = s;
			al = (size_t)(sp - s);
			b = sp + 1;
			bl = json_string_length(e) - al - 1;
		} else if (json_is_array(e) && json_array_size(e) == 2 &&
			   json_is_string(json_array_get(e, 0)) &&
			   json_is_string(json_array_get(e, 1))) {
			a = json_string_value(json_array_get(e, 0));
			al = json_string_length(json_array_get(e, 0));
			b = json_string_value(json_array_get(e, 1));
			bl = json_string_length(json_array_get(e, 1));
		} else {
			r = st_diag_set(diag, -ST_E_TOKENIZER,
					"tokenizer.json: merge %zu is neither "
					"\"a b\" nor [a, b]", i);
			break;
		}
		ia = stk_strmap_get(&m->vocab, a, al);
		ib = stk_strmap_get(&m->vocab, b, bl);
		/* the merged token: a + b without b's continuing prefix */
		cat.len = 0;
		if ((r = stk_buf_put(&cat, a, al)) ||
		    (r = stk_buf_put(&cat, b + (bl >= pl ? pl : bl),
				     bl >= pl ? bl - pl : 0)))
			break;
		in = stk_strmap_get(&m->vocab, cat.p, cat.len);
		if (ia < 0 || ib < 0 || in < 0) {
			r = st_diag_set(diag, -ST_E_TOKENIZER,
					"tokenizer.json: merge %zu (\"%.*s\" "
					"\"%.*s\") uses a token missing from "
					"the vocabulary", i, (int)ST_MIN(al, 64),
					a, (int)ST_MIN(bl, 64), b);
			break;
		}
		if ((r = stk_pairmap_put(&m->merges, ia, ib, (uint32_t)i, in)))
			break;
	}
	stk_buf_free(&cat);
	return r;
}

int stk_bpe_load(struct stk_bpe *m, json_t *model, struct st_diag *diag)
{
	json_t *vocab = json_object_get(model, "vocab");
	json_t *merges = json_object_get(model, "merges");
	const char *type = json_string_value(json_object_get(model, "type"));
	const char *key;
	json_t *val;
	char *unk;
	int r;

	memset(m, 0, sizeof(*m));
	m->unk_id = -1;
	m->max_id = -1;
	if (type && strcmp(type, "BPE"))
		return st_diag_set(diag, -ST_E_TOKENIZER,
				   "tokenizer.json: model type \"%s\" is not "
				   "supported (BPE only)", type);
	if (!json_is_object(vocab) || (merges && !json_is_array(merges)))
		return st_diag_set(diag, -ST_E_TOKENIZER,
				   "tokenizer.json: BPE model without a vocab "
				   "object or merges list");
	m->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
	m->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
	m->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
	m->cont_prefix = opt_str(model, "continuing_subword_prefix");
	m->eow_suffix = opt_str(model, "end_of_word_suffix");
	if ((r = stk_strmap_init(&m->vocab, json_object_size(vocab))))
		return r;
	json_object_foreach(vocab, key, val) {
		json_int_t id = json_integer_value(val);

		if (!json_is_integer(val) || id < 0 || id >= STK_MAX_ID)
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: vocab entry \"%.64s\""
					   " has no valid id", key);
		/* jansson object keys are NUL-terminated, never hold NUL */
		if ((r = stk_strmap_put(&m->vocab, key, strlen(key),
					(int32_t)id)))
			return r;
		if (id > m->max_id)
			m->max_id = (int32_t)id;
	}
	if (merges && (r = load_merges(m, merges, diag)))
		return r;
	unk = opt_str(model, "unk_token");
	if (unk) {
		m->unk_id = stk_strmap_get(&m->vocab, unk, strlen(unk));
		free(unk);
	}
	for (int b = 0; b < 256; b++) {
		char name[8];

		snprintf(name, sizeof(name), "<0x%02X>", b);
		m->byte_ids[b] = stk_strmap_get(&m->vocab, name, 6);
	}
	for (uint32_t cp = 0; cp < STK_CHAR_IDS; cp++) {
		char c[4];

		m->char_ids[cp] = stk_strmap_get(&m->vocab, c,
						 stk_utf8_put(cp, c));
	}
	return 0;
}

void stk_bpe_free(struct stk_bpe *m)
{
	stk_strmap_free(&m->vocab);
	stk_pairmap_free(&m->merges);
	free(m->cont_prefix);
	free(m->eow_suffix);
	memset(m, 0, sizeof(*m));
}

/* ---- merging one word -------------------------------------------------- */

struct sym {
	int32_t id;             /* -1: merged into its left neighbour */
	int32_t prev, next;
};

struct word {
	struct sym *s;
	size_t n, cap;
	struct sym *s_local;    /* on the caller's stack: never realloc'd */
	struct stk_heap h;      /* merge candidates (st_tokenizer_heap.h) */
};

static int word_add(struct word *w, int32_t id)
{
	if (w->n == w->cap) {
		size_t c = w->cap * 2;
		struct sym *s = w->s == w->s_local ? malloc(c * sizeof(*s)) :
			realloc(w->s, c * sizeof(*s));

		if (!s)
			return -ENOMEM;
		if (w->s == w->s_local)
			memcpy(s, w->s, w->n * sizeof(*s));
		w->s = s;
		w->cap = c;
	}
	w->s[w->n].id = id;
	w->s[w->n].prev = (int32_t)w->n - 1;
	w->s[w->n].next = -1;
	if (w->n)
		w->s[w->n - 1].next = (int32_t)w->n;
	w->n++;
	return 0;
}

/* The merge candidate of the pair starting at symbol pos: 1 with *key and
 * *nid set, or 0 when there is no pair there or it does not merge. */
static int pair_cand(const struct stk_bpe *m, const struct word *w,
		     int32_t pos, uint64_t *key, int32_t *nid)
{
	uint32_t rank;
	int32_t nx = w->s[pos].next;

	if (nx < 0 ||
	    !stk_pairmap_get(&m->merges, w->s[pos].id, w->s[nx].id, &rank, nid))
		return 0;
	*key = (uint64_t)rank << 32 | (uint32_t)pos;
	return 1;
}

static int merge_all(const struct stk_bpe *m, struct word *w)
{
	uint64_t key;
	int32_t nid;
	int r;

	for (size_t i = 0; i + 1 < w->n; i++)
		if (pair_cand(m, w, (int32_t)i, &key, &nid) &&
		    (r = stk_heap_append(&w->h, key, nid)))
			return r;
	stk_heap_make(&w->h);
	while (w->h.n) {
		struct stk_cand top = w->h.p[0];
		int32_t pos = (int32_t)(uint32_t)top.key;
		struct sym *a = &w->s[pos];
		uint32_t rank;
		int32_t nx = a->next;
		int queued = 0;

		/* stale entry: the pair at pos changed since it was queued
		 * (HF compares the new ids, not the ranks: keep that) */
		if (a->id < 0 || nx < 0 ||
		    !stk_pairmap_get(&m->merges, a->id, w->s[nx].id, &rank,
				     &nid) || nid != top.new_id) {
			stk_heap_pop(&w->h);
			continue;
		}
		a->id = top.new_id;
		a->next = w->s[nx].next;
		if (a->next >= 0)
			w->s[a->next].prev = pos;
		w->s[nx].id = -1;
		/* the new pairs with both neighbours: the first takes the
		 * popped entry's place */
		if (a->prev >= 0 && pair_cand(m, w, a->prev, &key, &nid)) {
			stk_heap_replace_top(&w->h, key, nid);
			queued = 1;
		}
		if (pair_cand(m, w, pos, &key, &nid)) {
			if (!queued)
				stk_heap_replace_top(&w->h, key, nid);
			else if ((r = stk_heap_push(&w->h, key, nid)))
				return r;
			queued = 1;
		}
		if (!queued)
			stk_heap_pop(&w->h);
	}
	return 0;
}

/* Looks up one character, code point cp encoded as c[0..l) (with the
 * word's prefix/suffix rules). */
static int32_t char_id(const struct stk_bpe *m, const char *c, size_t l,
		       uint32_t cp, int first, int last, struct stk_buf *tmp)
{
	int r;

	if ((first || !m->cont_prefix) && (!last || !m->eow_suffix)) {
		/* l checks that c is cp's own encoding (not a replaced
		 * invalid byte) */
		if (cp < STK_CHAR_IDS && l == (cp < 0x80 ? 1u : 2u))
			return m->char_ids[cp];
		return stk_strmap_get(&m->vocab, c, l);
	}
	tmp->len = 0;
	if ((!first && m->cont_prefix &&
	     (r = stk_buf_put(tmp, m->cont_prefix, strlen(m->cont_prefix)))) ||
	    (r = stk_buf_put(tmp, c, l)) ||
	    (last && m->eow_suffix &&
	     (r = stk_buf_put(tmp, m->eow_suffix, strlen(m->eow_suffix)))))
		return r;
	return stk_strmap_get(&m->vocab, tmp->p, tmp->len);
}

/* Byte fallback for one character: its bytes as <0xXX> tokens, if all exist */
static int add_bytes(const struct stk_bpe *m, struct word *w, const char *c,
		     size_t l, int first, int last)
{
	const char *pre = !first && m->cont_prefix ? m->cont_prefix : "";
	const char *suf = last && m->eow_suffix ? m->eow_suffix : "";
	const char *parts[3] = { pre, c, suf };
	size_t lens[3] = { strlen(pre), l, strlen(suf) };
	int r;

	for (int k = 0; k < 3; k++)
		for (size_t j = 0; j < lens[k]; j++)
			if (m->byte_ids[(uint8_t)parts[k][j]] < 0)
				return 0;
	for (int k = 0; k < 3; k++)
		for (size_t j = 0; j < lens[k]; j++)
			if ((r = word_add(w, m->byte_ids[(uint8_t)parts[k][j]])))
				return r;
	return 1;
}

int stk_bpe_word(const struct stk_bpe *m, const char *wd, size_t len,
		 struct stk_ids *out)
{
	struct sym s_local[64];
	struct stk_cand h_local[128];
	struct word w = { s_local, 0, 64, s_local, { 0 } };
	struct stk_buf tmp = { 0 };
	int32_t unk = -1;       /* pending (possibly fused) unk */
	size_t i = 0;
	int r = 0;

	if (!len)
		return 0;
	stk_heap_init_local(&w.h, h_local, 128);
	if (m->ignore_merges) {
		int32_t id = stk_strmap_get(&m->vocab, wd, len);

		if (id >= 0)
			return stk_ids_push(out, id);
	}
	while (i < len) {
		uint32_t cp;
		size_t l = stk_utf8_get(wd + i, len - i, &cp);
		int first = i == 0, last = i + l >= len;
		int32_t id = char_id(m, wd + i, l, cp, first, last, &tmp);

		i += l;
		if (id < -1) {
			r = id;
			goto out;
		}
		if (id >= 0) {
			if (unk >= 0 && (r = word_add(&w, unk)))
				goto out;
			unk = -1;
			if ((r = word_add(&w, id)))
				goto out;
			continue;
		}
		if (m->byte_fallback) {
			r = add_bytes(m, &w, wd + i - l, l, first, last);
			if (r < 0)
				goto out;
			if (r == 1) {
				r = 0;
				continue;
			}
		}
		/* unknown character: the unk token (fused runs are one) */
		if (m->unk_id < 0)
			continue;
		if (unk >= 0 && !m->fuse_unk && (r = word_add(&w, unk)))
			goto out;
		unk = m->unk_id;
	}
	if (unk >= 0 && (r = word_add(&w, unk)))
		goto out;
	if ((r = merge_all(m, &w)))
		goto out;
	for (size_t k = 0; k < w.n; k = (size_t)w.s[k].next) {
		if ((r = stk_ids_push(out, w.s[k].id)))
			goto out;
		if (w.s[k].next < 0)
			break;
	}
out:
	if (w.s != s_local)
		free(w.s);
	stk_heap_free(&w.h);
	stk_buf_free(&tmp);
	return r;
}

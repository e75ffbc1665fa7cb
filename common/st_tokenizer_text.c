/*
 * st_tokenizer_text.c — normalizers and pre-tokenizers of a tokenizer.json,
 * with the semantics of Hugging Face `tokenizers` (src/normalizers,
 * src/pre_tokenizers): a normalizer rewrites one text segment, a
 * pre-tokenizer cuts it into the words the model encodes one by one.
 *
 * Unicode comes from libraries, never from tables of ours: utf8proc for
 * NFC/NFD/NFKC/NFKD, case and categories, PCRE2 (UTF + UCP, JIT when
 * available) for the split regexes.  Text reaching this file is valid
 * UTF-8 (st_tokenizer_encode sanitizes it first), so PCRE2 runs with
 * PCRE2_NO_UTF_CHECK.
 */
#include "st_tokenizer_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

/* GPT-2's pre-tokenizer regex (HF pre_tokenizers/byte_level.rs). */
static const char gpt2_pattern[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
	"|\\s+(?!\\S)|\\s+";

static pcre2_code *re_compile(const char *pattern, size_t len,
			      struct st_diag *diag, int *ret)
{
	int err;
	PCRE2_SIZE at;
	pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len,
				       PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);

	if (!re) {
		PCRE2_UCHAR msg[256];

		pcre2_get_error_message(err, msg, sizeof(msg));
		*ret = st_diag_set(diag, -ST_E_TOKENIZER,
				   "tokenizer.json: regex /%.*s/ at %zu: %s",
				   (int)(len > 200 ? 200 : len), pattern, (size_t)at,
				   (char *)msg);
		return NULL;
	}
	/* JIT is an optimisation; the interpreter is used when it fails */
	(void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
	*ret = 0;
	return re;
}

static char *dup_str(const char *s, size_t n)
{
	char *d = malloc(n + 1);

	if (d) {
		memcpy(d, s, n);
		d[n] = '\0';
	}
	return d;
}

static const char *type_of(json_t *o)
{
	const char *t = json_string_value(json_object_get(o, "type"));

	return t ? t : "";
}

static int flag(json_t *o, const char *key, int dflt)
{
	json_t *v = json_object_get(o, key);

	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* ---- loading ----------------------------------------------------------- */

static int add_norm(struct stk_text *tx, struct stk_norm **ret)
{
	struct stk_norm *n = realloc(tx->norm, (tx->n_norm + 1) * sizeof(*n));

	if (!n)
		return -ENOMEM;
	tx->norm = n;
	*ret = &n[tx->n_norm++];
	memset(*ret, 0, sizeof(**ret));
	return 0;
}

/* Reads {"String": s} or {"Regex": r} into *ret_str or *ret_re. */
static int load_pattern(json_t *pat, char **ret_str, pcre2_code **ret_re,
			struct st_diag *diag)
{
	json_t *s = json_object_get(pat, "String");
	json_t *r = json_object_get(pat, "Regex");
	int rc = 0;

	if (json_is_string(s)) {
		*ret_str = dup_str(json_string_value(s), json_string_length(s));
		return *ret_str ? 0 : -ENOMEM;
	}
	if (json_is_string(r)) {
		*ret_re = re_compile(json_string_value(r), json_string_length(r),
				     diag, &rc);
		return rc;
	}
	return st_diag_set(diag, -ST_E_TOKENIZER,
			   "tokenizer.json: pattern is neither String nor Regex");
}

static int load_norm(struct stk_text *tx, json_t *o, struct st_diag *diag)
{
	const char *t = type_of(o);
	struct stk_norm *n;
	int r;

	if (json_is_null(o) || !o)
		return 0;
	if (!strcmp(t, "Sequence")) {
		json_t *list = json_object_get(o, "normalizers"), *e;
		size_t i;

		if (!json_is_array(list))
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: normalizer Sequence "
					   "without a normalizers list");
		json_array_foreach(list, i, e)
			if ((r = load_norm(tx, e, diag)))
				return r;
		return 0;
	}
	if ((r = add_norm(tx, &n)))
		return r;
	if (!strcmp(t, "NFC"))
		n->kind = STK_NORM_NFC;
	else if (!strcmp(t, "NFD"))
		n->kind = STK_NORM_NFD;
	else if (!strcmp(t, "NFKC"))
		n->kind = STK_NORM_NFKC;
	else if (!strcmp(t, "NFKD"))
		n->kind = STK_NORM_NFKD;
	else if (!strcmp(t, "Lowercase"))
		n->kind = STK_NORM_LOWERCASE;
	else if (!strcmp(t, "StripAccents"))
		n->kind = STK_NORM_STRIP_ACCENTS;
	else if (!strcmp(t, "Strip")) {
		n->kind = STK_NORM_STRIP;
		n->left = flag(o, "strip_left", 1);
		n->right = flag(o, "strip_right", 1);
	} else if (!strcmp(t, "Prepend")) {
		json_t *p = json_object_get(o, "prepend");

		n->kind = STK_NORM_PREPEND;
		if (!json_is_string(p))
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: Prepend without "
					   "a prepend string");
		n->str = dup_str(json_string_value(p), json_string_length(p));
		if (!n->str)
			return -ENOMEM;
	} else if (!strcmp(t, "Replace")) {
		json_t *c = json_object_get(o, "content");

		n->kind = STK_NORM_REPLACE;
		if (!json_is_string(c))
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: Replace normalizer "
					   "without content");
		n->content = dup_str(json_string_value(c),
				     json_string_length(c));
		if (!n->content)
			return -ENOMEM;
		if ((r = load_pattern(json_object_get(o, "pattern"), &n->str,
				      &n->re, diag)))
			return r;
	} else {
		tx->n_norm--;
		return st_diag_set(diag, -ST_E_TOKENIZER,
				   "tokenizer.json: normalizer type \"%s\" is "
				   "not supported", t);
	}
	return 0;
}

static int add_pre(struct stk_text *tx, struct stk_pre **ret)
{
	struct stk_pre *p = realloc(tx->pre, (tx->n_pre + 1) * sizeof(*p));

	if (!p)
		return -ENOMEM;
	tx->pre = p;
	*ret = &p[tx->n_pre++];
	memset(*ret, 0, sizeof(**ret));
	return 0;
}

static int parse_behavior(json_t *o, enum stk_split_behavior dflt,
			  enum stk_split_behavior *ret, struct st_diag *diag)
{
	static const struct {
		const char *name;
		enum stk_split_behavior b;
	} tab[] = {
		{ "Removed", STK_SPLIT_REMOVED },
		{ "Isolated", STK_SPLIT_ISOLATED },
		{ "MergedWithPrevious", STK_SPLIT_MERGED_PREV },
		{ "MergedWithNext", STK_SPLIT_MERGED_NEXT },
		{ "Contiguous", STK_SPLIT_CONTIGUOUS },
	};
	const char *b = json_string_value(json_object_get(o, "behavior"));

	*ret = dflt;
	if (!b)
		return 0;
	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		if (!strcmp(tab[i].name, b)) {
			*ret = tab[i].b;
			return 0;
		}
	}
	return st_diag_set(diag, -ST_E_TOKENIZER,
			   "tokenizer.json: split behavior \"%s\" unknown", b);
}

/* A pre-tokenizer that is a fixed regex split (Digits, Punctuation, ...). */
static int add_regex_split(struct stk_text *tx, const char *pattern,
			   enum stk_split_behavior b, int invert,
			   struct st_diag *diag)
{
	struct stk_pre *p;
	int r;

	if ((r = add_pre(tx, &p)))
		return r;
	p->kind = STK_PRE_SPLIT;
	p->behavior = b;
	p->invert = invert;
	p->re = re_compile(pattern, strlen(pattern), diag, &r);
	return r;
}

static int load_pre(struct stk_text *tx, json_t *o, struct st_diag *diag)
{
	const char *t = type_of(o);
	struct stk_pre *p;
	enum stk_split_behavior b;
	int r;

	if (json_is_null(o) || !o)
		return 0;
	if (!strcmp(t, "Sequence")) {
		json_t *list = json_object_get(o, "pretokenizers"), *e;
		size_t i;

		if (!json_is_array(list))
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: pre_tokenizer "
					   "Sequence without a list");
		json_array_foreach(list, i, e)
			if ((r = load_pre(tx, e, diag)))
				return r;
		return 0;
	}
	if (!strcmp(t, "Digits"))
		return add_regex_split(tx, flag(o, "individual_digits", 0) ?
				       "\\p{N}" : "\\p{N}+",
				       STK_SPLIT_ISOLATED, 0, diag);
	if (!strcmp(t, "Punctuation")) {
		if ((r = parse_behavior(o, STK_SPLIT_ISOLATED, &b, diag)))
			return r;
		/* Rust: is_ascii_punctuation() || Unicode P* categories */
		return add_regex_split(tx, "[\\p{P}!-/:-@\\[-`{-~]", b, 0,
				       diag);
	}
	if (!strcmp(t, "WhitespaceSplit"))
		return add_regex_split(tx, "\\s+", STK_SPLIT_REMOVED, 0, diag);
	if (!strcmp(t, "Whitespace"))
		return add_regex_split(tx, "\\w+|[^\\w\\s]+",
				       STK_SPLIT_REMOVED, 1, diag);
	if ((r = add_pre(tx, &p)))
		return r;
	if (!strcmp(t, "Split")) {
		p->kind = STK_PRE_SPLIT;
		p->invert = flag(o, "invert", 0);
		if ((r = parse_behavior(o, STK_SPLIT_ISOLATED, &p->behavior,
					diag)))
			return r;
		return load_pattern(json_object_get(o, "pattern"), &p->literal,
				    &p->re, diag);
	}
	if (!strcmp(t, "ByteLevel")) {
		p->kind = STK_PRE_BYTELEVEL;
		p->add_prefix_space = flag(o, "add_prefix_space", 1);
		p->use_regex = flag(o, "use_regex", 1);
		if (p->use_regex && !tx->gpt2_re) {
			tx->gpt2_re = re_compile(gpt2_pattern,
						 strlen(gpt2_pattern), diag, &r);
			if (r)
				return r;
		}
		return 0;
	}
	if (!strcmp(t, "Metaspace")) {
		json_t *rep = json_object_get(o, "replacement");
		const char *ps = json_string_value(json_object_get(o,
							"prepend_scheme"));
		size_t rl = json_string_length(rep);

		p->kind = STK_PRE_METASPACE;
		if (!json_is_string(rep) || rl == 0 || rl >= sizeof(p->rep))
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: Metaspace "
					   "replacement must be one character");
		memcpy(p->rep, json_string_value(rep), rl);
		p->split = flag(o, "split", 1);
		if (!ps)
			p->prepend = flag(o, "add_prefix_space", 1) ?
				     STK_PREPEND_ALWAYS : STK_PREPEND_NEVER;
		else if (!strcmp(ps, "always"))
			p->prepend = STK_PREPEND_ALWAYS;
		else if (!strcmp(ps, "first"))
			p->prepend = STK_PREPEND_FIRST;
		else if (!strcmp(ps, "never"))
			p->prepend = STK_PREPEND_NEVER;
		else
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: Metaspace "
					   "prepend_scheme \"%s\" unknown", ps);
		return 0;
	}
	tx->n_pre--;
	return st_diag_set(diag, -ST_E_TOKENIZER,
			   "tokenizer.json: pre_tokenizer type \"%s\" is not "
			   "supported", t);
}

int stk_text_load(struct stk_text *tx, json_t *normalizer, json_t *pre,
		  struct st_diag *diag)
{
	int r;

	memset(tx, 0, sizeof(*tx));
	for (unsigned b = 0; b < 256; b++)
		tx->byte_nchars[b] = (uint8_t)stk_utf8_put(
			stk_byte_to_cp((uint8_t)b), tx->byte_chars[b]);
	if ((r = load_norm(tx, normalizer, diag)))
		return r;
	return load_pre(tx, pre, diag);
}

void stk_text_free(struct stk_text *tx)
{
	for (int i = 0; i < tx->n_norm; i++) {
		free(tx->norm[i].str);
		free(tx->norm[i].content);
		pcre2_code_free(tx->norm[i].re);
	}
	for (int i = 0; i < tx->n_pre; i++) {
		pcre2_code_free(tx->pre[i].re);
		free(tx->pre[i].literal);
	}
	pcre2_code_free(tx->gpt2_re);
	free(tx->norm);
	free(tx->pre);
	memset(tx, 0, sizeof(*tx));
}

/* ---- matching ---------------------------------------------------------- */

/* A cut of a piece: [s, e) and whether it is a match of the pattern. */
struct cut {
	size_t s, e;
	int m;
};

struct cuts {
	struct cut *p;
	size_t n, cap;
};

static int cuts_add(struct cuts *c, size_t s, size_t e, int m)
{
	if (s >= e)
		return 0;
	if (c->n == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 32;
		struct cut *p = realloc(c->p, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		c->p = p;
		c->cap = cap;
	}
	c->p[c->n].s = s;
	c->p[c->n].e = e;
	c->p[c->n].m = m;
	c->n++;
	return 0;
}

/* Cuts s into alternating non-match / match ranges (HF find_matches). */
static int find_cuts(pcre2_code *re, const char *lit, const char *s,
		     size_t len, pcre2_match_data *md, struct cuts *c)
{
	size_t pos = 0, last = 0;
	int r;

	c->n = 0;
	if (lit) {
		size_t ll = strlen(lit);

		while (ll && pos < len) {
			const char *f = memmem(s + pos, len - pos, lit, ll);

			if (!f)
				break;
			pos = (size_t)(f - s);
			if ((r = cuts_add(c, last, pos, 0)) ||
			    (r = cuts_add(c, pos, pos + ll, 1)))
				return r;
			pos += ll;
			last = pos;
		}
		return cuts_add(c, last, len, 0);
	}
	while (pos <= len) {
		int rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos,
				     PCRE2_NO_UTF_CHECK, md, NULL);
		PCRE2_SIZE *ov;

		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0)
			return -ST_E_TOKENIZER;     /* e.g. match limit */
		ov = pcre2_get_ovector_pointer(md);
		if (ov[1] <= ov[0]) {
			/* empty match: skip one character */
			uint32_t cp;

			if (ov[0] >= len)
				break;
			pos = ov[0] + stk_utf8_get(s + ov[0], len - ov[0], &cp);
			continue;
		}
		if ((r = cuts_add(c, last, ov[0], 0)) ||
		    (r = cuts_add(c, ov[0], ov[1], 1)))
			return r;
		last = pos = ov[1];
	}
	return cuts_add(c, last, len, 0);
}

/*
 * Splits piece [s, s+len) by pattern with a split behavior
 * (HF normalizer.rs NormalizedString::split), appending the parts to out.
 */
static int split_piece(pcre2_code *re, const char *lit,
		       enum stk_split_behavior b, int invert, const char *s,
		       size_t len, pcre2_match_data *md, struct cuts *c,
		       struct stk_pieces *out)
{
	size_t k = 0;
	int r, prev = 0;

	if ((r = find_cuts(re, lit, s, len, md, c)))
		return r;
	for (size_t i = 0; i < c->n; i++)
		c->p[i].m ^= invert;
	switch (b) {
	case STK_SPLIT_ISOLATED:
		k = c->n;
		break;
	case STK_SPLIT_REMOVED:
		for (size_t i = 0; i < c->n; i++)
			if (!c->p[i].m)
				c->p[k++] = c->p[i];
		break;
	case STK_SPLIT_MERGED_PREV:
		for (size_t i = 0; i < c->n; i++) {
			int m = c->p[i].m;

			if (m && !prev && k)
				c->p[k - 1].e = c->p[i].e;
			else
				c->p[k++] = c->p[i];
			prev = m;
		}
		break;
	case STK_SPLIT_MERGED_NEXT:
		/* walk backwards, then the kept cuts are reversed in place */
		for (size_t i = c->n; i-- > 0;) {
			int m = c->p[i].m;

			if (m && !prev && k)
				c->p[c->n - k].s = c->p[i].s;
			else
				c->p[c->n - 1 - k++] = c->p[i];
			prev = m;
		}
		memmove(c->p, c->p + c->n - k, k * sizeof(*c->p));
		break;
	case STK_SPLIT_CONTIGUOUS:
		for (size_t i = 0; i < c->n; i++) {
			int m = c->p[i].m;

			if (m == prev && k)
				c->p[k - 1].e = c->p[i].e;
			else
				c->p[k++] = c->p[i];
			prev = m;
		}
		break;
	}
	for (size_t i = 0; i < k; i++)
		if ((r = stk_pieces_add_text(out, s + c->p[i].s,
					     c->p[i].e - c->p[i].s)))
			return r;
	return 0;
}

/* ---- normalizers ------------------------------------------------------- */

static int norm_utf8proc(const char *s, size_t len, utf8proc_option_t opt,
			 struct stk_buf *out)
{
	utf8proc_uint8_t *dst = NULL;
	utf8proc_ssize_t n;
	int r;

	if (!len)
		return 0;
	n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len,
			 &dst, opt | UTF8PROC_STABLE);
	if (n < 0)
		return n == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -ST_E_TOKENIZER;
	r = stk_buf_put(out, dst, (size_t)n);
	free(dst);
	return r;
}

/* Lowercase and StripAccents, one code point at a time. */
static int norm_per_char(const struct stk_norm *n, const char *s, size_t len,
			 struct stk_buf *out)
{
	size_t i = 0;
	int r;

	while (i < len) {
		uint32_t cp;
		size_t l = stk_utf8_get(s + i, len - i, &cp);
		char enc[4];

		if (n->kind == STK_NORM_LOWERCASE) {
			/* simple (1:1) case mapping; Rust's to_lowercase
			 * differs only for a few characters such as U+0130 */
			cp = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
			if ((r = stk_buf_put(out, enc, stk_utf8_put(cp, enc))))
				return r;
		} else if (utf8proc_category((utf8proc_int32_t)cp) !=
			   UTF8PROC_CATEGORY_MN) {
			/* StripAccents drops the non-spacing marks */
			if ((r = stk_buf_put(out, s + i, l)))
				return r;
		}
		i += l;
	}
	return 0;
}

static int norm_strip(const struct stk_norm *n, const char *s, size_t len,
		      struct stk_buf *out)
{
	size_t a = 0, b = len;

	while (n->left && a < b) {
		uint32_t cp;
		size_t l = stk_utf8_get(s + a, b - a, &cp);

		if (!stk_is_space(cp))
			break;
		a += l;
	}
	while (n->right && b > a) {
		size_t st = b - 1;
		uint32_t cp;

		while (st > a && ((uint8_t)s[st] & 0xC0) == 0x80)
			st--;
		stk_utf8_get(s + st, b - st, &cp);
		if (!stk_is_space(cp))
			break;
		b = st;
	}
	return stk_buf_put(out, s + a, b - a);
}

static int norm_replace(const struct stk_norm *n, const char *s, size_t len,
			struct stk_buf *out)
{
	struct cuts c = { 0 };
	pcre2_match_data *md = NULL;
	int r;

	if (n->re && !(md = pcre2_match_data_create(1, NULL)))
		return -ENOMEM;
	r = find_cuts(n->re, n->str, s, len, md, &c);
	for (size_t i = 0; !r && i < c.n; i++) {
		if (c.p[i].m)
			r = stk_buf_put(out, n->content, strlen(n->content));
		else
			r = stk_buf_put(out, s + c.p[i].s, c.p[i].e - c.p[i].s);
	}
	free(c.p);
	pcre2_match_data_free(md);
	return r;
}

static int norm_one(const struct stk_norm *n, const char *s, size_t len,
		    struct stk_buf *out)
{
	int r;

	switch (n->kind) {
	case STK_NORM_NFC:
		return norm_utf8proc(s, len, UTF8PROC_COMPOSE, out);
	case STK_NORM_NFD:
		return norm_utf8proc(s, len, UTF8PROC_DECOMPOSE, out);
	case STK_NORM_NFKC:
		return norm_utf8proc(s, len,
				     UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
	case STK_NORM_NFKD:
		return norm_utf8proc(s, len,
				     UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
	case STK_NORM_LOWERCASE:
	case STK_NORM_STRIP_ACCENTS:
		return norm_per_char(n, s, len, out);
	case STK_NORM_STRIP:
		return norm_strip(n, s, len, out);
	case STK_NORM_PREPEND:
		/* HF prepends only to a non-empty string */
		if (!len)
			return 0;
		if ((r = stk_buf_put(out, n->str, strlen(n->str))))
			return r;
		return stk_buf_put(out, s, len);
	case STK_NORM_REPLACE:
		return norm_replace(n, s, len, out);
	}
	return -ST_E_TOKENIZER;
}

int stk_text_normalize(const struct stk_text *tx, const char *s, size_t len,
		       struct stk_buf *out)
{
	struct stk_buf tmp = { 0 };
	int r;

	out->len = 0;
	if ((r = stk_buf_put(out, s, len)))
		return r;
	for (int i = 0; i < tx->n_norm; i++) {
		struct stk_buf sw;

		tmp.len = 0;
		if ((r = stk_buf_put(&tmp, "", 0)) ||
		    (r = norm_one(&tx->norm[i], out->p, out->len, &tmp)))
			break;
		sw = *out;
		*out = tmp;
		tmp = sw;
	}
	stk_buf_free(&tmp);
	return r;
}

/* ---- pre-tokenizers ---------------------------------------------------- */

/*
 * Work space of one stk_text_pretokenize() call, reused from piece to
 * piece (a pre-tokenizer step runs once per piece, and pieces are words:
 * allocating per piece cost more than the splitting).
 */
struct pre_scratch {
	pcre2_match_data *md;
	struct cuts c;
	struct stk_pieces parts;        /* ByteLevel: the GPT-2 split */
	struct stk_buf buf;             /* ByteLevel prefix, Metaspace text */
};

/* ByteLevel on one piece: prefix space, GPT-2 split, bytes -> code points */
static int pre_bytelevel(const struct stk_text *tx, const struct stk_pre *p,
			 const char *s, size_t len, struct pre_scratch *w,
			 struct stk_pieces *out)
{
	struct stk_pieces *parts = &w->parts;
	struct stk_buf *pre = &w->buf;
	int r = 0;

	parts->text.len = 0;
	parts->n = 0;
	if (p->add_prefix_space && (len == 0 || s[0] != ' ')) {
		pre->len = 0;
		if ((r = stk_buf_putc(pre, ' ')) ||
		    (r = stk_buf_put(pre, s, len)))
			return r;
		s = pre->p;
		len = pre->len;
	}
	if (p->use_regex)
		r = split_piece(tx->gpt2_re, NULL, STK_SPLIT_ISOLATED, 0, s,
				len, w->md, &w->c, parts);
	else if (len)
		r = stk_pieces_add_text(parts, s, len);
	for (size_t i = 0; !r && i < parts->n; i++) {
		const uint8_t *u = (const uint8_t *)parts->text.p +
				   parts->p[i].off;
		size_t off = out->text.len;

		for (size_t j = 0; !r && j < parts->p[i].len; j++)
			r = stk_buf_put(&out->text, tx->byte_chars[u[j]],
					tx->byte_nchars[u[j]]);
		if (!r)
			r = stk_pieces_add(out, off, out->text.len - off);
	}
	return r;
}

static int pre_metaspace(const struct stk_pre *p, const char *s, size_t len,
			 int first, struct pre_scratch *w,
			 struct stk_pieces *out)
{
	struct stk_buf *b = &w->buf;
	size_t rl = strlen(p->rep);
	int r = 0;

	b->len = 0;
	if (p->prepend == STK_PREPEND_ALWAYS ||
	    (p->prepend == STK_PREPEND_FIRST && first)) {
		/* the test is on the text after ' ' -> replacement */
		if (!(len && (s[0] == ' ' ||
			      (len >= rl && !memcmp(s, p->rep, rl)))))
			r = stk_buf_put(b, p->rep, rl);
	}
	for (size_t i = 0; !r && i < len; i++)
		r = s[i] == ' ' ? stk_buf_put(b, p->rep, rl)
				: stk_buf_putc(b, s[i]);
	if (!r && b->len) {
		if (p->split)
			r = split_piece(NULL, p->rep, STK_SPLIT_MERGED_NEXT, 0,
					b->p, b->len, w->md, &w->c, out);
		else
			r = stk_pieces_add_text(out, b->p, b->len);
	}
	return r;
}

int stk_text_pretokenize(const struct stk_text *tx, const char *s, size_t len,
			 int first, struct stk_pieces *out)
{
	struct stk_pieces a = { 0 }, b = { 0 };
	struct pre_scratch w = { 0 };
	int r;

	if (!(w.md = pcre2_match_data_create(1, NULL)))
		return -ENOMEM;
	if ((r = stk_pieces_add_text(&a, s, len)))
		goto out;
	for (int i = 0; i < tx->n_pre; i++) {
		const struct stk_pre *p = &tx->pre[i];
		struct stk_pieces sw;

		b.text.len = 0;
		b.n = 0;
		for (size_t j = 0; !r && j < a.n; j++) {
			const char *ps = a.text.p + a.p[j].off;
			size_t pl = a.p[j].len;

			switch (p->kind) {
			case STK_PRE_SPLIT:
				r = split_piece(p->re, p->literal, p->behavior,
						p->invert, ps, pl, w.md, &w.c,
						&b);
				break;
			case STK_PRE_BYTELEVEL:
				r = pre_bytelevel(tx, p, ps, pl, &w, &b);
				break;
			case STK_PRE_METASPACE:
				r = pre_metaspace(p, ps, pl, first && j == 0,
						  &w, &b);
				break;
			}
		}
		if (r)
			goto out;
		sw = a;
		a = b;
		b = sw;
	}
	stk_pieces_free(out);
	*out = a;
	memset(&a, 0, sizeof(a));
out:
	stk_pieces_free(&a);
	stk_pieces_free(&b);
	stk_pieces_free(&w.parts);
	stk_buf_free(&w.buf);
	free(w.c.p);
	pcre2_match_data_free(w.md);
	return r;
}

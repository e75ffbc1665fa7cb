/*
 * st_tokenizer_decode.c — decoders (HF src/decoders), the streaming
 * detokenizer and st_tokenizer_decode().
 *
 * HF runs a decoder chain over the list of token strings.  Every step we
 * support works token by token, except two that look at the whole text:
 * Fuse (joins the list; ByteLevel joins it too) and a Strip that comes after
 * such a join, which then removes characters at the start (and end) of the
 * whole text.  So one token's bytes can be produced alone, with the token's
 * position (Metaspace drops the replacement in token 0) and a count of
 * leading characters still to strip; st_tokenizer_decode() is the stream of
 * st_detok_push() calls plus a final flush, and the streamed chunks always
 * concatenate to exactly the full decode.
 *
 * Bytes become text only as whole UTF-8 characters: an incomplete character
 * at the end of a chunk is held back (struct st_detok.pending) until its
 * last byte arrives; ill-formed bytes become U+FFFD, one per maximal
 * ill-formed subpart (as Rust's String::from_utf8_lossy, which HF's
 * ByteLevel decoder uses).  Known difference from HF: HF's ByteFallback
 * turns an ill-formed run of <0xXX> tokens into one U+FFFD per byte.
 */
#include "st_tokenizer_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "st_tokenizer.h"

static const char *type_of(json_t *o)
{
	const char *t = json_string_value(json_object_get(o, "type"));

	return t ? t : "";
}

static int add_dec(struct stk_decoder *dc, struct stk_dec **ret)
{
	struct stk_dec *d = realloc(dc->d, (dc->n + 1) * sizeof(*d));

	if (!d)
		return -ENOMEM;
	dc->d = d;
	*ret = &d[dc->n++];
	memset(*ret, 0, sizeof(**ret));
	return 0;
}

static int one_char(json_t *v, char *out, size_t cap)
{
	size_t l = json_string_length(v);
	uint32_t cp;

	if (!json_is_string(v) || l == 0 || l >= cap ||
	    stk_utf8_get(json_string_value(v), l, &cp) != l)
		return -1;
	memcpy(out, json_string_value(v), l);
	out[l] = '\0';
	return 0;
}

static int load_dec(struct stk_decoder *dc, json_t *o, int *joined,
		    struct st_diag *diag)
{
	const char *t = type_of(o);
	struct stk_dec *d;
	int r;

	if (!strcmp(t, "Sequence")) {
		json_t *list = json_object_get(o, "decoders"), *e;
		size_t i;

		if (!json_is_array(list))
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: decoder Sequence "
					   "without a decoders list");
		json_array_foreach(list, i, e)
			if ((r = load_dec(dc, e, joined, diag)))
				return r;
		return 0;
	}
	if ((r = add_dec(dc, &d)))
		return r;
	if (!strcmp(t, "ByteLevel")) {
		d->kind = STK_DEC_BYTELEVEL;
		*joined = 1;
	} else if (!strcmp(t, "ByteFallback")) {
		d->kind = STK_DEC_BYTEFALLBACK;
	} else if (!strcmp(t, "Fuse")) {
		d->kind = STK_DEC_FUSE;
		*joined = 1;
	} else if (!strcmp(t, "Replace")) {
		json_t *pat = json_object_get(json_object_get(o, "pattern"),
					      "String");
		json_t *c = json_object_get(o, "content");

		d->kind = STK_DEC_REPLACE;
		if (!json_is_string(pat) || !json_string_length(pat) ||
		    !json_is_string(c))
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: Replace decoder "
					   "needs a String pattern and content");
		d->pattern = strdup(json_string_value(pat));
		d->content = strdup(json_string_value(c));
		if (!d->pattern || !d->content)
			return -ENOMEM;
	} else if (!strcmp(t, "Strip")) {
		json_int_t st = json_integer_value(json_object_get(o, "start"));
		json_int_t sp = json_integer_value(json_object_get(o, "stop"));
		char c[8];

		d->kind = STK_DEC_STRIP;
		if (one_char(json_object_get(o, "content"), c, sizeof(c)) ||
		    st < 0 || sp < 0 || st > 1024 || sp > 1024)
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: Strip decoder needs "
					   "one content char and small counts");
		d->content = strdup(c);
		if (!d->content)
			return -ENOMEM;
		d->start = (int)st;
		d->stop = (int)sp;
		d->joined = *joined;
		if (d->joined) {
			/* acts on the whole text: kept out of the per-token
			 * chain (see the file comment) */
			if (dc->strip_start + dc->strip_stop &&
			    strcmp(dc->strip_content, c))
				return st_diag_set(diag, -ST_E_TOKENIZER,
						   "tokenizer.json: two Strip "
						   "decoders with different "
						   "content");
			memcpy(dc->strip_content, c, sizeof(c));
			dc->strip_start += d->start;
			dc->strip_stop += d->stop;
		}
	} else if (!strcmp(t, "Metaspace")) {
		const char *ps = json_string_value(json_object_get(o,
							"prepend_scheme"));

		d->kind = STK_DEC_METASPACE;
		if (one_char(json_object_get(o, "replacement"), d->rep,
			     sizeof(d->rep)))
			return st_diag_set(diag, -ST_E_TOKENIZER,
					   "tokenizer.json: Metaspace decoder "
					   "replacement must be one character");
		if (ps)
			d->prepend = strcmp(ps, "never") != 0;
		else
			d->prepend = !json_is_false(json_object_get(o,
							"add_prefix_space"));
	} else {
		dc->n--;
		return st_diag_set(diag, -ST_E_TOKENIZER,
				   "tokenizer.json: decoder type \"%s\" is not "
				   "supported", t);
	}
	return 0;
}

int stk_decoder_load(struct stk_decoder *dc, json_t *decoder,
		     struct st_diag *diag)
{
	int joined = 0;

	memset(dc, 0, sizeof(*dc));
	for (uint32_t cp = 0; cp < 0x144; cp++)
		dc->cp_byte[cp] = (int16_t)stk_cp_to_byte(cp);
	if (!decoder || json_is_null(decoder)) {
		dc->join_space = 1;     /* HF: tokens.join(" ") */
		return 0;
	}
	return load_dec(dc, decoder, &joined, diag);
}

void stk_decoder_free(struct stk_decoder *dc)
{
	for (int i = 0; i < dc->n; i++) {
		free(dc->d[i].pattern);
		free(dc->d[i].content);
	}
	free(dc->d);
	memset(dc, 0, sizeof(*dc));
}

/* ---- one token --------------------------------------------------------- */

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* One decoder step on token bytes s, appended to o. */
static int dec_step(const struct stk_decoder *dc, const struct stk_dec *d,
		    const char *s, size_t len, int index, struct stk_buf *o)
{
	size_t i = 0, at;
	int r = 0;

	switch (d->kind) {
	case STK_DEC_BYTELEVEL:
		/* a token with a character outside the map keeps its bytes */
		for (i = 0; i < len;) {
			uint32_t cp;
			size_t l = stk_utf8_get(s + i, len - i, &cp);

			if (cp >= 0x144 || dc->cp_byte[cp] < 0)
				return stk_buf_put(o, s, len);
			i += l;
		}
		/* one byte per character, so at most len bytes: room is made
		 * once and the bytes are written in place */
		at = o->len;
		if ((r = stk_buf_put(o, s, len)))
			return r;
		o->len = at;
		for (i = 0; i < len;) {
			uint32_t cp;

			i += stk_utf8_get(s + i, len - i, &cp);
			o->p[o->len++] = (char)dc->cp_byte[cp];
		}
		o->p[o->len] = '\0';
		return 0;
	case STK_DEC_BYTEFALLBACK:
		if (len == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' &&
		    hexval(s[3]) >= 0 && hexval(s[4]) >= 0)
			return stk_buf_putc(o, (char)(hexval(s[3]) * 16 +
						      hexval(s[4])));
		return stk_buf_put(o, s, len);
	case STK_DEC_REPLACE: {
		size_t pl = strlen(d->pattern);

		while (!r && i < len) {
			if (len - i >= pl && !memcmp(s + i, d->pattern, pl)) {
				r = stk_buf_put(o, d->content,
						strlen(d->content));
				i += pl;
			} else {
				r = stk_buf_putc(o, s[i++]);
			}
		}
		return r;
	}
	case STK_DEC_METASPACE: {
		size_t rl = strlen(d->rep);

		while (!r && i < len) {
			if (len - i >= rl && !memcmp(s + i, d->rep, rl)) {
				/* HF drops every replacement of token 0 */
				if (!(index == 0 && d->prepend))
					r = stk_buf_putc(o, ' ');
				i += rl;
			} else {
				r = stk_buf_putc(o, s[i++]);
			}
		}
		return r;
	}
	case STK_DEC_STRIP: {
		size_t cl = strlen(d->content), a = 0, b = len;

		if (d->joined)
			return stk_buf_put(o, s, len);
		for (int k = 0; k < d->start && b - a >= cl &&
		     !memcmp(s + a, d->content, cl); k++)
			a += cl;
		for (int k = 0; k < d->stop && b - a >= cl &&
		     !memcmp(s + b - cl, d->content, cl); k++)
			b -= cl;
		return stk_buf_put(o, s + a, b - a);
	}
	case STK_DEC_FUSE:
		break;
	}
	return stk_buf_put(o, s, len);
}

/*
 * Work buffers of a decode, reused from token to token: a whole-text decode
 * then allocates a few times in all instead of four times a token (under
 * ASan each allocation costs more than the decoding).  Zeroed to start;
 * scratch_free() releases them.
 */
struct dec_scratch {
	struct stk_buf a, b;            /* dec_token's step input and output */
	struct stk_buf bytes, work;     /* detok_push_buf's */
};

static void scratch_free(struct dec_scratch *s)
{
	stk_buf_free(&s->a);
	stk_buf_free(&s->b);
	stk_buf_free(&s->bytes);
	stk_buf_free(&s->work);
}

/* The bytes of one token string through the per-token decoder steps, into
 * out (reset first); s->a and s->b are the steps' work buffers. */
static int dec_token(const struct stk_decoder *dc, const char *tok, size_t len,
		     int index, struct dec_scratch *s, struct stk_buf *out)
{
	int r;

	out->len = 0;
	s->a.len = 0;
	if ((r = stk_buf_put(&s->a, tok, len)))
		return r;
	for (int i = 0; i < dc->n; i++) {
		struct stk_buf sw;

		s->b.len = 0;
		if ((r = stk_buf_put(&s->b, "", 0)) ||
		    (r = dec_step(dc, &dc->d[i], s->a.p, s->a.len, index,
				  &s->b)))
			return r;
		sw = s->a;
		s->a = s->b;
		s->b = sw;
	}
	if (dc->join_space && index > 0 && (r = stk_buf_putc(out, ' ')))
		return r;
	return stk_buf_put(out, s->a.p, s->a.len);
}

/* ---- streaming --------------------------------------------------------- */

static const char fffd[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

void st_detok_init(struct st_detok *d, const struct st_tokenizer *t,
		   int skip_special)
{
	memset(d, 0, sizeof(*d));
	d->tok = t;
	d->skip_special = skip_special;
	d->strip_left = t ? t->dec.strip_start : 0;
}

/*
 * Decodes one id and appends the completed characters to out; the detok
 * state is updated only on success.  s: work buffers (kept for the next
 * call).
 */
static int detok_push_buf(struct st_detok *d, int32_t id,
			  struct dec_scratch *s, struct stk_buf *out)
{
	const struct st_tokenizer *t = d->tok;
	const struct stk_decoder *dc = &t->dec;
	struct stk_buf *bytes = &s->bytes, *work = &s->work;
	const char *tok, *src;
	size_t len, n, i = 0, cl = strlen(dc->strip_content);
	int strip_left = d->strip_left, r;

	tok = stk_id_str(t, id, &len);
	if (!tok || (d->skip_special && t->id_special[id]))
		return 0;       /* no text: padding, unknown or skipped id */
	if ((r = dec_token(dc, tok, len, d->n_emitted_tokens, s, bytes)))
		return r;
	/* whole-text Strip: drop leading content chars of the text */
	while (strip_left > 0 && cl && bytes->len - i >= cl &&
	       !memcmp(bytes->p + i, dc->strip_content, cl)) {
		i += cl;
		strip_left--;
	}
	if (i < bytes->len)
		strip_left = 0;
	/* the held-back bytes go first (most tokens have none: no copy) */
	src = bytes->p + i;
	n = bytes->len - i;
	if (d->n_pending) {
		work->len = 0;
		if ((r = stk_buf_put(work, d->pending, (size_t)d->n_pending)) ||
		    (r = stk_buf_put(work, src, n)))
			return r;
		src = work->p;
		n = work->len;
	}
	for (i = 0; i < n;) {
		size_t end = i;
		int l = 0;

		/* a run of well-formed characters goes out in one copy */
		while (end < n && (l = stk_utf8_step((const uint8_t *)src + end,
						     n - end)) > 0)
			end += (size_t)l;
		if (end > i && (r = stk_buf_put(out, src + i, end - i)))
			return r;
		i = end;
		if (i == n || l == 0)
			break;          /* all out, or incomplete: held back */
		/* ill-formed: -l bytes become one U+FFFD */
		if ((r = stk_buf_put(out, fffd, 3)))
			return r;
		i += (size_t)-l;
	}
	/* commit: at most 3 bytes of an incomplete character remain */
	d->n_pending = (int)(n - i);
	memcpy(d->pending, src + i, n - i);
	d->strip_left = strip_left;
	d->n_emitted_tokens++;
	return 0;
}

static int copy_out(const struct stk_buf *b, char *out, size_t cap)
{
	if (!out || cap < b->len + 1)
		return -ENOSPC;
	if (b->len)
		memcpy(out, b->p, b->len);
	out[b->len] = '\0';
	return (int)b->len;
}

int st_detok_push(struct st_detok *d, int32_t id, char *out, size_t cap)
{
	/* one token's work fits on the stack (tokens are short; a longer
	 * one moves its buffers to the heap): no allocation per token */
	char sa[256], sb[256], sbytes[256], swork[256], sout[256];
	struct st_detok save;
	struct dec_scratch s;
	struct stk_buf b;
	int r;

	if (!d || !d->tok)
		return -EINVAL;
	stk_buf_init_local(&s.a, sa, sizeof(sa));
	stk_buf_init_local(&s.b, sb, sizeof(sb));
	stk_buf_init_local(&s.bytes, sbytes, sizeof(sbytes));
	stk_buf_init_local(&s.work, swork, sizeof(swork));
	stk_buf_init_local(&b, sout, sizeof(sout));
	save = *d;
	r = detok_push_buf(d, id, &s, &b);
	if (!r) {
		r = copy_out(&b, out, cap);
		if (r < 0)
			*d = save;      /* nothing consumed on -ENOSPC */
	}
	scratch_free(&s);
	stk_buf_free(&b);
	return r;
}

int st_detok_flush(struct st_detok *d, char *out, size_t cap)
{
	char sout[16];
	struct stk_buf b;
	int r = 0;

	if (!d)
		return -EINVAL;
	stk_buf_init_local(&b, sout, sizeof(sout));
	/* a held-back incomplete character is one ill-formed subpart */
	if (d->n_pending)
		r = stk_buf_put(&b, fffd, 3);
	if (!r)
		r = copy_out(&b, out, cap);
	if (r >= 0)
		d->n_pending = 0;
	stk_buf_free(&b);
	return r;
}

int st_tokenizer_decode(const struct st_tokenizer *t, const int32_t *ids,
			size_t n, int skip_special, char **ret_text)
{
	struct st_detok d;
	struct dec_scratch s = { 0 };
	struct stk_buf b = { 0 };
	int r = 0;

	if (!t || !ret_text || (n && !ids))
		return -EINVAL;
	st_detok_init(&d, t, skip_special);
	for (size_t i = 0; !r && i < n; i++)
		r = detok_push_buf(&d, ids[i], &s, &b);
	scratch_free(&s);
	if (!r && d.n_pending)
		r = stk_buf_put(&b, fffd, 3);
	if (!r)
		r = stk_buf_put(&b, "", 0);     /* allocated, NUL-terminated */
	if (r) {
		stk_buf_free(&b);
		return r;
	}
	/* whole-text Strip at the end (not applied while streaming) */
	if (t->dec.strip_stop) {
		size_t cl = strlen(t->dec.strip_content);

		for (int k = 0; k < t->dec.strip_stop && cl && b.len >= cl &&
		     !memcmp(b.p + b.len - cl, t->dec.strip_content, cl); k++)
			b.len -= cl;
		b.p[b.len] = '\0';
	}
	*ret_text = b.p;
	return 0;
}

/*
 * st_tokenizer_map.c — the tokenizer's containers: growable buffers, lists
 * of text pieces, open-addressing hash maps (string -> id with XXH3 hashes,
 * id pair -> merge), UTF-8 helpers and GPT-2's byte <-> unicode map.
 *
 * The maps use linear probing at a load factor of at most 1/2; they are
 * filled once at load time and only read afterwards.
 */
#include "st_tokenizer_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

/* ---- buffers ----------------------------------------------------------- */

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	size_t c = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return 0;
	while (c < need) {
		if (c > SIZE_MAX / 2 / elem)
			return -ENOMEM;
		c *= 2;
	}
	q = realloc(*p, c * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = c;
	return 0;
}

void stk_buf_init_local(struct stk_buf *b, char *storage, size_t cap)
{
	b->p = b->local = storage;
	b->len = 0;
	b->cap = cap;
	if (cap)
		storage[0] = '\0';
}

int stk_buf_put(struct stk_buf *b, const void *src, size_t n)
{
	int r;

	/* still in the caller's storage and about to outgrow it: move to
	 * the heap (grow() must never realloc the caller's storage) */
	if (b->local && b->p == b->local && b->len + n + 1 > b->cap) {
		char *q = malloc(b->cap);

		if (!q)
			return -ENOMEM;
		if (b->len)
			memcpy(q, b->p, b->len);
		b->p = q;
	}
	/* one spare byte so the text can always be NUL-terminated */
	if ((r = grow((void **)&b->p, &b->cap, b->len + n + 1, 1)))
		return r;
	if (n)
		memcpy(b->p + b->len, src, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

int stk_buf_putc(struct stk_buf *b, char c)
{
	return stk_buf_put(b, &c, 1);
}

void stk_buf_free(struct stk_buf *b)
{
	if (b->p != b->local)
		free(b->p);
	memset(b, 0, sizeof(*b));
}

int stk_ids_push(struct stk_ids *v, int32_t id)
{
	int r = grow((void **)&v->p, &v->cap, v->n + 1, sizeof(*v->p));

	if (r)
		return r;
	v->p[v->n++] = id;
	return 0;
}

int stk_pieces_add(struct stk_pieces *ps, size_t off, size_t len)
{
	int r = grow((void **)&ps->p, &ps->cap, ps->n + 1, sizeof(*ps->p));

	if (r)
		return r;
	ps->p[ps->n].off = off;
	ps->p[ps->n].len = len;
	ps->n++;
	return 0;
}

int stk_pieces_add_text(struct stk_pieces *ps, const char *src, size_t len)
{
	size_t off = ps->text.len;
	int r = stk_buf_put(&ps->text, src, len);

	return r ? r : stk_pieces_add(ps, off, len);
}

void stk_pieces_free(struct stk_pieces *ps)
{
	stk_buf_free(&ps->text);
	free(ps->p);
	memset(ps, 0, sizeof(*ps));
}

/* ---- string -> id map -------------------------------------------------- */

static size_t cap_for(size_t expect)
{
	size_t c = 16;

	while (c < expect * 2)
		c *= 2;
	return c;
}

static int strmap_alloc(struct stk_strmap *m, size_t cap)
{
	m->slots = malloc(cap * sizeof(*m->slots));
	if (!m->slots)
		return -ENOMEM;
	for (size_t i = 0; i < cap; i++)
		m->slots[i].len = UINT32_MAX;
	m->cap = cap;
	m->n = 0;
	return 0;
}

int stk_strmap_init(struct stk_strmap *m, size_t expect)
{
	memset(m, 0, sizeof(*m));
	return strmap_alloc(m, cap_for(expect));
}

void stk_strmap_free(struct stk_strmap *m)
{
	free(m->slots);
	stk_buf_free(&m->arena);
	memset(m, 0, sizeof(*m));
}

static struct stk_strmap_slot *strmap_find(const struct stk_strmap *m,
					   const char *key, size_t len,
					   uint64_t h)
{
	size_t mask = m->cap - 1;

	for (size_t i = h & mask;; i = (i + 1) & mask) {
		struct stk_strmap_slot *s = &m->slots[i];

		if (s->len == UINT32_MAX)
			return s;
		if (s->hash == h && s->len == len &&
		    !memcmp(m->arena.p + s->off, key, len))
			return s;
	}
}

static int strmap_rehash(struct stk_strmap *m)
{
	struct stk_strmap_slot *old = m->slots;
	size_t old_cap = m->cap, n = m->n;
	int r = strmap_alloc(m, old_cap * 2);

	if (r) {
		m->slots = old;
		m->cap = old_cap;
		return r;
	}
	for (size_t i = 0; i < old_cap; i++) {
		size_t mask = m->cap - 1, j;

		if (old[i].len == UINT32_MAX)
			continue;
		for (j = old[i].hash & mask; m->slots[j].len != UINT32_MAX;
		     j = (j + 1) & mask)
			;
		m->slots[j] = old[i];
	}
	m->n = n;
	free(old);
	return 0;
}

int stk_strmap_put(struct stk_strmap *m, const char *key, size_t len,
		   int32_t val)
{
	uint64_t h;
	struct stk_strmap_slot *s;
	size_t off;
	int r;

	if (len >= UINT32_MAX || m->arena.len + len >= UINT32_MAX)
		return -ENOMEM;
	if ((m->n + 1) * 2 > m->cap && (r = strmap_rehash(m)))
		return r;
	h = XXH3_64bits(key, len);
	s = strmap_find(m, key, len, h);
	if (s->len != UINT32_MAX) {
		s->val = val;
		return 0;
	}
	off = m->arena.len;
	if ((r = stk_buf_put(&m->arena, key, len)))
		return r;
	s->hash = h;
	s->off = (uint32_t)off;
	s->len = (uint32_t)len;
	s->val = val;
	m->n++;
	return 0;
}

int32_t stk_strmap_get(const struct stk_strmap *m, const char *key, size_t len)
{
	const struct stk_strmap_slot *s;

	if (!m->cap)
		return -1;
	s = strmap_find(m, key, len, XXH3_64bits(key, len));
	return s->len == UINT32_MAX ? -1 : s->val;
}

/* ---- pair -> merge map ------------------------------------------------- */

/* splitmix64's finaliser: a cheap, well-mixing hash of the 64-bit key */
static uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

static int pairmap_alloc(struct stk_pairmap *m, size_t cap)
{
	m->slots = malloc(cap * sizeof(*m->slots));
	if (!m->slots)
		return -ENOMEM;
	for (size_t i = 0; i < cap; i++)
		m->slots[i].key = UINT64_MAX;
	m->cap = cap;
	m->n = 0;
	return 0;
}

int stk_pairmap_init(struct stk_pairmap *m, size_t expect)
{
	memset(m, 0, sizeof(*m));
	return pairmap_alloc(m, cap_for(expect));
}

void stk_pairmap_free(struct stk_pairmap *m)
{
	free(m->slots);
	memset(m, 0, sizeof(*m));
}

static struct stk_pair_slot *pairmap_find(const struct stk_pairmap *m,
					  uint64_t key)
{
	size_t mask = m->cap - 1;

	for (size_t i = mix64(key) & mask;; i = (i + 1) & mask)
		if (m->slots[i].key == key || m->slots[i].key == UINT64_MAX)
			return &m->slots[i];
}

int stk_pairmap_put(struct stk_pairmap *m, int32_t a, int32_t b,
		    uint32_t rank, int32_t new_id)
{
	uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
	struct stk_pair_slot *s;

	if ((m->n + 1) * 2 > m->cap) {
		struct stk_pair_slot *old = m->slots;
		size_t old_cap = m->cap, n = m->n;
		int r = pairmap_alloc(m, old_cap * 2);

		if (r) {
			m->slots = old;
			m->cap = old_cap;
			return r;
		}
		for (size_t i = 0; i < old_cap; i++)
			if (old[i].key != UINT64_MAX)
				*pairmap_find(m, old[i].key) = old[i];
		m->n = n;
		free(old);
	}
	s = pairmap_find(m, key);
	if (s->key == UINT64_MAX)
		m->n++;
	s->key = key;
	s->rank = rank;
	s->new_id = new_id;
	return 0;
}

int stk_pairmap_get(const struct stk_pairmap *m, int32_t a, int32_t b,
		    uint32_t *rank, int32_t *new_id)
{
	uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
	const struct stk_pair_slot *s;

	if (!m->cap)
		return 0;
	s = pairmap_find(m, key);
	if (s->key == UINT64_MAX)
		return 0;
	*rank = s->rank;
	*new_id = s->new_id;
	return 1;
}

/* ---- UTF-8 ------------------------------------------------------------- */

int stk_utf8_step(const uint8_t *s, size_t n)
{
	uint8_t b = s[0], lo = 0x80, hi = 0xBF;
	int need;

	if (b < 0x80)
		return 1;
	if (b >= 0xC2 && b <= 0xDF)
		need = 2;
	else if (b >= 0xE0 && b <= 0xEF) {
		need = 3;
		if (b == 0xE0)
			lo = 0xA0;
		else if (b == 0xED)
			hi = 0x9F;
	} else if (b >= 0xF0 && b <= 0xF4) {
		need = 4;
		if (b == 0xF0)
			lo = 0x90;
		else if (b == 0xF4)
			hi = 0x8F;
	} else
		return -1;
	for (int i = 1; i < need; i++) {
		if ((size_t)i >= n)
			return 0;
		if (s[i] < lo || s[i] > hi)
			return -i;
		lo = 0x80;
		hi = 0xBF;
	}
	return need;
}

size_t stk_utf8_put(uint32_t cp, char *out)
{
	uint8_t *o = (uint8_t *)out;

	if (cp < 0x80) {
		o[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (uint8_t)(0xC0 | (cp >> 6));
		o[1] = (uint8_t)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (uint8_t)(0xE0 | (cp >> 12));
		o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (uint8_t)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (uint8_t)(0xF0 | (cp >> 18));
	o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
	o[3] = (uint8_t)(0x80 | (cp & 0x3F));
	return 4;
}

size_t stk_utf8_get(const char *s, size_t n, uint32_t *cp)
{
	const uint8_t *u = (const uint8_t *)s;
	int l = stk_utf8_step(u, n);

	if (l <= 0) {
		/* not a valid character: callers pass sanitized text, but
		 * never read past n */
		*cp = 0xFFFD;
		return 1;
	}
	switch (l) {
	case 1:
		*cp = u[0];
		break;
	case 2:
		*cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
		break;
	case 3:
		*cp = ((uint32_t)(u[0] & 0x0F) << 12) |
		      ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
		break;
	default:
		*cp = ((uint32_t)(u[0] & 0x07) << 18) |
		      ((uint32_t)(u[1] & 0x3F) << 12) |
		      ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
		break;
	}
	return (size_t)l;
}

static const char utf8_fffd[3] = { (char)0xEF, (char)0xBF, (char)0xBD };

int stk_utf8_sanitize(const char *s, size_t n, struct stk_buf *out)
{
	const uint8_t *u = (const uint8_t *)s;
	size_t i = 0, run = 0;
	int r;

	out->len = 0;
	if ((r = stk_buf_put(out, "", 0)))
		return r;
	while (i < n) {
		int l = stk_utf8_step(u + i, n - i);

		if (l > 0) {
			i += (size_t)l;
			run += (size_t)l;
			continue;
		}
		if ((r = stk_buf_put(out, s + i - run, run)) ||
		    (r = stk_buf_put(out, utf8_fffd, 3)))
			return r;
		run = 0;
		i += l < 0 ? (size_t)-l : n - i;  /* truncated at the end */
	}
	return stk_buf_put(out, s + n - run, run);
}

/* ---- GPT-2 byte <-> unicode -------------------------------------------- */

/*
 * GPT-2 keeps the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF as
 * the code points of the same value and maps the other 68 bytes, in
 * increasing order, to U+0100, U+0101, ... (encoder.py bytes_to_unicode).
 */
static int byte_is_kept(unsigned b)
{
	return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
	       (b >= 0xAE && b <= 0xFF);
}

uint32_t stk_byte_to_cp(uint8_t b)
{
	unsigned k = 0;

	if (byte_is_kept(b))
		return b;
	for (unsigned x = 0; x < b; x++)
		k += !byte_is_kept(x);
	return 0x100 + k;
}

int stk_cp_to_byte(uint32_t cp)
{
	unsigned k = 0;

	if (cp < 0x100)
		return byte_is_kept(cp) ? (int)cp : -1;
	if (cp >= 0x100 + 68)
		return -1;
	for (unsigned x = 0; x < 256; x++) {
		if (byte_is_kept(x))
			continue;
		if (k++ == cp - 0x100)
			return (int)x;
	}
	return -1;
}

int stk_is_space(uint32_t cp)
{
	return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 ||
	       cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
	       cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
	       cp == 0x3000;
}

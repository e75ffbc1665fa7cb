/* st_proto.c — wire helpers for st_proto.h. */
#include "st_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "st_error.h"

void st_wbuf_init(struct st_wbuf *w)
{
	memset(w, 0, sizeof(*w));
}

void st_wbuf_fini(struct st_wbuf *w)
{
	free(w->data);
	memset(w, 0, sizeof(*w));
}

static void wbuf_put(struct st_wbuf *w, const void *p, size_t n)
{
	if (w->err)
		return;
	if (w->len + n > w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 256;
		uint8_t *d;

		while (cap < w->len + n)
			cap *= 2;
		d = realloc(w->data, cap);
		if (!d) {
			w->err = -ENOMEM;
			return;
		}
		w->data = d;
		w->cap = cap;
	}
	if (n)
		memcpy(w->data + w->len, p, n);
	w->len += n;
}

/* Little-endian encoding is done byte by byte so the code is correct on any
 * host; strata targets little-endian x86-64/arm64 but the wire is defined. */
static void put_le(struct st_wbuf *w, uint64_t v, int n)
{
	uint8_t b[8];

	for (int i = 0; i < n; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	wbuf_put(w, b, (size_t)n);
}

void st_wbuf_u8(struct st_wbuf *w, uint8_t v) { put_le(w, v, 1); }
void st_wbuf_u16(struct st_wbuf *w, uint16_t v) { put_le(w, v, 2); }
void st_wbuf_u32(struct st_wbuf *w, uint32_t v) { put_le(w, v, 4); }
void st_wbuf_i32(struct st_wbuf *w, int32_t v) { put_le(w, (uint32_t)v, 4); }
void st_wbuf_u64(struct st_wbuf *w, uint64_t v) { put_le(w, v, 8); }

void st_wbuf_f32(struct st_wbuf *w, float v)
{
	uint32_t u;

	memcpy(&u, &v, 4);
	put_le(w, u, 4);
}

void st_wbuf_f64(struct st_wbuf *w, double v)
{
	uint64_t u;

	memcpy(&u, &v, 8);
	put_le(w, u, 8);
}

void st_wbuf_bytes(struct st_wbuf *w, const void *p, size_t n)
{
	wbuf_put(w, p, n);
}

void st_wbuf_str(struct st_wbuf *w, const char *s)
{
	size_t n = s ? strlen(s) : 0;

	put_le(w, (uint32_t)n, 4);
	wbuf_put(w, s, n);
}

void st_rbuf_init(struct st_rbuf *r, const void *data, size_t len)
{
	r->data = data;
	r->len = len;
	r->pos = 0;
}

size_t st_rbuf_left(const struct st_rbuf *r)
{
	return r->len - r->pos;
}

static int get_le(struct st_rbuf *r, uint64_t *v, int n)
{
	uint64_t x = 0;

	if (st_rbuf_left(r) < (size_t)n)
		return -ST_E_PROTO;
	for (int i = 0; i < n; i++)
		x |= (uint64_t)r->data[r->pos + i] << (8 * i);
	r->pos += (size_t)n;
	*v = x;
	return 0;
}

int st_rbuf_u8(struct st_rbuf *r, uint8_t *v)
{
	uint64_t x;
	int e = get_le(r, &x, 1);

	if (!e)
		*v = (uint8_t)x;
	return e;
}

int st_rbuf_u16(struct st_rbuf *r, uint16_t *v)
{
	uint64_t x;
	int e = get_le(r, &x, 2);

	if (!e)
		*v = (uint16_t)x;
	return e;
}

int st_rbuf_u32(struct st_rbuf *r, uint32_t *v)
{
	uint64_t x;
	int e = get_le(r, &x, 4);

	if (!e)
		*v = (uint32_t)x;
	return e;
}

int st_rbuf_i32(struct st_rbuf *r, int32_t *v)
{
	uint64_t x;
	int e = get_le(r, &x, 4);

	if (!e)
		*v = (int32_t)(uint32_t)x;
	return e;
}

int st_rbuf_u64(struct st_rbuf *r, uint64_t *v)
{
	return get_le(r, v, 8);
}

int st_rbuf_f32(struct st_rbuf *r, float *v)
{
	uint64_t x;
	uint32_t u;
	int e = get_le(r, &x, 4);

	if (!e) {
		u = (uint32_t)x;
		memcpy(v, &u, 4);
	}
	return e;
}

int st_rbuf_f64(struct st_rbuf *r, double *v)
{
	uint64_t x;
	int e = get_le(r, &x, 8);

	if (!e)
		memcpy(v, &x, 8);
	return e;
}

int st_rbuf_bytes(struct st_rbuf *r, void *out, size_t n)
{
	if (st_rbuf_left(r) < n)
		return -ST_E_PROTO;
	memcpy(out, r->data + r->pos, n);
	r->pos += n;
	return 0;
}

int st_rbuf_str(struct st_rbuf *r, size_t max_len, char **ret)
{
	size_t save = r->pos;
	uint32_t n;
	char *s;

	if (st_rbuf_u32(r, &n) < 0)
		return -ST_E_PROTO;
	if (n > max_len || st_rbuf_left(r) < n) {
		r->pos = save;
		return -ST_E_PROTO;
	}
	s = malloc((size_t)n + 1);
	if (!s) {
		r->pos = save;
		return -ENOMEM;
	}
	memcpy(s, r->data + r->pos, n);
	s[n] = 0;
	r->pos += n;
	*ret = s;
	return 0;
}

int st_proto_encode(struct st_wbuf *out, uint16_t type, uint64_t request_id,
		    uint32_t client_id, int32_t status, const void *payload,
		    size_t payload_len)
{
	out->len = 0;
	out->err = 0;
	if (payload_len > ST_MSG_MAX_BYTES - ST_PROTO_HEADER_BYTES)
		return -ST_E_LIMIT;
	st_wbuf_u32(out, ST_PROTO_MAGIC);
	st_wbuf_u16(out, ST_PROTO_VERSION);
	st_wbuf_u16(out, type);
	st_wbuf_u64(out, request_id);
	st_wbuf_u32(out, client_id);
	st_wbuf_i32(out, status);
	st_wbuf_u32(out, (uint32_t)payload_len);
	st_wbuf_u32(out, 0);
	st_wbuf_bytes(out, payload, payload_len);
	return out->err;
}

int st_proto_decode_header(const void *buf, size_t len,
			   struct st_msg_header *h)
{
	struct st_rbuf r;

	if (!buf || len < ST_PROTO_HEADER_BYTES)
		return -ST_E_PROTO;
	st_rbuf_init(&r, buf, len);
	st_rbuf_u32(&r, &h->magic);
	st_rbuf_u16(&r, &h->version);
	st_rbuf_u16(&r, &h->type);
	st_rbuf_u64(&r, &h->request_id);
	st_rbuf_u32(&r, &h->client_id);
	st_rbuf_i32(&r, &h->status);
	st_rbuf_u32(&r, &h->payload_len);
	st_rbuf_u32(&r, &h->reserved);
	if (h->magic != ST_PROTO_MAGIC)
		return -ST_E_BADMAGIC;
	if (h->version != ST_PROTO_VERSION)
		return -ST_E_VERSION;
	if (h->reserved != 0 ||
	    (size_t)h->payload_len != len - ST_PROTO_HEADER_BYTES)
		return -ST_E_PROTO;
	return 0;
}

const char *st_proto_type_name(uint16_t type)
{
	switch (type & ~ST_MSG_REPLY) {
	case ST_MSG_HELLO: return "HELLO";
	case ST_MSG_BYE: return "BYE";
	case ST_MSG_PING: return "PING";
	case ST_MSG_STATS: return "STATS";
	case ST_MSG_SHUTDOWN: return "SHUTDOWN";
	case 0x0006: return "DEV_EXPORT";  /* st_devpool.h */
	case 0x0007: return "DEV_REVOKE";
	default: break;
	}
	if ((type & 0x7f00) == ST_MSG_ES_FIRST)
		return "expertd-message";
	if ((type & 0x7f00) == ST_MSG_KV_FIRST)
		return "kvd-message";
	if ((type & 0x7f00) == ST_MSG_CW_FIRST)
		return "computed-message";
	return "unknown";
}

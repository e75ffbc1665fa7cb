/* kv_session_proto.c — KV_MSG_SESSION's payloads (kv_session_proto.h). */
#include "kv_session_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kv_proto.h"

int kv_session_name_ok(const char *name, struct st_diag *diag)
{
	size_t n = strlen(name);

	if (n == 0 || n > KV_SESSION_NAME_BYTES) {
		st_diag_set(diag, -EINVAL, "a session name has 1 to %d "
			    "characters (got %zu)", KV_SESSION_NAME_BYTES, n);
		return 0;
	}
	if (name[0] == '.') {
		st_diag_set(diag, -EINVAL, "session name '%s' starts with "
			    "'.'", name);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		      c == '-')) {
			st_diag_set(diag, -EINVAL, "session name: only "
				    "letters, digits, '.', '_' and '-' "
				    "(character %zu is not)", i + 1);
			return 0;
		}
	}
	return 1;
}

void kv_proto_encode_session(struct st_wbuf *w, const struct kv_msg_session *m)
{
	st_wbuf_u32(w, m->op);
	st_wbuf_str(w, m->name);
	st_wbuf_u64(w, m->ident.model_id);
	st_wbuf_u64(w, m->ident.store_id);
	st_wbuf_u32(w, m->ident.kv_dtype);
	st_wbuf_u32(w, m->ident.page_rows);
	st_wbuf_str(w, m->ident.model);
	st_wbuf_u32(w, m->n_ids);
	for (uint32_t i = 0; i < m->n_ids; i++)
		st_wbuf_i32(w, m->ids[i]);
}

/* Reads a u32-length string of at most cap - 1 bytes into buf. */
static int read_str(struct st_rbuf *r, char *buf, size_t cap)
{
	char *s = NULL;
	int rc = st_rbuf_str(r, cap - 1, &s);

	if (rc < 0)
		return rc;
	if (strlen(s) >= cap) {
		free(s);
		return -ST_E_PROTO;
	}
	memcpy(buf, s, strlen(s) + 1);
	free(s);
	return 0;
}

int kv_proto_decode_session(const uint8_t *p, size_t len,
			    struct kv_msg_session *ret, struct st_diag *diag)
{
	struct st_rbuf r;

	memset(ret, 0, sizeof(*ret));
	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &ret->op) ||
	    read_str(&r, ret->name, sizeof(ret->name)) ||
	    st_rbuf_u64(&r, &ret->ident.model_id) ||
	    st_rbuf_u64(&r, &ret->ident.store_id) ||
	    st_rbuf_u32(&r, &ret->ident.kv_dtype) ||
	    st_rbuf_u32(&r, &ret->ident.page_rows) ||
	    read_str(&r, ret->ident.model, sizeof(ret->ident.model)) ||
	    st_rbuf_u32(&r, &ret->n_ids))
		return st_diag_set(diag, -ST_E_PROTO, "SESSION: payload of "
				   "%zu bytes is malformed", len);
	if (ret->op < KV_SESSION_SAVE || ret->op > KV_SESSION_REMOVE)
		return st_diag_set(diag, -ST_E_PROTO, "SESSION: unknown "
				   "operation %u", ret->op);
	if (ret->op == KV_SESSION_LIST && ret->name[0])
		return st_diag_set(diag, -ST_E_PROTO, "SESSION LIST: no name "
				   "expected");
	if (ret->op != KV_SESSION_LIST && !kv_session_name_ok(ret->name, diag))
		return -EINVAL;
	if ((ret->op == KV_SESSION_SAVE) != (ret->n_ids > 0))
		return st_diag_set(diag, -ST_E_PROTO, "SESSION: %u token ids "
				   "(SAVE takes the conversation's ids, other "
				   "operations none)", ret->n_ids);
	if (ret->n_ids > KV_PROTO_MAX_IDS)
		return st_diag_set(diag, -ST_E_LIMIT, "SESSION: %u token ids, "
				   "at most %d", ret->n_ids,
				   (int)KV_PROTO_MAX_IDS);
	if (st_rbuf_left(&r) != (size_t)ret->n_ids * 4)
		return st_diag_set(diag, -ST_E_PROTO, "SESSION: %u ids need "
				   "%zu bytes, got %zu", ret->n_ids,
				   (size_t)ret->n_ids * 4, st_rbuf_left(&r));
	if (ret->n_ids) {
		ret->ids = malloc(sizeof(int32_t) * ret->n_ids);
		if (!ret->ids)
			return -ENOMEM;
		for (uint32_t i = 0; i < ret->n_ids; i++)
			st_rbuf_i32(&r, &ret->ids[i]);
	}
	return 0;
}

void kv_msg_session_fini(struct kv_msg_session *m)
{
	free(m->ids);
	m->ids = NULL;
	m->n_ids = 0;
}

void kv_proto_encode_session_list(struct st_wbuf *w, uint32_t n,
				  const struct kv_session_info *v)
{
	st_wbuf_u32(w, n);
	for (uint32_t i = 0; i < n; i++) {
		st_wbuf_str(w, v[i].name);
		st_wbuf_u32(w, v[i].n_rows);
		st_wbuf_u64(w, v[i].file_bytes);
		st_wbuf_str(w, v[i].model);
		st_wbuf_str(w, v[i].bad);
	}
}

int kv_proto_decode_session_list(const uint8_t *p, size_t len, uint32_t cap,
				 struct kv_session_info *ret,
				 uint32_t *ret_n)
{
	struct st_rbuf r;
	uint32_t n;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &n) || n > cap)
		return -ST_E_PROTO;
	for (uint32_t i = 0; i < n; i++)
		if (read_str(&r, ret[i].name, sizeof(ret[i].name)) ||
		    st_rbuf_u32(&r, &ret[i].n_rows) ||
		    st_rbuf_u64(&r, &ret[i].file_bytes) ||
		    read_str(&r, ret[i].model, sizeof(ret[i].model)) ||
		    read_str(&r, ret[i].bad, sizeof(ret[i].bad)))
			return -ST_E_PROTO;
	if (st_rbuf_left(&r))
		return -ST_E_PROTO;
	*ret_n = n;
	return 0;
}

/* cw_session.c — computed's side of saved sessions (cw_session.h). */
#include "cw_session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_model.h"
#include "st_log.h"
#include "st_store.h"
#include "st_store_id.h"
#include "st_util.h"

int cw_session_ident(const struct cw_model *m, struct kv_client *kv,
		     const char *model_name, uint32_t kv_dtype,
		     struct kv_session_ident *ret, struct st_diag *diag)
{
	const struct st_store *st = cw_model_store(m);
	uint64_t weights = 0;
	int r;

	memset(ret, 0, sizeof(*ret));
	r = st_store_id(st, &weights, diag);
	if (r < 0)
		return r;
	ret->store_id = st_xxh3(st->config_json, strlen(st->config_json)) ^
			weights;
	ret->model_id = kv_client_model_id(kv);
	ret->page_rows = kv_client_page_rows(kv);
	ret->kv_dtype = kv_dtype;
	snprintf(ret->model, sizeof(ret->model), "%s", model_name);
	return 0;
}

int cw_session_save(struct kv_client *kv, const struct kv_session_ident *id,
		    const char *name, uint32_t seq, const int32_t *ids,
		    int n_ids, int n_rows, int publish, uint32_t *ret_rows,
		    int32_t *ret_replaced, struct st_diag *diag)
{
	uint32_t groups = 0;
	int r;

	if (ret_rows)
		*ret_rows = 0;
	if (ret_replaced)
		*ret_replaced = -1;
	n_rows = ST_MIN(n_rows, n_ids);
	if (n_rows <= 0)
		return st_diag_set(diag, -EINVAL, "session '%s': no rows to "
				   "save", name);
	if (publish) {
		r = kv_client_seq_publish(kv, seq, ids, (uint32_t)n_rows, diag);
		if (r < 0)
			return r;
	}
	r = kv_client_session_save(kv, name, id, ids, (uint32_t)n_rows,
				   &groups, ret_replaced, diag);
	if (r < 0)
		return r;
	if (ret_rows)
		*ret_rows = groups * id->page_rows;
	st_info("session '%s' saved: %u of %d rows", name,
		groups * id->page_rows, n_rows);
	return 0;
}

int cw_session_load(struct kv_client *kv, const struct kv_session_ident *id,
		    const char *name, uint32_t *ret_rows,
		    struct st_diag *diag)
{
	uint32_t placed, rows, n_ids;
	int32_t *ids = NULL;
	int r = kv_client_session_load(kv, name, id, &placed, &rows, &ids,
				       &n_ids, diag);

	free(ids);
	if (r == 0 && ret_rows)
		*ret_rows = rows;
	return r;
}

int cw_session_status(int r)
{
	switch (r) {
	case -EINVAL:
	case -ST_E_CONFIG:
	case -ST_E_CHECKSUM:
	case -ST_E_FORMAT:
	case -ST_E_VERSION:
		return 400;
	case -ST_E_NOTFOUND:
		return 404;
	case -ST_E_PEERGONE:
	case -ST_E_BUDGET:
		return 503;
	default:
		return 500;
	}
}

json_t *cw_session_http(struct kv_client *kv,
			const struct kv_session_ident *id, const char *method,
			const char *name, int load, int *ret_status,
			struct st_diag *diag)
{
	int r;

	*ret_status = 200;
	if (!strcmp(method, "GET") && !name) {
		struct kv_session_info *v =
			calloc(KV_SESSION_MAX_LIST, sizeof(*v));
		uint32_t n = 0;
		json_t *data;

		if (!v) {
			*ret_status = 500;
			st_diag_set(diag, -ENOMEM, "out of memory");
			return NULL;
		}
		r = kv_client_session_list(kv, KV_SESSION_MAX_LIST, v, &n,
					   diag);
		if (r < 0) {
			free(v);
			*ret_status = cw_session_status(r);
			return NULL;
		}
		data = json_array();
		for (uint32_t i = 0; i < n; i++) {
			json_t *e = json_pack(
				"{s:s,s:s,s:I,s:I,s:s}", "id", v[i].name,
				"object", "session", "rows",
				(json_int_t)v[i].n_rows, "bytes",
				(json_int_t)v[i].file_bytes, "model",
				v[i].model);

			/* a file that cannot be loaded says why */
			if (v[i].bad[0])
				json_object_set_new(e, "corrupt",
						    json_string(v[i].bad));
			json_array_append_new(data, e);
		}
		free(v);
		return json_pack("{s:s,s:o}", "object", "list", "data", data);
	}
	if (!name || !kv_session_name_ok(name, diag)) {
		*ret_status = name ? 400 : 405;
		if (!name)
			st_diag_set(diag, -EINVAL, "use GET /v1/sessions, "
				    "POST /v1/sessions/NAME[/load] or DELETE "
				    "/v1/sessions/NAME");
		return NULL;
	}
	if (!strcmp(method, "DELETE") && !load) {
		r = kv_client_session_remove(kv, name, diag);
		if (r < 0) {
			*ret_status = cw_session_status(r);
			return NULL;
		}
		return json_pack("{s:s,s:s,s:b}", "id", name, "object",
				 "session", "deleted", 1);
	}
	if (!strcmp(method, "POST") && load) {
		uint32_t placed, rows, n_ids;
		int32_t *ids = NULL;

		r = kv_client_session_load(kv, name, id, &placed, &rows, &ids,
					   &n_ids, diag);
		free(ids);
		if (r < 0) {
			*ret_status = cw_session_status(r);
			return NULL;
		}
		return json_pack("{s:s,s:s,s:I,s:I}", "id", name, "object",
				 "session", "rows", (json_int_t)rows,
				 "prompt_tokens", (json_int_t)n_ids);
	}
	*ret_status = 405;
	st_diag_set(diag, -EINVAL, "use GET /v1/sessions, POST "
		    "/v1/sessions/NAME (save; body: the conversation), POST "
		    "/v1/sessions/NAME/load or DELETE /v1/sessions/NAME");
	return NULL;
}

json_t *cw_session_save_ids(struct kv_client *kv,
			    const struct kv_session_ident *id,
			    const char *name, const int32_t *ids, int n_ids,
			    int *ret_status, struct st_diag *diag)
{
	uint32_t groups = 0;
	int32_t replaced = -1;
	json_t *j;
	int r;

	*ret_status = 200;
	if (n_ids <= 0) {
		*ret_status = 400;
		st_diag_set(diag, -EINVAL, "session '%s': an empty "
			    "conversation", name);
		return NULL;
	}
	r = kv_client_session_save(kv, name, id, ids, (uint32_t)n_ids,
				   &groups, &replaced, diag);
	if (r < 0) {
		*ret_status = cw_session_status(r);
		return NULL;
	}
	j = json_pack("{s:s,s:s,s:I,s:b}", "id", name, "object", "session",
		      "rows", (json_int_t)groups * id->page_rows, "replaced",
		      replaced >= 0);
	if (j && replaced >= 0)
		json_object_set_new(j, "replaced_rows",
				    json_integer(replaced));
	return j;
}

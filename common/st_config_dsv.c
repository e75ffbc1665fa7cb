/* st_config_dsv.c — see st_config_dsv.h. */
#include "st_config_dsv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_util.h"

int st_dsvcfg_want_int(const json_t *o, const char *key, int min, int *ret,
		       const char *src, const char *family,
		       struct st_diag *diag)
{
	const json_t *v = json_object_get(o, key);

	if (!v)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: key \"%s\" missing (a %s config.json has it)",
				   src, key, family);
	if (!json_is_integer(v) || json_integer_value(v) < min ||
	    json_integer_value(v) > (1 << 30))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" must be an integer >= %d", src,
				   key, min);
	*ret = (int)json_integer_value(v);
	return 0;
}

int st_dsvcfg_want_num(const json_t *o, const char *key, double *ret,
		       const char *src, const char *family,
		       struct st_diag *diag)
{
	const json_t *v = json_object_get(o, key);

	if (!v)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: key \"%s\" missing (a %s config.json has it)",
				   src, key, family);
	if (!json_is_number(v))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" must be a number", src, key);
	*ret = json_number_value(v);
	return 0;
}

int st_dsvcfg_want_bool(const json_t *o, const char *key, int *ret,
			const char *src, struct st_diag *diag)
{
	const json_t *v = json_object_get(o, key);

	if (!v || !json_is_boolean(v))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: key \"%s\" missing or not true/false",
				   src, key);
	*ret = json_is_true(v);
	return 0;
}

int st_dsvcfg_want_str(const json_t *o, const char *key, int required,
		       const char *const *values, const char *src,
		       const char *family, struct st_diag *diag)
{
	const json_t *v = json_object_get(o, key);

	if (!v && !required)
		return 0;
	if (!v)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: key \"%s\" missing", src, key);
	for (int i = 0; json_is_string(v) && values[i]; i++)
		if (!strcmp(json_string_value(v), values[i]))
			return 0;
	return st_diag_set(diag, -ST_E_UNSUPPORTED,
			   "%s: \"%s\" is %s%s%s, not \"%s\" (the only value strata implements for %s)",
			   src, key, json_is_string(v) ? "\"" : "",
			   json_is_string(v) ? json_string_value(v) : "not a string",
			   json_is_string(v) ? "\"" : "", values[0], family);
}

int st_dsvcfg_want_ints(const json_t *o, const struct st_dsvcfg_ikey *k,
			size_t n, const char *src, const char *family,
			struct st_diag *diag)
{
	int r;

	for (size_t i = 0; i < n; i++)
		if ((r = st_dsvcfg_want_int(o, k[i].key, k[i].min, k[i].dst, src,
					    family, diag)) < 0)
			return r;
	return 0;
}

int st_dsvcfg_want_nums(const json_t *o, const struct st_dsvcfg_dkey *k,
			size_t n, const char *src, const char *family,
			struct st_diag *diag)
{
	int r;

	for (size_t i = 0; i < n; i++)
		if ((r = st_dsvcfg_want_num(o, k[i].key, k[i].dst, src, family,
					    diag)) < 0)
			return r;
	return 0;
}

int st_dsvcfg_loads(const char *text, const char *source, json_t **ret_root,
		    struct st_diag *diag)
{
	json_error_t jerr;

	*ret_root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
	if (!*ret_root)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: not valid JSON (line %d: %s)", source,
				   jerr.line, jerr.text);
	return 0;
}

int st_dsvcfg_read(const char *dir, char **ret_text, char *path, size_t cap,
		   struct st_diag *diag)
{
	size_t len;
	int r;

	*ret_text = NULL;
	snprintf(path, cap, "%s/config.json", dir);
	r = st_read_file(path, ret_text, &len);
	if (r < 0)
		return st_diag_set(diag, r, "%s: cannot read: %s", path,
				   st_strerror(r));
	return 0;
}

int st_dsvcfg_detect(const char *text, const char *const *model_types)
{
	json_t *root = json_loads(text, 0, NULL);
	const json_t *v = root ? json_object_get(root, "model_type") : NULL;
	int yes = 0;

	for (int i = 0; v && json_is_string(v) && model_types[i] && !yes; i++)
		yes = !strcmp(json_string_value(v), model_types[i]);
	json_decref(root);
	return yes;
}

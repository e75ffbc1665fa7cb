/*
 * st_config_dsv.h — the plumbing of the DeepSeek-V4 family's config
 * reader (st_config_dsv_read.c, one reader for every revision): typed key
 * reads that name the family in their messages, tables of integer and
 * number keys, the JSON parse and file read, the model_type detection,
 * and what only V4.1 reads (st_config_dsv41.c).  A new revision adds a
 * row to the reader's table and a file of what it alone has.
 */
#ifndef ST_CONFIG_DSV_H
#define ST_CONFIG_DSV_H

#include <stddef.h>

#include <jansson.h>

#include "st_error.h"

/* An integer key into *dst, at least min; a number key into *dst. */
struct st_dsvcfg_ikey { const char *key; int *dst; int min; };
struct st_dsvcfg_dkey { const char *key; double *dst; };

/*
 * Reads key of object o into *ret: an integer in [min, 2^30] (want_int),
 * any number (want_num), true/false (want_bool).  src names the file in
 * messages, family the model ("DeepSeek-V4", "DeepSeek-V4.1").
 * Errors: -ST_E_CONFIG (missing, wrong type or range) with diag.
 */
int st_dsvcfg_want_int(const json_t *o, const char *key, int min, int *ret,
		       const char *src, const char *family,
		       struct st_diag *diag);
int st_dsvcfg_want_num(const json_t *o, const char *key, double *ret,
		       const char *src, const char *family,
		       struct st_diag *diag);
int st_dsvcfg_want_bool(const json_t *o, const char *key, int *ret,
			const char *src, struct st_diag *diag);
/*
 * A string key that must hold one of values (NULL-terminated; values[0]
 * is named in the message); absent is an error only when `required`.
 * Errors: -ST_E_CONFIG (missing), -ST_E_UNSUPPORTED (another value).
 */
int st_dsvcfg_want_str(const json_t *o, const char *key, int required,
		       const char *const *values, const char *src,
		       const char *family, struct st_diag *diag);
/* st_dsvcfg_want_int / _num over n table rows, in order; the first
 * error. */
int st_dsvcfg_want_ints(const json_t *o, const struct st_dsvcfg_ikey *k,
			size_t n, const char *src, const char *family,
			struct st_diag *diag);
int st_dsvcfg_want_nums(const json_t *o, const struct st_dsvcfg_dkey *k,
			size_t n, const char *src, const char *family,
			struct st_diag *diag);

/* text parsed as JSON (duplicate keys refused) into *ret_root (caller
 * decrefs).  Errors: -ST_E_FORMAT naming source, the line and jansson's
 * message. */
int st_dsvcfg_loads(const char *text, const char *source, json_t **ret_root,
		    struct st_diag *diag);
/* dir/config.json read into *ret_text (malloc'd, caller frees) and its
 * path into path[cap].  Errors: st_read_file's, with diag. */
int st_dsvcfg_read(const char *dir, char **ret_text, char *path, size_t cap,
		   struct st_diag *diag);
/* 1 when text is JSON whose "model_type" is one of model_types
 * (NULL-terminated), else 0 (never an error). */
int st_dsvcfg_detect(const char *text, const char *const *model_types);

struct st_dsv_config;

/* ---- V4.1's own parts (st_config_dsv41.c), in the reader's order ---- */

/* The composite top level: only its known keys, model_type "deepseek_v41"
 * (or "deepseek_v4.1"), expert_dtype "fp4" when present; *ret_text the
 * "text_config" object (borrowed).  Errors: -ST_E_CONFIG,
 * -ST_E_UNSUPPORTED, naming src. */
int st_dsvcfg_v41_top(const json_t *root, const char *src,
		      const json_t **ret_text, struct st_diag *diag);
/* text_config t's routing: num_hash_layers 0 when present, gate_temp >
 * 0 (read into c).  Errors: -ST_E_UNSUPPORTED, -ST_E_CONFIG. */
int st_dsvcfg_v41_routing(const json_t *t, const char *src,
			  struct st_dsv_config *c, struct st_diag *diag);
/* text_config t's CSA2 layer roles (KV, index and candidate sources,
 * checked against c->compress_ratio) and Engram layers into c.  Errors:
 * -ST_E_CONFIG, -ST_E_LIMIT. */
int st_dsvcfg_v41_layers(const json_t *t, const char *src,
			 struct st_dsv_config *c, struct st_diag *diag);
/* The ids (the top level authoritative, text_config repeating them;
 * defaults bos 0, eos 1, pad 2, image -1) and the top level's
 * tie_word_embeddings (false when present).  Errors: -ST_E_CONFIG,
 * -ST_E_UNSUPPORTED. */
int st_dsvcfg_v41_ids(const json_t *root, const json_t *t, const char *src,
		      struct st_dsv_config *c, struct st_diag *diag);

#endif

/*
 * es_convert_opts.c — `strata convert`'s options: the expert format
 * spellings, the attention and shared-expert precisions, the scale
 * searches, and the --keep-layers rules that give each layer its format
 * (es_convert.h documents each public function).
 */
#include "es_convert_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void es_convert_opts_init(struct es_convert_opts *opts)
{
	static const struct es_convert_opts def = ES_CONVERT_OPTS_DEFAULT;

	*opts = def;
}

/* --- formats per layer --------------------------------------------------- */


int es_cv_default_format(const struct es_convert_opts *o,
			  struct st_wformat *ret)
{
	struct st_wformat f = { o->expert_dtype, o->expert_group };

	if (f.group == 0) {
		switch (f.dtype) {
		case ST_DTYPE_MXFP4: f.group = ST_MXFP4_BLOCK; break;
		case ST_DTYPE_NVFP4: f.group = ST_NVFP4_BLOCK; break;
		case ST_DTYPE_E2M1_F16: f.group = 32; break;
		case ST_DTYPE_F8_E4M3: f.group = ST_FP8_DEFAULT_BLOCK; break;
		default: break;
		}
	}
	if (st_wformat_check(&f))
		return -EINVAL;
	*ret = f;
	return 0;
}

int es_convert_parse_experts(const char *name, struct es_convert_opts *opts,
			     struct st_diag *diag)
{
	struct st_wformat f;

	if (st_wformat_parse(name, &f))
		return st_diag_set(diag, -EINVAL, "expert format \"%s\": use "
				   ES_CV_FORMAT_SPELLINGS, name ? name : "");
	opts->expert_dtype = f.dtype;
	opts->expert_group = f.group;
	return 0;
}

enum st_scale_search es_cv_effective_search(enum st_dtype dt,
					     enum st_scale_search ss)
{
	if (dt == ST_DTYPE_MXFP4 || dt == ST_DTYPE_NVFP4 ||
	    dt == ST_DTYPE_E2M1_F16)
		return ss;
	return ST_SCALE_SEARCH_NONE;
}

int es_convert_parse_attention(const char *name, struct es_convert_opts *opts,
			       struct st_diag *diag)
{
	if (name && !strcmp(name, "bf16"))
		opts->attention_dtype = ST_DTYPE_BF16;
	else if (name && !strcmp(name, "f32"))
		opts->attention_dtype = ST_DTYPE_F32;
	else if (name && !strcmp(name, "auto"))
		opts->attention_dtype = ST_DTYPE_COUNT;
	else if (name && !strcmp(name, "fp8")) {
		/* E4M3 with an FP32 scale per row and 128 columns, as
		 * --dense fp8 stores them, for q/k/v/o only */
		opts->attention_dtype = ST_DTYPE_COUNT;
		if (opts->dense_fp8 == ES_DENSE_FP8_NONE)
			opts->dense_fp8 = ES_DENSE_FP8_ATTENTION;
	} else if (name && !strncmp(name, "fp8-", 4))
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "--attention %s: "
				   "the attention block size is fixed at 128 "
				   "columns; use fp8", name);
	else
		return st_diag_set(diag, -EINVAL, "--attention \"%s\": use "
				   "bf16, f32, fp8 or auto", name ? name : "");
	return 0;
}

int es_convert_parse_shared_experts(const char *name,
				    struct es_convert_opts *opts,
				    struct st_diag *diag)
{
	struct st_wformat f;

	if (st_wformat_parse(name, &f))
		return st_diag_set(diag, -EINVAL, "--shared-experts \"%s\": "
				   "use " ES_CV_FORMAT_SPELLINGS, name ? name : "");
	opts->shared_experts = f;
	opts->shared_experts_set = 1;
	return 0;
}

int es_convert_parse_scale_search(const char *name,
				  struct es_convert_opts *opts,
				  struct st_diag *diag)
{
	enum st_scale_search ss;

	if (st_scale_search_parse(name, &ss))
		return st_diag_set(diag, -EINVAL, "scale search \"%s\": use "
				   "none, mse, calibrated or gptq (with "
				   "--calibrate STATS)", name ? name : "");
	opts->scale_search = ss;
	return 0;
}

static int keep_item_str(const struct es_keep_rule *r, char *buf,
			 size_t len);

/* Parses a layer number at *p (decimal, no sign, at most 7 digits),
 * advancing *p; -1 when there is none. */
static int parse_layer_num(const char **p)
{
	const char *s = *p;
	int v = 0, n = 0;

	while (*s >= '0' && *s <= '9' && n < 8) {
		v = v * 10 + (*s++ - '0');
		n++;
	}
	if (n == 0 || n > 7)
		return -1;
	*p = s;
	return v;
}

/* One GROUP of a keep spec: [s, end) = "ITEM,ITEM=FORMAT".  Appends to
 * rules[*n] (cap ES_CONVERT_MAX_KEEP). */
static int parse_keep_group(const char *s, const char *end,
			    struct es_keep_rule *rules, int *n,
			    struct st_diag *diag)
{
	const char *eq = memchr(s, '=', (size_t)(end - s));
	char fmt[ST_WFORMAT_NAME_MAX + 8];
	struct st_wformat f;
	const char *p = s;
	int first = *n;

	if (!eq || eq == s)
		return st_diag_set(diag, -EINVAL, "--keep \"%.*s\": expected "
				   "LAYERS=FORMAT (e.g. first,last=fp8)",
				   (int)(end - s), s);
	if ((size_t)(end - eq - 1) >= sizeof(fmt))
		return st_diag_set(diag, -EINVAL, "--keep \"%.*s\": unknown "
				   "format; use " ES_CV_FORMAT_SPELLINGS,
				   (int)(end - s), s);
	memcpy(fmt, eq + 1, (size_t)(end - eq - 1));
	fmt[end - eq - 1] = 0;
	if (st_wformat_parse(fmt, &f))
		return st_diag_set(diag, -EINVAL, "--keep \"%.*s\": unknown "
				   "format \"%s\"; use " ES_CV_FORMAT_SPELLINGS,
				   (int)(end - s), s, fmt);
	while (p < eq) {
		const char *item = p;
		struct es_keep_rule r = { 0, 0, f };
		int ok = 1, v;

		if (!strncmp(p, "first", 5)) {
			r.lo = r.hi = ES_KEEP_FIRST;
			p += 5;
		} else if (!strncmp(p, "last", 4)) {
			r.lo = r.hi = ES_KEEP_LAST;
			p += 4;
		} else if ((v = parse_layer_num(&p)) < 0) {
			ok = 0;
		} else {
			r.lo = r.hi = v;
			if (*p == '-') {
				p++;
				v = parse_layer_num(&p);
				if (v < r.lo)
					ok = 0;
				r.hi = v;
			}
		}
		if (!ok || (p != eq && *p != ',') || (*p == ',' && p + 1 == eq))
			return st_diag_set(diag, -EINVAL, "--keep \"%.*s\": bad "
					   "layer \"%.*s\" (use first, last, a "
					   "layer number N or a range N-M)",
					   (int)(end - s), s,
					   (int)(strcspn(item, ",=")), item);
		if (*n >= ES_CONVERT_MAX_KEEP)
			return st_diag_set(diag, -ST_E_LIMIT, "--keep: more than "
					   "%d rules", ES_CONVERT_MAX_KEEP);
		rules[(*n)++] = r;
		if (*p == ',')
			p++;
	}
	return *n - first;
}

/* Layers lo..hi of rule r in a model of n_layers layers (n_layers < 0:
 * unknown, then first/last resolve only to themselves and -1 / -2 stand
 * for them). */
static void keep_range(const struct es_keep_rule *r, int n_layers, int *lo,
		       int *hi)
{
	*lo = r->lo;
	*hi = r->hi;
	if (n_layers > 0) {
		if (r->lo == ES_KEEP_FIRST)
			*lo = *hi = 0;
		if (r->lo == ES_KEEP_LAST)
			*lo = *hi = n_layers - 1;
	}
}

/*
 * A layer that two rules with different formats both name (the later
 * wins: "1-2=bf16;2=e2m1-g64" is a range with an exception).  Returns 0,
 * or 1 with diag naming the layer, both rules and which one wins.
 */
static int keep_conflicts(const struct es_keep_rule *rules, int n,
			  int n_layers, struct st_diag *diag)
{
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) {
			int alo, ahi, blo, bhi, at;
			char fa[ST_WFORMAT_NAME_MAX], fb[ST_WFORMAT_NAME_MAX];
			char ia[32], ib[32], what[48];

			if (rules[i].fmt.dtype == rules[j].fmt.dtype &&
			    rules[i].fmt.group == rules[j].fmt.group)
				continue;
			keep_range(&rules[i], n_layers, &alo, &ahi);
			keep_range(&rules[j], n_layers, &blo, &bhi);
			if (ahi < blo || bhi < alo)
				continue;
			at = ST_MAX(alo, blo);
			st_wformat_name(&rules[i].fmt, fa, sizeof(fa));
			st_wformat_name(&rules[j].fmt, fb, sizeof(fb));
			keep_item_str(&rules[i], ia, sizeof(ia));
			keep_item_str(&rules[j], ib, sizeof(ib));
			if (at == ES_KEEP_FIRST || at == ES_KEEP_LAST)
				snprintf(what, sizeof(what), "the %s layer",
					 at == ES_KEEP_FIRST ? "first" : "last");
			else
				snprintf(what, sizeof(what), "layer %d", at);
			st_diag_set(diag, 1, "--keep-layers: %s is named twice, "
				    "%s=%s and then %s=%s: the later rule wins "
				    "(%s)", what, ia, fa, ib, fb, fb);
			return 1;
		}
	return 0;
}

int es_convert_keep_overrides(const struct es_convert_opts *opts,
			      int n_layers, struct st_diag *diag)
{
	if (opts->n_keep < 0 || opts->n_keep > ES_CONVERT_MAX_KEEP)
		return 0;
	return keep_conflicts(opts->keep, opts->n_keep, n_layers, diag);
}

int es_convert_parse_keep(const char *spec, struct es_convert_opts *opts,
			  struct st_diag *diag)
{
	struct es_keep_rule rules[ES_CONVERT_MAX_KEEP];
	const char *s = spec;
	int n, r;

	if (!spec || !*spec)
		return st_diag_set(diag, -EINVAL, "--keep: empty (expected "
				   "LAYERS=FORMAT, e.g. first,last=fp8)");
	if (opts->n_keep < 0 || opts->n_keep > ES_CONVERT_MAX_KEEP)
		return st_diag_set(diag, -EINVAL, "--keep: bad rule count");
	n = opts->n_keep;
	memcpy(rules, opts->keep, sizeof(rules[0]) * (size_t)n);
	for (;;) {
		const char *end = strchr(s, ';');

		if (!end)
			end = s + strlen(s);
		r = parse_keep_group(s, end, rules, &n, diag);
		if (r < 0)
			return r;
		if (!*end)
			break;
		s = end + 1;
	}
	r = n - opts->n_keep;
	memcpy(opts->keep, rules, sizeof(rules[0]) * (size_t)n);
	opts->n_keep = n;
	return r;
}

static int keep_item_str(const struct es_keep_rule *r, char *buf, size_t len)
{
	if (r->lo == ES_KEEP_FIRST && r->hi == ES_KEEP_FIRST)
		return snprintf(buf, len, "first");
	if (r->lo == ES_KEEP_LAST && r->hi == ES_KEEP_LAST)
		return snprintf(buf, len, "last");
	if (r->lo < 0 || r->hi < r->lo)
		return -1;
	if (r->lo == r->hi)
		return snprintf(buf, len, "%d", r->lo);
	return snprintf(buf, len, "%d-%d", r->lo, r->hi);
}

int es_convert_keep_str(const struct es_convert_opts *opts, char *buf,
			size_t len)
{
	size_t at = 0;

	if (!len)
		return -ENAMETOOLONG;
	buf[0] = 0;
	if (opts->n_keep < 0 || opts->n_keep > ES_CONVERT_MAX_KEEP)
		return -EINVAL;
	for (int i = 0; i < opts->n_keep; i++) {
		const struct es_keep_rule *r = &opts->keep[i];
		const struct es_keep_rule *next = i + 1 < opts->n_keep ?
						  &opts->keep[i + 1] : NULL;
		char item[32], fmt[ST_WFORMAT_NAME_MAX];
		int k;

		if (keep_item_str(r, item, sizeof(item)) < 0 ||
		    st_wformat_name(&r->fmt, fmt, sizeof(fmt))) {
			buf[0] = 0;
			return -EINVAL;
		}
		if (next && next->fmt.dtype == r->fmt.dtype &&
		    next->fmt.group == r->fmt.group)
			k = snprintf(buf + at, len - at, "%s,", item);
		else
			k = snprintf(buf + at, len - at, "%s=%s%s", item, fmt,
				     next ? ";" : "");
		if (k < 0 || (size_t)k >= len - at) {
			buf[0] = 0;
			return -ENAMETOOLONG;
		}
		at += (size_t)k;
	}
	return 0;
}

int es_convert_layer_format(const struct es_convert_opts *opts, int n_layers,
			    int layer, struct st_wformat *ret)
{
	struct st_wformat f;

	if (es_cv_default_format(opts, &f) || layer < 0 || layer >= n_layers ||
	    opts->n_keep < 0 || opts->n_keep > ES_CONVERT_MAX_KEEP)
		return -EINVAL;
	for (int i = 0; i < opts->n_keep; i++) {
		const struct es_keep_rule *r = &opts->keep[i];
		int lo = r->lo == ES_KEEP_FIRST ? 0 :
			 r->lo == ES_KEEP_LAST ? n_layers - 1 : r->lo;
		int hi = r->hi == ES_KEEP_FIRST ? 0 :
			 r->hi == ES_KEEP_LAST ? n_layers - 1 : r->hi;

		if (st_wformat_check(&r->fmt) || lo < 0 || hi < lo ||
		    hi >= n_layers)
			return -EINVAL;
		if (layer >= lo && layer <= hi)
			f = r->fmt;
	}
	*ret = f;
	return 0;
}

/*
 * es_convert.c — the store writer: checkpoint -> strata store (see
 * es_convert.h for the contract, common/st_store.h for the format).
 *
 * Three phases:
 *  1. check: config, every expert matrix and every dense role with its
 *     shape and dtype, tokenizer files (loaded as computed loads them),
 *     every float weight finite; nothing is written before all pass;
 *  2. write into OUT.tmp-<pid>: dense.bin, experts-LLL.bin, the copied
 *     files, manifest.json last; every file fsynced, then the directory;
 *  3. publish: rename the temporary directory to OUT (atomic exchange with
 *     an existing store under force), fsync the parent.
 * The output depends only on the checkpoint and the options: tensors in the
 * checkpoint's (name-sorted) order, zero padding, a manifest with a fixed
 * key order and no times or absolute paths.
 */
#include "es_convert.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

#include "st_build_config.h"
#include "st_calib.h"
#include "st_config.h"
#include "st_config_dsv4.h"
#include "es_convert_engram.h"
#include "st_gptq.h"
#include "st_safetensors.h"
#include "st_store.h"
#include "st_tokenizer.h"
#include "st_log.h"
#include "st_util.h"

/* The store files are little-endian, written from host memory as is. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
	       "the store writer assumes a little-endian host");

/* Elements converted per step for large dense tensors. */
#define CHUNK_ELEMS ((size_t)1 << 20)

static const char *const mat_names[3] = { "gate", "up", "down" };

/* Copied into the store: required ones first, then optional. */
static const struct {
	const char *name;
	int required;
} copied_files[] = {
	{ "config.json", 1 },
	{ "generation_config.json", 0 },
	{ "tokenizer.json", 1 },
	{ "tokenizer_config.json", 1 },
};

struct conv {
	const char *model_dir;
	char out[4096];           /* out_dir without trailing slashes */
	char parent[4096];        /* its directory */
	const char *base;         /* its last component (inside out) */
	char tmp[4200];           /* out.tmp-<pid> */
	struct es_convert_opts o;
	struct st_diag *diag;

	struct st_model_config cfg;
	char *config_text;
	size_t config_len;
	struct st_checkpoint *ck;
	const struct st_tensor_info **experts; /* [(l * E + e) * 3 + m] */
	uint8_t *is_expert;                    /* per checkpoint tensor */
	uint8_t *is_attn;                      /* q/k/v/o, per tensor */
	uint8_t *is_shexp;                     /* shared-expert gate/up/down */
	enum st_dtype dense_dtype;
	struct st_wformat def_fmt;          /* opts' default format */
	struct st_store_layer *layers;      /* [n_layers] record layouts */
	uint64_t record_bytes;              /* the largest layer record */
	int have_copied[ST_ARRAY_SIZE(copied_files)];

	/* calibrated scale search (opts.calib_path) */
	struct st_calib cal;
	uint64_t cal_file_xxh3;
	float *cal_w;             /* per-column weights of one matrix */
	float *gptq_w;            /* GPTQ: one matrix in float32 */
	double *gptq_h;           /* GPTQ: its input's second moment */
	uint64_t cal_fallback;    /* (layer, expert)s with too few tokens */

	/* DeepSeek-V4 (config model_type "deepseek_v4"): lossless store */
	int dsv4;
	struct st_dsv4_config v4;
	const struct st_tensor_info **v4_scales; /* like experts: E8M0 */
	/* DeepSeek-V4.1 (model_type "deepseek_v41"): the V4 path plus the
	 * Engram tables (es_convert_engram.c); dsv4 is set too */
	int dsv41;
	struct st_dsv41_config v41;
	struct es_engram_plan engram;
	int skipped[ES_V41_N_SKIP];         /* tensors per skipped group */

	uint64_t done, total;     /* progress, bytes read */
	XXH3_state_t *xs;
	json_t *manifest;
};

void es_convert_opts_init(struct es_convert_opts *opts)
{
	static const struct es_convert_opts def = ES_CONVERT_OPTS_DEFAULT;

	*opts = def;
}

/* --- formats per layer --------------------------------------------------- */

#define FORMAT_SPELLINGS "mxfp4, nvfp4, e2m1-g32, e2m1-g128 (e2m1-g<N>, N " \
	"even), fp8 (block 128; fp8-b<N>), bf16, f32"

/* The default format of opts, its group filled in when 0. */
static int default_format(const struct es_convert_opts *o,
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
				   FORMAT_SPELLINGS, name ? name : "");
	opts->expert_dtype = f.dtype;
	opts->expert_group = f.group;
	return 0;
}

/*
 * The scale search a matrix of format dt really gets: the 4-bit formats
 * search (measured on kjv-moe valid-small it removes 35-68 % of their
 * perplexity cost); FP8 keeps the plain amax/448 scale, because there the
 * search lowers the weight RMS error but raised perplexity (25.5850 ->
 * 25.6527): with 3 mantissa bits FP8's relative precision hardly depends on
 * the scale, so the search only clips the largest weights.
 */
static enum st_scale_search effective_search(enum st_dtype dt,
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
				   "use " FORMAT_SPELLINGS, name ? name : "");
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
				   "format; use " FORMAT_SPELLINGS,
				   (int)(end - s), s);
	memcpy(fmt, eq + 1, (size_t)(end - eq - 1));
	fmt[end - eq - 1] = 0;
	if (st_wformat_parse(fmt, &f))
		return st_diag_set(diag, -EINVAL, "--keep \"%.*s\": unknown "
				   "format \"%s\"; use " FORMAT_SPELLINGS,
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

	if (default_format(opts, &f) || layer < 0 || layer >= n_layers ||
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

/* Reports progress; returns -ECANCELED when the caller asked to stop
 * (opts.cancel), so the writer unwinds and removes its temporary dir. */
static int progress(struct conv *c, uint64_t bytes)
{
	c->done += bytes;
	if (c->o.progress)
		c->o.progress(c->done, c->total, c->o.progress_arg);
	if (c->o.cancel && *c->o.cancel)
		return st_diag_set(c->diag, -ECANCELED, "convert interrupted; "
				   "nothing was written to the output");
	return 0;
}

/* "[a, b, c]" */
static const char *shape_str(int n_dims, const int64_t *shape, char *buf,
			     size_t len)
{
	size_t at = 0;

	at += (size_t)snprintf(buf, len, "[");
	for (int d = 0; d < n_dims && at < len; d++)
		at += (size_t)snprintf(buf + at, len - at, "%s%" PRId64,
				       d ? ", " : "", shape[d]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
	return buf;
}

/* Checks tensor t against the expected [rows, cols] (cols 0: a vector). */
static int check_shape(struct conv *c, const struct st_tensor_info *t,
		       int64_t rows, int64_t cols)
{
	int64_t want[2] = { rows, cols };
	int want_dims = cols ? 2 : 1;
	char got_s[128], want_s[64];

	if (t->n_dims == want_dims && t->shape[0] == rows &&
	    (want_dims == 1 || t->shape[1] == cols))
		return 0;
	return st_diag_set(c->diag, -ST_E_FORMAT,
			   "checkpoint %s: tensor %s has shape %s, config.json "
			   "implies %s", c->model_dir, t->name,
			   shape_str(t->n_dims, t->shape, got_s, sizeof(got_s)),
			   shape_str(want_dims, want, want_s, sizeof(want_s)));
}

static int float_dtype(enum st_dtype dt)
{
	return dt == ST_DTYPE_F32 || dt == ST_DTYPE_F16 || dt == ST_DTYPE_BF16;
}

/* --- phase 1: checks ----------------------------------------------------- */

static int check_experts(struct conv *c)
{
	int L = c->cfg.n_layers, E = c->cfg.n_experts;

	c->experts = calloc((size_t)L * E * 3, sizeof(*c->experts));
	if (!c->experts)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	for (int l = 0; l < L; l++)
		for (int e = 0; e < E; e++)
			for (int m = 0; m < 3; m++) {
				const struct st_tensor_info *t;
				char name[256];
				int r = st_expert_tensor_name(&c->cfg, l, e,
							      (enum st_expert_mat)m,
							      name, sizeof(name));

				if (r)
					return st_diag_set(c->diag, r, "expert "
							   "tensor name (%d, %d): "
							   "%s", l, e,
							   st_strerror(r));
				t = st_checkpoint_find(c->ck, name);
				if (!t)
					return st_diag_set(c->diag, -ST_E_NOTFOUND,
							   "checkpoint %s: tensor %s "
							   "is missing (layer %d, "
							   "expert %d, %s matrix)",
							   c->model_dir, name, l, e,
							   mat_names[m]);
				if ((r = check_shape(c, t, c->layers[0].mat[m].rows,
						     c->layers[0].mat[m].cols)))
					return r;
				if (!float_dtype(t->dtype))
					return st_diag_set(c->diag,
							   -ST_E_UNSUPPORTED,
							   "checkpoint %s: tensor %s: "
							   "dtype %s (expert matrices "
							   "must be F32, F16 or BF16)",
							   c->model_dir, name,
							   st_dtype_traits(t->dtype)->name);
				c->experts[((size_t)l * E + e) * 3 + m] = t;
				c->is_expert[t - c->ck->tensors] = 1;
			}
	return 0;
}

static int check_dense(struct conv *c)
{
	int all_bf16 = 1;

	for (int role = 0; role < ST_T_ROLE_COUNT; role++) {
		int global = role == ST_T_EMBED || role == ST_T_FINAL_NORM ||
			     role == ST_T_LM_HEAD;
		int n = global ? 1 : c->cfg.n_layers;

		for (int l = 0; l < n; l++) {
			const struct st_tensor_info *t;
			int64_t rows, cols;
			char name[256];
			int r = st_dense_tensor_name(&c->cfg,
						     (enum st_dense_role)role, l,
						     name, sizeof(name));

			if (r == -ST_E_NOTFOUND)
				break;
			if (r)
				return st_diag_set(c->diag, r, "dense tensor name "
						   "(role %d, layer %d): %s", role,
						   l, st_strerror(r));
			t = st_checkpoint_find(c->ck, name);
			if (!t)
				return st_diag_set(c->diag, -ST_E_NOTFOUND,
						   "checkpoint %s: tensor %s is "
						   "missing", c->model_dir, name);
			st_dense_tensor_shape(&c->cfg, (enum st_dense_role)role,
					      &rows, &cols);
			if ((r = check_shape(c, t, rows, cols)))
				return r;
			if (role == ST_T_Q || role == ST_T_K || role == ST_T_V ||
			    role == ST_T_O)
				c->is_attn[t - c->ck->tensors] = 1;
			if (role == ST_T_SHEXP_GATE || role == ST_T_SHEXP_UP ||
			    role == ST_T_SHEXP_DOWN)
				c->is_shexp[t - c->ck->tensors] = 1;
		}
	}
	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i];

		if (c->is_expert[i])
			continue;
		if (strstr(t->name, ".experts."))
			return st_diag_set(c->diag, -ST_E_FORMAT,
					   "checkpoint %s: tensor %s looks like an "
					   "expert matrix, but config.json has %d "
					   "layers of %d experts", c->model_dir,
					   t->name, c->cfg.n_layers,
					   c->cfg.n_experts);
		if (!float_dtype(t->dtype))
			return st_diag_set(c->diag, -ST_E_UNSUPPORTED,
					   "checkpoint %s: tensor %s: dtype %s "
					   "(dense tensors must be F32, F16 or "
					   "BF16)", c->model_dir, t->name,
					   st_dtype_traits(t->dtype)->name);
		if (t->n_dims > 4)
			return st_diag_set(c->diag, -ST_E_UNSUPPORTED,
					   "checkpoint %s: tensor %s has %d "
					   "dimensions (at most 4)", c->model_dir,
					   t->name, t->n_dims);
		all_bf16 &= t->dtype == ST_DTYPE_BF16;
	}
	c->dense_dtype = all_bf16 && !c->o.dense_f32 ? ST_DTYPE_BF16 :
						       ST_DTYPE_F32;
	return 0;
}

static int check_copied_files(struct conv *c)
{
	for (size_t i = 0; i < ST_ARRAY_SIZE(copied_files); i++) {
		char path[4200];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", c->model_dir,
			 copied_files[i].name);
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			c->have_copied[i] = 1;
			c->total += (uint64_t)st.st_size;
		} else if (copied_files[i].required) {
			return st_diag_set(c->diag, -ST_E_NOTFOUND,
					   "checkpoint %s: %s is missing (a store "
					   "needs the tokenizer)", c->model_dir,
					   copied_files[i].name);
		}
	}
	return 0;
}

/* The tokenizer must load as computed will load it: a broken one is
 * refused here, not met by the first request.  Ids beyond the
 * embedding's vocab_size rows only warn: small test models keep a large
 * model's tokenizer, and computed refuses such an id in a prompt. */
static int check_tokenizer(struct conv *c)
{
	struct st_tokenizer *tok = NULL;
	struct st_diag d = { "" };
	int r = st_tokenizer_load(c->model_dir, &tok, &d);
	int n;

	if (r)
		return st_diag_set(c->diag, r, "checkpoint %s: the tokenizer "
				   "cannot be loaded: %s; fix or replace "
				   "tokenizer.json / tokenizer_config.json "
				   "(nothing was written)", c->model_dir, d.msg);
	n = st_tokenizer_n_vocab(tok);
	st_tokenizer_free(tok);
	if (c->cfg.vocab_size > 0 && n > c->cfg.vocab_size)
		st_warn("convert: %s: tokenizer.json has token ids up to %d, "
			"but config.json vocab_size is %d (the embedding's "
			"rows): prompts that encode to the ids beyond will be "
			"refused; check that the tokenizer belongs to these "
			"weights", c->model_dir, n - 1, c->cfg.vocab_size);
	return 0;
}

/* Index of the first element of n (width-byte words at src) whose bits
 * under mask are all set, or -1.  Blocks are tested branch-free first
 * (the compiler vectorizes the OR), so a clean tensor costs one pass at
 * memory speed. */
#define NONFINITE_BLOCK 4096
static int64_t first_all_ones(const uint8_t *src, uint64_t n, size_t width,
			      uint32_t mask)
{
	for (uint64_t b = 0; b < n; b += NONFINITE_BLOCK) {
		uint64_t e = ST_MIN(n, b + NONFINITE_BLOCK);
		unsigned bad = 0;

		if (width == 2) {
			for (uint64_t i = b; i < e; i++) {
				uint16_t v;

				memcpy(&v, src + i * 2, 2);
				bad |= (v & mask) == mask;
			}
		} else {
			for (uint64_t i = b; i < e; i++) {
				uint32_t v;

				memcpy(&v, src + i * 4, 4);
				bad |= (v & mask) == mask;
			}
		}
		for (uint64_t i = b; bad && i < e; i++) {
			uint32_t v = 0;

			memcpy(&v, src + i * width, width); /* little-endian */
			if ((v & mask) == mask)
				return (int64_t)i;
		}
	}
	return -1;
}

/* Index of the first NaN or infinity (all exponent bits set) among the n
 * elements of a F32, F16 or BF16 tensor at src, or -1 (also for any
 * other dtype: codes are kept as shipped); *ret_nan: a NaN (mantissa not
 * zero) rather than an infinity. */
static int64_t first_nonfinite(enum st_dtype dt, const uint8_t *src,
			       uint64_t n, int *ret_nan)
{
	uint32_t mask, mant, v = 0;
	size_t es;
	int64_t k;

	switch (dt) {
	case ST_DTYPE_F32: mask = 0x7f800000u; mant = 0x007fffffu; es = 4; break;
	case ST_DTYPE_F16: mask = 0x7c00u; mant = 0x03ffu; es = 2; break;
	case ST_DTYPE_BF16: mask = 0x7f80u; mant = 0x007fu; es = 2; break;
	default: return -1;
	}
	k = first_all_ones(src, n, es, mask);
	if (k >= 0) {
		memcpy(&v, src + (uint64_t)k * es, es);
		*ret_nan = (v & mant) != 0;
	}
	return k;
}

/* Every float tensor of the checkpoint holds finite values: a NaN or an
 * infinity (a damaged download or export) would make every token's
 * logits NaN, so the tensor, its file and the element are named. */
static int check_finite(struct conv *c)
{
	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i];
		int nan = 0;
		int64_t k = first_nonfinite(t->dtype,
					    st_checkpoint_data(c->ck, t),
					    t->n_elems, &nan);
		char where[64] = "";

		if (k < 0)
			continue;
		if (t->n_dims == 2)
			snprintf(where, sizeof(where), " [%" PRId64 ", %" PRId64
				 "]", k / t->shape[1], k % t->shape[1]);
		return st_diag_set(c->diag, -ST_E_FORMAT, "checkpoint %s: "
				   "tensor %s (file %s) holds %s at element %"
				   PRId64 "%s: the weights are damaged; "
				   "re-download or re-export the checkpoint "
				   "(nothing was written)", c->model_dir,
				   t->name, c->ck->file_names[t->file_index],
				   nan ? "a NaN" : "an infinity", k, where);
	}
	return 0;
}

/* --- output directory ---------------------------------------------------- */

/* Is `name` "<base><suffix><digits>"?  Returns the number or -1. */
static long leftover_pid(const char *name, const char *base,
			 const char *suffix)
{
	size_t bl = strlen(base), sl = strlen(suffix);
	char *end;
	long pid;

	if (strncmp(name, base, bl) || strncmp(name + bl, suffix, sl))
		return -1;
	name += bl + sl;
	if (*name < '0' || *name > '9')
		return -1;
	pid = strtol(name, &end, 10);
	return *end || pid <= 0 ? -1 : pid;
}

/* Removes OUT.tmp-<pid> / OUT.old-<pid> left by converts that died (their
 * pid is gone: killed with SIGKILL, crashed), saying so in the log (warn:
 * the space was held until now); a live convert's directory is left
 * alone. */
static void remove_leftovers(struct conv *c)
{
	DIR *d = opendir(c->parent);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d))) {
		long pid = leftover_pid(de->d_name, c->base, ".tmp-");
		char path[8400];

		if (pid < 0)
			pid = leftover_pid(de->d_name, c->base, ".old-");
		if (pid < 0 || (pid != getpid() && st_pid_alive((int)pid)))
			continue;
		snprintf(path, sizeof(path), "%s/%s", c->parent, de->d_name);
		if (pid != getpid())
			st_warn("convert: removing %s, left by a convert that "
				"died (pid %ld)", path, pid);
		st_rm_rf(path);
	}
	closedir(d);
}

/* An existing directory we may replace under force: empty, or a store. */
static int replaceable(const char *dir)
{
	char path[4200];
	DIR *d;
	struct dirent *de;
	int empty = 1;

	snprintf(path, sizeof(path), "%s/%s", dir, ST_STORE_MANIFEST);
	if (st_path_exists(path))
		return 1;
	d = opendir(dir);
	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			empty = 0;
	closedir(d);
	return empty;
}

static int prepare_out(struct conv *c, const char *out_dir, int *ret_exists)
{
	size_t n = strlen(out_dir);
	struct stat st;
	char *slash;

	while (n > 1 && out_dir[n - 1] == '/')
		n--;
	if (n == 0 || n >= sizeof(c->out) - 32)
		return st_diag_set(c->diag, -EINVAL, "output directory \"%s\": "
				   "empty or too long", out_dir);
	memcpy(c->out, out_dir, n);
	c->out[n] = 0;
	slash = strrchr(c->out, '/');
	if (!slash) {
		snprintf(c->parent, sizeof(c->parent), ".");
		c->base = c->out;
	} else {
		size_t pl = slash == c->out ? 1 : (size_t)(slash - c->out);

		memcpy(c->parent, c->out, pl);
		c->parent[pl] = 0;
		c->base = slash + 1;
	}
	if (!*c->base || !strcmp(c->base, ".") || !strcmp(c->base, ".."))
		return st_diag_set(c->diag, -EINVAL, "output directory \"%s\": "
				   "name a new directory", out_dir);
	if (stat(c->parent, &st) < 0)
		return st_diag_set(c->diag, -errno, "output directory %s: parent "
				   "%s: %s", c->out, c->parent, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return st_diag_set(c->diag, -ENOTDIR, "output directory %s: "
				   "parent %s is not a directory", c->out,
				   c->parent);
	remove_leftovers(c);
	*ret_exists = lstat(c->out, &st) == 0;
	if (*ret_exists) {
		if (!c->o.force)
			return st_diag_set(c->diag, -EEXIST,
					   "output directory %s exists; pass "
					   "--force to replace it", c->out);
		if (!S_ISDIR(st.st_mode) || !replaceable(c->out))
			return st_diag_set(c->diag, -EEXIST,
					   "output directory %s exists and is not "
					   "a strata store; refusing to replace it",
					   c->out);
	}
	snprintf(c->tmp, sizeof(c->tmp), "%s.tmp-%d", c->out, (int)getpid());
	if (mkdir(c->tmp, 0755) < 0)
		return st_diag_set(c->diag, -errno, "cannot create %s: %s", c->tmp,
				   strerror(errno));
	return 0;
}

/* --- writing helpers ----------------------------------------------------- */

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

static int create_out_file(struct conv *c, const char *name, int *ret_fd)
{
	char path[4400];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", c->tmp, name);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return st_diag_set(c->diag, -errno, "cannot create %s: %s", path,
				   strerror(errno));
	*ret_fd = fd;
	return 0;
}

/* fsync + close, reporting either failure (a write error may only show at
 * fsync time on some file systems). */
static int finish_out_file(struct conv *c, int fd, const char *name)
{
	int r = 0;

	if (fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	if (r)
		return st_diag_set(c->diag, r, "%s/%s: %s", c->tmp, name,
				   strerror(-r));
	return 0;
}

static int write_error(struct conv *c, int r, const char *name)
{
	return st_diag_set(c->diag, r, "writing %s/%s: %s", c->tmp, name,
			   strerror(-r));
}

static char *hex64(uint64_t x, char buf[17])
{
	snprintf(buf, 17, "%016" PRIx64, x);
	return buf;
}

/* json_object_set_new that reports allocation failure (of v or the set). */
static int jset(json_t *o, const char *key, json_t *v)
{
	if (!v)
		return -ENOMEM;
	return json_object_set_new(o, key, v) ? -ENOMEM : 0;
}

static int jappend(json_t *a, json_t *v)
{
	if (!v)
		return -ENOMEM;
	return json_array_append_new(a, v) ? -ENOMEM : 0;
}

static int jset_hex(json_t *o, const char *key, uint64_t x)
{
	char h[17];

	return jset(o, key, json_string(hex64(x, h)));
}

static int jset_int(json_t *o, const char *key, uint64_t x)
{
	return jset(o, key, json_integer((json_int_t)x));
}

/* --- phase 2: dense.bin -------------------------------------------------- */

/* Writes tensor t at `off` of fd in the store's dense dtype; returns the
 * bytes written in *ret_bytes and their XXH3 in *ret_xxh3. */
/* The dtype dense tensor i is written in: --attention for q/k/v/o when
 * set, else the store's dense dtype. */
static enum st_dtype dense_out_dtype(const struct conv *c, int i)
{
	if (c->dsv4) /* V4: every dense tensor as the checkpoint has it */
		return c->ck->tensors[i].dtype;
	if (c->is_attn[i] && c->o.attention_dtype != ST_DTYPE_COUNT)
		return c->o.attention_dtype;
	/* --shared-experts bf16|f32 (fp8 goes through dense_fp8_matrix) */
	if (c->is_shexp[i] && c->o.shared_experts_set &&
	    (c->o.shared_experts.dtype == ST_DTYPE_BF16 ||
	     c->o.shared_experts.dtype == ST_DTYPE_F32))
		return c->o.shared_experts.dtype;
	return c->dense_dtype;
}

static int write_dense_tensor(struct conv *c, int fd, float *fbuf,
			      const struct st_tensor_info *t, uint64_t off,
			      uint64_t *ret_bytes, uint64_t *ret_xxh3)
{
	const uint8_t *src = st_checkpoint_data(c->ck, t);
	size_t es = st_dtype_traits(t->dtype)->block_bytes;
	enum st_dtype odt = dense_out_dtype(c, (int)(t - c->ck->tensors));
	int direct = t->dtype == odt;
	uint64_t out_es = direct ? es : odt == ST_DTYPE_BF16 ? 2 : 4;
	int r;

	XXH3_64bits_reset(c->xs);
	for (uint64_t i = 0; i < t->n_elems; i += CHUNK_ELEMS) {
		size_t n = (size_t)ST_MIN((uint64_t)CHUNK_ELEMS, t->n_elems - i);
		const void *out = src + i * es;

		if (!direct) {
			/* only BF16 stays BF16; everything else becomes F32 */
			r = st_convert_to_f32(t->dtype, src + i * es, n, fbuf);
			if (r)
				return st_diag_set(c->diag, r, "tensor %s: cannot "
						   "convert %s", t->name,
						   st_dtype_traits(t->dtype)->name);
			if (odt == ST_DTYPE_BF16) {
				/* F32/F16 -> BF16 (--attention bf16), in
				 * place: each bf16 goes to a lower address
				 * than the float it came from */
				uint16_t *h = (uint16_t *)(void *)fbuf;

				for (size_t k = 0; k < n; k++)
					h[k] = st_f32_to_bf16(fbuf[k]);
			}
			out = fbuf;
		}
		XXH3_64bits_update(c->xs, out, n * out_es);
		r = pwrite_full(fd, out, n * out_es, off + i * out_es);
		if (r)
			return write_error(c, r, ST_STORE_DENSE_FILE);
	}
	*ret_bytes = t->n_elems * out_es;
	*ret_xxh3 = XXH3_64bits_digest(c->xs);
	return 0;
}

/* 1 if checkpoint tensor `name` is a matrix stored as FP8 with
 * --dense fp8 (attention projections and LM head) or --shared-experts fp8
 * (the shared experts' matrices), with its shape. */
static int dense_fp8_matrix(struct conv *c, const char *name, int64_t *ret_rows,
			    int64_t *ret_cols)
{
	static const enum st_dense_role roles[] = { ST_T_LM_HEAD, ST_T_Q,
						    ST_T_K, ST_T_V, ST_T_O,
						    ST_T_SHEXP_GATE,
						    ST_T_SHEXP_UP,
						    ST_T_SHEXP_DOWN };
	const int shexp_fp8 = c->o.shared_experts_set &&
			      c->o.shared_experts.dtype == ST_DTYPE_F8_E4M3;

	if (!c->o.dense_fp8 && !shexp_fp8)
		return 0;
	for (size_t i = 0; i < ST_ARRAY_SIZE(roles); i++) {
		const int sh = roles[i] >= ST_T_SHEXP_GATE;
		int n = roles[i] == ST_T_LM_HEAD ? 1 : c->cfg.n_layers;

		if (sh ? !shexp_fp8 : !c->o.dense_fp8)
			continue;
		if (roles[i] == ST_T_LM_HEAD &&
		    c->o.dense_fp8 == ES_DENSE_FP8_ATTENTION)
			continue;

		for (int l = 0; l < n; l++) {
			char nm[256];

			if (st_dense_tensor_name(&c->cfg, roles[i], l, nm,
						 sizeof(nm)) == 0 &&
			    !strcmp(nm, name)) {
				st_dense_tensor_shape(&c->cfg, roles[i], ret_rows,
						      ret_cols);
				return 1;
			}
		}
	}
	return 0;
}

/* Writes matrix t (rows x cols) as FP8 E4M3 codes at `off` (row by row,
 * st_fp8_quantize_row with blocks of ST_FP8_DEFAULT_BLOCK) and its scales
 * (rows x nblk floats) into *ret_scales (malloc'ed, caller frees). */
static int write_dense_fp8(struct conv *c, int fd, const struct st_tensor_info *t,
			   int64_t rows, int64_t cols, uint64_t off,
			   uint64_t *ret_xxh3, float **ret_scales)
{
	const uint8_t *src = st_checkpoint_data(c->ck, t);
	const size_t es = st_dtype_traits(t->dtype)->block_bytes;
	const int64_t nblk = (cols + ST_FP8_DEFAULT_BLOCK - 1) /
			     ST_FP8_DEFAULT_BLOCK;
	float *row = malloc(sizeof(float) * (size_t)cols);
	uint8_t *codes = malloc((size_t)cols);
	float *sc = malloc(sizeof(float) * (size_t)(rows * nblk));
	int r = 0;

	if (!row || !codes || !sc) {
		r = -ENOMEM;
		goto out;
	}
	XXH3_64bits_reset(c->xs);
	for (int64_t i = 0; i < rows && !r; i++) {
		r = st_convert_to_f32(t->dtype, src + (size_t)(i * cols) * es,
				      (size_t)cols, row);
		if (r) {
			st_diag_set(c->diag, r, "tensor %s: cannot convert %s",
				    t->name, st_dtype_traits(t->dtype)->name);
			break;
		}
		st_fp8_quantize_row(row, (size_t)cols, ST_FP8_DEFAULT_BLOCK,
				    codes, sc + i * nblk);
		XXH3_64bits_update(c->xs, codes, (size_t)cols);
		r = pwrite_full(fd, codes, (size_t)cols, off + (uint64_t)(i * cols));
		if (r)
			r = write_error(c, r, ST_STORE_DENSE_FILE);
	}
	*ret_xxh3 = XXH3_64bits_digest(c->xs);
out:
	free(row);
	free(codes);
	if (r)
		free(sc);
	else
		*ret_scales = sc;
	return r;
}

/* Appends one manifest entry of dense.bin. */
static int dense_entry(json_t *arr, const char *name, const char *dtype,
		       int n_dims, const int64_t *shape, uint64_t off,
		       uint64_t bytes, uint64_t h, const char *source_dtype)
{
	json_t *o = json_object(), *sh;
	int r;

	if ((r = jappend(arr, o)))
		return r;
	sh = json_array();
	for (int d = 0; d < n_dims && sh && !r; d++)
		r = jappend(sh, json_integer(shape[d]));
	if (r || !sh) {
		json_decref(sh);
		return r ? r : -ENOMEM;
	}
	if ((r = jset(o, "name", json_string(name))) ||
	    (r = jset(o, "dtype", json_string(dtype))) ||
	    (r = jset(o, "shape", sh)) ||
	    (r = jset_int(o, "offset", off)) ||
	    (r = jset_int(o, "bytes", bytes)) ||
	    (r = jset_hex(o, "xxh3", h)) ||
	    (r = jset(o, "source_dtype", json_string(source_dtype))))
		return r;
	return 0;
}

/* --dense fp8: matrix t as codes plus a NAME.scale tensor; advances *cur. */
static int write_dense_fp8_pair(struct conv *c, int fd, json_t *arr,
				const struct st_tensor_info *t, int64_t rows,
				int64_t cols, uint64_t *cur)
{
	const int64_t nblk = (cols + ST_FP8_DEFAULT_BLOCK - 1) /
			     ST_FP8_DEFAULT_BLOCK;
	const int64_t shape[2] = { rows, cols }, sshape[2] = { rows, nblk };
	uint64_t off = ST_ALIGN_UP(*cur, ST_STORE_DENSE_ALIGN), soff, h = 0;
	uint64_t sbytes = (uint64_t)(rows * nblk) * sizeof(float);
	float *sc = NULL;
	char sname[600];
	int r;

	r = write_dense_fp8(c, fd, t, rows, cols, off, &h, &sc);
	if (r)
		return r;
	r = dense_entry(arr, t->name, "F8_E4M3", 2, shape, off,
			(uint64_t)(rows * cols), h,
			st_dtype_traits(t->dtype)->name);
	soff = ST_ALIGN_UP(off + (uint64_t)(rows * cols), ST_STORE_DENSE_ALIGN);
	snprintf(sname, sizeof(sname), "%s.scale", t->name);
	if (!r) {
		r = pwrite_full(fd, sc, sbytes, soff);
		if (r)
			r = write_error(c, r, ST_STORE_DENSE_FILE);
	}
	if (!r)
		r = dense_entry(arr, sname, "F32", 2, sshape, soff, sbytes,
				st_xxh3(sc, sbytes), "F32");
	free(sc);
	*cur = soff + sbytes;
	return r;
}

static int write_dense(struct conv *c)
{
	json_t *dense = json_object(), *arr = json_array();
	float *fbuf = malloc(CHUNK_ELEMS * sizeof(float));
	uint64_t cur = 0;
	int fd = -1, r;

	if (!dense || !arr || !fbuf) {
		r = -ENOMEM;
		goto out;
	}
	if ((r = create_out_file(c, ST_STORE_DENSE_FILE, &fd)))
		goto out;
	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i];
		uint64_t off = ST_ALIGN_UP(cur, ST_STORE_DENSE_ALIGN);
		uint64_t bytes = 0, h = 0;
		json_t *o, *shape;

		if (c->is_expert[i])
			continue;
		{
			int64_t rows, cols;

			if (dense_fp8_matrix(c, t->name, &rows, &cols)) {
				r = write_dense_fp8_pair(c, fd, arr, t, rows,
							 cols, &cur);
				if (!r)
					r = progress(c, t->n_bytes);
				if (r)
					goto out;
				continue;
			}
		}
		r = write_dense_tensor(c, fd, fbuf, t, off, &bytes, &h);
		if (r)
			goto out;
		cur = off + bytes;
		o = json_object();
		if ((r = jappend(arr, o)))
			goto out;
		shape = json_array();
		for (int d = 0; d < t->n_dims && shape && !r; d++)
			r = jappend(shape, json_integer(t->shape[d]));
		if (r) {
			json_decref(shape);
			goto out;
		}
		if ((r = jset(o, "name", json_string(t->name))) ||
		    (r = jset(o, "dtype", json_string(st_dtype_traits(
				dense_out_dtype(c, i))->name))) ||
		    (r = jset(o, "shape", shape)) ||
		    (r = jset_int(o, "offset", off)) ||
		    (r = jset_int(o, "bytes", bytes)) ||
		    (r = jset_hex(o, "xxh3", h)) ||
		    (r = jset(o, "source_dtype",
			      json_string(st_dtype_traits(t->dtype)->name))))
			goto out;
		if ((r = progress(c, t->n_bytes)))
			goto out;
	}
	cur = ST_ALIGN_UP(cur, ST_STORE_DENSE_ALIGN);
	if (ftruncate(fd, (off_t)cur) < 0) {
		r = write_error(c, -errno, ST_STORE_DENSE_FILE);
		goto out;
	}
	r = finish_out_file(c, fd, ST_STORE_DENSE_FILE);
	fd = -1;
	if (r)
		goto out;
	if ((r = jset(dense, "file", json_string(ST_STORE_DENSE_FILE))) ||
	    (r = jset_int(dense, "bytes", cur)) ||
	    (r = jset_int(dense, "align", ST_STORE_DENSE_ALIGN)))
		goto out;
	r = jset(dense, "tensors", arr);
	arr = NULL;
	if (r)
		goto out;
	r = jset(c->manifest, "dense", dense);
	dense = NULL;
out:
	if (fd >= 0)
		close(fd);
	free(fbuf);
	json_decref(arr);
	json_decref(dense);
	if (r == -ENOMEM)
		st_diag_set(c->diag, r, "out of memory");
	return r;
}

/* --- phase 2: expert files ----------------------------------------------- */

/* Largest finite |x| of checkpoint tensor t (rows x cols), for the NVFP4
 * per-tensor scale. */
static int tensor_amax(const struct st_tensor_info *t, const uint8_t *src,
		       int64_t rows, size_t cols, float *row, float *ret)
{
	size_t es = st_dtype_traits(t->dtype)->block_bytes;
	float amax = 0.0f;

	for (int64_t i = 0; i < rows; i++) {
		int r = st_convert_to_f32(t->dtype, src + (size_t)i * cols * es,
					  cols, row);

		if (r)
			return r;
		for (size_t j = 0; j < cols; j++)
			if (isfinite(row[j]) && fabsf(row[j]) > amax)
				amax = fabsf(row[j]);
	}
	*ret = amax;
	return 0;
}

/* Quantizes / converts row i of a matrix (row[] in float32) into its
 * place in the record. */
static int fill_row(const struct st_store_matrix *x, const float *row,
		    int64_t i, float global, int mse, const float *w,
		    uint8_t *rec)
{
	const size_t cols = (size_t)x->cols;
	const size_t n_groups = x->fmt.group ?
				(cols + x->fmt.group - 1) / x->fmt.group : 0;
	uint8_t *data = rec + x->data_offset, *sc = rec + x->scale_offset;

	switch (x->fmt.dtype) {
	case ST_DTYPE_MXFP4:
		if (w)
			return st_mxfp4_quantize_row_wmse(
				row, w, cols, data + (size_t)i * cols / 2,
				sc + (size_t)i * n_groups);
		return (mse ? st_mxfp4_quantize_row_mse :
			      st_mxfp4_quantize_row)(row, cols,
					     data + (size_t)i * cols / 2,
					     sc + (size_t)i * n_groups);
	case ST_DTYPE_NVFP4:
		if (w)
			return st_nvfp4_quantize_row_wmse(
				row, w, cols, global,
				data + (size_t)i * cols / 2,
				sc + (size_t)i * n_groups);
		return (mse ? st_nvfp4_quantize_row_mse :
			      st_nvfp4_quantize_row)(row, cols, global,
					     data + (size_t)i * cols / 2,
					     sc + (size_t)i * n_groups);
	case ST_DTYPE_E2M1_F16:
		if (w)
			return st_e2m1f16_quantize_row_wmse(
				row, w, cols, x->fmt.group,
				data + (size_t)i * cols / 2,
				(uint16_t *)(void *)(sc + (size_t)i * n_groups * 2));
		return (mse ? st_e2m1f16_quantize_row_mse :
			      st_e2m1f16_quantize_row)(
			row, cols, x->fmt.group, data + (size_t)i * cols / 2,
			(uint16_t *)(void *)(sc + (size_t)i * n_groups * 2));
	case ST_DTYPE_F8_E4M3:
		return (mse ? st_fp8_quantize_row_mse :
			      st_fp8_quantize_row)(
			row, cols, x->fmt.group, data + (size_t)i * cols,
			(float *)(void *)(sc + (size_t)i * n_groups * 4));
	case ST_DTYPE_BF16:
		for (size_t j = 0; j < cols; j++) {
			uint16_t h = st_f32_to_bf16(row[j]);

			memcpy(data + ((size_t)i * cols + j) * 2, &h, 2);
		}
		return 0;
	case ST_DTYPE_F32:
		memcpy(data + (size_t)i * cols * 4, row, cols * 4);
		return 0;
	default:
		return -EINVAL;
	}
}

/* V4: matrix m of expert (layer, expert) is the checkpoint's MXFP4 as
 * is: t's E2M1 code bytes (I8 [rows, cols / 2], OCP nibble order) into
 * the data section, its .scale E8M0 bytes ([rows, cols / 32]) into the
 * scale section, both byte for byte. */
static int fill_matrix_dsv4(struct conv *c, const struct st_tensor_info *t,
			    const struct st_store_matrix *x, int layer,
			    int expert, int m, uint8_t *rec)
{
	const struct st_tensor_info *ts =
		c->v4_scales[((size_t)layer * c->cfg.n_experts + expert) * 3 +
			     m];

	if (t->n_bytes != x->data_bytes || ts->n_bytes != x->scale_bytes)
		return st_diag_set(c->diag, -ST_E_FORMAT, "tensor %s: %" PRIu64
				   " + %" PRIu64 " bytes, the MXFP4 record "
				   "section holds %" PRIu64 " + %" PRIu64,
				   t->name, t->n_bytes, ts->n_bytes,
				   x->data_bytes, x->scale_bytes);
	memcpy(rec + x->data_offset, st_checkpoint_data(c->ck, t),
	       x->data_bytes);
	memcpy(rec + x->scale_offset, st_checkpoint_data(c->ck, ts),
	       x->scale_bytes);
	return 0;
}

/* Fills matrix x of a record from checkpoint tensor t.  Sections are
 * 64-byte aligned in a 4096-aligned record, so the scale arrays are
 * aligned for their element type. */
static int fill_matrix(struct conv *c, const struct st_tensor_info *t,
		       const struct st_store_matrix *x, int layer, int expert,
		       int m, uint8_t *rec, float *row)
{
	const uint8_t *src = st_checkpoint_data(c->ck, t);
	size_t es = st_dtype_traits(t->dtype)->block_bytes;
	size_t cols = (size_t)x->cols;
	enum st_scale_search ss = effective_search(x->fmt.dtype,
						   c->o.scale_search);
	const float *w = NULL;
	float global = 1.0f;
	int r = 0;

	if (c->dsv4)
		return fill_matrix_dsv4(c, t, x, layer, expert, m, rec);
	/* calibrated: weights from the statistics, or the plain MSE search
	 * for an expert that saw too few calibration tokens */
	if ((ss == ST_SCALE_SEARCH_CALIBRATED || ss == ST_SCALE_SEARCH_GPTQ) &&
	    st_calib_weights(&c->cal, layer, expert, m, ST_CALIB_MIN_TOKENS,
			     c->cal_w) == 1)
		w = c->cal_w;

	if (x->fmt.dtype == ST_DTYPE_BF16 && t->dtype == ST_DTYPE_BF16) {
		memcpy(rec + x->data_offset, src, x->data_bytes);
		return 0;
	}
	if (x->fmt.dtype == ST_DTYPE_NVFP4) {
		float amax = 0.0f;

		r = tensor_amax(t, src, x->rows, cols, row, &amax);
		global = st_nvfp4_global_scale(amax);
		memcpy(rec + x->tscale_offset, &global, 4);
	}
	if (!r && ss == ST_SCALE_SEARCH_GPTQ &&
	    st_calib_second_moment(&c->cal, layer, expert, m,
				   ST_CALIB_MIN_TOKENS, c->gptq_h) == 1) {
		for (int64_t i = 0; !r && i < x->rows; i++)
			r = st_convert_to_f32(t->dtype, src + (size_t)i * cols * es,
					      cols, c->gptq_w + (size_t)i * cols);
		if (!r)
			r = st_gptq_quantize(&x->fmt, c->gptq_w, (size_t)x->rows,
					     cols, c->gptq_h, global,
					     rec + x->data_offset,
					     rec + x->scale_offset);
		if (r)
			return st_diag_set(c->diag, r, "tensor %s: GPTQ failed: "
					   "%s", t->name, st_strerror(r));
		return 0;
	}
	for (int64_t i = 0; !r && i < x->rows; i++) {
		r = st_convert_to_f32(t->dtype, src + (size_t)i * cols * es, cols,
				      row);
		if (!r)
			r = fill_row(x, row, i, global,
				     ss != ST_SCALE_SEARCH_NONE, w, rec);
		if (r)
			return st_diag_set(c->diag, r, "tensor %s: row %" PRId64
					   ": conversion failed: %s", t->name, i,
					   st_strerror(r));
	}
	if (r)
		return st_diag_set(c->diag, r, "tensor %s: conversion failed: %s",
				   t->name, st_strerror(r));
	return 0;
}

/* How each format rounds and picks its scales (manifest "rounding"). */
static const char *rounding_text(enum st_dtype dt, enum st_scale_search ss)
{
	int mse = ss != ST_SCALE_SEARCH_NONE;

	if (ss == ST_SCALE_SEARCH_GPTQ)
		switch (dt) {
		case ST_DTYPE_MXFP4:
		case ST_DTYPE_NVFP4:
		case ST_DTYPE_E2M1_F16:
			return "GPTQ (arXiv:2210.17323): columns in order, "
			       "each rounded to nearest-even (saturate "
			       "\u00b16) and its error compensated in the "
			       "later columns through the Cholesky factor of "
			       "the inverse calibration second moment (damp "
			       "0.01 mean diagonal); each group's scale by "
			       "the activation-weighted search when reached";
		default:
			break;
		}
	if (ss == ST_SCALE_SEARCH_CALIBRATED)
		switch (dt) {
		case ST_DTYPE_MXFP4:
			return "nearest-even, saturate \u00b16; scale byte of "
			       "least activation-weighted squared error (sum "
			       "E[a_c^2] (w_c - q_c)^2) among e-1, e, e+1, e = "
			       "2^(floor(log2 amax) - 2)";
		case ST_DTYPE_NVFP4:
			return "nearest-even, saturate \u00b16; block scale of "
			       "least activation-weighted squared error (sum "
			       "E[a_c^2] (w_c - q_c)^2) among e4m3(amax / 6 / "
			       "tensor_scale * k/100), k = 80..110, tensor "
			       "scale amax_tensor / 2688";
		case ST_DTYPE_E2M1_F16:
			return "nearest-even, saturate \u00b16; scale of least "
			       "activation-weighted squared error (sum "
			       "E[a_c^2] (w_c - q_c)^2) among f16(amax / 6 * "
			       "k/100), k = 80..110";
		default:
			break;
		}

	switch (dt) {
	case ST_DTYPE_MXFP4:
		return mse ? "nearest-even, saturate \u00b16; scale byte of "
			     "least squared error among e-1, e, e+1, e = "
			     "2^(floor(log2 amax) - 2)" :
			     "nearest-even, saturate \u00b16; scale "
			     "2^(floor(log2 amax) - 2)";
	case ST_DTYPE_NVFP4:
		return mse ? "nearest-even, saturate \u00b16; block scale of "
			     "least squared error among e4m3(amax / 6 / "
			     "tensor_scale * k/100), k = 80..110, tensor "
			     "scale amax_tensor / 2688" :
			     "nearest-even, saturate \u00b16; block scale "
			     "e4m3(amax / 6 / tensor_scale), tensor scale "
			     "amax_tensor / 2688";
	case ST_DTYPE_E2M1_F16:
		return mse ? "nearest-even, saturate \u00b16; scale of least "
			     "squared error among f16(amax / 6 * k/100), k = "
			     "80..110" :
			     "nearest-even, saturate \u00b16; scale f16(amax / 6)";
	case ST_DTYPE_F8_E4M3:
		return mse ? "nearest-even, saturate \u00b1448; scale of least "
			     "squared error among amax / 448 * k/100, k = "
			     "80..110" :
			     "nearest-even, saturate \u00b1448; scale amax / 448";
	default:
		return NULL;
	}
}

/* The manifest entry of one matrix. */
static int matrix_json(const struct st_store_matrix *x, int m,
		       enum st_scale_search ss, int lossless, json_t *o)
{
	enum st_dtype dt = x->fmt.dtype;
	const char *scale = st_scale_type_name(st_wformat_scale_type(dt));
	int fp4 = dt == ST_DTYPE_MXFP4 || dt == ST_DTYPE_NVFP4 ||
		  dt == ST_DTYPE_E2M1_F16;
	char name[ST_WFORMAT_NAME_MAX];
	int r;

	if (st_wformat_name(&x->fmt, name, sizeof(name)))
		return -EINVAL;
	if ((r = jset(o, "name", json_string(mat_names[m]))) ||
	    (r = jset_int(o, "rows", (uint64_t)x->rows)) ||
	    (r = jset_int(o, "cols", (uint64_t)x->cols)) ||
	    (r = jset(o, "format", json_string(name))) ||
	    (r = jset(o, "layout", json_string(x->il_rows ? "ocp-r16" :
					       fp4 ? "ocp" : "row-major"))))
		return r;
	if (scale &&
	    ((r = jset_int(o, "block", x->fmt.group)) ||
	     (r = jset(o, "scale", json_string(scale))) ||
	     (r = jset(o, "scale_search",
		       json_string(st_scale_search_name(ss)))) ||
	     (r = jset(o, "rounding", json_string(lossless ?
			"none: the checkpoint's codes and scales, byte for byte" :
			rounding_text(dt, ss))))))
		return r;
	if ((r = jset_int(o, "data_offset", x->data_offset)) ||
	    (r = jset_int(o, "data_bytes", x->data_bytes)))
		return r;
	if (x->scale_bytes &&
	    ((r = jset_int(o, "scale_offset", x->scale_offset)) ||
	     (r = jset_int(o, "scale_bytes", x->scale_bytes))))
		return r;
	if (x->tscale_bytes &&
	    ((r = jset(o, "tensor_scale", json_string("f32"))) ||
	     (r = jset(o, "tensor_scale_use", json_string("multiply"))) ||
	     (r = jset_int(o, "tensor_scale_offset", x->tscale_offset)) ||
	     (r = jset_int(o, "tensor_scale_bytes", x->tscale_bytes))))
		return r;
	return 0;
}

/* Rewrites matrix x of a record, filled row-major, in its interleaved
 * layout (x->il_rows set: st_mxfp4il.h); nothing for other matrices. */
static int interleave_matrix(struct conv *c, const struct st_store_matrix *x,
			     uint8_t *rec)
{
	uint8_t *tmp;
	int r;

	if (!x->il_rows)
		return 0;
	tmp = malloc(x->data_bytes + x->scale_bytes);
	if (!tmp)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	memcpy(tmp, rec + x->data_offset, x->data_bytes);
	memcpy(tmp + x->data_bytes, rec + x->scale_offset, x->scale_bytes);
	r = st_mxfp4il_pack(tmp, tmp + x->data_bytes, x->rows, x->cols,
			    rec + x->data_offset, rec + x->scale_offset);
	free(tmp);
	if (r)
		return st_diag_set(c->diag, r, "interleaving an MXFP4 matrix "
				   "of %lld x %lld failed", (long long)x->rows,
				   (long long)x->cols);
	return 0;
}

/* Writes experts-LLL.bin of layer l and appends its manifest entry. */
static int write_expert_layer(struct conv *c, int l, uint8_t *rec, float *row,
			      json_t *layers)
{
	const struct st_store_layer *ly = &c->layers[l];
	int E = c->cfg.n_experts, fd = -1, r;
	json_t *o = json_object(), *mats = json_array(), *sums = json_array();
	char name[64];

	st_store_expert_file_name(l, name, sizeof(name));
	if (!o || !mats || !sums) {
		r = -ENOMEM;
		goto fail;
	}
	if ((r = jset_int(o, "layer", (uint64_t)l)) ||
	    (r = jset_int(o, "record_bytes", ly->record_bytes)))
		goto fail;
	for (int m = 0; m < 3; m++) {
		json_t *mo = json_object();

		if ((r = jappend(mats, mo)) ||
		    (r = matrix_json(&ly->mat[m], m,
				       effective_search(ly->mat[m].fmt.dtype,
							c->o.scale_search),
				       c->dsv4, mo)))
			goto fail;
	}
	r = jset(o, "matrices", mats);
	mats = NULL;
	if (r)
		goto fail;
	if ((r = create_out_file(c, name, &fd)))
		goto fail;
	for (int e = 0; e < E; e++) {
		uint64_t src_bytes = 0;
		char h[17];

		memset(rec, 0, ly->record_bytes);
		for (int m = 0; m < 3; m++) {
			const struct st_tensor_info *t =
				c->experts[((size_t)l * E + e) * 3 + m];

			if ((r = fill_matrix(c, t, &ly->mat[m], l, e, m, rec,
					     row)) ||
			    (r = interleave_matrix(c, &ly->mat[m], rec)))
				goto fail;
			src_bytes += t->n_bytes;
		}
		r = jappend(sums, json_string(hex64(st_xxh3(rec, ly->record_bytes),
						    h)));
		if (r)
			goto fail;
		r = pwrite_full(fd, rec, ly->record_bytes,
				(uint64_t)e * ly->record_bytes);
		if (r) {
			r = write_error(c, r, name);
			goto fail;
		}
		if ((r = progress(c, src_bytes)))
			goto fail;
	}
	r = finish_out_file(c, fd, name);
	fd = -1;
	if (r)
		goto fail;
	if ((r = jset(o, "file", json_string(name))) ||
	    (r = jset_int(o, "bytes", (uint64_t)E * ly->record_bytes)))
		goto fail;
	r = jset(o, "xxh3", sums);
	sums = NULL;
	if (r)
		goto fail;
	r = jappend(layers, o);
	o = NULL;
fail:
	if (fd >= 0)
		close(fd);
	json_decref(o);
	json_decref(mats);
	json_decref(sums);
	return r;
}

/* experts.policy.shared_experts: what the shared experts were written in
 * ("bf16", "f32", "fp8"), or that the model has none. */
static const char *shared_name(const struct conv *c)
{
	int seen_bf16 = 0, seen_f32 = 0;

	if (!c->cfg.shared_inter)
		return "none (the model has none)";
	if (c->o.shared_experts_set &&
	    c->o.shared_experts.dtype == ST_DTYPE_F8_E4M3)
		return "fp8";
	for (int i = 0; i < c->ck->n_tensors; i++)
		if (c->is_shexp[i]) {
			if (dense_out_dtype(c, i) == ST_DTYPE_BF16)
				seen_bf16 = 1;
			else
				seen_f32 = 1;
		}
	return seen_bf16 && seen_f32 ? "mixed" : seen_f32 ? "f32" : "bf16";
}

/* What the attention projections were written in ("bf16", "f32", or
 * "mixed" when the checkpoint's own dtypes differ and auto kept them). */
static const char *attention_name(const struct conv *c)
{
	int seen_bf16 = 0, seen_f32 = 0;

	if (c->dsv4)
		return "fp8 (E4M3 with E8M0 block scales, as the checkpoint)";
	if (c->o.dense_fp8 != ES_DENSE_FP8_NONE)
		return "fp8"; /* q/k/v/o as E4M3 (dense_fp8_matrix) */
	for (int i = 0; i < c->ck->n_tensors; i++)
		if (c->is_attn[i]) {
			if (dense_out_dtype(c, i) == ST_DTYPE_BF16)
				seen_bf16 = 1;
			else
				seen_f32 = 1;
		}
	return seen_bf16 && seen_f32 ? "mixed" : seen_f32 ? "f32" : "bf16";
}

/* experts.policy.calibration: which statistics the calibrated search
 * used (by content hash: no path, so the store stays reproducible). */
static int calibration_json(struct conv *c, json_t *pol)
{
	json_t *o = json_object();
	char h[17];
	int r = o ? 0 : -ENOMEM;

	if (!r)
		r = jset(o, "stats_xxh3", json_string(hex64(c->cal_file_xxh3, h)));
	if (!r)
		r = jset(o, "model_id", json_string(hex64(c->cal.model_id, h)));
	if (!r)
		r = jset(o, "text_xxh3", json_string(hex64(c->cal.text_xxh3, h)));
	if (!r)
		r = jset_int(o, "tokens", c->cal.n_tokens);
	if (!r)
		r = jset_int(o, "min_tokens", ST_CALIB_MIN_TOKENS);
	if (!r)
		r = jset_int(o, "fallback_experts", c->cal_fallback);
	if (r) {
		json_decref(o);
		return r;
	}
	return jset(pol, "calibration", o);
}

/* experts: {n_layers, n_experts, record_bytes, record_align,
 * section_align, policy, layers: []}; *ret_layers borrowed from it. */
static int experts_json(struct conv *c, json_t **ret_ex, json_t **ret_layers)
{
	json_t *ex = json_object(), *pol = json_object(), *layers = json_array();
	char def[ST_WFORMAT_NAME_MAX], keep[4096];
	int r = 0;

	if (!ex || !pol || !layers)
		r = -ENOMEM;
	if (!r && (st_wformat_name(&c->def_fmt, def, sizeof(def)) ||
		   es_convert_keep_str(&c->o, keep, sizeof(keep))))
		r = -EINVAL;
	if (!r)
		r = jset_int(ex, "n_layers", (uint64_t)c->cfg.n_layers);
	if (!r)
		r = jset_int(ex, "n_experts", (uint64_t)c->cfg.n_experts);
	if (!r)
		r = jset_int(ex, "record_bytes", c->record_bytes);
	if (!r)
		r = jset_int(ex, "record_align", ST_STORE_RECORD_ALIGN);
	if (!r)
		r = jset_int(ex, "section_align", ST_STORE_SECTION_ALIGN);
	if (!r && !(r = jset(pol, "default", json_string(def))))
		r = jset(pol, "keep", json_string(keep));
	if (!r)
		r = jset(pol, "scale_search",
			 json_string(st_scale_search_name(c->o.scale_search)));
	if (!r && c->o.calib_path)
		r = calibration_json(c, pol);
	if (!r)
		r = jset(pol, "attention", json_string(attention_name(c)));
	if (!r && c->dsv4)
		r = jset(pol, "source", json_string("lossless: the "
			 "checkpoint's MXFP4 experts and FP8 / BF16 / F32 / "
			 "I64 dense tensors byte for byte"));
	if (!r)
		r = jset(pol, "shared_experts", json_string(c->dsv4 ?
			 "dense (FP8 with E8M0 block scales, as the checkpoint)" :
			 shared_name(c)));
	if (!r) {
		r = jset(ex, "policy", pol);
		pol = NULL;
	}
	if (!r)
		r = json_object_set(ex, "layers", layers) ? -ENOMEM : 0;
	json_decref(pol);
	if (r) {
		json_decref(layers);
		json_decref(ex);
		return r;
	}
	*ret_ex = ex;
	*ret_layers = layers; /* borrowed from ex after this point */
	json_decref(layers);
	return 0;
}

static int write_experts(struct conv *c)
{
	json_t *ex = NULL, *layers = NULL;
	uint8_t *rec = NULL;
	float *row = NULL;
	int64_t max_cols = 0;
	int r;

	for (int m = 0; m < 3; m++)
		max_cols = ST_MAX(max_cols, c->layers[0].mat[m].cols);
	r = experts_json(c, &ex, &layers);
	if (r)
		goto out;
	row = malloc((size_t)max_cols * sizeof(float));
	if (!row || posix_memalign((void **)&rec, ST_STORE_RECORD_ALIGN,
				   c->record_bytes)) {
		rec = NULL;
		r = -ENOMEM;
		goto out;
	}
	for (int l = 0; l < c->cfg.n_layers && !r; l++)
		r = write_expert_layer(c, l, rec, row, layers);
	if (!r) {
		r = jset(c->manifest, "experts", ex);
		ex = NULL;
	}
out:
	json_decref(ex);
	free(rec);
	free(row);
	if (r == -ENOMEM)
		st_diag_set(c->diag, r, "out of memory");
	return r;
}

/* --- phase 2: copied files and the manifest ------------------------------ */

static int write_whole(struct conv *c, const char *name, const void *buf,
		       size_t len)
{
	int fd, r;

	if ((r = create_out_file(c, name, &fd)))
		return r;
	r = pwrite_full(fd, buf, len, 0);
	if (r) {
		close(fd);
		return write_error(c, r, name);
	}
	return finish_out_file(c, fd, name);
}

static int copy_files(struct conv *c, json_t *arr)
{
	for (size_t i = 0; i < ST_ARRAY_SIZE(copied_files); i++) {
		const char *name = copied_files[i].name;
		char path[4200];
		char *buf = NULL;
		size_t len;
		json_t *o;
		int r;

		if (!c->have_copied[i])
			continue;
		if (!strcmp(name, "config.json")) {
			/* exactly the text the config was parsed from */
			buf = c->config_text;
			len = c->config_len;
		} else {
			snprintf(path, sizeof(path), "%s/%s", c->model_dir, name);
			r = st_read_file(path, &buf, &len);
			if (r)
				return st_diag_set(c->diag, r, "%s: %s", path,
						   strerror(-r));
		}
		r = write_whole(c, name, buf, len);
		if (!r && !(r = jappend(arr, (o = json_object()))))
			if (!(r = jset(o, "name", json_string(name))) &&
			    !(r = jset_int(o, "bytes", len)))
				r = jset_hex(o, "xxh3", st_xxh3(buf, len));
		if (buf != c->config_text)
			free(buf);
		if (r)
			return r == -ENOMEM ? st_diag_set(c->diag, r, "out of "
							  "memory") : r;
		if ((r = progress(c, len)))
			return r;
	}
	return 0;
}

static int manifest_head(struct conv *c)
{
	json_t *m = c->manifest, *src = json_object(), *sf = json_array();
	int r;

	if (!src || !sf) {
		json_decref(src);
		json_decref(sf);
		return -ENOMEM;
	}
	r = jset(src, "files", sf);
	for (int i = 0; i < c->ck->n_files && !r; i++) {
		json_t *o = json_object();

		if (!(r = jappend(sf, o)) &&
		    !(r = jset(o, "name", json_string(c->ck->file_names[i]))))
			r = jset_int(o, "bytes", c->ck->file_sizes[i]);
	}
	if (r) {
		json_decref(src);
		return r;
	}
	if ((r = jset(m, "format", json_string(ST_STORE_FORMAT))) ||
	    (r = jset_int(m, "version", ST_STORE_VERSION)) ||
	    (r = jset(m, "writer", json_string("strata " ST_VERSION)))) {
		json_decref(src);
		return r;
	}
	if (jset(m, "config", json_stringn(c->config_text, c->config_len))) {
		json_decref(src);
		return st_diag_set(c->diag, -ST_E_FORMAT, "%s/config.json: not "
				   "valid UTF-8 (or out of memory)",
				   c->model_dir);
	}
	if ((r = jset(m, "source", src)))
		return r;
	return jset(m, "files", json_array());
}

static int write_manifest(struct conv *c)
{
	char *text = json_dumps(c->manifest, JSON_INDENT(1) |
					      JSON_PRESERVE_ORDER |
					      JSON_ENSURE_ASCII);
	size_t len;
	int r;

	if (!text)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	len = strlen(text);
	text[len] = '\n'; /* json_dumps leaves the NUL there: replace it */
	r = write_whole(c, ST_STORE_MANIFEST, text, len + 1);
	free(text);
	return r;
}

static int fsync_dir(struct conv *c, const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return st_diag_set(c->diag, -errno, "%s: %s", dir,
				   strerror(errno));
	if (fsync(fd) < 0)
		r = st_diag_set(c->diag, -errno, "fsync %s: %s", dir,
				strerror(errno));
	close(fd);
	return r;
}

/* --- phase 3: publish ---------------------------------------------------- */

static int publish(struct conv *c, int exists)
{
	char old[4200];

	if (!exists) {
		if (renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->out,
			      RENAME_NOREPLACE) == 0)
			return fsync_dir(c, c->parent);
		if (errno == EEXIST || errno == ENOTEMPTY)
			return st_diag_set(c->diag, -EEXIST, "output directory %s "
					   "appeared during the conversion; not "
					   "replacing it", c->out);
		if (errno != EINVAL && errno != ENOSYS)
			return st_diag_set(c->diag, -errno, "rename %s -> %s: %s",
					   c->tmp, c->out, strerror(errno));
		if (rename(c->tmp, c->out) < 0)
			return st_diag_set(c->diag, -errno, "rename %s -> %s: %s",
					   c->tmp, c->out, strerror(errno));
		return fsync_dir(c, c->parent);
	}
	/* force: swap the new store in atomically; the old one ends up in
	 * tmp and is removed with it. */
	if (renameat2(AT_FDCWD, c->tmp, AT_FDCWD, c->out, RENAME_EXCHANGE) == 0)
		return fsync_dir(c, c->parent);
	if (errno != EINVAL && errno != ENOSYS)
		return st_diag_set(c->diag, -errno, "exchange %s and %s: %s",
				   c->tmp, c->out, strerror(errno));
	/* no RENAME_EXCHANGE on this file system: move the old one aside */
	snprintf(old, sizeof(old), "%s.old-%d", c->out, (int)getpid());
	if (rename(c->out, old) < 0)
		return st_diag_set(c->diag, -errno, "rename %s -> %s: %s", c->out,
				   old, strerror(errno));
	if (rename(c->tmp, c->out) < 0) {
		int e = errno;

		rename(old, c->out);
		return st_diag_set(c->diag, -e, "rename %s -> %s: %s", c->tmp,
				   c->out, strerror(e));
	}
	st_rm_rf(old);
	return fsync_dir(c, c->parent);
}

/* --- entry --------------------------------------------------------------- */

/* Resolves every layer's format and record layout. */
static int plan_layers(struct conv *c)
{
	const int L = c->cfg.n_layers;
	char keep[4096];
	int r;

	if (es_convert_keep_str(&c->o, keep, sizeof(keep)))
		return st_diag_set(c->diag, -EINVAL, "keep rules: invalid or "
				   "too long");
	c->layers = calloc((size_t)L, sizeof(*c->layers));
	if (!c->layers)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	for (int l = 0; l < L; l++) {
		struct st_wformat f, fm[3];
		char name[ST_WFORMAT_NAME_MAX];
		struct st_diag d = { { 0 } };

		if (es_convert_layer_format(&c->o, L, l, &f))
			return st_diag_set(c->diag, -EINVAL, "--keep %s: a rule "
					   "names a layer the model does not have "
					   "(%d layers: 0-%d)", keep, L, L - 1);
		fm[0] = fm[1] = fm[2] = f;
		r = st_store_layout(&c->cfg, fm, c->layers[l].mat,
				    &c->layers[l].record_bytes, &d);
		if (r) {
			st_wformat_name(&f, name, sizeof(name));
			return st_diag_set(c->diag, r, "layer %d (%s): %s", l,
					   name, d.msg);
		}
		/* MXFP4 is written row-interleaved (st_mxfp4il.h) where the
		 * rows allow it; lossless V4 records keep the checkpoint's
		 * row-major bytes */
		for (int m = 0; m < 3; m++) {
			struct st_store_matrix *x = &c->layers[l].mat[m];

			if (!c->dsv4 && x->fmt.dtype == ST_DTYPE_MXFP4 &&
			    x->cols % 32 == 0)
				x->il_rows = ST_MXFP4IL_ROWS;
		}
		c->record_bytes = ST_MAX(c->record_bytes,
					 c->layers[l].record_bytes);
	}
	return 0;
}

/* A scale search only applies to the 4-bit formats (effective_search):
 * asking for one when no layer has such a format changes nothing, so it
 * is refused rather than recorded. */
static int check_search_applies(struct conv *c)
{
	if (c->o.scale_search == ST_SCALE_SEARCH_NONE)
		return 0;
	for (int l = 0; l < c->cfg.n_layers; l++)
		if (effective_search(c->layers[l].mat[0].fmt.dtype,
				     c->o.scale_search) != ST_SCALE_SEARCH_NONE)
			return 0;
	return st_diag_set(c->diag, -EINVAL, "--scale-search %s changes "
			   "nothing here: only the 4-bit expert formats (mxfp4, "
			   "nvfp4, e2m1-g<N>) search their scales, and no layer "
			   "has one; drop the option",
			   st_scale_search_name(c->o.scale_search));
}

/* Reads opts.calib_path and checks it belongs to this checkpoint. */
static int load_calibration(struct conv *c)
{
	const struct st_model_config *m = &c->cfg;
	uint64_t id;
	int r = st_calib_read(c->o.calib_path, &c->cal, &c->cal_file_xxh3,
			      c->diag);

	if (r)
		return r;
	if (c->cal.n_layers != (uint32_t)m->n_layers ||
	    c->cal.n_experts != (uint32_t)m->n_experts ||
	    c->cal.hidden != (uint32_t)m->hidden_size ||
	    c->cal.inter != (uint32_t)m->expert_inter)
		return st_diag_set(c->diag, -EINVAL, "%s: statistics of a model "
				   "with %u layers, %u experts, hidden %u, expert "
				   "width %u; this one has %d, %d, %d, %d: "
				   "run strata calibrate for this model",
				   c->o.calib_path, c->cal.n_layers,
				   c->cal.n_experts, c->cal.hidden, c->cal.inter,
				   m->n_layers, m->n_experts, m->hidden_size,
				   m->expert_inter);
	id = st_calib_model_id(c->ck, c->config_text, c->config_len);
	if (id != c->cal.model_id)
		return st_diag_set(c->diag, -EINVAL, "%s: statistics of another "
				   "model (model id %016llx, this checkpoint "
				   "%016llx: other config or router weights): "
				   "run strata calibrate --model %s",
				   c->o.calib_path,
				   (unsigned long long)c->cal.model_id,
				   (unsigned long long)id, c->model_dir);
	if (c->o.scale_search == ST_SCALE_SEARCH_GPTQ && !c->cal.sum_xx)
		return st_diag_set(c->diag, -EINVAL, "%s: statistics without the "
				   "second-moment matrices GPTQ needs: run "
				   "strata calibrate --covariance",
				   c->o.calib_path);
	c->cal_w = malloc(sizeof(float) *
			  (size_t)ST_MAX(m->hidden_size, m->expert_inter));
	if (!c->cal_w)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if (c->o.scale_search == ST_SCALE_SEARCH_GPTQ) {
		size_t big = (size_t)ST_MAX(m->hidden_size, m->expert_inter);

		c->gptq_w = malloc(sizeof(float) * (size_t)m->hidden_size *
				   (size_t)m->expert_inter);
		c->gptq_h = malloc(sizeof(double) * big * big);
		if (!c->gptq_w || !c->gptq_h)
			return st_diag_set(c->diag, -ENOMEM, "out of memory "
					   "for GPTQ");
	}
	for (uint32_t i = 0; i < c->cal.n_layers * c->cal.n_experts; i++)
		if (c->cal.count[i] < ST_CALIB_MIN_TOKENS)
			c->cal_fallback++;
	return 0;
}

/* --- DeepSeek-V4: a lossless store of the official layout --------------- */

/* The V4 store keeps the checkpoint's own formats; options that would
 * change them are refused rather than ignored. */
static int check_opts_dsv4(struct conv *c)
{
	const char *what = NULL;

	if (c->def_fmt.dtype != ST_DTYPE_MXFP4)
		what = "--experts (the checkpoint's experts are MXFP4 "
		       "already and are kept as they are)";
	else if (c->o.n_keep)
		what = "--keep";
	else if (c->o.scale_search != ST_SCALE_SEARCH_NONE || c->o.calib_path)
		what = "--scale-search / --calibrate (nothing is quantized)";
	else if (c->o.attention_dtype != ST_DTYPE_COUNT || c->o.dense_f32 ||
		 c->o.dense_fp8)
		what = "--attention / --dense (dense tensors keep the "
		       "checkpoint's FP8, BF16 and F32)";
	else if (c->o.shared_experts_set)
		what = "--shared-experts (the shared expert stays FP8 in "
		       "dense.bin)";
	if (what)
		return st_diag_set(c->diag, -ST_E_UNSUPPORTED, "%s: a "
				   "DeepSeek-%s checkpoint is stored losslessly "
				   "in its own formats; drop %s", c->model_dir,
				   c->dsv41 ? "V4.1" : "V4", what);
	return 0;
}

/* Finds a V4 tensor and checks its dtype and 2-D shape. */
static int find_dsv4(struct conv *c, const char *name, enum st_dtype dt,
		     int64_t rows, int64_t cols,
		     const struct st_tensor_info **ret)
{
	const struct st_tensor_info *t = st_checkpoint_find(c->ck, name);

	if (!t)
		return st_diag_set(c->diag, -ST_E_NOTFOUND, "checkpoint %s: "
				   "tensor %s is missing", c->model_dir, name);
	if (t->dtype != dt)
		return st_diag_set(c->diag, -ST_E_FORMAT, "checkpoint %s: "
				   "tensor %s: dtype %s, expected %s",
				   c->model_dir, name,
				   st_dtype_traits(t->dtype)->name,
				   st_dtype_traits(dt)->name);
	*ret = t;
	return check_shape(c, t, rows, cols);
}

/* Every routed expert: w1 / w3 / w2 as I8 [rows, cols / 2] packed E2M1
 * plus .scale F8_E8M0 [rows, cols / 32]; marks them as expert tensors. */
static int check_experts_dsv4(struct conv *c)
{
	static const char *const wname[3] = { "w1", "w3", "w2" };
	const int L = c->cfg.n_layers, E = c->cfg.n_experts;
	size_t n = (size_t)L * E * 3;

	c->experts = calloc(n, sizeof(*c->experts));
	c->v4_scales = calloc(n, sizeof(*c->v4_scales));
	if (!c->experts || !c->v4_scales)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	for (int l = 0; l < L; l++)
		for (int e = 0; e < E; e++)
			for (int m = 0; m < 3; m++) {
				const struct st_store_matrix *x =
					&c->layers[l].mat[m];
				size_t k = ((size_t)l * E + e) * 3 + m;
				char nm[256];
				int r;

				snprintf(nm, sizeof(nm), "layers.%d.ffn.experts."
					 "%d.%s.weight", l, e, wname[m]);
				if ((r = find_dsv4(c, nm, ST_DTYPE_I8, x->rows,
						   x->cols / 2, &c->experts[k])))
					return r;
				snprintf(nm, sizeof(nm), "layers.%d.ffn.experts."
					 "%d.%s.scale", l, e, wname[m]);
				if ((r = find_dsv4(c, nm, ST_DTYPE_F8_E8M0,
						   x->rows, x->cols /
						   ST_MXFP4_BLOCK,
						   &c->v4_scales[k])))
					return r;
				c->is_expert[c->experts[k] - c->ck->tensors] = 1;
				c->is_expert[c->v4_scales[k] - c->ck->tensors] = 1;
				c->total += c->experts[k]->n_bytes;
			}
	return 0;
}

/* Dense tensors: the MTP block (mtp.*) is skipped (marked like an expert
 * tensor, so write_dense passes over it); the rest must be BF16, F32,
 * I64 or F8_E4M3 with a NAME.scale F8_E8M0 [ceil(rows / bo), ceil(cols /
 * bi)] (bo, bi: quantization_config.weight_block_size). */
static int check_dense_dsv4(struct conv *c)
{
	const int bo = c->v4.fp8_block[0], bi = c->v4.fp8_block[1];

	for (int i = 0; i < c->ck->n_tensors; i++) {
		const struct st_tensor_info *t = &c->ck->tensors[i], *ts;
		char nm[600];
		size_t len = strlen(t->name);
		int r;

		if (c->is_expert[i])
			continue;
		if (c->dsv41) {
			const char *why;
			int grp;

			switch (es_v41_classify(t->name, c->cfg.n_layers, &grp,
						&why)) {
			case ES_V41_SKIP:
				c->is_expert[i] = 2;
				c->skipped[grp]++;
				continue;
			case ES_V41_REFUSE:
				return st_diag_set(c->diag, -ST_E_FORMAT,
						   "checkpoint %s: tensor %s: %s; "
						   "strata does not convert it",
						   c->model_dir, t->name, why);
			default:
				break;
			}
		}
		if (!strncmp(t->name, "mtp.", 4)) {
			c->is_expert[i] = 2;
			continue;
		}
		if (strstr(t->name, ".experts."))
			return st_diag_set(c->diag, -ST_E_FORMAT, "checkpoint %s: "
					   "tensor %s looks like an expert matrix, "
					   "but config.json has %d layers of %d "
					   "experts", c->model_dir, t->name,
					   c->cfg.n_layers, c->cfg.n_experts);
		if (t->n_dims > 4)
			return st_diag_set(c->diag, -ST_E_UNSUPPORTED,
					   "checkpoint %s: tensor %s has %d "
					   "dimensions (at most 4)", c->model_dir,
					   t->name, t->n_dims);
		c->total += t->n_bytes;
		switch (t->dtype) {
		case ST_DTYPE_BF16: case ST_DTYPE_F32: case ST_DTYPE_I64:
			continue;
		case ST_DTYPE_F8_E8M0: /* checked with its weight */
			if (len > 6 && !strcmp(t->name + len - 6, ".scale"))
				continue;
			break;
		case ST_DTYPE_F8_E4M3:
			if (t->n_dims != 2 || len < 7 ||
			    strcmp(t->name + len - 7, ".weight"))
				break;
			snprintf(nm, sizeof(nm), "%.*s.scale", (int)(len - 7),
				 t->name);
			if ((r = find_dsv4(c, nm, ST_DTYPE_F8_E8M0,
					   (t->shape[0] + bo - 1) / bo,
					   (t->shape[1] + bi - 1) / bi, &ts)))
				return r;
			continue;
		default:
			break;
		}
		return st_diag_set(c->diag, -ST_E_UNSUPPORTED, "checkpoint %s: "
				   "tensor %s: dtype %s where a DeepSeek-V4 "
				   "checkpoint has BF16, F32, I64 or FP8 (E4M3 "
				   ".weight with an E8M0 .scale)", c->model_dir,
				   t->name, st_dtype_traits(t->dtype)->name);
	}
	return 0;
}

/* check_all for a V4 checkpoint (config text already read). */
static int check_all_dsv4(struct conv *c)
{
	char path[4200];
	int r;

	snprintf(path, sizeof(path), "%s/config.json", c->model_dir);
	c->dsv4 = 1;
	if ((r = st_dsv4_config_parse(c->config_text, path, &c->v4, c->diag)) ||
	    (r = check_opts_dsv4(c)))
		return r;
	st_dsv4_expert_config(&c->v4, &c->cfg);
	if ((r = plan_layers(c)) ||
	    (r = st_checkpoint_open(c->model_dir, &c->ck, c->diag)))
		return r;
	c->is_expert = calloc((size_t)c->ck->n_tensors + 1, 1);
	c->is_attn = calloc((size_t)c->ck->n_tensors + 1, 1);
	if (!c->is_expert || !c->is_attn)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if ((r = check_experts_dsv4(c)) || (r = check_dense_dsv4(c)) ||
	    (r = check_copied_files(c)) || (r = check_tokenizer(c)))
		return r;
	return check_finite(c);
}

/* Checkpoint bytes of the Engram tables (progress). */
static uint64_t engram_bytes(const struct conv *c)
{
	uint64_t n = 0;

	for (int i = 0; i < c->engram.n; i++)
		n += c->engram.weight[i]->n_bytes + c->engram.scale[i]->n_bytes;
	return n;
}

/* check_all for a V4.1 checkpoint: the V4 lossless path with the V4.1
 * geometry, plus the Engram tables and hash (es_convert_engram.c). */
static int check_all_dsv41(struct conv *c)
{
	char path[4200];
	int r;

	snprintf(path, sizeof(path), "%s/config.json", c->model_dir);
	c->dsv4 = c->dsv41 = 1;
	if ((r = st_dsv41_config_parse(c->config_text, path, &c->v41,
					 c->diag)) ||
	    (r = st_dsv41_config_check_store(&c->v41, path, c->diag)) ||
	    (r = check_opts_dsv4(c)))
		return r;
	st_dsv41_expert_config(&c->v41, &c->cfg);
	/* the dense checks read the FP8 block from the V4 config */
	c->v4.fp8_block[0] = c->v41.fp8_block[0];
	c->v4.fp8_block[1] = c->v41.fp8_block[1];
	if ((r = plan_layers(c)) ||
	    (r = st_checkpoint_open(c->model_dir, &c->ck, c->diag)))
		return r;
	c->is_expert = calloc((size_t)c->ck->n_tensors + 1, 1);
	c->is_attn = calloc((size_t)c->ck->n_tensors + 1, 1);
	if (!c->is_expert || !c->is_attn)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if ((r = check_experts_dsv4(c)) ||
	    (r = es_engram_check(c->ck, &c->v41, c->model_dir, c->is_expert,
				 &c->engram, c->diag)) ||
	    (r = check_dense_dsv4(c)))
		return r;
	c->total += engram_bytes(c);
	if ((r = check_copied_files(c)) || (r = check_tokenizer(c)))
		return r;
	return check_finite(c);
}

/* The manifest's "skipped" list: the groups of checkpoint tensors a V4.1
 * store leaves out, with their counts. */
static int skipped_json(struct conv *c)
{
	json_t *arr = json_array();
	int r = jset(c->manifest, "skipped", arr);

	for (int g = 0; g < ES_V41_N_SKIP && !r; g++) {
		json_t *o = json_object();

		if (!(r = jappend(arr, o)) &&
		    !(r = jset(o, "tensors", json_string(es_v41_skip_name(g)))) &&
		    !(r = jset_int(o, "count", (uint64_t)c->skipped[g])))
			r = jset(o, "why", json_string(es_v41_skip_why(g)));
	}
	return r;
}

static int check_all(struct conv *c)
{
	char path[4200];
	int r;

	if (!st_scale_search_name(c->o.scale_search))
		return st_diag_set(c->diag, -EINVAL, "scale search %d: not "
				   "none (0), mse (1) or calibrated (2)",
				   (int)c->o.scale_search);
	if ((c->o.scale_search == ST_SCALE_SEARCH_CALIBRATED ||
	     c->o.scale_search == ST_SCALE_SEARCH_GPTQ) !=
	    (c->o.calib_path != NULL))
		return st_diag_set(c->diag, -EINVAL, c->o.calib_path ?
				   "--calibrate STATS goes with the calibrated "
				   "or gptq scale search, not with "
				   "--scale-search %s" :
				   "the %s scale search needs activation "
				   "statistics: --calibrate STATS (made by "
				   "strata calibrate)",
				   st_scale_search_name(c->o.scale_search));
	if (default_format(&c->o, &c->def_fmt))
		return st_diag_set(c->diag, -EINVAL, "expert format (dtype %d, "
				   "group %u) is not one of " FORMAT_SPELLINGS,
				   (int)c->o.expert_dtype, c->o.expert_group);
	snprintf(path, sizeof(path), "%s/config.json", c->model_dir);
	if ((r = st_read_file(path, &c->config_text, &c->config_len)))
		return st_diag_set(c->diag, r, "%s: %s", path, strerror(-r));
	if (st_dsv41_config_detect(c->config_text))
		return check_all_dsv41(c);
	if (st_dsv4_config_detect(c->config_text))
		return check_all_dsv4(c);
	if ((r = st_config_load(c->model_dir, &c->cfg, c->diag)))
		return r;
	if (c->o.shared_experts_set && !c->cfg.shared_inter)
		return st_diag_set(c->diag, -ST_E_UNSUPPORTED, "--shared-experts: "
				   "this model (%s) has no shared experts; the "
				   "option is for models that have them "
				   "(Qwen2-MoE): drop it",
				   st_arch_name(c->cfg.arch));
	if (c->o.shared_experts_set &&
	    c->o.shared_experts.dtype != ST_DTYPE_BF16 &&
	    c->o.shared_experts.dtype != ST_DTYPE_F32 &&
	    !(c->o.shared_experts.dtype == ST_DTYPE_F8_E4M3 &&
	      c->o.shared_experts.group == ST_FP8_DEFAULT_BLOCK))
		return st_diag_set(c->diag, -ST_E_UNSUPPORTED, "--shared-experts: "
				   "shared experts are dense tensors (dense.bin, "
				   "read by every token), which computed "
				   "reads in bf16, f32 or fp8 (block 128) only; "
				   "use one of those");
	if (c->o.attention_dtype != ST_DTYPE_COUNT &&
	    c->o.attention_dtype != ST_DTYPE_BF16 &&
	    c->o.attention_dtype != ST_DTYPE_F32)
		return st_diag_set(c->diag, -EINVAL, "attention dtype %d: not "
				   "BF16 or F32", (int)c->o.attention_dtype);
	if ((r = plan_layers(c)))
		return r;
	if ((r = check_search_applies(c)))
		return r;
	if ((r = st_checkpoint_open(c->model_dir, &c->ck, c->diag)))
		return r;
	if (c->o.calib_path && (r = load_calibration(c)))
		return r;
	c->is_expert = calloc((size_t)c->ck->n_tensors + 1, 1);
	c->is_attn = calloc((size_t)c->ck->n_tensors + 1, 1);
	c->is_shexp = calloc((size_t)c->ck->n_tensors + 1, 1);
	if (!c->is_expert || !c->is_attn || !c->is_shexp)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if ((r = check_experts(c)) || (r = check_dense(c)) ||
	    (r = check_copied_files(c)) || (r = check_tokenizer(c)) ||
	    (r = check_finite(c)))
		return r;
	for (int i = 0; i < c->ck->n_tensors; i++)
		c->total += c->ck->tensors[i].n_bytes;
	return 0;
}

static int write_all(struct conv *c)
{
	json_t *files;
	int r;

	c->manifest = json_object();
	c->xs = XXH3_createState();
	if (!c->manifest || !c->xs)
		return st_diag_set(c->diag, -ENOMEM, "out of memory");
	if ((r = manifest_head(c)))
		return r == -ENOMEM ? st_diag_set(c->diag, r, "out of memory") : r;
	files = json_object_get(c->manifest, "files");
	if ((r = copy_files(c, files)) || (r = write_dense(c)) ||
	    (r = write_experts(c)))
		return r;
	if (c->dsv41 &&
	    ((r = es_engram_write(&c->engram, c->ck, c->tmp, c->manifest, files,
				  c->diag)) ||
	     (r = progress(c, engram_bytes(c))) || (r = skipped_json(c))))
		return r == -ENOMEM ? st_diag_set(c->diag, r, "out of memory") : r;
	if ((r = write_manifest(c)) ||
	    (r = fsync_dir(c, c->tmp)))
		return r;
	return 0;
}

static void conv_free(struct conv *c)
{
	json_decref(c->manifest);
	XXH3_freeState(c->xs);
	free(c->experts);
	free(c->v4_scales);
	es_engram_plan_fini(&c->engram);
	free(c->layers);
	free(c->is_expert);
	free(c->is_attn);
	free(c->is_shexp);
	free(c->config_text);
	free(c->cal_w);
	free(c->gptq_w);
	free(c->gptq_h);
	st_calib_free(&c->cal);
	st_checkpoint_close(c->ck);
}

int es_convert_check(const char *model_dir, const struct es_convert_opts *opts,
		     struct st_diag *diag)
{
	struct conv c = { .model_dir = model_dir, .diag = diag };
	int r;

	if (!model_dir)
		return st_diag_set(diag, -EINVAL, "convert: no model directory");
	if (opts)
		c.o = *opts;
	else
		es_convert_opts_init(&c.o);
	r = check_all(&c);
	conv_free(&c);
	return r;
}

int es_convert(const char *model_dir, const char *out_dir,
	       const struct es_convert_opts *opts, struct st_diag *diag)
{
	struct conv c = { .model_dir = model_dir, .diag = diag };
	int r, exists = 0, made_tmp = 0;

	if (!model_dir || !out_dir)
		return st_diag_set(diag, -EINVAL, "convert: no model or output "
				   "directory");
	if (opts)
		c.o = *opts;
	else
		es_convert_opts_init(&c.o);
	r = check_all(&c);
	if (!r)
		r = prepare_out(&c, out_dir, &exists);
	if (!r) {
		made_tmp = 1;
		if (c.o.progress)
			c.o.progress(0, c.total, c.o.progress_arg);
		r = write_all(&c);
	}
	if (!r)
		r = publish(&c, exists);
	if (made_tmp)
		st_rm_rf(c.tmp); /* on success: gone, or the replaced store */
	if (!r && c.o.progress)
		c.o.progress(c.total, c.total, c.o.progress_arg);
	conv_free(&c);
	return r;
}

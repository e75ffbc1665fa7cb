/* st_plan.c — see st_plan.h. */
#include "st_plan.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "es_pool.h"
#include "kv_pool.h"
#include "kv_proto.h"
#include "st_config.h"
#include "st_ledger.h"
#include "st_store.h"
#include "st_tokenizer.h"
#include "st_util.h"

/*
 * What a strata daemon occupies besides the model: code, libraries
 * (nanomsg, jansson, hwloc, libnuma...), stacks and heap at start.
 * Measured on x86-64 Debian 12 (debugoptimized build) as VmHWM of each
 * daemon with a tiny store, minus the model-dependent parts this file
 * computes; re-measure with tests/appliance/test_plan_measured.sh when the
 * daemons change much.
 */
#define BASE_EXPERTD (3270ull * 1024)
#define BASE_KVD (3050ull * 1024)
#define BASE_COMPUTED (6400ull * 1024)

void st_plan_opts_default(struct st_plan_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->batch = 1;
	o->context = 4096;
	o->kv_dtype = ST_DTYPE_F32; /* strata run/up's default (kv.dtype) */
	o->experts.dtype = ST_DTYPE_MXFP4;
	o->experts.group = 32;
	o->dense_dtype = ST_DTYPE_BF16;
	o->hot_experts = -1;
	o->page_rows = 16;
}

/* --- model from config.json --------------------------------------------- */

static int jint(json_t *o, const char *key, int def)
{
	json_t *v = json_object_get(o, key);

	if (json_is_integer(v))
		return (int)json_integer_value(v);
	if (json_is_real(v))
		return (int)json_real_value(v);
	return def;
}

static void add_stream(struct st_plan_model *m, const char *name,
		       uint32_t n_layers, uint32_t row_elems,
		       uint32_t scale_bytes, uint32_t tokens_per_row,
		       uint32_t window_rows)
{
	struct st_plan_stream *s;

	if (m->n_streams >= ST_PLAN_MAX_STREAMS || !n_layers || !row_elems)
		return;
	s = &m->streams[m->n_streams++];
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->n_layers = n_layers;
	s->row_elems = row_elems;
	s->scale_bytes = scale_bytes;
	s->tokens_per_row = tokens_per_row ? tokens_per_row : 1;
	s->window_rows = window_rows;
}

static int model_from_json(json_t *c, const char *source,
			   struct st_plan_model *m, struct st_diag *diag)
{
	const char *mt = json_string_value(json_object_get(c, "model_type"));
	int L, H, nh, kvh, hd, E, I, dense_k;
	int moe_layers, inter, shared, shared_inter;
	uint64_t attn, per_layer_dense;

	/* multimodal checkpoints keep the language model's keys in
	 * text_config */
	if (!json_object_get(c, "num_hidden_layers") &&
	    json_is_object(json_object_get(c, "text_config"))) {
		c = json_object_get(c, "text_config");
		if (json_string_value(json_object_get(c, "model_type")))
			mt = json_string_value(json_object_get(c, "model_type"));
	}
	L = jint(c, "num_hidden_layers", 0);
	H = jint(c, "hidden_size", 0);
	nh = jint(c, "num_attention_heads", 0);

	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "%s", mt ? mt : "unknown");
	if (L < 1 || H < 1 || nh < 1)
		return st_diag_set(diag, -ST_E_CONFIG, "%s: num_hidden_layers, "
				   "hidden_size and num_attention_heads must be "
				   "positive integers", source);
	m->max_context = jint(c, "max_position_embeddings", 0);
	kvh = jint(c, "num_key_value_heads", nh);
	hd = jint(c, "head_dim", H / nh);
	E = jint(c, "num_local_experts",
		 jint(c, "num_experts", jint(c, "n_routed_experts", 0)));
	I = jint(c, "moe_intermediate_size", 0);
	inter = jint(c, "intermediate_size", 0);
	if (!I)
		I = inter; /* mixtral: the expert width is intermediate_size */
	dense_k = jint(c, "first_k_dense_replace", 0);
	if (dense_k > L)
		dense_k = L;
	moe_layers = E ? L - dense_k : 0;
	shared = jint(c, "n_shared_experts", 0);
	shared_inter = jint(c, "shared_expert_intermediate_size", shared * I);
	m->n_layers = L;
	m->hidden = H;
	m->n_heads = nh;
	m->n_kv_heads = kvh;
	m->head_dim = hd;
	m->vocab = jint(c, "vocab_size", 0);
	m->n_experts = E;
	m->top_k = jint(c, "num_experts_per_tok", E ? 1 : 0);
	m->n_shared_experts = shared;
	m->expert_inter = I;
	m->expert_params = (uint64_t)moe_layers * (uint64_t)E * 3ull *
			   (uint64_t)H * (uint64_t)I;

	if (json_is_integer(json_object_get(c, "kv_lora_rank"))) {
		/* MLA (DeepSeek V2/V3): one latent row per token and layer */
		int r = jint(c, "kv_lora_rank", 0);
		int rope = jint(c, "qk_rope_head_dim", 64);
		int nope = jint(c, "qk_nope_head_dim", hd);
		int vhd = jint(c, "v_head_dim", hd);
		int qr = jint(c, "q_lora_rank", 0);

		add_stream(m, "latent", (uint32_t)L, (uint32_t)(r + rope), 4, 1,
			   0);
		attn = (qr ? (uint64_t)H * qr + (uint64_t)qr * nh * (nope + rope)
			   : (uint64_t)H * nh * (nope + rope)) +
		       (uint64_t)H * (r + rope) + (uint64_t)r * nh * (nope + vhd) +
		       (uint64_t)nh * vhd * H;
	} else if (json_is_array(json_object_get(c, "compress_ratios"))) {
		/* DeepSeek-V4 (approximate, MODEL_FAMILY_DEEPSEEK_V4.md 2.6):
		 * a sliding window of full rows in every layer, rows pooled
		 * over `ratio` tokens in compressed layers, index keys in the
		 * layers pooled by 4 */
		json_t *cr = json_object_get(c, "compress_ratios");
		json_t *idx = json_object_get(c, "index_source_layer_ids");
		int win = jint(c, "sliding_window", 128);
		int ihd = jint(c, "index_head_dim", 128);
		uint32_t n_by_ratio[129] = { 0 }, n_index = 0;

		for (int l = 0; l < L && l < (int)json_array_size(cr); l++) {
			int v = (int)json_integer_value(json_array_get(cr, l));

			if (v > 0 && v <= 128)
				n_by_ratio[v]++;
			if (v == 4 && !json_is_array(idx))
				n_index++;
		}
		if (json_is_array(idx)) /* V4.1: layers that own index keys */
			n_index = (uint32_t)json_array_size(idx);
		add_stream(m, "window", (uint32_t)L, (uint32_t)(kvh * hd), 4, 1,
			   (uint32_t)win);
		for (int v = 1; v <= 128; v++)
			if (n_by_ratio[v]) {
				char name[16];

				snprintf(name, sizeof(name), "pooled/%d", v);
				add_stream(m, name, n_by_ratio[v], (uint32_t)hd,
					   4, (uint32_t)v, 0);
			}
		add_stream(m, "index", n_index, (uint32_t)ihd, 4, 4, 0);
		attn = (uint64_t)H * nh * hd * 2 + (uint64_t)H * kvh * hd;
	} else {
		/* GQA: K and V of every KV head, one row per token */
		int win = 0;

		if (json_is_true(json_object_get(c, "use_sliding_window")) ||
		    (mt && !strcmp(mt, "mistral")))
			win = jint(c, "sliding_window", 0);
		add_stream(m, "kv", (uint32_t)L, (uint32_t)(2 * kvh * hd),
			   (uint32_t)(2 * kvh * 4), 1, (uint32_t)win);
		attn = 2ull * H * nh * hd + 2ull * H * kvh * hd;
	}
	/* per layer besides attention: two norms, the router, shared
	 * experts; the first_k_dense_replace layers have a dense FFN */
	per_layer_dense = 2ull * H + (E ? (uint64_t)E * H : 0) +
			  3ull * H * shared_inter;
	m->attn_params = attn * (uint64_t)L;
	m->dense_params = m->attn_params + per_layer_dense * (uint64_t)L +
			  (uint64_t)dense_k * 3ull * H * inter +
			  (uint64_t)m->vocab * H *
				  (json_is_true(json_object_get(c,
						"tie_word_embeddings")) ? 1 : 2) +
			  (uint64_t)H;
	{
		struct st_model_config cfg;
		char *txt = json_dumps(c, 0);

		/* families strata runs: exact store layout later */
		m->strata_runs_it = txt && st_config_parse(txt, source, &cfg,
							    NULL) == 0;
		free(txt);
	}
	return 0;
}

int st_plan_model_load(const char *dir, struct st_plan_model *m,
		       struct st_diag *diag)
{
	char path[4200];
	json_error_t jerr;
	json_t *c;
	int r;

	snprintf(path, sizeof(path), "%s/config.json", dir);
	if (!st_path_exists(path)) {
		/* a file given directly (config.json or a spec) */
		if (st_path_exists(dir))
			snprintf(path, sizeof(path), "%s", dir);
		else
			return st_diag_set(diag, -ENOENT, "%s: no such model "
					   "directory, store or config.json",
					   dir);
	}
	c = json_load_file(path, 0, &jerr);
	if (!c)
		return st_diag_set(diag, -ST_E_FORMAT, "%s: line %d: %s", path,
				   jerr.line, jerr.text);
	if (!json_is_object(c)) {
		json_decref(c);
		return st_diag_set(diag, -ST_E_FORMAT, "%s: not a JSON object",
				   path);
	}
	r = model_from_json(c, path, m, diag);
	json_decref(c);
	if (r == 0) {
		struct stat st;

		/* a store: computed maps its dense.bin as it is */
		snprintf(path, sizeof(path), "%s/dense.bin", dir);
		if (stat(path, &st) == 0)
			m->dense_file_bytes = (uint64_t)st.st_size;
	}
	return r;
}

/* Resets this process's peak RSS to its current RSS (Linux >= 4.0);
 * 0 or -errno. */
static int reset_peak_rss(void)
{
	FILE *f = fopen("/proc/self/clear_refs", "we");
	int r = 0;

	if (!f)
		return -errno;
	if (fputs("5", f) < 0)
		r = -EIO;
	if (fclose(f) != 0)
		r = -EIO;
	return r;
}

int st_plan_measure_store(const char *dir, struct st_plan_model *m,
			  struct st_diag *diag)
{
	struct st_store *st = NULL;
	struct st_tokenizer *tok = NULL;
	char path[4200];
	uint64_t rss0;
	int r;

	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	if (st_path_exists(path)) {
		r = reset_peak_rss();
		if (r < 0)
			return st_diag_set(diag, r, "cannot reset the peak RSS: "
					   "%s", st_strerror(r));
		rss0 = st_pid_rss_bytes(0);
		r = st_store_open(dir, &st, diag);
		if (r < 0)
			return r;
		m->store_open_bytes = st_peak_rss_bytes() - rss0;
	}
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	if (st_path_exists(path)) {
		r = reset_peak_rss();
		rss0 = st_pid_rss_bytes(0);
		if (r == 0 && st_tokenizer_load(dir, &tok, NULL) == 0) {
			m->tokenizer_bytes = st_peak_rss_bytes() - rss0;
			m->tokenizer_kept_bytes = st_pid_rss_bytes(0) - rss0;
		}
		st_tokenizer_free(tok);
	}
	st_store_close(st);
	return 0;
}

int st_plan_model_from_params(uint64_t expert_params, uint64_t dense_params,
			      uint64_t attn_params, int n_experts, int top_k,
			      int n_layers, int kv_heads, int head_dim,
			      int hidden, struct st_plan_model *m,
			      struct st_diag *diag)
{
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "params");
	if (n_layers < 1)
		return st_diag_set(diag, -EINVAL, "--layers must be at least 1");
	if (expert_params && (n_experts < 1 || top_k < 1 || top_k > n_experts))
		return st_diag_set(diag, -EINVAL, "--experts-count N and "
				   "--top-k K (1 <= K <= N) are needed with "
				   "--expert-params");
	if (kv_heads < 0 || head_dim < 0 || (kv_heads && !head_dim))
		return st_diag_set(diag, -EINVAL, "--kv-heads and --head-dim "
				   "must be given together");
	m->n_layers = n_layers;
	m->n_kv_heads = kv_heads;
	m->head_dim = head_dim;
	m->hidden = hidden;
	m->n_experts = n_experts;
	m->top_k = top_k;
	m->expert_params = expert_params;
	m->dense_params = dense_params > attn_params ? dense_params : attn_params;
	m->attn_params = attn_params;
	if (kv_heads)
		add_stream(m, "kv", (uint32_t)n_layers,
			   (uint32_t)(2 * kv_heads * head_dim),
			   (uint32_t)(2 * kv_heads * 4), 1, 0);
	return 0;
}

/* --- sizes ---------------------------------------------------------------- */

static int kv_elem_bytes(enum st_dtype dt)
{
	switch (dt) {
	case ST_DTYPE_F32: return 4;
	case ST_DTYPE_F16: case ST_DTYPE_BF16: return 2;
	case ST_DTYPE_F8_E4M3: return 1;
	default: return 0;
	}
}

static uint64_t stream_row_bytes(const struct st_plan_stream *s,
				 enum st_dtype dt)
{
	if (s->row_bytes_fixed)
		return s->row_bytes_fixed;
	return (uint64_t)s->row_elems * (uint64_t)kv_elem_bytes(dt) +
	       (dt == ST_DTYPE_F8_E4M3 ? s->scale_bytes : 0);
}

static uint64_t stream_rows(const struct st_plan_stream *s, uint64_t tokens)
{
	uint64_t rows = (tokens + s->tokens_per_row - 1) / s->tokens_per_row;

	return s->window_rows && rows > s->window_rows ? s->window_rows : rows;
}

uint64_t st_plan_kv_bytes(const struct st_plan_model *m, enum st_dtype dt,
			  uint64_t n_tokens)
{
	uint64_t sum = 0;

	for (int i = 0; i < m->n_streams; i++)
		sum += (uint64_t)m->streams[i].n_layers *
		       stream_rows(&m->streams[i], n_tokens) *
		       stream_row_bytes(&m->streams[i], dt);
	return sum;
}

/* Bytes of n parameters in format f (data and scales of rows of 4096
 * elements: the per-row overhead of the real shapes is negligible). */
static uint64_t wformat_bytes(const struct st_wformat *f, uint64_t n)
{
	uint64_t data = 0, scales = 0;

	if (st_wformat_matrix_bytes(f, 1, 4096, &data, &scales, NULL) < 0)
		return 0;
	return (uint64_t)((long double)n * (long double)(data + scales) / 4096.0L);
}

/* KV pool geometry kvd would build for this plan (metadata bytes and
 * page bytes), with kvd's default max_seqs and the rows per sequence
 * strata up/run give it (the model's context; kvd's default when the
 * config has none).  ret_seq_bytes (may be NULL): the pages of one
 * sequence of that many rows in every stream (kv_layout_seq_bytes, not
 * clamped to the pool made for kv_budget), kvd's floor under
 * --memory-budget without --budget (kvd/kv_budget_ledger.c). */
static void kv_geometry(const struct st_plan_model *m,
			const struct st_plan_opts *o, uint64_t kv_budget,
			uint64_t *ret_meta, uint64_t *ret_private,
			uint64_t *ret_page_bytes, uint64_t *ret_seq_bytes)
{
	struct kv_stream_decl decl[256];
	struct kv_layout lay;
	uint32_t n = 0;

	*ret_meta = 0;
	*ret_private = 0;
	*ret_page_bytes = 0;
	if (ret_seq_bytes)
		*ret_seq_bytes = 0;
	for (int i = 0; i < m->n_streams; i++)
		for (uint32_t l = 0; l < m->streams[i].n_layers && n < 256; l++) {
			decl[n].row_bytes = (uint32_t)stream_row_bytes(
				&m->streams[i], o->kv_dtype);
			decl[n].tokens_per_row = m->streams[i].tokens_per_row;
			decl[n].window_rows = m->streams[i].tokens_per_row == 1 ?
					      m->streams[i].window_rows : 0;
			decl[n].flags = 0;
			n++;
		}
	if (!n || kv_layout_compute(decl, n, o->page_rows, kv_budget, 64,
				    kv_rows_per_seq_for_context(
					    m->max_context), &lay, NULL) < 0)
		return;
	/* kvd writes the tables up to the end of the page table when it
	 * formats the pool (the padding before the page data stays
	 * untouched) */
	*ret_meta = ST_ALIGN_UP(lay.table_off + (uint64_t)lay.max_seqs *
				lay.n_streams * lay.max_pages_per_seq * 4ull,
				4096);
	/* and writes in its own memory (kv_pool.c, kv_cache.c): the free
	 * list and prefix group of every page (4 + 4 bytes), the prefix
	 * cache's free ids and hash buckets (4 bytes per group of n_streams
	 * pages, buckets a power of two), sequence lists (12 bytes) */
	{
		uint64_t groups = lay.n_pages / n + 1, nb = 16;

		while (nb < groups)
			nb <<= 1;
		*ret_private = 8ull * lay.n_pages + 4ull * groups + 4ull * nb +
			       12ull * lay.max_seqs;
	}
	*ret_page_bytes = lay.page_bytes;
	if (ret_seq_bytes)
		*ret_seq_bytes = kv_layout_seq_bytes(&lay);
}

/* Bytes of expertd's pool segment holding r->ram_warm of experts: records
 * plus tables, as es_pool_layout_compute lays it out. */
static uint64_t pool_segment_bytes(const struct st_plan_model *m,
				   const struct st_plan_result *r,
				   int moe_layers)
{
	struct es_pool_geom g = { 0 };
	struct es_pool_layout lay;

	g.n_layers = (uint32_t)moe_layers;
	g.n_experts = (uint32_t)m->n_experts;
	g.top_k = (uint32_t)m->top_k;
	g.record_bytes = r->record_bytes;
	g.n_slots = r->record_bytes ?
		(uint32_t)ST_MIN(r->ram_warm / r->record_bytes,
				 (uint64_t)UINT32_MAX) : 0;
	if (g.n_slots && es_pool_layout_compute(&g, &lay) == 0)
		return lay.total_bytes;
	return r->ram_warm;
}

/* Bytes of whole expert records --host-budget gives expertd (a share: n
 * = all records x pct / 100, as expertd; bytes: rounded down to records);
 * 0 when it gives none (host_budget and host_budget_pct 0). */
static uint64_t host_budget_records(const struct st_plan_opts *o,
				    const struct st_plan_result *r)
{
	uint64_t rec = ST_MAX(r->record_bytes, 1);

	if (o->host_budget_pct > 0)
		return (uint64_t)((double)(r->experts_all / rec) *
				  o->host_budget_pct / 100.0 + 1e-9) * rec;
	return o->host_budget / rec * rec;
}

/* Tokens of context `bytes` of KV hold, all sequences together: bytes /
 * kv_per_token, or for pooled rows (DeepSeek-V4: a token costs a fraction
 * of a row) one sequence's windows and compressor states first, then
 * kv_growth_per_token per token. */
static uint64_t kv_tokens(const struct st_plan_model *m,
			  const struct st_plan_result *r, uint64_t bytes)
{
	for (int i = 0; i < m->n_streams; i++)
		if (m->streams[i].tokens_per_row > 1 &&
		    r->kv_growth_per_token > 0)
			return bytes > r->kv_fixed ?
				(uint64_t)((double)(bytes - r->kv_fixed) /
					   r->kv_growth_per_token) : 0;
	return r->kv_per_token ? bytes / r->kv_per_token : 0;
}

/* Clamps v to [lo, hi] (lo wins over hi). */
/* The shared budget's section of the plan (st_plan_shared in st_plan.h,
 * where the rules are written); r's expert and KV figures are computed.
 * 0, or -ST_E_BUDGET with diag when the floors exceed the budget. */
static int plan_shared(const struct st_plan_model *m,
		       const struct st_plan_opts *o, struct st_plan_result *r,
		       struct st_diag *diag)
{
	struct st_plan_shared *sh = &r->shared;
	uint64_t M = o->memory_budget;
	char a[32], b[32], c[32], d[32];

	sh->total = M;
	sh->floor[0] = host_budget_records(o, r);
	if (!sh->floor[0])
		sh->floor[0] = r->record_bytes * (uint64_t)m->top_k;
	{
		/* kvd's: --budget in whole pages, or one sequence of the
		 * model's context in every stream.  Neither depends on the
		 * budget of the pool (kvd's is made for M): a pool of 1 TiB
		 * gives them even where M holds fewer pages than streams */
		uint64_t meta, priv, pb;

		kv_geometry(m, o, 1ull << 40, &meta, &priv, &pb,
			    &sh->floor[1]);
		if (o->kv_budget)
			sh->floor[1] = pb ? ST_ALIGN_UP(o->kv_budget, pb) :
					    o->kv_budget;
	}
	if (sh->floor[0] + sh->floor[1] > M)
		return st_diag_set(diag, -ST_E_BUDGET, "--memory-budget %s is "
				   "below the floors of its two sides: experts "
				   "%s (%s) + KV %s (%s); give at least %s "
				   "(%llu bytes)", st_format_bytes(M, a,
				   sizeof(a)), st_format_bytes(sh->floor[0], b,
				   sizeof(b)), o->host_budget ||
				   o->host_budget_pct > 0 ? "--host-budget" :
				   "one layer's top-k experts",
				   st_format_bytes(sh->floor[1], c, sizeof(c)),
				   o->kv_budget ? "--kv-budget" :
				   "one sequence of the model's context",
				   st_format_bytes(sh->floor[0] + sh->floor[1],
						   d, sizeof(d)),
				   (unsigned long long)(sh->floor[0] +
							sh->floor[1]));
	sh->cap[0] = ST_MIN(r->experts_all, M);
	sh->cap[1] = M;
	/* expertd joins first, then kvd (st_ledger_open's rule), taking from
	 * the experts down to their floor for its own */
	sh->start[0] = st_ledger_join_target(M, sh->floor[0], sh->cap[0], 0,
					     0, 0);
	sh->start[1] = st_ledger_join_target(M, sh->floor[1], sh->cap[1], 0,
					     sh->cap[0], sh->start[0]);
	if (sh->start[0] + sh->start[1] > M)
		sh->start[0] = M - sh->start[1];
	for (int s = 0; s < 2; s++) {
		sh->min[s] = sh->floor[s];
		sh->max[s] = ST_MIN(sh->cap[s], M - sh->floor[1 - s]);
	}
	for (int i = 0; i < 3; i++) {
		const uint64_t *v = i == 0 ? sh->start : i == 1 ? sh->min :
				    sh->max;

		sh->experts_pct[i] = r->experts_all ?
			100.0 * (double)v[0] / (double)r->experts_all : 0.0;
		sh->kv_tokens[i] = kv_tokens(m, r, v[1]);
	}
	return 0;
}

int st_plan_compute(const struct st_plan_model *m,
		    const struct st_plan_opts *o, struct st_plan_result *r,
		    struct st_diag *diag)
{
	uint64_t moe_records, hot_bytes_per, base, fixed;
	int moe_layers;

	memset(r, 0, sizeof(*r));
	if (o->batch < 1 || o->context < 1)
		return st_diag_set(diag, -EINVAL, "--batch and --context must "
				   "be at least 1");
	if (!kv_elem_bytes(o->kv_dtype))
		return st_diag_set(diag, -EINVAL, "KV dtype must be f32, f16, "
				   "bf16 or fp8");
	if (st_wformat_check(&o->experts) < 0)
		return st_diag_set(diag, -EINVAL, "invalid expert format");
	if (m->n_layers < 1)
		return st_diag_set(diag, -EINVAL, "the model has no layers");
	moe_layers = m->n_experts ? m->n_layers : 0;
	moe_records = (uint64_t)moe_layers * (uint64_t)m->n_experts;

	/* experts: the exact store record when strata runs the family */
	r->experts_all = wformat_bytes(&o->experts, m->expert_params);
	r->record_bytes = moe_records ?
		ST_ALIGN_UP(r->experts_all / moe_records, ST_STORE_RECORD_ALIGN) : 0;
	if (m->strata_runs_it && m->expert_inter && m->hidden) {
		struct st_model_config cfg = { 0 };
		struct st_wformat f3[3] = { o->experts, o->experts, o->experts };
		struct st_store_matrix mat[3];
		uint64_t rb;

		cfg.hidden_size = m->hidden;
		cfg.expert_inter = m->expert_inter;
		if (st_store_layout(&cfg, f3, mat, &rb, NULL) == 0) {
			r->record_bytes = rb;
			r->experts_all = rb * moe_records;
		}
	}
	if (m->record_stored_bytes) {
		r->record_bytes = m->record_stored_bytes;
		r->experts_all = m->record_stored_bytes * moe_records;
	}
	r->dense = st_dtype_bytes(o->dense_dtype, m->dense_params);
	r->attention = st_dtype_bytes(o->dense_dtype, m->attn_params);
	if (m->dense_stored_bytes) {
		r->dense = m->dense_stored_bytes;
		r->attention = m->attn_stored_bytes;
	}
	r->kv_per_token = st_plan_kv_bytes(m, o->kv_dtype, 1);
	for (int i = 0; i < m->n_streams; i++) {
		const struct st_plan_stream *s = &m->streams[i];
		uint64_t rb = (uint64_t)s->n_layers *
			      stream_row_bytes(s, o->kv_dtype);

		if (s->window_rows)
			r->kv_fixed += rb * stream_rows(s, (uint64_t)o->context);
		else
			r->kv_growth_per_token += (double)rb / s->tokens_per_row;
	}
	r->kv = (uint64_t)o->batch * st_plan_kv_bytes(m, o->kv_dtype,
						     (uint64_t)o->context);
	if (o->activations) {
		r->activations = o->activations;
	} else {
		/* per token in flight: hidden states, attention and expert
		 * intermediates, logits (FP32).  With a GPU: a prefill chunk
		 * of up to 512 tokens per sequence, plus double-buffered
		 * staging of one layer's top-k experts per sequence (an
		 * estimate: no device build exists to measure).  CPU build:
		 * one token per sequence and its attention scores over the
		 * context, as computed works (checked by the measured test) */
		uint64_t chunk = o->context < 512 ? (uint64_t)o->context : 512;
		uint64_t per_tok = 4ull * (8ull * m->hidden +
					   3ull * m->n_heads * m->head_dim +
					   3ull * m->expert_inter * m->top_k +
					   m->vocab);

		if (o->gpu_bytes)
			r->activations = (uint64_t)o->batch * chunk * per_tok +
					 2ull * o->batch * m->top_k *
						 r->record_bytes;
		else /* computed works a token at a time per sequence */
			r->activations = (uint64_t)o->batch *
					 (per_tok + 4ull * m->n_heads *
						    (uint64_t)o->context);
	}
	r->nvme_store = r->experts_all + r->dense + m->nvme_extra_bytes;
	hot_bytes_per = r->record_bytes * (uint64_t)moe_layers;

	/* T0: dense weights, hot experts, KV of running sequences,
	 * activations */
	if (o->gpu_bytes) {
		int64_t free_b = (int64_t)o->gpu_bytes - (int64_t)r->dense -
				 (int64_t)r->kv - (int64_t)r->activations;
		int64_t min_hot = (int64_t)hot_bytes_per * m->top_k;

		r->rec_hot_experts = free_b > 0 && hot_bytes_per ?
			(int)ST_MIN((uint64_t)free_b / hot_bytes_per,
				    (uint64_t)m->n_experts) : 0;
		r->hot_experts = o->hot_experts >= 0 ?
			ST_MIN(o->hot_experts, m->n_experts) :
			r->rec_hot_experts;
		r->gpu_hot = hot_bytes_per * (uint64_t)r->hot_experts;
		r->gpu_total = r->dense + r->gpu_hot + r->kv + r->activations;
		r->gpu_margin = (int64_t)o->gpu_bytes - (int64_t)r->gpu_total;
		{
			int64_t kv_room = (int64_t)o->gpu_bytes -
					  (int64_t)r->dense -
					  (int64_t)r->activations -
					  (o->hot_experts >= 0 ?
					   (int64_t)r->gpu_hot : min_hot);

			r->rec_kv_budget = kv_room > 0 ? (uint64_t)kv_room : 0;
		}
	}
	/* T1: what must be in host memory besides the expert pool */
	{
		uint64_t page_bytes = 0, kv_budget = o->kv_budget;

		if (!kv_budget)
			kv_budget = 1ull << 30; /* kvd's default */
		kv_geometry(m, o, kv_budget, &r->d.kv_meta_bytes,
			    &r->d.kv_private_bytes, &page_bytes, NULL);
		if (page_bytes) {
			uint64_t pages = 0;

			/* kvd pages every stream by token (kv_pool.h): a
			 * pooled stream has a page per page_rows tokens too;
			 * a windowed one frees the pages before its window */
			for (int i = 0; i < m->n_streams; i++) {
				const struct st_plan_stream *s = &m->streams[i];
				uint64_t np = ((uint64_t)o->context +
					       o->page_rows - 1) / o->page_rows;

				if (s->tokens_per_row == 1 && s->window_rows &&
				    (uint64_t)o->context > s->window_rows)
					np -= ((uint64_t)o->context -
					       s->window_rows) / o->page_rows;
				pages += (uint64_t)s->n_layers * np;
			}
			r->d.kv_touched = pages * page_bytes * (uint64_t)o->batch;
		} else {
			r->d.kv_touched = r->kv;
		}
	}
	base = BASE_EXPERTD + BASE_KVD + BASE_COMPUTED;
	fixed = o->gpu_bytes ? base :
		r->dense + r->kv + r->d.kv_meta_bytes + r->activations + base;
	r->ram_avail = o->ram_bytes;
	if (!r->ram_avail) {
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

		r->ram_avail = pages > 0 && psz > 0 ?
			(uint64_t)pages * (uint64_t)psz : 0;
	}
	{
		uint64_t want = r->experts_all - ST_MIN(r->gpu_hot, r->experts_all);
		uint64_t rec = ST_MAX(r->record_bytes, 1);

		if (o->host_budget_pct > 0 || o->host_budget) {
			/* expertd: n_slots = all records x pct / 100, or
			 * the bytes' whole records */
			r->ram_warm = ST_MIN(host_budget_records(o, r), want);
		} else {
			/* as much as fits; the rest streams from the store */
			uint64_t room = r->ram_avail > fixed ?
					r->ram_avail - fixed : 0;

			r->ram_warm = ST_MIN(room / rec * rec, want);
		}
		r->ram_streamed = want - r->ram_warm;
	}

	/* per-daemon memory (CPU build, as `strata run` reports it) */
	{
		uint64_t rec = ST_MAX(r->record_bytes, 1);

		r->d.pool_bytes = pool_segment_bytes(m, r, moe_layers);
		/* the pool's tables come on top of the experts: when the
		 * pool was sized to the room left, give back records until
		 * the segment fits */
		while (!o->host_budget && o->host_budget_pct <= 0 &&
		       r->ram_warm >= rec &&
		       fixed + r->d.pool_bytes > r->ram_avail) {
			uint64_t over = fixed + r->d.pool_bytes - r->ram_avail;

			r->ram_warm -= ST_MIN(r->ram_warm / rec,
					      (over + rec - 1) / rec) * rec;
			r->ram_streamed = r->experts_all -
					  ST_MIN(r->gpu_hot, r->experts_all) -
					  r->ram_warm;
			r->d.pool_bytes = pool_segment_bytes(m, r, moe_layers);
		}
		r->d.dense_bytes = m->dense_file_bytes ? m->dense_file_bytes :
							  r->dense;
		r->d.work_bytes = o->gpu_bytes ? 0 : r->activations;
		r->d.expertd = BASE_EXPERTD + m->store_open_bytes +
			       r->d.pool_bytes;
		r->d.kvd = BASE_KVD + r->d.kv_meta_bytes + r->d.kv_private_bytes;
		/* computed loads the tokenizer last: its parse peaks, then
		 * the heap it freed takes the work buffers, while the dense
		 * weights, experts and KV pages (mapped files and shared
		 * memory) come on top of what it keeps */
		r->d.computed = BASE_COMPUTED + m->store_open_bytes +
				ST_MAX(m->tokenizer_bytes,
				       m->tokenizer_kept_bytes + r->d.dense_bytes +
					       r->d.pool_bytes + r->d.kv_touched +
					       r->d.work_bytes);
	}

	/* T1 */
	r->ram_total = fixed + r->d.pool_bytes;
	r->ram_margin = (int64_t)r->ram_avail - (int64_t)r->ram_total;
	{
		int64_t room = (int64_t)r->ram_avail - (int64_t)fixed;

		r->rec_host_budget = room > 0 ?
			ST_MIN((uint64_t)room, r->experts_all) : 0;
		if (!o->gpu_bytes) {
			int64_t kv_room = (int64_t)r->ram_avail -
					  (int64_t)(fixed - r->kv) -
					  (int64_t)r->d.pool_bytes -
					  (int64_t)(r->record_bytes * m->top_k);

			r->rec_kv_budget = kv_room > 0 ? (uint64_t)kv_room : 0;
			/* a pool sized to the room left was sized after this
			 * workload's KV: that much stays recommended (not 0
			 * next to a plan that fits) */
			if (!o->host_budget && o->host_budget_pct <= 0 &&
			    r->ram_margin >= 0 && r->rec_kv_budget < r->kv)
				r->rec_kv_budget = r->kv;
		}
	}
	r->rec_max_tokens = kv_tokens(m, r, r->rec_kv_budget);
	r->fits = r->ram_margin >= 0 && (!o->gpu_bytes || r->gpu_margin >= 0);
	/* expertd must hold one layer's top-k experts (es_pool.c) */
	if (m->n_experts && r->ram_warm < r->record_bytes * (uint64_t)m->top_k &&
	    r->experts_all > r->gpu_hot)
		r->fits = 0;
	if (o->gpu_bytes && r->hot_experts < m->top_k && m->n_experts)
		r->fits = 0; /* no layer's top-k fits on the device */
	return o->memory_budget ? plan_shared(m, o, r, diag) : 0;
}

/* --- output ---------------------------------------------------------------- */

static const char *gb(uint64_t b, char *buf, size_t len)
{
	char x[32];

	snprintf(buf, len, "%.2f GB (%s)", (double)b / 1e9,
		 st_format_bytes(b, x, sizeof(x)));
	return buf;
}

static const char *dtname(enum st_dtype dt)
{
	switch (dt) {
	case ST_DTYPE_F32: return "f32";
	case ST_DTYPE_F16: return "f16";
	case ST_DTYPE_BF16: return "bf16";
	case ST_DTYPE_F8_E4M3: return "fp8";
	default: return "?";
	}
}

/* The shared budget's section (--memory-budget). */
static void print_shared(const struct st_plan_shared *sh, FILE *f)
{
	char a[64], b[64];

	fprintf(f, "\nshared host budget %s (--memory-budget): moved between "
		"the expert pool and\n  the KV pages by measured value, "
		"within each side's floor and cap\n",
		gb(sh->total, a, sizeof(a)));
	fprintf(f, "  experts floor    %s, cap %s\n",
		gb(sh->floor[0], a, sizeof(a)), gb(sh->cap[0], b, sizeof(b)));
	fprintf(f, "  KV floor         %s, cap %s\n",
		gb(sh->floor[1], a, sizeof(a)), gb(sh->cap[1], b, sizeof(b)));
	fprintf(f, "  starting split   experts %s = %.1f %% of the experts, "
		"KV %s = %" PRIu64 " tokens of context\n",
		gb(sh->start[0], a, sizeof(a)), sh->experts_pct[0],
		gb(sh->start[1], b, sizeof(b)), sh->kv_tokens[0]);
	fprintf(f, "  experts range    %.1f %% .. %.1f %% of the experts "
		"(%s .. %s)\n", sh->experts_pct[1], sh->experts_pct[2],
		st_format_bytes(sh->min[0], a, sizeof(a)),
		st_format_bytes(sh->max[0], b, sizeof(b)));
	fprintf(f, "  KV range         %" PRIu64 " .. %" PRIu64 " tokens of "
		"context (%s .. %s)\n", sh->kv_tokens[1], sh->kv_tokens[2],
		st_format_bytes(sh->min[1], a, sizeof(a)),
		st_format_bytes(sh->max[1], b, sizeof(b)));
}

void st_plan_print(const struct st_plan_model *m, const struct st_plan_opts *o,
		   const struct st_plan_result *r, FILE *f)
{
	char a[64], fmt[ST_WFORMAT_NAME_MAX] = "?";

	st_wformat_name(&o->experts, fmt, sizeof(fmt));
	fprintf(f, "model %s: %d layers, %d experts (top-%d), %.2f B expert "
		"and %.2f B dense parameters\n", m->name, m->n_layers,
		m->n_experts, m->top_k, (double)m->expert_params / 1e9,
		(double)m->dense_params / 1e9);
	int kv_own = m->n_streams > 0;

	/* every stream in the model's own row format (DeepSeek-V4.1):
	 * --kv-dtype changes nothing, so it is not named */
	for (int i = 0; i < m->n_streams; i++)
		kv_own = kv_own && m->streams[i].row_bytes_fixed;
	if (m->dense_stored_bytes)
		fprintf(f, "workload: batch %d x context %d tokens, KV %s; "
			"weights as the checkpoint stores them (MXFP4 experts, "
			"FP8 + E8M0 / BF16 / F32 dense)\n", o->batch,
			o->context, kv_own ? "in the model's own formats" :
					     dtname(o->kv_dtype));
	else
		fprintf(f, "workload: batch %d x context %d tokens, KV %s, "
			"experts %s, dense %s\n", o->batch, o->context,
			dtname(o->kv_dtype), fmt, dtname(o->dense_dtype));
	if (r->kv_fixed || (r->kv_growth_per_token > 0 &&
			    r->kv_growth_per_token != (double)r->kv_per_token))
		fprintf(f, "KV streams         %" PRIu64 " B at the first token (",
			r->kv_per_token);
	else
		fprintf(f, "KV per token       %" PRIu64 " B (", r->kv_per_token);
	for (int i = 0; i < m->n_streams; i++)
		fprintf(f, "%s%s: %u layers x %" PRIu64 " B%s%s", i ? "; " : "",
			m->streams[i].name, m->streams[i].n_layers,
			stream_row_bytes(&m->streams[i], o->kv_dtype),
			m->streams[i].tokens_per_row > 1 ? " per pooled row" : "",
			m->streams[i].window_rows ? " in a window" : "");
	fprintf(f, ")\n");
	if (r->kv_growth_per_token > 0 &&
	    (r->kv_fixed || r->kv_growth_per_token != (double)r->kv_per_token))
		fprintf(f, "KV growth          %.1f B per token of context, "
			"plus %.2f MB fixed per sequence (windows, "
			"compressor state); %.2f GB for batch x context\n",
			r->kv_growth_per_token, (double)r->kv_fixed / 1e6,
			(double)r->kv / 1e9);
	fprintf(f, "experts in all     %s (one expert of one layer: %" PRIu64
		" B)\n", gb(r->experts_all, a, sizeof(a)), r->record_bytes);
	if (o->gpu_bytes) {
		fprintf(f, "\nT0 GPU (budget %s)\n", gb(o->gpu_bytes, a, sizeof(a)));
		fprintf(f, "  dense weights    %s (attention %.2f GB)\n",
			gb(r->dense, a, sizeof(a)), (double)r->attention / 1e9);
		fprintf(f, "  hot experts      %s (%d per layer)\n",
			gb(r->gpu_hot, a, sizeof(a)), r->hot_experts);
		fprintf(f, "  KV cache         %s\n", gb(r->kv, a, sizeof(a)));
		fprintf(f, "  activations+buf  %s\n",
			gb(r->activations, a, sizeof(a)));
		fprintf(f, "  total            %s: %s by %.2f GB\n",
			gb(r->gpu_total, a, sizeof(a)),
			r->gpu_margin >= 0 ? "fits" : "DOES NOT FIT",
			(double)(r->gpu_margin >= 0 ? r->gpu_margin :
				 -r->gpu_margin) / 1e9);
	}
	fprintf(f, "\nT1 host RAM (budget %s)\n", gb(r->ram_avail, a, sizeof(a)));
	fprintf(f, "  warm experts     %s (expertd pool with tables %s)\n",
		gb(r->ram_warm, a, sizeof(a)),
		st_format_bytes(r->d.pool_bytes, fmt, sizeof(fmt)));
	if (r->ram_streamed)
		fprintf(f, "  (experts streamed from NVMe on a miss: %s)\n",
			gb(r->ram_streamed, a, sizeof(a)));
	if (!o->gpu_bytes) {
		fprintf(f, "  dense weights    %s (attention %.2f GB)\n",
			gb(r->dense, a, sizeof(a)), (double)r->attention / 1e9);
		fprintf(f, "  KV cache         %s (+ kvd tables %s)\n",
			gb(r->kv, a, sizeof(a)),
			st_format_bytes(r->d.kv_meta_bytes, fmt, sizeof(fmt)));
		fprintf(f, "  activations+buf  %s\n",
			gb(r->activations, a, sizeof(a)));
	}
	fprintf(f, "  total            %s: %s by %.2f GB\n",
		gb(r->ram_total, a, sizeof(a)),
		r->ram_margin >= 0 ? "fits" : "DOES NOT FIT",
		(double)(r->ram_margin >= 0 ? r->ram_margin : -r->ram_margin) /
			1e9);
	fprintf(f, "\nT2 NVMe\n  store            %s\n",
		gb(r->nvme_store, a, sizeof(a)));
	if (m->nvme_extra_bytes)
		fprintf(f, "  of which %-8s %s, read %" PRIu64 " B per token\n",
			m->nvme_extra_name, gb(m->nvme_extra_bytes, a, sizeof(a)),
			m->nvme_extra_per_token);
	if (m->strata_runs_it && !o->gpu_bytes) {
		fprintf(f, "\nper daemon (peak RSS, CPU build): expertd %s, ",
			st_format_bytes(r->d.expertd, a, sizeof(a)));
		fprintf(f, "kvd %s, ", st_format_bytes(r->d.kvd, a, sizeof(a)));
		fprintf(f, "computed %s\n",
			st_format_bytes(r->d.computed, a, sizeof(a)));
	}
	if (o->memory_budget)
		print_shared(&r->shared, f);
	fprintf(f, "\nverdict: %s\n", r->fits ? "FITS" : "DOES NOT FIT");
	fprintf(f, "recommendations:\n");
	if (o->gpu_bytes)
		fprintf(f, "  hot experts per layer   %d (of %d; top-k is %d)\n",
			r->rec_hot_experts, m->n_experts, m->top_k);
	fprintf(f, "  KV budget               %s\n",
		gb(r->rec_kv_budget, a, sizeof(a)));
	fprintf(f, "  max batch x context     %" PRIu64 " tokens\n",
		r->rec_max_tokens);
	fprintf(f, "  host budget (experts)   %s\n",
		gb(r->rec_host_budget, a, sizeof(a)));
}

int st_plan_print_json(const struct st_plan_model *m,
		       const struct st_plan_opts *o,
		       const struct st_plan_result *r, FILE *f)
{
	json_t *j = json_pack(
		"{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, s:I, s:I,"
		" s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:i, s:I, s:I, s:I,"
		" s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}}",
		"model", m->name,
		"experts_all", (json_int_t)r->experts_all,
		"record_bytes", (json_int_t)r->record_bytes,
		"dense", (json_int_t)r->dense,
		"attention", (json_int_t)r->attention,
		"kv_per_token", (json_int_t)r->kv_per_token,
		"kv", (json_int_t)r->kv,
		"activations", (json_int_t)r->activations,
		"hot_experts", r->hot_experts,
		"gpu_hot", (json_int_t)r->gpu_hot,
		"gpu_total", (json_int_t)r->gpu_total,
		"gpu_margin", (json_int_t)r->gpu_margin,
		"ram_warm", (json_int_t)r->ram_warm,
		"ram_streamed", (json_int_t)r->ram_streamed,
		"ram_total", (json_int_t)r->ram_total,
		"ram_margin", (json_int_t)r->ram_margin,
		"nvme_store", (json_int_t)r->nvme_store,
		"fits", r->fits,
		"rec_hot_experts", r->rec_hot_experts,
		"rec_kv_budget", (json_int_t)r->rec_kv_budget,
		"rec_max_tokens", (json_int_t)r->rec_max_tokens,
		"rec_host_budget", (json_int_t)r->rec_host_budget,
		"daemons", "expertd", (json_int_t)r->d.expertd,
		"kvd", (json_int_t)r->d.kvd,
		"computed", (json_int_t)r->d.computed,
		"pool_bytes", (json_int_t)r->d.pool_bytes,
		"kv_meta_bytes", (json_int_t)r->d.kv_meta_bytes,
		"kv_private_bytes", (json_int_t)r->d.kv_private_bytes,
		"store_open_bytes", (json_int_t)m->store_open_bytes,
		"tokenizer_bytes", (json_int_t)m->tokenizer_bytes,
		"tokenizer_kept_bytes", (json_int_t)m->tokenizer_kept_bytes,
		"kv_touched", (json_int_t)r->d.kv_touched,
		"dense_bytes", (json_int_t)r->d.dense_bytes,
		"work_bytes", (json_int_t)r->d.work_bytes);

	if (!j)
		return -ENOMEM;
	if (o->memory_budget) {
		const struct st_plan_shared *sh = &r->shared;
		json_t *sj = json_pack("{s:I}", "total", (json_int_t)sh->total);
		static const char *const side[2] = { "experts", "kv" };

		for (int s = 0; s < 2; s++)
			json_object_set_new(sj, side[s], json_pack(
				"{s:I, s:I, s:I, s:I, s:I}",
				"floor", (json_int_t)sh->floor[s],
				"cap", (json_int_t)sh->cap[s],
				"start", (json_int_t)sh->start[s],
				"min", (json_int_t)sh->min[s],
				"max", (json_int_t)sh->max[s]));
		json_object_set_new(json_object_get(sj, "experts"), "pct",
				    json_pack("{s:f, s:f, s:f}",
					      "start", sh->experts_pct[0],
					      "min", sh->experts_pct[1],
					      "max", sh->experts_pct[2]));
		json_object_set_new(json_object_get(sj, "kv"), "tokens",
				    json_pack("{s:I, s:I, s:I}",
					      "start",
					      (json_int_t)sh->kv_tokens[0],
					      "min", (json_int_t)sh->kv_tokens[1],
					      "max",
					      (json_int_t)sh->kv_tokens[2]));
		json_object_set_new(j, "shared", sj);
	}
	json_dumpf(j, f, JSON_COMPACT);
	fputc('\n', f);
	json_decref(j);
	return 0;
}

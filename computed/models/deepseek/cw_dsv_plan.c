/*
 * cw_dsv_plan.c — DeepSeek-V4-Flash and V4.1-Flash described for the
 * capacity planner (common/st_plan.h), exactly as strata stores and runs
 * them: dense weights in their checkpoint formats (FP8 E4M3 + E8M0 block
 * scales, BF16, F32, I64 tid2eid; V4's MTP block's dense tensors too,
 * as strata convert keeps them), routed experts as the store's MXFP4
 * records (st_store_layout; the decoder layers', which decode reads; the
 * MTP block's, read only to draft, are not counted), and the KV streams the forward
 * pass declares (cw_dsv_streams, DESIGN 3a).  V4.1 from its config read
 * by st_config_dsv41 (the one V4.1 config reader) and
 * MODEL_FAMILY_DEEPSEEK_V4.md section 3: its tensor list (3.2), its cache
 * formats (3.7/3.8: FP8 window rows, FP4 compressed rows and index keys,
 * 890 B per token) and its Engram tables (on NVMe).
 */
#include "cw_dsv_plan.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "st_config_dsv41.h"
#include "st_store.h"
#include "st_util.h"

/* Bytes of an FP8 matrix [out, in] with E8M0 scales per b0 x b1 block
 * (params: the weights only). */
static uint64_t fp8_bytes(uint64_t out, uint64_t in, int b0, int b1,
			  int params)
{
	return out * in + (params ? 0 : ((out + b0 - 1) / b0) *
					   ((in + b1 - 1) / b1));
}

/* One V4 block's dense bytes as stored, or (params) parameter counts:
 * attention of compress ratio `ratio` (its part into *ret_attn), norms,
 * mHC mixers, router with tid2eid (hashed) or bias, shared expert. */
static uint64_t v4_block_dense(const struct st_dsv_config *c, int ratio,
			       int hashed, int params, uint64_t *ret_attn)
{
	const uint64_t D = c->hidden_size, V = c->vocab_size, hc = c->hc_mult;
	const uint64_t H = c->n_heads, hd = c->head_dim, G = c->o_groups;
	const uint64_t R = c->o_lora_rank, QR = c->q_lora_rank;
	const uint64_t E = c->n_experts, I = c->moe_inter, K = c->top_k;
	const uint64_t nmu = (2 + hc) * hc;
	const uint64_t B2 = params ? 1 : 2, B4 = params ? 1 : 4;
	const uint64_t B8 = params ? 1 : 8;
	const int b0 = c->fp8_block[0], b1 = c->fp8_block[1];
	uint64_t dense = 0, a = 0;

	/* attention: wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b,
	 * attn_sink */
	a += fp8_bytes(QR, D, b0, b1, params) + QR * B2;
	a += fp8_bytes(H * hd, QR, b0, b1, params);
	a += fp8_bytes(hd, D, b0, b1, params) + hd * B2;
	a += fp8_bytes(G * R, H / G * hd, b0, b1, params);
	a += fp8_bytes(D, G * R, b0, b1, params);
	a += H * B4;
	if (ratio) {
		/* compressor: wkv, wgate (BF16), ape (F32), norm */
		uint64_t cols = ratio == 4 ? 2 * hd : hd;

		a += 2 * cols * D * B2 + (uint64_t)ratio * cols * B4 + hd * B2;
	}
	if (ratio == 4) {
		/* indexer: wq_b (FP8), weights_proj (BF16), its compressor
		 * (CSA-shaped, index_head_dim wide) */
		uint64_t IH = c->index_n_heads, Id = c->index_head_dim;

		a += fp8_bytes(IH * Id, QR, b0, b1, params) + IH * D * B2;
		a += 2 * (2 * Id) * D * B2 + 4 * (2 * Id) * B4 + Id * B2;
	}
	*ret_attn += a;
	dense += a;
	/* norms, mHC mixers of both sites */
	dense += 2 * D * B2 + 2 * (nmu * hc * D + nmu + 3) * B4;
	/* router, bias or tid2eid, shared expert */
	dense += E * D * B2;
	dense += hashed ? V * K * B8 : E * B4;
	dense += 2 * fp8_bytes(I, D, b0, b1, params) +
		 fp8_bytes(D, I, b0, b1, params);
	return dense;
}

/* V4 dense bytes as stored, or (params) parameter counts: the global
 * tensors, every decoder layer, and the MTP block strata convert keeps
 * (num_nextn_predict_layers > 0, window-only as released: the block plus
 * e_proj, h_proj (FP8), enorm, hnorm, norm (BF16), hc_head_* (F32)). */
static void v4_dense(const struct st_dsv_config *c, int params,
		     uint64_t *ret_dense, uint64_t *ret_attn)
{
	const uint64_t D = c->hidden_size, V = c->vocab_size, hc = c->hc_mult;
	const uint64_t B2 = params ? 1 : 2, B4 = params ? 1 : 4;
	const int b0 = c->fp8_block[0], b1 = c->fp8_block[1];
	uint64_t dense = 0, attn = 0;

	/* embed, head (BF16), norm (BF16), hc_head_{fn,base,scale} (F32) */
	dense += 2 * V * D * B2 + D * B2 + (hc * hc * D + hc + 1) * B4;
	for (int l = 0; l < c->n_layers; l++)
		dense += v4_block_dense(c, c->compress_ratio[l],
					l < c->n_hash_layers, params, &attn);
	if (c->n_nextn > 0 && c->nextn_ratio == 0) {
		dense += v4_block_dense(c, 0, 0, params, &attn);
		dense += 2 * fp8_bytes(D, D, b0, b1, params) + 3 * D * B2 +
			 (hc * hc * D + hc + 1) * B4;
	}
	*ret_dense = dense;
	*ret_attn = attn;
}

void cw_dsv_plan_dense_bytes(const struct st_dsv_config *c,
			      uint64_t *ret_dense, uint64_t *ret_attn)
{
	v4_dense(c, 0, ret_dense, ret_attn);
}

/* Streams of all layers merged by shape (kind, row, pooling, window). */
static int add_v4_streams(const struct st_dsv_config *c,
			  struct st_plan_model *m, struct st_diag *diag)
{
	static const char *const kind_name[] = {
		[CW_DSV_WINDOW] = "window",
		[CW_DSV_COMP_ROWS] = "pooled",
		[CW_DSV_INDEX_ROWS] = "index",
		[CW_DSV_COMP_STATE] = "cstate",
		[CW_DSV_INDEX_STATE] = "istate",
	};

	m->n_streams = 0;
	for (int l = 0; l < c->n_layers; l++) {
		struct cw_dsv_stream st[CW_DSV_MAX_STREAMS];
		int n = cw_dsv_streams(c, l, st);

		for (int i = 0; i < n; i++) {
			uint32_t tpr = st[i].rows_den ? (uint32_t)st[i].rows_den : 1;
			uint32_t win = st[i].rows_den ? 0 : (uint32_t)st[i].fixed_rows;
			char name[16];
			int j;

			snprintf(name, sizeof(name), "%s/%u",
				 kind_name[st[i].kind], win ? win : tpr);
			for (j = 0; j < m->n_streams; j++)
				if (!strcmp(m->streams[j].name, name) &&
				    m->streams[j].row_elems ==
					    (uint32_t)st[i].row_elems)
					break;
			if (j == m->n_streams) {
				if (j == ST_PLAN_MAX_STREAMS)
					return st_diag_set(diag, -ST_E_LIMIT,
							   "more than %d KV stream shapes",
							   ST_PLAN_MAX_STREAMS);
				memset(&m->streams[j], 0, sizeof(m->streams[j]));
				snprintf(m->streams[j].name,
					 sizeof(m->streams[j].name), "%s", name);
				m->streams[j].row_elems = (uint32_t)st[i].row_elems;
				/* FP8 rows: one float scale per row (cw_kvrow) */
				m->streams[j].scale_bytes = 4;
				m->streams[j].tokens_per_row = tpr;
				m->streams[j].window_rows = win;
				m->n_streams++;
			}
			m->streams[j].n_layers++;
		}
	}
	return 0;
}

static int plan_v4(const char *text, const char *source,
		   struct st_plan_model *m, struct st_diag *diag)
{
	struct st_dsv_config c;
	struct st_model_config ec;
	struct st_wformat f = { .dtype = ST_DTYPE_MXFP4, .group = 32 };
	struct st_wformat f3[3] = { f, f, f };
	struct st_store_matrix mat[3];
	uint64_t rb;
	int r;

	if ((r = st_dsv_config_parse(text, source,
				     ST_DSV_REV_V4, &c, diag)) < 0)
		return r;
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "deepseek_v4");
	m->n_layers = c.n_layers;
	m->hidden = c.hidden_size;
	m->n_heads = c.n_heads;
	m->n_kv_heads = 1;
	m->head_dim = c.head_dim;
	m->vocab = c.vocab_size;
	m->n_experts = c.n_experts;
	m->top_k = c.top_k;
	m->n_shared_experts = c.n_shared;
	m->expert_inter = c.moe_inter;
	m->max_context = c.max_position_embeddings;
	m->expert_params = (uint64_t)c.n_layers * c.n_experts * 3ull *
			   c.hidden_size * c.moe_inter;
	st_dsv_expert_config(&c, &ec);
	if ((r = st_store_layout(&ec, f3, mat, &rb, diag)) < 0)
		return r;
	m->record_stored_bytes = rb;
	cw_dsv_plan_dense_bytes(&c, &m->dense_stored_bytes,
				 &m->attn_stored_bytes);
	v4_dense(&c, 1, &m->dense_params, &m->attn_params);
	return add_v4_streams(&c, m, diag);
}

/* --- V4.1 ------------------------------------------------------------------ */

/* The V4.1 model from its config (st_dsv_config_parse, the one V4.1
 * config reader; the store-only checks of st_dsv41_config_check_store). */
static int plan_v41(const char *text, const char *source,
		    struct st_plan_model *m, struct st_diag *diag)
{
	struct st_dsv_config *c = calloc(1, sizeof(*c));
	uint64_t D, V, H, hd, QR, G, R, E, I, IH, Id, dense, attn;
	int L, b, n_src2 = 0, n_src1 = 0, n_state = 0, r;

	if (!c)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	if ((r = st_dsv_config_parse(text, source, ST_DSV_REV_V41, c, diag)) ||
	    (r = st_dsv41_config_check_store(c, source, diag))) {
		free(c);
		return r;
	}
	L = c->n_layers;
	D = (uint64_t)c->hidden_size;
	V = (uint64_t)c->vocab_size;
	H = (uint64_t)c->n_heads;
	hd = (uint64_t)c->head_dim;
	QR = (uint64_t)c->q_lora_rank;
	G = (uint64_t)c->o_groups;
	R = (uint64_t)c->o_lora_rank;
	E = (uint64_t)c->n_experts;
	I = (uint64_t)c->moe_inter;
	IH = (uint64_t)c->index_n_heads;
	Id = (uint64_t)c->index_head_dim;
	b = c->fp8_block[0];
	memset(m, 0, sizeof(*m));
	snprintf(m->name, sizeof(m->name), "deepseek_v41");
	m->n_layers = L;
	m->hidden = (int)D;
	m->n_heads = (int)H;
	m->n_kv_heads = 1;
	m->head_dim = (int)hd;
	m->vocab = (int)V;
	m->n_experts = (int)E;
	m->top_k = c->top_k;
	m->n_shared_experts = c->n_shared;
	m->expert_inter = (int)I;
	m->max_context = c->max_position_embeddings;
	m->expert_params = (uint64_t)L * E * 3 * D * I;
	/* an expert: w1, w3 [I, D], w2 [D, I], E2M1 codes + E8M0 per 32
	 * (section 3.2), each section 64-byte aligned, the record 4096 */
	{
		uint64_t g = ST_ALIGN_UP(I * D / 2, 64) + ST_ALIGN_UP(I * D / 32, 64);

		m->record_stored_bytes = ST_ALIGN_UP(3 * g, 4096);
	}
	/* dense weights as stored, text decode only (mtp, vision and
	 * bias_vl skipped; Engram tables counted on NVMe) */
	dense = 2 * V * D * 2 + D * 2;
	attn = 0;
	for (int l = 0; l < L; l++) {
		int ratio = c->compress_ratio[l];
		uint64_t a = 0, nmu = 24;

		a += fp8_bytes(QR, D, b, b, 0) + QR * 2;
		a += fp8_bytes(H * hd, QR, b, b, 0);
		a += fp8_bytes(hd, D, b, b, 0) + hd * 2;
		a += fp8_bytes(G * R, H / G * hd, b, b, 0);
		a += fp8_bytes(D, G * R, b, b, 0);
		a += H * 4;
		if (c->kv_source[l]) {
			/* compressor wkv (+ wgate when pooling), norm;
			 * indexer wk, k_norm */
			a += hd * D * 2 * (ratio > 1 ? 2 : 1) + hd * 2;
			a += Id * hd * 2 + Id * 2;
		}
		if (c->index_source[l])
			a += fp8_bytes(IH * Id, QR, b, b, 0) + IH * D * 2;
		if (st_dsv41_engram_index(c, l) >= 0) {
			uint64_t ng = (uint64_t)c->engram_max_ngram - 1;
			uint64_t eh = (uint64_t)c->engram_n_heads;
			uint64_t ed = (uint64_t)c->engram_head_dim;
			uint64_t hc = (uint64_t)c->hc_mult;

			/* wkv [(hc + 1) D, ng x heads x head_dim] FP8,
			 * q_weight, k_weight [hc, D] BF16 */
			dense += fp8_bytes((hc + 1) * D, ng * eh * ed, b, b, 0) +
				 2 * hc * D * 2;
		}
		attn += a;
		dense += a + 2 * D * 2 + 2 * (nmu * 4 * D + nmu + 3) * 4;
		dense += E * D * 2 + E * 4;
		dense += 2 * fp8_bytes(I, D, b, b, 0) + fp8_bytes(D, I, b, b, 0);
		/* KV: sources pool by their ratio */
		if (c->kv_source[l]) {
			if (ratio > 1) {
				n_src2++;
				n_state++;
			} else {
				n_src1++;
			}
		}
	}
	m->dense_stored_bytes = dense;
	m->attn_stored_bytes = attn;
	/* parameter count for the model line, approximate: FP8 weights are
	 * a byte each, embed and head two (the other BF16/F32 tensors, a few
	 * percent of the bytes, are counted at their bytes) */
	m->dense_params = dense - 2 * V * D;
	m->attn_params = attn;
	/* Engram tables: rows x (head_dim E4M3 + head_dim / 32 E8M0) */
	if (c->n_engram) {
		uint64_t ed = (uint64_t)c->engram_head_dim, rows = 0;
		uint64_t per_layer_ids = (uint64_t)(c->engram_max_ngram - 1) *
					 (uint64_t)c->engram_n_heads;

		for (int i = 0; i < c->n_engram; i++)
			rows += (uint64_t)c->engram_rows[i];
		m->nvme_extra_bytes = rows * (ed + ed / 32);
		m->nvme_extra_per_token = (uint64_t)c->n_engram *
					  per_layer_ids * (ed + ed / 32);
		snprintf(m->nvme_extra_name, sizeof(m->nvme_extra_name),
			 "Engram");
	}
	/* KV (section 3.7/3.8): window rows FP8 + E8M0 per 32 in every
	 * layer; compressed rows E2M1 + E4M3 per 16 (288 B); index keys
	 * E2M1 + E8M0 per 32 (68 B); the pooling partial group in fp32 */
	{
		struct st_plan_stream *s = m->streams;
		uint32_t crow = (uint32_t)(hd / 2 + hd / 16);
		uint32_t ikey = (uint32_t)(Id / 2 + Id / 32);
		int win = c->sliding_window;
		char wname[sizeof(s->name)];

		snprintf(wname, sizeof(wname), "window/%d", win);
#define ST(nm, nl, rbytes, tpr, wr)                                         \
	do {                                                                \
		if (nl) {                                                   \
			snprintf(s->name, sizeof(s->name), "%s", nm);       \
			s->n_layers = (uint32_t)(nl);                       \
			s->row_elems = (uint32_t)hd;                        \
			s->row_bytes_fixed = (rbytes);                      \
			s->tokens_per_row = (tpr);                          \
			s->window_rows = (wr);                              \
			s++;                                                \
		}                                                           \
	} while (0)
		ST(wname, L, (uint32_t)(hd + hd / 32), 1, (uint32_t)win);
		ST("pooled/2", n_src2, crow, 2, 0);
		ST("index/2", n_src2, ikey, 2, 0);
		ST("pooled/1", n_src1, crow, 1, 0);
		ST("index/1", n_src1, ikey, 1, 0);
		ST("cstate/1", n_state, (uint32_t)(2 * hd * 4), 1, 1);
#undef ST
		m->n_streams = (int)(s - m->streams);
	}
	free(c);
	return 0;
}

int cw_dsv_plan_model(const char *text, const char *source,
		       struct st_plan_model *ret, struct st_diag *diag)
{
	json_error_t jerr;
	json_t *root = json_loads(text, 0, &jerr);
	const char *mt;
	int r;

	if (!root)
		return st_diag_set(diag, -ST_E_FORMAT, "%s: line %d: %s", source,
				   jerr.line, jerr.text);
	mt = json_string_value(json_object_get(root, "model_type"));
	if (mt && !strcmp(mt, "deepseek_v4"))
		r = plan_v4(text, source, ret, diag);
	else if (mt && (!strcmp(mt, "deepseek_v41") ||
			!strcmp(mt, "deepseek_v4.1")))
		r = plan_v41(text, source, ret, diag);
	else
		r = -ST_E_UNSUPPORTED;
	json_decref(root);
	return r;
}

/* Bytes of the window streams ("window/W") of one sequence in dt. */
static uint64_t window_bytes(const struct st_plan_model *m, enum st_dtype dt)
{
	struct st_plan_model one = { .n_streams = 1 };
	uint64_t sum = 0;

	for (int i = 0; i < m->n_streams; i++)
		if (!strncmp(m->streams[i].name, "window/", 7)) {
			one.streams[0] = m->streams[i];
			sum += st_plan_kv_bytes(&one, dt,
						m->streams[i].window_rows);
		}
	return sum;
}

void cw_dsv_plan_print_doc(const struct st_plan_model *m,
			    const struct st_plan_opts *o,
			    const struct st_plan_result *r, FILE *f)
{
	const uint64_t wb = window_bytes(m, o->kv_dtype);
	const double touched = (double)m->n_layers * m->top_k *
			       (double)r->record_bytes;
	const double share = r->experts_all ?
		(double)r->ram_streamed / (double)r->experts_all : 0.0;

	/* the doc's figures are for the released shapes only */
	const int real_v4 = m->n_layers == 43 && m->n_experts == 256 &&
			    m->hidden == 4096;
	const int real_v41 = m->n_layers == 40 && m->n_experts == 384 &&
			     m->hidden == 5120;

	if (!strcmp(m->name, "deepseek_v4") && real_v4) {
		fprintf(f, "\nDeepSeek-V4-Flash as released (its checkpoint and "
			"docs/models/deepseek-v4-flash.config.json), next to "
			"this plan:\n"
			"  one expert 13,369,344 B (12.75 MiB)        plan: %llu B\n"
			"  experts of 43 layers 137 GiB                plan: %.2f GiB\n"
			"  global KV 6,880 B/token in BF16 rows,\n"
			"    ~3.5-3.9 KB/token in an FP8 layout        plan: %.1f B/token "
			"(this --kv-dtype; kvd's FP8 row: 1 B + a 4-B scale)\n"
			"  window 43 x 128 rows: 5.6 MB/seq in BF16    plan: %.2f MB "
			"(this --kv-dtype), + %.2f MB compressor state\n"
			"  checkpoint 148.66 GiB incl. ~3.4 GiB MTP    plan: %.2f GiB "
			"experts + dense (the MTP block's dense kept; its experts,\n"
			"                                              read only "
			"to draft, not counted)\n",
			(unsigned long long)r->record_bytes,
			(double)r->experts_all / (1ull << 30),
			r->kv_growth_per_token, (double)wb / 1e6,
			(double)(r->kv_fixed - wb) / 1e6,
			(double)(r->experts_all + r->dense) / (1ull << 30));
	}
	if (!strcmp(m->name, "deepseek_v4") || !strcmp(m->name, "deepseek_v41")) {
		fprintf(f, "\nexpert I/O per decoded token: %.2f GB of experts "
			"touched (%d layers x top-%d); %.0f %% of the experts "
			"live only on NVMe, so with routing spread evenly "
			"~%.2f GB per token come from NVMe%s: at 3 GB/s that "
			"bounds decode at ~%.2f tokens/s (an assumption: "
			"measure the drive and the routing's locality, "
			"docs/BENCHMARKS.md V4)\n", touched / 1e9, m->n_layers,
			m->top_k, 100.0 * share, touched * share / 1e9,
			m->nvme_extra_per_token ? " plus the Engram rows" : "",
			touched * share > 0 ? 3e9 / (touched * share +
					       (double)m->nvme_extra_per_token) :
					      0.0);
	}
	if (!strcmp(m->name, "deepseek_v41") && real_v41) {
		fprintf(f, "\nDeepSeek-V4.1-Flash as released (its checkpoint and "
			"docs/models/deepseek-v41-flash.config.json), next "
			"to this plan:\n"
			"  one expert 18,800,640 B (17.93 MiB)         plan: %llu B\n"
			"  15,360 experts 288.8 GB                     plan: %.1f GB\n"
			"  global KV 890 B/token (FP4 rows + keys)     plan: %.1f B/token\n"
			"  window 40 x 128 x 528 B = 2.7 MB/seq        plan: %.2f MB "
			"(+ %.3f MB partial groups)\n"
			"  Engram 202,758,032,400 B, 48 x 264 B/token  plan: %llu B, "
			"%llu B/token\n"
			"  (the KV formats are V4.1's own: --kv-dtype does not change "
			"them)\n",
			(unsigned long long)r->record_bytes,
			(double)r->experts_all / 1e9, r->kv_growth_per_token,
			(double)wb / 1e6,
			(double)(r->kv_fixed - wb) / 1e6,
			(unsigned long long)m->nvme_extra_bytes,
			(unsigned long long)m->nvme_extra_per_token);
	}
}

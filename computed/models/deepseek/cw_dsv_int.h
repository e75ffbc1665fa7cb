/*
 * cw_dsv_int.h — the DeepSeek-V4 family's in-memory weights (private to
 * computed/models/deepseek): one model struct and one layer struct for
 * every revision (cfg.revision says which; a field a revision does not
 * have stays zero / NULL), the matrix type both compute modes share, and
 * the matrix helpers (cw_dsv_mat.c).  Matrices are row-major
 * [rows][cols]: dequantised F32 in reference mode; in fast mode the FP8
 * ones stay E4M3 codes with expanded scales and the BF16 ones the fast
 * kernels multiply (compressors, index key projection, LM head) BF16.
 * V4.1's Engram tables stay FP8 (row bytes + scales).
 */
#ifndef CW_DSV_INT_H
#define CW_DSV_INT_H

#include <stdint.h>

#include "cw_backend.h"
#include "cw_dsv.h"
#include "cw_dsv_ops.h"  /* the pieces both forward passes use */
#include "st_store.h"

struct st_engram_hash;
struct cw_threads;

struct cw_dsv_mat {
	int rows, cols;
	float *w;
	int quantized;  /* stored FP8 or FP4: its input gets the ACT_FP8 trip */
	/* fast mode: the weights as stored (owned), viewed by fv, w then
	 * NULL: FP8 matrices' E4M3 codes with one float scale per (row, block
	 * of fp8_block[1] inputs) expanded from the E8M0 blocks (fscale,
	 * owned); BF16 compressors and LM head as BF16 (fscale NULL) */
	uint8_t *codes;
	float *fscale;
	struct cw_wview fv;
};

/* One compressor (main or indexer).  CSA (ratio 4, overlap): wkv/wgate
 * give 2*width values per token (series a, then b); HCA: width. */
struct cw_dsv_comp {
	int ratio, overlap, width;
	struct cw_dsv_mat wkv, wgate;
	float *ape;   /* [ratio][cols of wkv] */
	float *norm;  /* [width] */
};

struct cw_dsv_layer {
	/* V4: 0 window only, 4 CSA, else HCA; V4.1: 0 window only, 1, or
	 * r > 1 pooled */
	int ratio;
	float *attn_norm, *ffn_norm;
	float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
	float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
	struct cw_dsv_mat wq_a, wq_b, wkv, wo_a, wo_b;
	float *q_norm, *kv_norm, *sink;
	/* the indexer's query projection and head weights (V4: CSA layers;
	 * V4.1: index sources) */
	struct cw_dsv_mat iwq_b, iweights;
	struct cw_dsv_mat gate;
	float *gate_bias;          /* score-routed layers */
	struct cw_dsv_mat sh_w1, sh_w2, sh_w3;
	struct cw_dsv_mat *ew1, *ew2, *ew3; /* [n_experts]; NULL: store */
	/* ---- V4 (cw_dsv_load_attn.c) ---- */
	struct cw_dsv_comp comp;  /* ratio != 0 */
	int has_indexer;           /* ratio 4 */
	struct cw_dsv_comp icomp;
	int32_t *tid2eid;          /* hash layers: [vocab][top_k] */
	/* ---- V4.1 (cw_dsv_load_attn.c, cw_dsv_load_engram.c) ---- */
	int kv_src, idx_src;        /* layers whose KV / top-k it uses, -1 */
	/* KV source: compressor (wgate only at ratio > 1) and index keys */
	struct cw_dsv_mat cwkv, cwgate, iwk;
	float *cnorm, *iknorm;
	/* Engram (ei >= 0; V4 layers: 0 and no table): table FP8
	 * [rows][head_dim] + E8M0 [rows][head_dim / 32], wkv [(hc+1) D]
	 * [rows_per_pos * head_dim], qk = q_weight * k_weight [hc][D] */
	int ei;
	uint8_t *etab, *escale;
	int64_t erows;
	struct cw_dsv_mat ewkv;
	float *eqk;
};

/* V4's multi-token prediction block mtp.0 (inference/model.py MTPBlock):
 * the block itself is layers[n_layers] (window-only attention, learned
 * routing); these are its own input and output weights. */
struct cw_dsv_mtp {
	struct cw_dsv_mat e_proj, h_proj;  /* [D][D], FP8 */
	float *enorm, *hnorm, *norm;       /* [D] */
	float *hc_head_fn, *hc_head_base, *hc_head_scale; /* [hc][hc D], [hc], [1] */
};

struct cw_dsv_model {
	struct st_dsv_config cfg;      /* cfg.revision: which release */
	float *embed, *norm;           /* [vocab][D], [D] */
	struct cw_dsv_mat head;       /* [vocab][D] (fast mode: BF16) */
	/* [n_layers + has_mtp]: the decoder layers, then the MTP block */
	struct cw_dsv_layer *layers;
	int has_mtp;                   /* V4 checkpoint with mtp.0.* loaded */
	struct cw_dsv_mtp mtp;
	double *freq_main, *freq_comp; /* [rope_dim/2] */
	unsigned qat;                  /* CW_DSV4_QAT_* or CW_DSV41_QAT_* */
	/* store mode (cw_dsv_load_store): the routed experts come from
	 * expertd's pool (es, borrowed) as MXFP4 records laid out as
	 * rec[layer] says (owned), the layers' ew1/ew2/ew3 are then NULL;
	 * V4.1's Engram rows from its Engram tier */
	struct es_client *es;
	struct st_store_layer *rec;
	int no_route_reports;          /* cw_dsv_set_route_reports(m, 0) */
	/* V4.1, cw_dsv41_set_decode_index_keys LAST_SOURCE: the last KV
	 * source layer whose index keys ratio > 1 index sources score at
	 * one-token decode steps with an open group; -1 (default): their
	 * own KV source's */
	int v41_decode_ikey_layer;
	int prefetch_depth;            /* cw_dsv_set_prefetch_depth */
	int no_step_hints;             /* cw_dsv_set_decode_overlap */
	int no_expert_overlap;         /* cw_dsv_set_decode_overlap */
	int no_layer_hints;            /* cw_dsv_set_layer_hints */
	/* CW_COMPUTE_FAST: matvecs on the backend be (NULL in reference
	 * mode), FP8 weights kept as codes, experts read straight from
	 * expertd's slot bytes */
	enum cw_compute compute;
	const struct cw_backend_ops *be;
	/* ---- V4 ---- */
	float *hc_head_fn, *hc_head_base, *hc_head_scale;
	/* ---- V4.1 ---- */
	struct st_engram_hash *hash;   /* NULL without Engram layers */
	int engram_rows_per_pos;
	struct cw_dsv41_engram_provider prov;
	int no_engram_prefetch;        /* measurements only */
	struct cw_threads *pool;       /* fast mode: cw_dsv41_set_threads */
};

/* ---- matrices in both compute modes (cw_dsv_mat.c; V4 and V4.1) ---- */

/* Fast mode: m (rows, cols set) keeps the E4M3 codes w [rows][cols] as
 * they are and one float scale per (row, block of b1 inputs), 2^(S[r /
 * b0][g] - 127) from the E8M0 blocks s [ceil(rows/b0)][ceil(cols/b1)], so
 * the fast backend's F8_E4M3 kernel (group b1) computes with exactly the
 * weights cw_dsv_fp8_dequant gives.  Owned by m (cw_dsv_mat_free).
 * 0 or -ENOMEM. */
int cw_dsv_mat_keep_fp8(struct cw_dsv_mat *m, const uint8_t *w,
			 const uint8_t *s, int b0, int b1);
/* Fast mode: m (rows, cols set) keeps a BF16 [rows][cols] tensor (2 bytes
 * per weight, the fast backend's BF16 kernel).  0 or -ENOMEM. */
int cw_dsv_mat_keep_bf16(struct cw_dsv_mat *m, const void *data);
/* y[rows] = m x[cols]: be NULL, the reference loop (F32 weights, one
 * double accumulation per row in input order); otherwise be's matvec on
 * the kept codes (fv) or, for a matrix kept as floats, its F32 kernel. */
void cw_dsv_mat_mv(const struct cw_backend_ops *be,
		    const struct cw_dsv_mat *m, const float *x, float *y);
/* y = w a on be, split by output rows over pool (NULL or one thread: on
 * the calling thread) when w is large enough to pay for it (>= 64 rows,
 * >= 64 Ki weights; 4 tasks per thread, row boundaries on multiples of
 * 16).  Each row is still one be->matvec_act reduction, so y does not
 * depend on the thread count. */
struct cw_threads;
void cw_dsv_view_mv(const struct cw_backend_ops *be, struct cw_threads *pool,
		     const struct cw_wview *w, const struct cw_act *a,
		     float *y);
/* cw_dsv_mat_mv split over pool as cw_dsv_view_mv (be NULL, pool NULL
 * or a 4-bit matrix: cw_dsv_mat_mv itself).  Same results. */
void cw_dsv_mat_mv_pool(const struct cw_backend_ops *be,
			 struct cw_threads *pool, const struct cw_dsv_mat *m,
			 const float *x, float *y);
/* sub = rows [r0, r0 + n) of m (borrowed views, nothing owned). */
void cw_dsv_mat_rows(const struct cw_dsv_mat *m, int r0, int n,
		      struct cw_dsv_mat *sub);
/* In-memory bytes of m: 4 per F32 weight, 2 per BF16, 1 per FP8 code. */
uint64_t cw_dsv_mat_bytes(const struct cw_dsv_mat *x);
/* Frees what m owns (w, codes, fscale); m may be zeroed or half built. */
void cw_dsv_mat_free(struct cw_dsv_mat *x);
/* The view of expert matrix x in an expertd record rec (MXFP4 codes and
 * E8M0 scales where the store's layout puts them; borrowed from the
 * slot). */
struct cw_wview cw_dsv_rec_view(const struct st_store_matrix *x,
				 const uint8_t *rec);
/* Expert matrix x of record rec dequantised exactly into w (rows x cols
 * floats, the caller's), *ret a borrowed F32 matrix over w. */
void cw_dsv_record_mat(const struct st_store_matrix *x, const uint8_t *rec,
			float *w, struct cw_dsv_mat *ret);

/* y = w x in the model's mode (the fast backend's kernels in fast mode,
 * split over the model's threads), with V4's ACT_FP8 round trip of x
 * first when w was stored FP8/FP4 and the model has it on. */
void cw_dsv_lin(const struct cw_dsv_model *m, const struct cw_dsv_mat *w,
		const float *x, float *y);
/* cw_dsv_lin on rows [r0, r0 + n) of w (y [n]). */
void cw_dsv_lin_rows(const struct cw_dsv_model *m,
		     const struct cw_dsv_mat *w, int r0, int n,
		     const float *x, float *y);
/* cw_dsv_lin_rows without the activation trip: wo_a, which the official
 * V4 code runs as a BF16 einsum on the unquantized head outputs
 * (inference/model.py Attention.forward, "wo_a is FP8 in checkpoint;
 * ... using BF16"; index file id 70831076062). */
void cw_dsv_lin_rows_noact(const struct cw_dsv_model *m,
			   const struct cw_dsv_mat *w, int r0, int n,
			   const float *x, float *y);
/* V4's CW_DSV4_QAT_ACT_FP8 or V4.1's CW_DSV41_QAT_ACT_FP8 on: the inputs
 * of FP8/FP4 matmuls take the FP8 trip (blocks of fp8_block[1]) and a
 * routed expert's SwiGLU output is weighted before w2's trip. */
int cw_dsv_act_fp8(const struct cw_dsv_model *m);

/* ---- the attention site, where the revisions agree (cw_dsv_attn.c) ---- */

struct cw_dsv_layer;

/* Layer L's query for position p from a = attn_norm(u) [D]: qr
 * [q_lora_rank] = q_norm(wq_a a), q [n_heads][head_dim] = wq_b qr (V4:
 * each head RMS-normed, unweighted), each head roped. */
void cw_dsv_attn_query(const struct cw_dsv_model *m,
		       const struct cw_dsv_layer *L, int64_t p,
		       const float *a, float *qr, float *q);
/* Layer L's K=V row of position p [head_dim]: kv_norm(wkv a), roped; V4
 * with CW_DSV4_QAT_KV_FP8: its nope dims through FP8 in blocks of 64. */
void cw_dsv_attn_kv(const struct cw_dsv_model *m,
		    const struct cw_dsv_layer *L, int64_t p, const float *a,
		    float *kv);
/* out [D]: each head's sink attention of q over rows[0..n_rows) (K = V,
 * head_dim each), de-roped at p, through the grouped output projection
 * (wo_a per group of heads, then wo_b). */
void cw_dsv_attn_out(const struct cw_dsv_model *m,
		     const struct cw_dsv_layer *L, int64_t p, const float *q,
		     const float *const *rows, int n_rows, float *out);

/* ---- the FFN site, both revisions (cw_dsv_moe.c) ---- */

/* What the FFN site keeps in a sequence state: store-mode scratch (xw:
 * one expert's w1, w3, w2 dequantised, or in fast mode the quantized
 * activations; xw2: V4.1 fast mode, the SwiGLU output quantized), the
 * counters of its evals, and the routing reports or hints expertd
 * refused (warned about once). */
struct cw_dsv_run {
	float *xw;
	void *xw2;
	struct cw_dsv_run_stats st;
	int route_failed;
};

/* Layer l's router on FFN input b (reference loop in both modes; V4.1:
 * logits / gate_temp), sqrt-softplus + bias, top_k into ids and weights
 * wts; hash_ids (V4 hash layers: tid2eid of the token) given instead of
 * the top-k, or NULL. */
void cw_dsv_route(const struct cw_dsv_model *m, int l, const float *b,
		  const int32_t *hash_ids, int32_t *ids, float *wts);

/*
 * The FFN site of layer l for the token `token` at position p: y [D] =
 * shared expert(b) + sum_k w_k expert_k(b), b the normed FFN input, the
 * experts from memory or (store mode) from expertd's pool through run.
 * ids_out / w_out [top_k] (may be NULL): the routed ids and weights.
 * Errors: -EINVAL (an expert id out of range), expertd's, -ENOMEM.
 */
int cw_dsv_moe(const struct cw_dsv_model *m, struct cw_dsv_run *run, int l,
	       int64_t p, int32_t token, const float *b, float *y,
	       int32_t *ids_out, float *w_out, struct st_diag *diag);

/* Store mode, a one-token eval, at the start of layer l
 * (cw_dsv_set_layer_hints): the layer's top-k on u [D] (the streams as
 * they enter the site, collapsed) under its ffn_norm, to expertd as a
 * step-named hint for position p.  A refused hint changes no result:
 * warned once, counted in run. */
void cw_dsv_layer_hint(const struct cw_dsv_model *m, struct cw_dsv_run *run,
		       int l, int64_t p, const float *u);

/* run zeroed, then (store mode) its scratch for m: reference mode one
 * expert's three matrices in F32, fast mode the activations quantized for
 * any backend m may run on (V4.1: and its SwiGLU output).  0 or -ENOMEM
 * (what was allocated is freed by cw_dsv_run_fini). */
int cw_dsv_run_init(const struct cw_dsv_model *m, struct cw_dsv_run *run);
/* Frees run's scratch (a zeroed run is fine). */
void cw_dsv_run_fini(struct cw_dsv_run *run);

/* ---- a kvd state: its sequence, the eval's bracket and the prefix
 * mode, every revision (cw_dsv_kv.c) ---- */

struct kv_client;

/*
 * A state's kvd sequence (kv NULL: a process-local state) and the one
 * bracket every revision's eval runs its layers in: cw_dsv_kv_begin pins
 * the sequence (restoring spilled pages; no spill meanwhile) and, rows >
 * 0, reserves its first `rows` positions in every stream; the eval reads
 * and writes its rows, setting row_missing where kvd mapped none;
 * cw_dsv_kv_end unpins it.  An eval that fails after its reservation
 * leaves rows of the chunk written and window pages possibly freed: the
 * state is marked failed and every later begin refuses it.
 */
struct cw_dsv_kvseq {
	struct kv_client *kv;
	uint32_t seq;
	int row_missing;  /* a row kvd did not map during this eval */
	int failed;       /* an eval failed after its reservation */
};

/* Pins q's sequence and (rows > 0) reserves rows [0, rows) in every
 * stream; clears row_missing.  Errors: -ST_E_STALE (an earlier eval
 * failed part way), kv_client_seq_pin's and _reserve's (then unpinned
 * again; the state is not marked failed). */
int cw_dsv_kv_begin(struct cw_dsv_kvseq *q, uint32_t rows,
		    struct st_diag *diag);

/* After cw_dsv_kv_begin: returns the eval's code r, -ST_E_STALE if r is 0
 * but a row of positions [from, from + n) was missing, or the unpin's
 * error if r was 0; r < 0 (after the row check) marks q failed. */
int cw_dsv_kv_end(struct cw_dsv_kvseq *q, int r, int from, int n,
		  struct st_diag *diag);

/* What a kvd state in prefix mode publishes in the prefix cache: the
 * prompt's ids (owned; NULL: not in prefix mode; n_prompt of them, the
 * first KV_PROTO_MAX_IDS), then the ids the state was fed after them (its
 * generated tokens, read from the state's token history); n: the
 * publishable prefix so far (positions evaluated on the prompt's own ids,
 * then every later one), capped at KV_PROTO_MAX_IDS; ended: a fed id
 * differed from the prompt's or a publish failed, n grows no more; and
 * the page groups already published; flags: KV_PUBLISH_F_* of every
 * publish (cw_dsv_state_set_publish_flags). */
struct cw_dsv_prompt {
	int32_t *ids;
	int n_prompt, n, groups_published;
	int lag;  /* positions past the prompt held back from publishing
		   * (cw_dsv_state_set_publish_lag: drafts not verified yet) */
	int ended;
	uint32_t flags;
};

/*
 * Creates a kvd sequence through kv: with a prompt (n_prompt > 0) asks the
 * prefix cache for it (*ret_cached: the tokens mapped) and keeps its first
 * KV_PROTO_MAX_IDS ids in p (what is sent is what can be published); else
 * an empty one (*ret_cached 0).  *ret_seq is set as soon as the sequence
 * exists, so the caller frees it with its state on any later error.
 * Errors: kv_client_seq_create(_prefix)'s, -ENOMEM (with diag).
 */
int cw_dsv_kv_seq_create(struct kv_client *kv, const int32_t *prompt,
			 int n_prompt, uint32_t *ret_seq, uint32_t *ret_cached,
			 struct cw_dsv_prompt *p, struct st_diag *diag);

/*
 * After a successful eval of a kvd state in prefix mode whose token
 * history is tokens[0..len): the positions from p->n on join the
 * publishable prefix while they hold the prompt's ids (one that differs
 * ends it there) and, past the prompt, whatever the state was fed (its
 * generated tokens), up to KV_PROTO_MAX_IDS; the full pages of the
 * publishable prefix reached so far are published
 * (kv_client_seq_publish), unless `publishable` is 0 (V4.1: a state whose
 * window rows are not in its pages).  Called after every eval, so each
 * page is published before the next eval's reservation could free its
 * window rows (3a).  A refused publish is warned about and ends
 * publishing for the state (the logits stand).
 */
void cw_dsv_kv_after_eval(struct kv_client *kv, uint32_t seq,
			  struct cw_dsv_prompt *p, const int32_t *tokens,
			  int len, int publishable);

/*
 * Publishes the full pages of the first n tokens (ids[0..n)) of a state
 * of len tokens in sequence seq (kv NULL: a process-local state).
 * why_not: NULL, or why this state may not publish (the message of the
 * -EINVAL).  Returns the page groups newly published; -EINVAL;
 * kv_client_seq_publish's errors.
 */
int cw_dsv_kv_publish(struct kv_client *kv, uint32_t seq, int len,
		      const int32_t *ids, int n, const char *why_not,
		      struct st_diag *diag);

#endif

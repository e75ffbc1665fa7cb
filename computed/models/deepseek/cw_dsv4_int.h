/*
 * cw_dsv4_int.h — the DeepSeek-V4 model's in-memory weights (private to
 * cw_dsv4*.c).  Every matrix is dequantised F32, row-major [rows][cols].
 */
#ifndef CW_DSV4_INT_H
#define CW_DSV4_INT_H

#include <stdint.h>

#include "cw_backend.h"
#include "cw_dsv4.h"
#include "st_store.h"

struct kv_client;

struct cw_dsv4_mat {
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
struct cw_dsv4_comp {
	int ratio, overlap, width;
	struct cw_dsv4_mat wkv, wgate;
	float *ape;   /* [ratio][cols of wkv] */
	float *norm;  /* [width] */
};

struct cw_dsv4_layer {
	int ratio;                 /* 0 window only, 4 CSA, else HCA */
	float *attn_norm, *ffn_norm;
	float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
	float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
	struct cw_dsv4_mat wq_a, wq_b, wkv, wo_a, wo_b;
	float *q_norm, *kv_norm, *sink;
	struct cw_dsv4_comp comp;
	int has_indexer;
	struct cw_dsv4_comp icomp;
	struct cw_dsv4_mat iwq_b, iweights;
	struct cw_dsv4_mat gate;
	float *gate_bias;          /* score-routed layers */
	int32_t *tid2eid;          /* hash layers: [vocab][top_k] */
	struct cw_dsv4_mat sh_w1, sh_w2, sh_w3;
	struct cw_dsv4_mat *ew1, *ew2, *ew3; /* [n_experts] */
};

struct cw_dsv4_model {
	struct st_dsv4_config cfg;
	float *embed, *norm;         /* [vocab][D], [D] */
	struct cw_dsv4_mat head;     /* [vocab][D] (fast mode: BF16 codes) */
	float *hc_head_fn, *hc_head_base, *hc_head_scale;
	struct cw_dsv4_layer *layers;
	double *freq_main, *freq_comp; /* [rope_dim/2] */
	unsigned qat;                  /* CW_DSV4_QAT_* */
	/* cw_dsv4_load_store: routed experts come from expertd (es,
	 * borrowed) as MXFP4 records laid out as rec[layer] says (owned);
	 * the layers' ew1/ew2/ew3 are then NULL.  NULL for cw_dsv4_load. */
	struct es_client *es;
	struct st_store_layer *rec;
	int no_route_reports;          /* cw_dsv4_set_route_reports(m, 0) */
	int prefetch_depth;            /* cw_dsv4_set_prefetch_depth */
	int no_step_hints;             /* cw_dsv4_set_decode_overlap */
	int no_expert_overlap;         /* cw_dsv4_set_decode_overlap */
	int no_layer_hints;            /* cw_dsv4_set_layer_hints */
	/* CW_COMPUTE_FAST (cw_dsv4_load_mode / _store_mode): matvecs on
	 * the fast backend's kernels (be), FP8 weights kept as codes,
	 * experts read straight from expertd's slot bytes */
	enum cw_compute compute;
	const struct cw_backend_ops *be;
};

/*
 * Per-layer state, as the streams of DESIGN 3a (cw_dsv4_streams), indexed
 * by enum cw_dsv4_stream_kind:
 *  WINDOW       ring of the last W K=V rows (after norm and rope), row of
 *               position p at p mod W;
 *  COMP_STATE   compressor partial state: the raw inputs (c, then z with
 *               ape) of the last comp_ring(ratio) tokens, token p at p mod
 *               ring (CSA: the open window and the previous one's, 8
 *               tokens; HCA: the open window, ratio tokens);
 *  COMP_ROWS    compressed rows, one per ratio tokens (grows);
 *  INDEX_STATE, INDEX_ROWS  the same for the indexer's compressor (CSA).
 * Process-local: buf[k] holds them; kvd state (cw_dsv4_state_new_kv): rows
 * live in the sequence's pages, fixed (ring) streams as per-token windowed
 * streams, so row p of WINDOW is position p's row, not p mod W.
 */
struct cw_dsv4_lstate {
	float *buf[CW_DSV4_MAX_STREAMS];  /* process-local; NULL if absent */
	int elems[CW_DSV4_MAX_STREAMS];   /* floats per row */
	int ring[CW_DSV4_MAX_STREAMS];    /* fixed streams: rows; else 0 */
	int kvs[CW_DSV4_MAX_STREAMS];     /* kvd stream index, -1 absent */
};

struct cw_dsv4_state {
	int len, cap;
	struct cw_dsv4_lstate *ls;
	int n_layers;
	struct cw_dsv4_debug *dbg;
	float *xw;  /* store mode: one expert's w1, w3, w2 dequantised
		     * (fast mode: scratch of the quantized activations) */
	int route_failed; /* store mode: routing reports expertd refused */
	struct cw_dsv4_run_stats st;
	/* kvd state (cw_dsv4_state_new_kv): the sequence's rows are in kvd
	 * pages; kv NULL for the process-local state */
	struct kv_client *kv;
	uint32_t seq;
	int row_missing;  /* a row kvd did not map during this eval */
	int failed;       /* an eval failed after its reservation */
	/* prefix mode (cw_dsv4_state_new_kv with a prompt): the prompt's ids
	 * (owned), how many of them the evals matched so far, and the page
	 * groups already published */
	int32_t *prompt;
	int n_prompt, groups_published;
	float *zero_row;  /* what a missing row reads (never used for a
			   * result: the eval fails) */
};

/* After a successful eval of ids[0..n) at positions [len - n, len) of a
 * kvd state in prefix mode: publishes the prompt's full pages reached so
 * far (cw_dsv4_kv.c). */
void cw_dsv4_kv_after_eval(struct cw_dsv4_state *s, const int32_t *ids,
			   int n);

/* A state for at most max_tokens positions: process-local (kv NULL: the
 * streams in malloc'd arrays) or in kvd pages (kv: no arrays; the caller
 * sets seq).  -EINVAL, -ENOMEM. */
int cw_dsv4_state_init(const struct cw_dsv4_model *m, int max_tokens,
		       struct kv_client *kv, struct cw_dsv4_state **ret);

/* ---- matrices in both compute modes (cw_dsv4_mat.c; V4 and V4.1) ---- */

/* Fast mode: m (rows, cols set) keeps the E4M3 codes w [rows][cols] as
 * they are and one float scale per (row, block of b1 inputs), 2^(S[r /
 * b0][g] - 127) from the E8M0 blocks s [ceil(rows/b0)][ceil(cols/b1)], so
 * the fast backend's F8_E4M3 kernel (group b1) computes with exactly the
 * weights cw_dsv4_fp8_dequant gives.  Owned by m (cw_dsv4_mat_free).
 * 0 or -ENOMEM. */
int cw_dsv4_mat_keep_fp8(struct cw_dsv4_mat *m, const uint8_t *w,
			 const uint8_t *s, int b0, int b1);
/* Fast mode: m (rows, cols set) keeps a BF16 [rows][cols] tensor (2 bytes
 * per weight, the fast backend's BF16 kernel).  0 or -ENOMEM. */
int cw_dsv4_mat_keep_bf16(struct cw_dsv4_mat *m, const void *data);
/* y[rows] = m x[cols]: be NULL, the reference loop (F32 weights, one
 * double accumulation per row in input order); otherwise be's matvec on
 * the kept codes (fv) or, for a matrix kept as floats, its F32 kernel. */
void cw_dsv4_mat_mv(const struct cw_backend_ops *be,
		    const struct cw_dsv4_mat *m, const float *x, float *y);
/* y = w a on be, split by output rows over pool (NULL or one thread: on
 * the calling thread) when w is large enough to pay for it (>= 64 rows,
 * >= 64 Ki weights; 4 tasks per thread, row boundaries on multiples of
 * 16).  Each row is still one be->matvec_act reduction, so y does not
 * depend on the thread count. */
struct cw_threads;
void cw_dsv4_view_mv(const struct cw_backend_ops *be, struct cw_threads *pool,
		     const struct cw_wview *w, const struct cw_act *a,
		     float *y);
/* cw_dsv4_mat_mv split over pool as cw_dsv4_view_mv (be NULL, pool NULL
 * or a 4-bit matrix: cw_dsv4_mat_mv itself).  Same results. */
void cw_dsv4_mat_mv_pool(const struct cw_backend_ops *be,
			 struct cw_threads *pool, const struct cw_dsv4_mat *m,
			 const float *x, float *y);
/* sub = rows [r0, r0 + n) of m (borrowed views, nothing owned). */
void cw_dsv4_mat_rows(const struct cw_dsv4_mat *m, int r0, int n,
		      struct cw_dsv4_mat *sub);
/* In-memory bytes of m: 4 per F32 weight, 2 per BF16, 1 per FP8 code. */
uint64_t cw_dsv4_mat_bytes(const struct cw_dsv4_mat *x);
/* Frees what m owns (w, codes, fscale); m may be zeroed or half built. */
void cw_dsv4_mat_free(struct cw_dsv4_mat *x);
/* The view of expert matrix x in an expertd record rec (MXFP4 codes and
 * E8M0 scales where the store's layout puts them; borrowed from the
 * slot). */
struct cw_wview cw_dsv4_rec_view(const struct st_store_matrix *x,
				 const uint8_t *rec);
/* Expert matrix x of record rec dequantised exactly into w (rows x cols
 * floats, the caller's), *ret a borrowed F32 matrix over w. */
void cw_dsv4_record_mat(const struct st_store_matrix *x, const uint8_t *rec,
			float *w, struct cw_dsv4_mat *ret);

#endif

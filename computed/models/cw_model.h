/*
 * cw_model.h — the MoE decoder forward pass of computed (Mixtral and
 * Qwen3-MoE families; MODEL_FAMILIES.md sections 0, 2, 4).
 *
 * Dense weights (embeddings, attention, norms, routers, LM head) are mapped
 * from the store's dense.bin: computed owns them.  Expert weights are read
 * only from expertd's host pool (es_client), never from the store files, so
 * the host budget is real.  K and V rows live in kvd's page pool (kv_client):
 * one stream per layer whose row holds K then V for every KV head.
 *
 * Reference mode (DESIGN.md 6a): float32 activations, weights dequantized
 * exactly, each output element one sequential reduction, so logits do not
 * depend on batching, chunking or which tier an expert came from.
 */
#ifndef CW_MODEL_H
#define CW_MODEL_H

#include <stdint.h>

#include "cw_backend.h"
#include "cw_device_ops.h"
#include "es_client.h"
#include "kv_client.h"
#include "st_config.h"
#include "st_error.h"
#include "st_store.h"

/* Optional observer of routing decisions (tests, trace recording):
 * experts[k] by descending weight, weights[k] as applied. */
typedef void (*cw_route_fn)(void *arg, int layer, uint32_t pos,
			    const int *experts, const float *weights, int k);

/*
 * Routing hooks (forced routing, gate look-ahead; cw_trace.h,
 * cw_lookahead.h).  force: after the router of `layer` picked experts[k]
 * and weights[k] for the token at pos, may replace them (return 1) — the
 * model then computes with the replaced choice.  layer_routed: once per
 * layer after every token is routed and before any expert is acquired;
 * h[n * hidden] is the residual stream after attention, experts[n * k]
 * the choices applied.  Either may be NULL.
 */
struct cw_model;
struct cw_route_hooks {
	int (*force)(void *arg, int layer, uint32_t pos, int *experts,
		     float *weights, int k);
	void (*layer_routed)(void *arg, struct cw_model *m, int layer,
			     uint32_t pos0, int n, const float *h,
			     const int *experts, int k);
	void *arg;
};
/* Optional observer of expert inputs (calibration statistics:
 * `strata calibrate`): for every (token, chosen expert) of a MoE layer,
 * x[x_len] the normed hidden state the expert's gate and up matrices
 * read, act[act_len] the SwiGLU activation its down matrix reads. */
typedef void (*cw_act_fn)(void *arg, int layer, int expert, const float *x,
			  int x_len, const float *act, int act_len);

/* Bytes of weights read, by kind (for the benchmark and the summary). */
struct cw_read_stats {
	uint64_t expert_bytes;
	uint64_t dense_bytes;   /* attention, norms, routers, embeddings rows */
	uint64_t lm_head_bytes;
	uint64_t tokens;        /* token positions computed */
	uint64_t expert_stall_ns; /* time waiting in es_client_acquire */
	/* experts computed before their layer's last miss arrived (expert
	 * overlap, cw_model_set_expert_overlap): n - 1 for a layer of n
	 * experts of which at least one was read; 0 with overlap off */
	uint64_t experts_early;
	/* attention KV rows read (one per (token, layer, row)): from a
	 * device page (cw_model_set_kvdev), and from a host row */
	uint64_t attn_rows_device, attn_rows_host;
	uint64_t kvdev_steps;      /* steps that acquired device pages */
	uint64_t kvdev_fails;      /* acquires that failed: host rows read */
	uint64_t attn_fn_fails;    /* layers the cw_attn_fn refused */
};

struct cw_model;

struct cw_model_opts {
	enum st_dtype kv_dtype;   /* ST_DTYPE_F32 (reference), F16, BF16 */
	uint32_t page_rows;       /* KV rows per page (default 16) */
	int n_threads;            /* matvec threads (1 = reference single) */
	enum cw_compute compute;  /* CW_COMPUTE_REFERENCE (0, default) or
				   * CW_COMPUTE_FAST (cw_backend.h) */
	int exact_math;           /* DeepSeek-V4/V4.1: 0 (default) the
				   * official code's quantization round
				   * trips, 1 none (--exact-math: the
				   * fixtures' strict references;
				   * cw_dsv_set_qat); other families:
				   * ignored (no round trips) */
};

/*
 * Opens the store at store_dir, maps dense.bin, and binds to the given
 * expertd and kvd clients (borrowed: they must outlive the model).  Checks
 * that expertd serves this store (store id) and declares the KV streams to
 * kvd.  Every dense tensor's checksum is verified.  *ret owned by the caller
 * (cw_model_close).
 * Errors: -ST_E_FORMAT / -ST_E_CONFIG / -ST_E_CHECKSUM with diag,
 * -ST_E_BUDGET from kvd.
 */
int cw_model_open(const char *store_dir, struct es_client *es,
		  struct kv_client *kv, const struct cw_model_opts *opts,
		  struct cw_model **ret, struct st_diag *diag);
void cw_model_close(struct cw_model *m);

const struct st_model_config *cw_model_config(const struct cw_model *m);
const struct st_store *cw_model_store(const struct cw_model *m);

/* Sets (or clears with NULL) the routing observer. */
void cw_model_set_route_fn(struct cw_model *m, cw_route_fn fn, void *arg);

/*
 * Device KV pages for attention (issue 10; DESIGN.md "Device pools shared
 * by CUDA IPC"): with kvdev set (borrowed, from cw_kvdev_open; used only
 * by the thread that runs the forward pass), every step of the families
 * of this file acquires, before layer 0, device residency of each
 * sequence's rows [0, first position of the step) for every layer's
 * stream (one cw_kvdev_acquire, stream a cudaStream_t or NULL) and
 * releases them after the last layer; attention then reads those rows
 * from the device pages, and the rows kvd could not place, and the step's
 * own rows (written on the host as always), from the host rows.  attn
 * (arg) runs the attention on the device; NULL: the device addresses are
 * readable by the CPU (the fake device of st_cuda.h, whose memory is host
 * shared memory) and the CPU attention reads them, bit-identical to the
 * host rows.  A failed acquire (kvd restarting, not imported yet, a new
 * epoch) reads host rows for that step and counts kvdev_fails.  kvdev
 * NULL clears (the CPU path: no extra cost).  DeepSeek-V4 stores ignore
 * it.
 */
struct cw_kvdev;
void cw_model_set_kvdev(struct cw_model *m, struct cw_kvdev *kvdev,
			void *stream, cw_attn_fn attn, void *arg);

/* Sets (or clears with NULL) the expert input observer. */
void cw_model_set_act_fn(struct cw_model *m, cw_act_fn fn, void *arg);

/* Expert overlap (on by default): when a layer's experts fit expertd's
 * pool in one group and run on the CPU, each is computed as soon as its
 * slot is ready (es_client_acquire_each), the shared expert while the
 * misses load; off, all are acquired first (es_client_acquire).  Results
 * are bit-identical either way; only the time waited for experts moves.
 * A DeepSeek-V4/V4.1 store: its model's switch (cw_dsv_set_expert_overlap). */
void cw_model_set_expert_overlap(struct cw_model *m, int on);

/* Sets (or clears with NULL) the device path of routed experts, with its
 * completion sync (NULL: fn computes synchronously) and their arg; ignored
 * while an expert input observer is set (it needs the activations). */
void cw_model_set_expert_fn(struct cw_model *m, cw_expert_fn fn,
			    cw_expert_sync_fn sync, void *arg);

/*
 * Times m's steps by phase on tl (cw_steptime.h: dense, experts, head,
 * kvd; borrowed, must outlive its use; NULL: off).  The families of this
 * file only: a DeepSeek-V4/V4.1 store's steps are not split into phases
 * (strata-bench-dsv --timeline times those in process).
 */
struct cw_steptime;
void cw_model_set_steptime(struct cw_model *m, struct cw_steptime *tl);

/*
 * Runs n tokens ids[0..n) of KV sequence `seq` at positions pos0 .. pos0+n-1
 * (rows 0 .. pos0-1 must already be in the sequence's pages).  Reserves the
 * KV rows with one batched kvd request, writes K/V, and produces logits:
 *  - ret_logits_all (n * vocab_size floats) for every position, when non-NULL;
 *  - else ret_logits_last (vocab_size floats) for the last one, when non-NULL.
 * Errors: -ST_E_BUDGET (KV or expert budget), -ST_E_LIMIT (past the model's
 * context), -ST_E_PEERGONE, -ST_E_CHECKSUM, with diag.
 * A one-sequence cw_model_eval_batch.
 */
int cw_model_eval(struct cw_model *m, uint32_t seq, uint32_t pos0,
		  const int32_t *ids, int n, float *ret_logits_all,
		  float *ret_logits_last, struct st_diag *diag);

/* Sets (or clears with NULL) the routing hooks (copied). */
void cw_model_set_route_hooks(struct cw_model *m,
			      const struct cw_route_hooks *hooks);

/*
 * Gate look-ahead probe: applies layer `layer`'s post-attention RMSNorm and
 * router to the hidden state h[hidden_size] and writes the top-k experts
 * (descending) into ret_experts[top_k].  Uses scratch of its own (not
 * thread-safe with itself).  0 or -EINVAL (layer out of range).
 */
int cw_model_route_probe(struct cw_model *m, int layer, const float *h,
			 int *ret_experts);
/* One token of a multi-sequence step (cw_model_eval_batch). */
struct cw_batch_tok {
	uint32_t seq;   /* KV sequence */
	uint32_t pos;   /* its position (row) in the sequence */
	int32_t id;     /* token id */
	float *logits;  /* vocab_size floats to fill, or NULL: none wanted */
};

/*
 * Runs one step of n tokens that may belong to different KV sequences
 * (continuous batching: the decode tokens of every running sequence and
 * prefill chunks of others).  Every token attends over rows 0 .. pos of its
 * own sequence: rows below pos must be written already or be another token
 * of this step.  The rows of all sequences are reserved with one batched
 * kvd request; the MoE layer runs over all n tokens together, so each
 * expert's weights are acquired and read once per step for every token
 * routed to it.  Logits are computed only for tokens with a logits buffer.
 * In reference mode each token's results are bit-identical to evaluating
 * it alone (every output element is one reduction over its own token).
 * Errors as cw_model_eval.
 */
int cw_model_eval_batch(struct cw_model *m, const struct cw_batch_tok *toks,
			int n, struct st_diag *diag);

/*
 * Per-sequence model state beyond kvd's pages (DeepSeek-V4 stores,
 * cw_model_dsv.h: the V4 / V4.1 state lives in computed).  cw_model_seq_begin
 * makes the state of KV sequence `seq` for at most max_tokens positions,
 * before its first eval; cw_model_seq_end frees it (call before freeing
 * the kvd sequence).  No-ops (0) for the other families.  Errors of
 * cw_model_seq_begin: -EINVAL (max_tokens < 1), -ENOMEM.
 */
int cw_model_seq_begin(struct cw_model *m, uint32_t seq, int max_tokens,
		       struct st_diag *diag);
void cw_model_seq_end(struct cw_model *m, uint32_t seq);
/*
 * Creates a KV sequence for a prompt of n_prompt ids and the model's state
 * for it: the other families kv_client_seq_create(_prefix) (prefix_cache
 * and n_prompt > 0: the prompt's cached full pages are mapped) then
 * cw_model_seq_begin(max_tokens); DeepSeek-V4 and V4.1
 * cw_dsvserve_seq_create (the state in kvd pages, prefix cache the same
 * way; the state publishes the full pages of the prompt and of the
 * generated tokens fed to it itself as it is evaluated, with the
 * KV_PUBLISH_F_* publish_flags; the other families ignore them: their
 * caller publishes).  *ret_seq: the kvd
 * sequence; *ret_cached: prompt positions already in it (evaluate from
 * there).  Free with cw_model_seq_destroy.  Errors: kvd's
 * (kv_client_seq_create...), cw_model_seq_begin's, -ENOMEM.
 */
int cw_model_seq_create(struct cw_model *m, struct kv_client *kv,
			const int32_t *prompt, int n_prompt, int prefix_cache,
			uint32_t publish_flags, int max_tokens,
			uint32_t *ret_seq, uint32_t *ret_cached,
			struct st_diag *diag);
/* Frees a sequence of cw_model_seq_create: the model's state and the kvd
 * sequence (kv, the client it was made with). */
void cw_model_seq_destroy(struct cw_model *m, struct kv_client *kv,
			  uint32_t seq);

/* Whether a sequence can be cut back after a verified draft step
 * (cw_model_seq_truncate): 1 for every family served now (DeepSeek-V4
 * and V4.1 included); 0 would keep drafts off. */
int cw_model_can_verify_drafts(const struct cw_model *m);

/*
 * Cuts sequence seq back to n_rows positions (the rejected drafts of a
 * verified step; kv: the client it was made with): the kvd sequence
 * (kv_client_seq_truncate) and, for a DeepSeek-V4 store, the model's
 * state with it (cw_dsv_state_truncate).  Not while it is evaluated.
 * Errors: kv_client_seq_truncate's (-ST_E_LIMIT, -EPERM: a published
 * row), cw_dsv_state_truncate's.
 */
int cw_model_seq_truncate(struct cw_model *m, struct kv_client *kv,
			  uint32_t seq, uint32_t n_rows, struct st_diag *diag);

/* 1 when the store has a multi-token-prediction block to draft with
 * (DeepSeek-V4's mtp.0, kept by strata convert), else 0. */
int cw_model_has_mtp(const struct cw_model *m);
/* Drafting with the MTP block for sequence seq (of cw_model_seq_create):
 * the block follows its evals from now on (call before the first).
 * 0, -ST_E_UNSUPPORTED (no block), -ST_E_NOTFOUND, -ENOMEM. */
int cw_model_seq_mtp_follow(struct cw_model *m, uint32_t seq,
			    struct st_diag *diag);
/* Up to k draft tokens into out after seq's last evaluated position and
 * `next`, the token sampled after it (not yet evaluated).  Returns the
 * count, -ST_E_UNSUPPORTED (no block), cw_dsv_mtp_draft's errors. */
int cw_model_seq_mtp_draft(struct cw_model *m, uint32_t seq, int32_t next,
			   int k, int32_t *out, struct st_diag *diag);

/* A sequence that verifies drafts of up to lag tokens: a DeepSeek-V4
 * state, which publishes its own pages, holds its last lag positions past
 * the prompt back from the prefix cache (cw_dsv_state_set_publish_lag);
 * the other families publish through their caller: 0, nothing done.
 * Errors: cw_dsvserve_seq_publish_lag's. */
int cw_model_seq_publish_lag(struct cw_model *m, uint32_t seq, int lag,
			     struct st_diag *diag);
/* 1 for a DeepSeek-V4 or V4.1 store (no route hooks or probes: V4's
 * hash-routed layers' experts are hinted to expertd exactly instead,
 * V4.1's Engram rows prefetched; a V4 or V4.1 state is in kvd pages
 * through cw_model_seq_create, prefix cache included), else 0.
 * cw_model_is_dsv41: 1 for a V4.1 store only. */
int cw_model_is_dsv4(const struct cw_model *m);
int cw_model_is_dsv41(const struct cw_model *m);
/* DeepSeek-V4 / V4.1 stores: "official" or "exact" (cw_dsv_math_name:
 * the math the model computes, opts.exact_math); NULL for other stores. */
const char *cw_model_dsv_math(const struct cw_model *m);
/*
 * DeepSeek-V4 / V4.1 stores: the gate look-ahead depth of the model
 * (cw_dsv_set_prefetch_depth / cw_dsv_set_prefetch_depth: hint expertd
 * the experts the next `depth` layers' routers pick on the current layer's
 * FFN input; results unchanged).  Not during an eval.  0, -EINVAL for
 * depth outside [0, 8], -ST_E_UNSUPPORTED for other stores (they take the
 * look-ahead through cw_routing).
 */
int cw_model_set_dsv_prefetch_depth(struct cw_model *m, int depth);

/* Accumulated read statistics (since open). */
void cw_model_read_stats(const struct cw_model *m, struct cw_read_stats *ret);

/* KV bytes per token: *ret_layout as the rows are laid out (K and V of
 * every layer, FP8 scales included) and *ret_formula by the textbook formula
 * 2 x layers x kv_heads x head_dim x bytes per element.  DeepSeek-V4:
 * *ret_layout is its growing streams in F32 (cw_dsv4_kv_bytes_per_token)
 * and *ret_formula 0 (no such formula). */
void cw_model_kv_bytes_per_token(const struct cw_model *m, uint64_t *ret_layout,
				 uint64_t *ret_formula);

/* Bytes of one expert's three matrices as read by a matvec (codes, scales
 * and tensor scales) in layer `layer` (0 if out of range); layers may
 * differ in format. */
uint64_t cw_model_expert_bytes_layer(const struct cw_model *m, int layer);

/* The same averaged over the layers (rounded down). */
uint64_t cw_model_expert_bytes(const struct cw_model *m);

/*
 * Where the dense weights (dense.bin: attention, norms, embedding, LM
 * head) live: *ret_bytes their size, *ret_huge the bytes of them in
 * transparent huge pages now (st_hugemem.h).  Returns 1 when their memory
 * is advised MADV_HUGEPAGE, 0 when not (STRATA_HUGE_PAGES=0), negative
 * errno when /proc/self/smaps cannot tell, -ENOTSUP for the DeepSeek-V4
 * family (its matrices are kept one by one, cw_dsv_mat.c).
 */
int cw_model_dense_pages(const struct cw_model *m, uint64_t *ret_bytes,
			 long long *ret_huge);

#endif

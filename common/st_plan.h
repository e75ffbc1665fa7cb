/*
 * st_plan.h — the capacity planner behind `strata plan`: where the bytes
 * of a model go (DESIGN.md section 1: T0 device, T1 host, T2 NVMe) for a
 * batch, a context, a KV dtype and weight formats, and whether that fits
 * the budgets.
 *
 * A model is described either by its checkpoint's config.json (any family
 * with the usual Hugging Face keys: Mixtral, Qwen3-MoE, DeepSeek V2/V3 with
 * MLA, DeepSeek-V4's compressed streams approximately) or by parameter
 * counts (st_plan_model_from_params), for models one has not downloaded.
 *
 * KV bytes are the sum over the model's KV streams (DESIGN.md section 3a):
 * per layer, rows(tokens) x row_bytes, rows = ceil(tokens / tokens_per_row),
 * or at most window_rows for a sliding window.  For GQA the one stream per
 * layer has row_bytes = 2 x kv_heads x head_dim x dtype bytes, so
 * KV = 2 x batch x tokens x layers x kv_heads x head_dim x bytes; for MLA
 * the row is (kv_lora_rank + qk_rope_head_dim) x bytes.  FP8 rows carry
 * one FP32 scale per KV head for K and for V, as strata stores them
 * (computed/kernels/cw_kvrow.h).
 *
 * All sizes are bytes.
 */
#ifndef ST_PLAN_H
#define ST_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "st_error.h"
#include "st_formats.h"

#define ST_PLAN_MAX_STREAMS 8

/* One KV stream kind of a layer (the same for every layer that has it). */
struct st_plan_stream {
	char name[16];           /* "kv", "latent", "window", "compressed"... */
	uint32_t n_layers;       /* layers that keep this stream */
	uint32_t row_elems;      /* values per row (K and V together for GQA) */
	uint32_t scale_bytes;    /* per-row scale bytes at FP8 (0 otherwise) */
	uint32_t tokens_per_row; /* 1, or 4 / 128 for pooled rows */
	uint32_t window_rows;    /* 0: all rows; W: only the last W */
	uint32_t row_bytes_fixed; /* > 0: bytes per row whatever the KV dtype
				   * (a cache format fixed by the model, e.g.
				   * V4.1's FP4 rows) */
};

struct st_plan_model {
	char name[64];           /* model_type or "params" */
	int n_layers, hidden, n_heads, n_kv_heads, head_dim, vocab;
	int n_experts, top_k, n_shared_experts;
	int expert_inter;        /* per-expert FFN width (0 when unknown) */
	int max_context;         /* max_position_embeddings, tokens (0 when
				  * unknown) */
	uint64_t expert_params;  /* all routed experts of all layers */
	uint64_t dense_params;   /* everything else: attention, embeddings,
				  * norms, routers, shared experts, LM head */
	uint64_t attn_params;    /* the attention part of dense_params */
	int n_streams;
	struct st_plan_stream streams[ST_PLAN_MAX_STREAMS];
	int strata_runs_it;      /* 1 for families strata runs today (per-
				  * daemon memory is predicted for them) */
	uint64_t dense_file_bytes; /* a store's dense.bin, 0 when unknown */
	/* measured in this process when loading a store (peak RSS added):
	 * what st_store_open and st_tokenizer_load cost a daemon */
	uint64_t store_open_bytes, tokenizer_bytes;
	uint64_t tokenizer_kept_bytes; /* RSS still held after the load (the
					* parse's freed heap included) */
	/* models stored losslessly in their own formats (DeepSeek-V4: FP8 +
	 * E8M0, BF16, F32, MXFP4 experts; computed/models/deepseek/cw_dsv_plan.c): when
	 * nonzero these replace the sizes derived from the parameter counts
	 * and --dense-format / --experts */
	uint64_t dense_stored_bytes, attn_stored_bytes, record_stored_bytes;
	/* bytes that live only on NVMe besides the store's experts and dense
	 * weights (V4.1's Engram tables), and what a token reads of them */
	uint64_t nvme_extra_bytes, nvme_extra_per_token;
	char nvme_extra_name[32];
};

/* What the operator chose. */
struct st_plan_opts {
	uint64_t gpu_bytes;      /* T0 budget; 0 = no GPU (CPU build) */
	uint64_t ram_bytes;      /* T1 budget; 0 = the machine's memory */
	int batch;               /* sequences at once (>= 1) */
	int context;             /* tokens per sequence (>= 1) */
	enum st_dtype kv_dtype;  /* F32, F16, BF16 or F8_E4M3 */
	struct st_wformat experts;  /* routed experts' format */
	enum st_dtype dense_dtype;  /* dense weights (F32, BF16, F16, F8) */
	int hot_experts;         /* per layer on the GPU; -1 = recommend */
	uint64_t host_budget;    /* expertd pool budget; 0 = all experts */
	double host_budget_pct;  /* or a share of all experts (0 = unused),
				  * as expertd --host-budget 25% */
	uint64_t kv_budget;      /* kvd budget; 0 = what batch x context needs */
	uint64_t memory_budget;  /* one host budget shared by the expert pool
				  * and the KV pages (--memory-budget);
				  * host_budget and kv_budget are then its
				  * floors; 0 = none */
	uint64_t activations;    /* activations and buffers; 0 = estimate */
	uint32_t page_rows;      /* KV rows per page (16) */
};

/* Per-daemon resident memory predicted for the CPU build (what `strata
 * run` reports as peak RSS: private and shared pages a process touched). */
struct st_plan_daemons {
	uint64_t expertd, kvd, computed;
	uint64_t pool_bytes;     /* expert pool segment */
	uint64_t kv_meta_bytes;  /* kvd's tables before the page data */
	uint64_t kv_private_bytes; /* kvd's own lists over the pages */
	uint64_t kv_touched;     /* KV page bytes of batch x context */
	uint64_t dense_bytes;    /* computed's copy of the dense weights */
	uint64_t work_bytes;     /* computed's activations and scratch */
};

/*
 * The shared host budget (--memory-budget M, common/st_ledger.h) of a
 * plan: index 0 is the experts' side (expertd's slots), 1 the KV side
 * (kvd's pages), as st_ledger.h's sides.  All bytes.
 *   floor: --host-budget (whole records) or else top_k records (expertd's
 *          geometry check); --kv-budget (whole pages) or else kvd's: the
 *          pages of one sequence of the model's context (the
 *          --max-rows-per-seq strata up/run give kvd; kvd's default 32768
 *          rows when the config has no max_position_embeddings) in every
 *          stream, whatever M (so floor[0] + floor[1] is the least M, the
 *          figure kvd names too).
 *   cap:   all experts' records, and M, each at most M.
 *   start: st_ledger_open's split as the launcher starts the daemons
 *          (expertd first): experts get M / 2 clamped to [floor, cap],
 *          KV what that leaves clamped to [floor, cap], taken from the
 *          experts down to their floor when the KV floor needs it.
 *   min/max: what each side holds at the extremes of the split (its
 *          floor; M less the other's floor, at most its cap).
 */
struct st_plan_shared {
	uint64_t total;
	uint64_t floor[2], cap[2], start[2], min[2], max[2];
	double experts_pct[3];   /* start, min, max: % of all experts */
	uint64_t kv_tokens[3];   /* start, min, max: tokens of context the
				  * KV side holds (st_plan_result's
				  * rec_max_tokens rule) */
};

struct st_plan_result {
	/* whole-model figures */
	uint64_t experts_all;    /* every routed expert in its format */
	uint64_t record_bytes;   /* one expert of one layer, as stored */
	uint64_t dense;          /* dense weights in dense_dtype */
	uint64_t attention;      /* the attention part of dense */
	uint64_t kv_per_token;   /* bytes per token of one sequence */
	double kv_growth_per_token; /* bytes one more token adds to a long
				  * sequence: streams without a window cap,
				  * a pooled row's bytes / its tokens */
	uint64_t kv_fixed;       /* bytes of the window-capped streams of one
				  * sequence at --context */
	uint64_t kv;             /* batch x context */
	uint64_t activations;
	/* T0 (only with gpu_bytes) */
	int hot_experts;         /* per layer */
	uint64_t gpu_hot, gpu_total;
	/* T1 */
	uint64_t ram_warm;       /* expert pool: warm experts */
	uint64_t ram_streamed;   /* experts left on NVMe, read on a miss */
	uint64_t ram_total;
	uint64_t ram_avail;      /* the budget the verdict used */
	/* T2 */
	uint64_t nvme_store;
	/* verdict: fits when both are >= 0; else the shortfall */
	int64_t gpu_margin, ram_margin;
	int fits;
	/* recommendations */
	int rec_hot_experts;     /* most hot experts per layer that fit */
	uint64_t rec_kv_budget;  /* bytes of KV the budget leaves */
	uint64_t rec_max_tokens; /* batch x context that fits */
	uint64_t rec_host_budget;
	struct st_plan_daemons d;
	struct st_plan_shared shared; /* with o->memory_budget, else zeros */
};

/*
 * Reads DIR/config.json (or the config.json a store keeps: a store dir
 * is recognised by its manifest.json) into *ret.  Families: those with
 * num_key_value_heads (GQA), kv_lora_rank (MLA), compress_ratios
 * (DeepSeek-V4, approximate: window, compressed and indexer streams).
 * 0, or -ST_E_CONFIG / -ST_E_FORMAT / -errno with diag naming the file and
 * key.
 */
int st_plan_model_load(const char *dir, struct st_plan_model *ret,
		       struct st_diag *diag);

/*
 * Measures what opening the store in dir (expertd, computed) and loading
 * its tokenizer (computed) add to a process's peak RSS, by doing both in
 * this process with the peak reset (/proc/self/clear_refs) before each;
 * fills m->store_open_bytes and m->tokenizer_bytes (0 when dir has no
 * store or tokenizer, or the kernel cannot reset the peak).  Call early,
 * before this process has freed much heap.  Returns 0 or a negative code
 * (nothing measured).
 */
int st_plan_measure_store(const char *dir, struct st_plan_model *m,
			  struct st_diag *diag);

/*
 * A model described by parameter counts (for `strata plan --expert-params
 * ...`): expert_params of n_experts experts in n_layers layers, top_k of
 * them per token, dense_params of which attn_params are attention; one
 * GQA stream per layer of 2 x kv_heads x head_dim values (kv_heads 0:
 * no KV).  hidden may be 0 (activations must then be given).  0 or
 * -EINVAL with diag.
 */
int st_plan_model_from_params(uint64_t expert_params, uint64_t dense_params,
			      uint64_t attn_params, int n_experts, int top_k,
			      int n_layers, int kv_heads, int head_dim,
			      int hidden, struct st_plan_model *ret,
			      struct st_diag *diag);

/* Default options: batch 1, context 4096, KV f16, experts mxfp4, dense
 * bf16, hot experts recommended, page rows 16. */
void st_plan_opts_default(struct st_plan_opts *o);

/* KV bytes of one sequence of n_tokens in dtype (sum over streams). */
uint64_t st_plan_kv_bytes(const struct st_plan_model *m, enum st_dtype dt,
			  uint64_t n_tokens);

/*
 * Computes the plan.  0, or -EINVAL with diag (batch/context < 1, a KV
 * dtype or expert format strata has no size for, a model without layers),
 * or -ST_E_BUDGET with diag when o->memory_budget is below the two
 * sides' floors (the message names them and the least budget).
 */
int st_plan_compute(const struct st_plan_model *m,
		    const struct st_plan_opts *o, struct st_plan_result *ret,
		    struct st_diag *diag);

/* Prints the plan for people. */
void st_plan_print(const struct st_plan_model *m, const struct st_plan_opts *o,
		   const struct st_plan_result *r, FILE *f);

/* Prints the plan as one JSON object (keys as in struct st_plan_result). */
int st_plan_print_json(const struct st_plan_model *m,
		       const struct st_plan_opts *o,
		       const struct st_plan_result *r, FILE *f);

#endif

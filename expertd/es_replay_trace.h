/*
 * es_replay_trace.h — routing traces for offline replay: which experts each
 * token chose at each MoE layer, in the order a runtime would ask for them.
 *
 * A trace is a sequence of steps; a step is one (token, layer) routing
 * decision with its top-k expert ids.  Steps are in execution order of a
 * batch-1 token stream: token 0 layer 0..L-1, token 1 layer 0..L-1, ...
 * (prefill rows are replayed as such a stream: with causal attention a
 * token's routing does not depend on later tokens).  The one exception is a
 * batched vLLM log (format A below): its steps keep the batch order, forward
 * by forward, layer by layer, row by row.
 *
 * Readers (format letters as in ../shared/fixtures/traces/SOURCES.md):
 *   strata  JSONL {"pos","layer","experts":[..][,"weights":[..]][,"seq"]},
 *           one line per token and layer (docs/REPLAY.md); a sequence ends
 *           where seq changes or a layer's pos does not increase; within
 *           one, lines are put in (pos, layer) order.  computed's recorder
 *           (--route-record) and the kjv-moe fixture's
 *           routing-valid-small.jsonl (+ "id", "gap") write this form.
 *   A, A'   vLLM route log: a "meta" line then {"type":"route","token_idx",
 *           "layer","topk_ids","topk_weights"}; leading profiling forwards
 *           (every row the same ids) are dropped.  Several A files of one
 *           run with distinct layers and equal row counts merge row by row.
 *   B       {"problem_id","layer","experts","token_idx"} grouped by layer.
 *   C       {"problem_id","layer","token_pos","experts"} in execution order
 *           (prefill layer by layer, then decode passes over the layers).
 *   D       moe-beyond CSV "Layer ID,Batch Number,Token,Activated Expert IDs".
 * Several files given together are concatenated in the order given (merged
 * A files count as one), token numbers continuing.
 */
#ifndef ES_REPLAY_TRACE_H
#define ES_REPLAY_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

/* Largest top-k and expert id a step can hold (DeepSeek-V3: 8 of 256). */
#define ES_TRACE_MAX_K 32
#define ES_TRACE_MAX_EXPERTS 65536
#define ES_TRACE_MAX_LAYERS 1024

enum es_trace_format {
	ES_TRACE_STRATA = 0, /* strata / kjv-moe JSONL */
	ES_TRACE_VLLM,       /* A, A' */
	ES_TRACE_MARIO_PROC, /* B */
	ES_TRACE_MARIO_RAW,  /* C */
	ES_TRACE_MOEBEYOND,  /* D */
};

/* One (token, layer) routing decision. */
struct es_trace_step {
	uint32_t token; /* token number in the replay stream, from 0 */
	uint16_t layer; /* dense layer index 0..n_layers-1 (layer_ids[] maps
			 * it back to the model's layer number) */
	uint8_t n;      /* experts chosen (top-k; distinct ids) */
	uint8_t pad;
	uint32_t first; /* index of the first id in es_trace.ids */
};

struct es_trace {
	size_t n_steps;
	struct es_trace_step *steps; /* owned, [n_steps], execution order */
	uint16_t *ids;               /* owned, expert ids of all steps */
	size_t n_ids;
	uint32_t n_tokens;  /* distinct token numbers */
	int n_layers;       /* MoE layers present */
	int layer_ids[ES_TRACE_MAX_LAYERS]; /* model layer number per index */
	int n_experts;      /* largest id + 1, or the file's own count */
	int top_k;          /* largest n of any step */
	int batched;        /* 1: steps keep a batch order (format A) */
	char formats[64];   /* formats read, e.g. "D" or "strata" */
	/* Capacities (internal). */
	size_t cap_steps, cap_ids;
};

/* Short name of a format ("strata", "A", "B", "C", "D"). */
const char *es_trace_format_name(enum es_trace_format f);

/*
 * Reads the trace files paths[0..n_paths-1] into *t (zeroed first; free with
 * es_trace_fini), detecting each file's format from its first line.  A files
 * of one run (one layer each, distinct layers, equal row counts after the
 * profiling rows are dropped) given next to each other are merged row by
 * row into one multi-layer trace.  Layers are renumbered densely in
 * increasing model layer order.
 * Errors: -ENOENT etc. (file), -ST_E_FORMAT with the file name and line
 * number in diag (unknown format, malformed line, id out of range, top-k
 * above ES_TRACE_MAX_K, repeated id in a row), -ENOMEM.
 */
int es_trace_read(const char *const *paths, int n_paths, struct es_trace *t,
		  struct st_diag *diag);

/* Appends one step (ids[0..n-1], layer = dense index) to t; used by the
 * readers and by tests that build traces by hand.  The caller keeps token
 * numbers non-decreasing per layer.  0, -EINVAL (n out of range, layer out of
 * range) or -ENOMEM. */
int es_trace_push(struct es_trace *t, uint32_t token, int layer,
		  const uint16_t *ids, int n);

/* Sets n_tokens, n_layers (if 0), n_experts (if 0) and top_k from the steps;
 * call after es_trace_push. */
void es_trace_seal(struct es_trace *t);

/* Frees what t owns; accepts a zeroed trace. */
void es_trace_fini(struct es_trace *t);

#endif

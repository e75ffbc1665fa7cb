/*
 * es_convert_engram.h — the DeepSeek-V4.1 parts of `strata convert`
 * (es_convert.c's V4 lossless path does experts and dense tensors): which
 * checkpoint tensors a V4.1 store keeps, skips or refuses, and the Engram
 * tables written to engram.bin plus the hash inputs to engram_hash.bin
 * (st_store.h, st_engram_file.h, st_engram_hash.h).
 */
#ifndef ES_CONVERT_ENGRAM_H
#define ES_CONVERT_ENGRAM_H

#include <stdint.h>

#include <jansson.h>

#include "st_config_dsv41.h"
#include "st_engram_file.h"
#include "st_engram_hash.h"
#include "st_safetensors.h"

enum es_v41_class {
	ES_V41_DENSE,      /* kept in dense.bin as the checkpoint has it */
	ES_V41_SKIP,       /* DSpark draft layers, vision tower: not stored */
	ES_V41_REFUSE,     /* not a V4.1 text tensor: convert refuses */
};

/* Skipped groups, counted for the manifest's "skipped" list. */
#define ES_V41_N_SKIP 2

/*
 * Classifies a non-expert checkpoint tensor name of a V4.1 checkpoint with
 * n_layers layers.  Kept: embed.weight, head.weight, norm.weight,
 * layers.N.{attn.*, ffn.*, engram.*, attn_norm.*, ffn_norm.*, hc_attn_*,
 * hc_ffn_*} with N < n_layers; skipped: mtp.* (group 0), vision.*,
 * aligner.*, image_start/image_end/image_newline (group 1), *ret_group set;
 * refused: anything else, and V4-only names (hc_head_*, attn.ape, tid2eid,
 * the indexer's own compressor), *ret_why saying why.
 */
enum es_v41_class es_v41_classify(const char *name, int n_layers,
				  int *ret_group, const char **ret_why);

/* Names of the skipped groups and why (for messages and the manifest). */
const char *es_v41_skip_name(int group);
const char *es_v41_skip_why(int group);

/* What es_engram_check found, for es_engram_write. */
struct es_engram_plan {
	int n;
	struct st_engram_layout layout[ST_ENGRAM_MAX_LAYERS];
	const struct st_tensor_info *weight[ST_ENGRAM_MAX_LAYERS];
	const struct st_tensor_info *scale[ST_ENGRAM_MAX_LAYERS];
	struct st_engram_hash *hash;  /* owned (es_engram_plan_fini) */
	uint64_t bytes;               /* of engram.bin */
};

/*
 * Finds layers.L.engram.embed.weight (F8_E4M3 [rows, dim]) and .scale
 * (F8_E8M0 [rows, dim/32]) of every Engram layer of g, with rows =
 * engram_num_embeddings and dim = engram_head_dim, marks them in
 * mark[tensor index] (value 2: not a dense tensor), and loads
 * model_dir/engram_hash.json checked against the config.  Returns 0,
 * -ST_E_NOTFOUND (a table or engram_hash.json missing), -ST_E_FORMAT
 * (dtype / shape), the hash loader's codes; diag names the tensor / file.
 */
int es_engram_check(const struct st_checkpoint *ck,
		    const struct st_dsv_config *g, const char *model_dir,
		    uint8_t *mark, struct es_engram_plan *ret,
		    struct st_diag *diag);

/*
 * Writes dir/engram.bin (header, every layer's rows packed and sealed) and
 * dir/engram_hash.bin (fsynced), sets manifest "engram" and appends
 * engram_hash.bin {name, bytes, xxh3} to `files`.  Deterministic: the
 * output depends only on the checkpoint.  Returns 0, -errno, -ENOMEM.
 */
int es_engram_write(const struct es_engram_plan *p,
		    const struct st_checkpoint *ck, const char *dir,
		    json_t *manifest, json_t *files, struct st_diag *diag);

/* Frees what es_engram_check allocated (the hash). */
void es_engram_plan_fini(struct es_engram_plan *p);

#endif

/*
 * st_config_dsv41.h — the DeepSeek-V4.1-Flash text configuration
 * (DeepseekV41ForCausalLM, model_type "deepseek_v41"), read from its
 * composite config.json: top-level ids and quantization_config, the text
 * model in "text_config" (key set: ../shared/MODEL_FAMILY_DEEPSEEK_V4.md
 * section 3.1).  vision_config is accepted and ignored (text-only).
 *
 * V4.1's CSA2 layer roles (KV / index / candidate sources), Engram and
 * gate_temp are fields of the family's one config struct, read by the
 * family's one reader (st_config_dsv_family.h: st_dsv_config_parse with
 * ST_DSV_REV_V41, V4.1's own parts in st_config_dsv41.c).  Declared here
 * is what only V4.1 has: its layer roles, the store's extra checks and
 * the Engram layer index.
 */
#ifndef ST_CONFIG_DSV41_H
#define ST_CONFIG_DSV41_H

#include <stdint.h>

#include "st_config.h"
#include "st_config_dsv_family.h"
#include "st_error.h"

/* The layer whose compressed KV layer l attends to (the nearest KV source
 * at or before l), -1 for a window-only layer. */
int st_dsv41_kv_source_of(const struct st_dsv_config *c, int l);

/* The layer whose indexer top-k layer l uses (nearest index source at or
 * before l), -1 for a window-only layer. */
int st_dsv41_index_source_of(const struct st_dsv_config *c, int l);

/* The last KV-source layer (-1 if none): layers after it own only window
 * KV (the CED decoder, model doc 3.4). */
int st_dsv41_last_kv_source(const struct st_dsv_config *c);

/*
 * What a strata store of this model needs on top of st_dsv_config_parse
 * (the store writer and reader call it; the forward pass does not need
 * it): hidden_size and moe_intermediate_size multiples of 32 (MXFP4
 * experts: one E8M0 scale per 32 inputs), engram_head_dim a multiple of 32
 * (one E8M0 scale per 32 columns of a table row), engram_layer_ids
 * strictly increasing (the order of the tables in engram.bin) and each
 * engram_num_embeddings at most 2^40 rows.  `source` names the config in
 * messages.  Returns 0 or -ST_E_CONFIG naming the key.
 */
int st_dsv41_config_check_store(const struct st_dsv_config *c,
				const char *source, struct st_diag *diag);

/* Index of model layer `layer` among the Engram layers
 * (c->engram_layer[]), or -1 if it has no Engram. */
int st_dsv41_engram_index(const struct st_dsv_config *c, int layer);

#endif

/*
 * st_config_dsv4.h — DeepSeek-V4 (model_type "deepseek_v4",
 * DeepseekV4ForCausalLM) spellings of the family's one config reader
 * (st_config_dsv_family.h: st_dsv_config_parse with revision
 * ST_DSV_REV_V4; key set: ../shared/MODEL_FAMILY_DEEPSEEK_V4.md section
 * 2.1).  They stay for the callers that name V4 (the store writer in
 * expertd/, the store reader, the CLI).
 *
 * Kept apart from st_model_config (st_config.h): V4's attention (one K=V
 * latent, compressed streams), mHC and hash routing share nothing with the
 * Mixtral/Qwen3-MoE fields.
 */
#ifndef ST_CONFIG_DSV4_H
#define ST_CONFIG_DSV4_H

#include "st_config.h"
#include "st_config_dsv_family.h"
#include "st_error.h"

/* The family's one config struct, revision ST_DSV_REV_V4 when read as a
 * V4 config.  The V4 spelling stays for expertd/es_convert.c. */
#define ST_DSV4_MAX_LAYERS ST_DSV_MAX_LAYERS
#define st_dsv4_config st_dsv_config

/* st_dsv_config_parse of a V4 config (a V4.1 one is refused: its
 * top-level keys are not V4's). */
static inline int st_dsv4_config_parse(const char *text, const char *source,
				       struct st_dsv_config *ret,
				       struct st_diag *diag)
{
	return st_dsv_config_parse(text, source, ST_DSV_REV_V4, ret, diag);
}

/* st_dsv_config_load of a V4 config. */
static inline int st_dsv4_config_load(const char *dir,
				      struct st_dsv_config *ret,
				      struct st_diag *diag)
{
	return st_dsv_config_load(dir, ST_DSV_REV_V4, ret, diag);
}

/* 1 if config.json text names a DeepSeek-V4 model (model_type
 * "deepseek_v4"), else 0. */
static inline int st_dsv4_config_detect(const char *text)
{
	return st_dsv_config_detect(text) == ST_DSV_REV_V4;
}

/* st_dsv_expert_config of a V4 config. */
static inline void st_dsv4_expert_config(const struct st_dsv_config *c,
					 struct st_model_config *ret)
{
	st_dsv_expert_config(c, ret);
}

#endif

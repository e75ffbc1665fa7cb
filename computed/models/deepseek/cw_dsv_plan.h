/*
 * cw_dsv_plan.h — DeepSeek-V4-Flash / V4.1-Flash for `strata plan`
 * (common/st_plan.h): the exact stored sizes and KV streams of these
 * models, which the planner's generic config.json reader only
 * approximates.
 */
#ifndef CW_DSV_PLAN_H
#define CW_DSV_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "st_config_dsv_family.h"
#include "st_error.h"
#include "st_plan.h"

/*
 * Fills *ret from config.json text (NUL-terminated; `source` names it in
 * messages) when its model_type is "deepseek_v4" (parsed strictly by
 * st_dsv_config_parse; KV streams from cw_dsv_streams, one row per
 * stream shape with the kvd row format of --kv-dtype; expert record from
 * st_store_layout as strata convert writes it; dense bytes from
 * cw_dsv_plan_dense_bytes) or "deepseek_v41" (parsed strictly by
 * st_dsv_config_parse and st_dsv41_config_check_store; V4.1's own KV
 * formats, MODEL_FAMILY_DEEPSEEK_V4.md 3.7-3.8, with fixed row bytes;
 * Engram tables as NVMe-only bytes).
 * Returns 0; -ST_E_UNSUPPORTED for another model_type (the caller keeps
 * its generic description); -ST_E_FORMAT (not JSON), -ST_E_CONFIG (keys
 * missing or wrong, diag names them), st_store_layout's errors.
 */
int cw_dsv_plan_model(const char *text, const char *source,
		       struct st_plan_model *ret, struct st_diag *diag);

/*
 * Bytes of a V4 model's dense weights as the checkpoint stores them and
 * strata's store keeps them (mtp.* skipped): FP8 E4M3 weights plus one
 * E8M0 byte per fp8_block block, BF16, F32, I64 tid2eid
 * (MODEL_FAMILY_DEEPSEEK_V4.md 2.3); *ret_attn the attention part
 * (attn.*: projections, norms, sink, compressors, indexer).
 */
void cw_dsv_plan_dense_bytes(const struct st_dsv_config *c,
			      uint64_t *ret_dense, uint64_t *ret_attn);

/* Prints MODEL_FAMILY_DEEPSEEK_V4.md's figures for the real model next to
 * the plan's (V4-Flash or V4.1-Flash by m->name, only at the released
 * shapes), and for any V4 / V4.1 model the expert bytes a decoded token
 * touches and reads from NVMe (routing spread evenly, 3 GB/s). */
void cw_dsv_plan_print_doc(const struct st_plan_model *m,
			    const struct st_plan_opts *o,
			    const struct st_plan_result *r, FILE *f);

#endif

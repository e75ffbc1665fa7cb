/*
 * cw_dsv_tensors.h — where the DeepSeek-V4-family loader (cw_dsv_load*.c)
 * gets its tensors: the checkpoint in the official
 * safetensors layout, or a strata store's dense.bin, looked up by name,
 * checked against the config's dtype and shape, and dequantised exactly
 * to F32 (reference mode) or kept as stored for the fast kernels (fast
 * mode: FP8 codes, BF16).  Formats: MODEL_FAMILY_DEEPSEEK_V4.md 2.3 and
 * 3.2.  What differs between revisions (which tensors, which formats a
 * layer has) stays in each loader; this is the plumbing they share.
 */
#ifndef CW_DSV_TENSORS_H
#define CW_DSV_TENSORS_H

#include <stdint.h>

#include "cw_dsv_int.h"
#include "st_safetensors.h"
#include "st_store.h"

/*
 * A tensor source: ck (the checkpoint) or, when st is set, a store's
 * dense.bin mapped at dense, whose entries look like checkpoint tensors
 * through tmp[] (two slots: a weight and its scale are found one after
 * the other and used together).  used (may be NULL): one flag per
 * checkpoint tensor, set by cw_dsv_src_find (the V4.1 loader refuses
 * tensors it did not use).  family names the model in messages
 * ("DeepSeek-V4").  All borrowed; diag gets the messages.
 */
struct cw_dsv_src {
	const struct st_checkpoint *ck;
	unsigned char *used;
	const struct st_store *st;
	const uint8_t *dense;
	struct st_tensor_info tmp[2];
	int tmp_i;
	const char *family;
	struct st_diag *diag;
	int fast;  /* CW_COMPUTE_FAST: FP8 codes and BF16 kept as stored */
	size_t dense_len;  /* bytes mapped by cw_dsv_src_map_store */
};

/* Looks `name` up; NULL when absent.  data (may be NULL) gets the
 * tensor's bytes (borrowed from the checkpoint or the mapping). */
const struct st_tensor_info *cw_dsv_src_lookup(struct cw_dsv_src *s,
					       const char *name,
					       const void **data);

/* Finds `name` and checks dtype dt and shape [d0, d1] (d1 < 0: 1-D
 * [d0]); marks it used.  Errors: -ST_E_NOTFOUND, -ST_E_FORMAT with diag. */
int cw_dsv_src_find(struct cw_dsv_src *s, const char *name, enum st_dtype dt,
		    int64_t d0, int64_t d1, const struct st_tensor_info **ret,
		    const void **data);

/* A BF16 or F32 tensor (either accepted) of d0 (x d1) elements as F32
 * into *ret (malloc'd, caller frees).  Errors: as find, -ENOMEM. */
int cw_dsv_src_plain(struct cw_dsv_src *s, const char *name, int64_t d0,
		     int64_t d1, float **ret);

/* E8M0 byte 255 is NaN (OCP MX; PITFALLS P5): a checkpoint holding one
 * would give NaN weights, so it is refused as corrupt (-ST_E_FORMAT). */
int cw_dsv_src_check_scales(struct cw_dsv_src *s, const char *name,
			    const uint8_t *sc, uint64_t n);

/*
 * <prefix>.weight F8_E4M3 [rows, cols] + <prefix>.scale F8_E8M0 in
 * blocks of b0 x b1 into m: dequantised exactly (cw_dsv_fp8_dequant), or
 * in fast mode the codes and expanded scales (cw_dsv_mat_keep_fp8).
 * Errors: as find, -ST_E_FORMAT (a NaN scale), -ENOMEM.
 */
int cw_dsv_src_fp8(struct cw_dsv_src *s, const char *prefix, int rows,
		   int cols, int b0, int b1, struct cw_dsv_mat *m);

/*
 * <prefix>.weight I8 [rows, cols/2] packed E2M1 (OCP nibble order) +
 * <prefix>.scale F8_E8M0 [rows, cols/32]: MXFP4, dequantised exactly into
 * m.  Errors: -ST_E_CONFIG (cols not a multiple of 32), as find,
 * -ST_E_FORMAT (a NaN scale), -ENOMEM.
 */
int cw_dsv_src_mxfp4(struct cw_dsv_src *s, const char *prefix, int rows,
		     int cols, struct cw_dsv_mat *m);

/* A BF16/F32 [rows, cols] matrix as F32 into m (cw_dsv_src_plain). */
int cw_dsv_src_mat_plain(struct cw_dsv_src *s, const char *name, int rows,
			 int cols, struct cw_dsv_mat *m);

/* A matrix the fast kernels multiply (compressors, index key projection,
 * LM head): in fast mode a BF16 tensor stays BF16 (2 bytes per weight,
 * the fast backend's BF16 kernel), otherwise as cw_dsv_src_mat_plain. */
int cw_dsv_src_mat16(struct cw_dsv_src *s, const char *name, int rows,
		     int cols, struct cw_dsv_mat *m);

/*
 * Makes the store st (borrowed; must outlive the source) the source of s:
 * its dense.bin mapped read-only (nothing mapped when it is empty).
 * Errors: -errno naming the file, with diag.  cw_dsv_src_unmap undoes it
 * (also after a failure).
 */
int cw_dsv_src_map_store(struct cw_dsv_src *s, const struct st_store *st,
			 struct st_diag *diag);
void cw_dsv_src_unmap(struct cw_dsv_src *s);

/* Every layer's expert record of store s must be the family's MXFP4
 * experts (as its writer makes them): gate/up [inter, hidden], down
 * [hidden, inter].  Errors: -ST_E_FORMAT naming the layer and matrix. */
int cw_dsv_check_store_experts(const struct st_store *s, int hidden,
			       int inter, struct st_diag *diag);

/* expertd (es; NULL: none) must serve store s's experts (layers,
 * experts, record size) with room for a token's top_k of them.
 * Errors: -ST_E_CONFIG (another store, no expertd), -ST_E_LIMIT (host
 * budget below top_k), with diag. */
struct es_client;
int cw_dsv_check_expertd(const struct st_store *s, struct es_client *es,
			 int top_k, const char *store_dir,
			 struct st_diag *diag);

#endif

/*
 * st_calib.h — activation statistics for the calibrated scale search
 * (`strata calibrate` writes them, `strata convert --calibrate` reads
 * them): per MoE layer and expert, the number of calibration tokens routed
 * to the expert and, per input channel c of each expert matrix, the sum of
 * a_c^2 over those tokens, so E[a_c^2] = sum / count:
 *   gate, up  input = the normed hidden state of the token (hidden_size
 *             channels; gate and up share it);
 *   down      input = the expert's SwiGLU activation silu(gate x) * up x
 *             (expert_inter channels).
 * These are the per-element weights of st_*_quantize_row_wmse (see there
 * for why, and the sources: AWQ arXiv:2306.00978, GPTQ arXiv:2210.17323).
 *
 * File (host byte order, little-endian machines; all integers unsigned):
 *   offset 0   "STCALIB1"                          8 bytes
 *          8   u32 version (1), u32 n_layers, u32 n_experts,
 *              u32 hidden, u32 inter, u32 flags (bit 0: the full
 *              second-moment matrices follow the sums; other bits 0)
 *         32   u64 model_id (st_calib_model_id of the checkpoint)
 *         40   u64 text_xxh3 (XXH3-64 of the calibration text's bytes)
 *         48   u64 n_tokens (token positions run), u64 n_windows
 *         64   u64 count[n_layers * n_experts] (tokens routed, by layer
 *              then expert)
 *              then per (layer, expert) in that order: f64 sum_x2[hidden],
 *              f64 sum_a2[inter]
 *              flags bit 0 only, then per (layer, expert): f64
 *              sum_xx[hidden * hidden], f64 sum_aa[inter * inter] (sums
 *              of x_i x_j over the routed tokens, row-major, symmetric:
 *              the Hessian of GPTQ, arXiv:2210.17323, up to the count)
 *   end - 8    u64 XXH3-64 of every byte before it
 * A file whose size, magic, version, dimensions or checksum is wrong is
 * refused (-ST_E_FORMAT / -ST_E_CHECKSUM) by st_calib_read.
 */
#ifndef ST_CALIB_H
#define ST_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_safetensors.h"

#define ST_CALIB_MAGIC "STCALIB1"
#define ST_CALIB_VERSION 1
/* An expert that saw fewer calibration tokens than this keeps the plain
 * (unweighted) MSE search: 32 tokens give each channel's E[a^2] to within
 * a factor of about 1.5 (chi-square with 32 degrees of freedom: relative
 * standard deviation sqrt(2/32) = 0.25), enough to rank channels. */
#define ST_CALIB_MIN_TOKENS 32

struct st_calib {
	uint32_t n_layers, n_experts, hidden, inter;
	uint64_t model_id, text_xxh3, n_tokens, n_windows;
	uint64_t *count;   /* owned, [n_layers * n_experts] */
	double *sum_x2;    /* owned, [n_layers * n_experts * hidden] */
	double *sum_a2;    /* owned, [n_layers * n_experts * inter] */
	/* full second moments (st_calib_init_full), else NULL: in memory
	 * only the upper triangle (j >= i) is summed; a file read back has
	 * both (st_calib_second_moment reads the upper one) */
	double *sum_xx;    /* owned, [n_layers * n_experts * hidden^2] */
	double *sum_aa;    /* owned, [n_layers * n_experts * inter^2] */
};

/* Allocates zeroed statistics for the given dimensions (each >= 1).
 * Returns 0, -EINVAL or -ENOMEM. */
int st_calib_init(struct st_calib *c, uint32_t n_layers, uint32_t n_experts,
		  uint32_t hidden, uint32_t inter);

/* The same with the full second-moment matrices when full != 0 (for the
 * GPTQ search: hidden^2 + inter^2 doubles per expert). */
int st_calib_init_full(struct st_calib *c, uint32_t n_layers,
		       uint32_t n_experts, uint32_t hidden, uint32_t inter,
		       int full);

/* Frees what st_calib_init / st_calib_read allocated; c may be zeroed. */
void st_calib_free(struct st_calib *c);

/* Adds one routed token of expert `expert` in layer `layer`: x[hidden]
 * its normed hidden state, a[inter] the expert's SwiGLU activation.
 * Out-of-range layer or expert: ignored (returns -EINVAL). */
int st_calib_add(struct st_calib *c, int layer, int expert, const float *x,
		 const float *a);

/*
 * The per-channel weights of matrix m (0 gate, 1 up, 2 down: enum
 * st_expert_mat) of expert `expert` in layer `layer`: ret[cols] = E[a_c^2]
 * (as float; cols = hidden for gate/up, inter for down).  Returns 1 and
 * fills ret, or 0 (ret untouched) when the expert saw fewer than
 * min_tokens tokens (the caller falls back to the unweighted search), or
 * -EINVAL (out of range).
 */
int st_calib_weights(const struct st_calib *c, int layer, int expert, int m,
		     uint64_t min_tokens, float *ret);

/*
 * The second-moment matrix E[a a^T] of matrix m's input (as st_calib_weights;
 * ret[cols * cols], row-major, symmetric).  Returns 1 and fills ret, 0 when
 * the expert saw fewer than min_tokens tokens or c has no full matrices,
 * -EINVAL out of range.
 */
int st_calib_second_moment(const struct st_calib *c, int layer, int expert,
			   int m, uint64_t min_tokens, double *ret);

/* Writes c to path (via path.tmp-<pid> and rename, fsynced).  0 or -errno
 * with diag. */
int st_calib_write(const struct st_calib *c, const char *path,
		   struct st_diag *diag);

/*
 * Reads and checks a statistics file into *ret (owned: st_calib_free) and
 * its whole-file XXH3-64 into *ret_file_xxh3 (may be NULL).  Errors with
 * diag: -ENOENT / -errno (cannot read), -ST_E_FORMAT (not a statistics
 * file, other version, sizes inconsistent with the dimensions, a
 * negative or non-finite sum), -ST_E_CHECKSUM (corrupt).
 */
int st_calib_read(const char *path, struct st_calib *ret,
		  uint64_t *ret_file_xxh3, struct st_diag *diag);

/*
 * The identity of a checkpoint for matching statistics to a model: XXH3
 * over config.json's text and the raw bytes of every router tensor (a
 * tensor named "*.gate.weight": Mixtral's block_sparse_moe.gate, Qwen3's
 * mlp.gate), in name order; cheap (routers are small) and different for a
 * retrained model of the same shape.
 */
uint64_t st_calib_model_id(const struct st_checkpoint *ck, const char *config,
			   size_t config_len);

#endif

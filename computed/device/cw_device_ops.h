/*
 * cw_device_ops.h — the hooks by which a forward pass hands work to a
 * device (the CUDA module, device/cw_cuda_experts.h): a routed expert's
 * FFN and its completion sync, and attention over device KV pages.
 *
 * They live in the device layer, below models/, so that the device code
 * can name them without including a model's header (docs/DESIGN.md
 * "Layout": lower layers never include higher ones); cw_model.h includes
 * this file and installs them (cw_model_set_expert_fn, _set_kvdev).
 */
#ifndef CW_DEVICE_OPS_H
#define CW_DEVICE_OPS_H

#include <stdint.h>

#include "cw_backend.h"

/*
 * Optional device path of one routed expert (the CUDA backend,
 * cw_cuda_experts.h): computes out[t] = down(silu(gate x[t]) * up x[t])
 * for the n tokens x[0..n) (hidden_size floats each) of expert (layer,
 * expert), whose host record is rec with views w[3] (gate, up, down) into
 * it, writing out[t] (hidden_size floats).  Returns 1 when it took the
 * expert (it was on the device), 0 to leave the expert to the CPU backend
 * (not on the device, unsupported format: no output written).  Called
 * from the thread that runs the forward pass.
 *
 * Overlap (issue 10): with a cw_expert_sync_fn set, a 1 may mean "queued":
 * the device works while the model computes the experts left to the CPU,
 * and out[t] is written only by the next sync call; the rows x[t] and
 * out[t] and rec stay valid until that call returns (the arrays x and out
 * themselves only during the call) (the model calls it once per group of
 * experts it acquired, normally once per layer, before releasing them).
 * After the last expert of a group the model calls it once more with
 * expert -1, n 0 and NULL rec, w, x, out ("the group is complete: start
 * the device work"), before computing the CPU's experts, so a device
 * path may launch a group's experts together (issue 27); the return
 * value of that call is ignored.
 */
typedef int (*cw_expert_fn)(void *arg, int layer, int expert,
			    const uint8_t *rec, const struct cw_wview w[3],
			    int n, const float *const *x, float *const *out);

/*
 * Completes every expert the cw_expert_fn (same arg) queued since the
 * previous call: waits for the device, writes their out rows, releases
 * their device slots.  Returns 0, or a negative code when any queued
 * expert failed: then none of their outputs is to be trusted and the
 * model computes all of them again on the CPU (and the device path
 * should refuse further experts).
 */
typedef int (*cw_expert_sync_fn)(void *arg);

/*
 * Optional device path of attention (issue 10: the CUDA module's,
 * cw_cuda_experts.h).  Called once per layer of a step whose older KV
 * rows are on the device (cw_model_set_kvdev, cw_model.h): token t of
 * the n attends with query toks[t].q (n_heads * head_dim floats, host
 * memory) over its
 * rows toks[t].rows[0 .. n_rows) in cw_kvrow.h's layout, where
 * toks[t].on_dev[j] says whether rows[j] is a device address (a page of
 * the device KV pool, cw_kvdev_rows) or a host row of kvd's pool (a page
 * kvd could not place on the device, and the rows this step wrote: the
 * host is the only writer), and writes toks[t].out (n_heads * head_dim
 * floats, host) before it returns.  All arrays are borrowed for the call.
 * Returns 0, or a negative code: the model then computes the layer's
 * attention on the CPU from the host rows (the hook should refuse from
 * then on).  Called from the thread that runs the forward pass.
 */
struct cw_attn_tok {
	const float *q;
	float *out;
	const uint8_t *const *rows;
	const uint8_t *on_dev;     /* [n_rows]: 1 device address, 0 host */
	uint32_t n_rows;
};
typedef int (*cw_attn_fn)(void *arg, int layer, int n,
			  const struct cw_attn_tok *toks);

#endif

/*
 * test_dsv4_plan.c — `strata plan` for DeepSeek-V4-Flash and V4.1-Flash
 * (computed/models/deepseek/cw_dsv_plan.c, common/st_plan.c) against independent
 * computations written out here from MODEL_FAMILY_DEEPSEEK_V4.md:
 *
 * V4-Flash (docs/models/deepseek-v4-flash.config.json, the doc's 2.1):
 *  - one expert record = w1, w3 (I8 [2048, 2048] + E8M0 [2048, 128]) and
 *    w2 (I8 [4096, 1024] + E8M0 [4096, 64]) = 13,369,344 B (doc 2.3);
 *    all experts = 43 x 256 records;
 *  - dense bytes = the doc's 2.3 tensor table summed tensor by tensor with
 *    its literal shapes, plus the MTP block strata convert keeps (a
 *    window-only block with a gate bias, e_proj and h_proj FP8 [4096,
 *    4096], enorm, hnorm, norm, hc_head_* as the model's);
 *  - KV growth per token: BF16 rows 6,880 B (doc 2.6: 21 CSA layers x
 *    (1024 + 256) / 4 + 20 HCA layers x 1024 / 128); FP8 rows of 512 B +
 *    a 4-B scale (kvd's format): 21 x (516 + 132) / 4 + 20 x 516 / 128;
 *  - KV of one sequence at 128k context in BF16: windows 43 x 128 rows,
 *    CSA rows 32768 x 21, index rows 32768 x 21, HCA rows 1024 x 20, and
 *    the compressor states strata keeps (raw c, z inputs: CSA 8 tokens x
 *    2 x 1024, HCA 128 x 2 x 512, indexer 8 x 2 x 256);
 *  - 24 GB GPU + 64 GB RAM: hot experts per layer = what the GPU has left
 *    after dense, KV and activations, divided by 43 records; fits.
 * V4.1-Flash (docs/models/deepseek-v41-flash.config.json, the doc's 3.1):
 *  record 18,800,640 B; KV growth 890 B per token; window 40 x 128 x
 *  528 B; Engram 202,758,032,400 B and 48 x 264 B per token (doc 3.5,
 *  3.8); 64 GB CPU-only: the warm pool + dense + KV fit the budget.
 * The fixture tiny-deepseek-v4, converted: the planner's dense bytes equal
 * the store's dense tensors byte for byte, its record the store's record.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "cw_dsv_plan.h"
#include "dsv_test_util.h"
#include "es_convert.h"
#include "st_store.h"
#include "st_util.h"
#include "test_util.h"

static int n_fail;

#define EQ(got, want)                                                      \
	CHECK((uint64_t)(got) == (uint64_t)(want), "%s = %llu, expected %llu", \
	      #got, (unsigned long long)(got), (unsigned long long)(want))

static int load(const char *file, struct st_plan_model *m)
{
	char path[4300], *text = NULL;
	const char *src = getenv("STRATA_SOURCE_DIR");
	struct st_diag d = { { 0 } };
	size_t len;
	int r;

	snprintf(path, sizeof(path), "%s/docs/models/%s", src ? src : "..", file);
	if (st_read_file(path, &text, &len) < 0) {
		CHECK(0, "cannot read %s", path);
		return -1;
	}
	r = cw_dsv_plan_model(text, path, m, &d);
	CHECK(r == 0, "%s: %s", path, d.msg);
	free(text);
	return r;
}

/* FP8 [out, in] with 128 x 128 E8M0 blocks, as the doc's table lists
 * weight and scale shapes */
#define F8(o, i, so, si) ((uint64_t)(o) * (i) + (uint64_t)(so) * (si))

static uint64_t v4_flash_dense_by_table(void)
{
	uint64_t model = 2ull * 129280 * 4096 * 2 /* embed, head BF16 */ +
			 4096 * 2 /* norm */ +
			 (4ull * 16384 + 4 + 1) * 4 /* hc_head_* F32 */;
	uint64_t common = 2 * 4096 * 2 /* attn_norm, ffn_norm */ +
			  2 * (24ull * 16384 + 24 + 3) * 4 /* hc_attn, hc_ffn */ +
			  F8(1024, 4096, 8, 32) + 1024 * 2 /* wq_a, q_norm */ +
			  F8(32768, 1024, 256, 8) /* wq_b */ +
			  F8(512, 4096, 4, 32) + 512 * 2 /* wkv, kv_norm */ +
			  F8(8192, 4096, 64, 32) /* wo_a */ +
			  F8(4096, 8192, 32, 64) /* wo_b */ +
			  64 * 4 /* attn_sink */ +
			  256ull * 4096 * 2 /* gate.weight */ +
			  2 * F8(2048, 4096, 16, 32) + F8(4096, 2048, 32, 16);
	uint64_t csa = 2ull * 1024 * 4096 * 2 + 4 * 1024 * 4 + 512 * 2 +
		       F8(8192, 1024, 64, 8) + 64ull * 4096 * 2 +
		       2ull * 256 * 4096 * 2 + 4 * 256 * 4 + 128 * 2;
	uint64_t hca = 2ull * 512 * 4096 * 2 + 128 * 512 * 4 + 512 * 2;
	uint64_t sum = model;

	for (int l = 0; l < 43; l++) {
		sum += common;
		sum += l < 3 ? 129280ull * 6 * 8 /* tid2eid I64 */ :
			       256 * 4 /* gate.bias F32 */;
		if (l >= 2)
			sum += l % 2 == 0 ? csa : hca;
	}
	/* mtp.0 (num_nextn_predict_layers 1, compress ratio 0) */
	sum += common + 256 * 4 + 2 * F8(4096, 4096, 32, 32) + 3 * 4096 * 2 +
	       (4ull * 16384 + 4 + 1) * 4;
	return sum;
}

static void test_v4_flash(void)
{
	struct st_plan_model m;
	struct st_plan_opts o;
	struct st_plan_result r;
	struct st_diag d = { { 0 } };
	const uint64_t rec = 2ull * (2048 * 2048 + 2048 * 128) +
			     (4096ull * 1024 + 4096 * 64);
	const uint64_t ctx = 131072;
	uint64_t kv;

	if (load("deepseek-v4-flash.config.json", &m) < 0)
		return;
	EQ(rec, 13369344);
	EQ(m.record_stored_bytes, rec);
	EQ(m.dense_stored_bytes, v4_flash_dense_by_table());
	st_plan_opts_default(&o);
	o.gpu_bytes = 24000000000ull;
	o.ram_bytes = 64000000000ull;
	o.context = (int)ctx;
	o.kv_dtype = ST_DTYPE_BF16;
	CHECK(st_plan_compute(&m, &o, &r, &d) == 0, "%s", d.msg);
	EQ(r.record_bytes, rec);
	EQ(r.experts_all, 43ull * 256 * rec);
	EQ(r.dense, v4_flash_dense_by_table());
	CHECK(r.kv_growth_per_token == 6880.0, "BF16 growth %.3f != 6880",
	      r.kv_growth_per_token);
	kv = 43ull * 128 * 1024 +               /* windows */
	     21ull * (ctx / 4) * 1024 +         /* CSA rows */
	     21ull * (ctx / 4) * 256 +          /* index rows */
	     20ull * (ctx / 128) * 1024 +       /* HCA rows */
	     21ull * 8 * 2 * 1024 * 2 +         /* CSA compressor state */
	     20ull * 128 * 2 * 512 * 2 +        /* HCA compressor state */
	     21ull * 8 * 2 * 256 * 2;           /* indexer compressor state */
	EQ(r.kv, kv);
	{
		int64_t room = (int64_t)o.gpu_bytes - (int64_t)r.dense -
			       (int64_t)r.kv - (int64_t)r.activations;
		int hot = (int)(room / (int64_t)(43 * rec));

		EQ(r.hot_experts, hot > 256 ? 256 : hot);
		CHECK(hot >= 6, "no top-6 fits on the GPU (hot %d)", hot);
		EQ(r.gpu_hot, (uint64_t)r.hot_experts * 43 * rec);
	}
	CHECK(r.fits, "V4-Flash on 24 GB GPU + 64 GB RAM does not fit");
	printf("V4-Flash, 24 GB GPU + 64 GB RAM, 128k: dense %.3f GB, hot "
	       "%d/layer, KV %.3f GB, warm %.2f GB, NVMe-only %.2f GB\n",
	       r.dense / 1e9, r.hot_experts, r.kv / 1e9, r.ram_warm / 1e9,
	       r.ram_streamed / 1e9);
	o.kv_dtype = ST_DTYPE_F8_E4M3;
	CHECK(st_plan_compute(&m, &o, &r, &d) == 0, "%s", d.msg);
	CHECK(r.kv_growth_per_token == 21.0 * (516 + 132) / 4 + 20.0 * 516 / 128,
	      "FP8 growth %.4f", r.kv_growth_per_token);
}

static void test_v41_flash(void)
{
	struct st_plan_model m;
	struct st_plan_opts o;
	struct st_plan_result r;
	struct st_diag d = { { 0 } };

	if (load("deepseek-v41-flash.config.json", &m) < 0)
		return;
	EQ(m.record_stored_bytes, 3ull * (2304ull * 2560 + 2304 * 160));
	EQ(m.record_stored_bytes, 18800640);
	EQ(m.nvme_extra_bytes, (384006168ull + 384016682ull) * 264);
	EQ(m.nvme_extra_bytes, 202758032400ull);
	EQ(m.nvme_extra_per_token, 48 * 264);
	st_plan_opts_default(&o);
	o.ram_bytes = 64000000000ull;
	o.context = 131072;
	CHECK(st_plan_compute(&m, &o, &r, &d) == 0, "%s", d.msg);
	CHECK(r.kv_growth_per_token == 890.0, "growth %.3f != 890",
	      r.kv_growth_per_token);
	EQ(r.kv_fixed, 40ull * 128 * 528 + 3 * 4096);
	EQ(r.kv, 40ull * 128 * 528 + 3 * 4096 + 131072ull * 890);
	EQ(r.experts_all, 40ull * 384 * 18800640);
	CHECK(r.fits && r.ram_total <= o.ram_bytes,
	      "V4.1 on 64 GB CPU: fits %d, total %llu", r.fits,
	      (unsigned long long)r.ram_total);
	EQ(r.ram_warm + r.ram_streamed, r.experts_all);
	EQ(r.nvme_store, r.experts_all + r.dense + 202758032400ull);
	o.gpu_bytes = 24000000000ull;
	CHECK(st_plan_compute(&m, &o, &r, &d) == 0, "%s", d.msg);
	CHECK(r.fits && r.hot_experts >= 6, "V4.1 on 24 GB GPU: fits %d hot %d",
	      r.fits, r.hot_experts);
}

/* The fixture's store: dense tensors and record as the planner says. */
static void test_fixture_store(void)
{
	char dir[4096], tmp[4096], store[4200], path[4300], *text = NULL;
	struct st_diag d = { { 0 } };
	struct es_convert_opts o;
	struct st_store *s = NULL;
	struct st_plan_model m;
	uint64_t sum = 0;
	size_t len;

	st_test_fixture_model("tiny-deepseek-v4", dir, sizeof(dir));
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(store, sizeof(store), "%s/store", tmp);
	es_convert_opts_init(&o);
	if (es_convert(dir, store, &o, &d) || st_store_open(store, &s, &d)) {
		CHECK(0, "convert/open: %s", d.msg);
		goto out;
	}
	snprintf(path, sizeof(path), "%s/config.json", dir);
	CHECK(st_read_file(path, &text, &len) == 0, "read %s", path);
	CHECK(text && cw_dsv_plan_model(text, path, &m, &d) == 0, "%s", d.msg);
	for (int i = 0; i < s->n_dense; i++)
		sum += s->dense[i].n_bytes;
	EQ(m.dense_stored_bytes, sum);
	EQ(m.record_stored_bytes, s->record_bytes);
	/* the plan's streams are the forward pass's (cw_dsv_streams): at
	 * 1000 tokens in F32, the state cw_dsv_state_new allocates */
	{
		struct st_plan_opts po;
		struct st_plan_result r;

		st_plan_opts_default(&po);
		po.kv_dtype = ST_DTYPE_F32;
		po.context = 1000;
		CHECK(st_plan_compute(&m, &po, &r, &d) == 0, "%s", d.msg);
		CHECK(r.kv_growth_per_token ==
			      cw_dsv4_kv_bytes_per_token(&s->dsv4, 4),
		      "growth %.3f vs cw_dsv4_kv_bytes_per_token %.3f",
		      r.kv_growth_per_token,
		      cw_dsv4_kv_bytes_per_token(&s->dsv4, 4));
		CHECK(r.kv_fixed == (uint64_t)cw_dsv4_fixed_bytes(&s->dsv4, 4),
		      "fixed %llu vs cw_dsv4_fixed_bytes %.0f",
		      (unsigned long long)r.kv_fixed,
		      cw_dsv4_fixed_bytes(&s->dsv4, 4));
	}
out:
	free(text);
	st_store_close(s);
	st_rm_rf(tmp);
}

int main(void)
{
	test_v4_flash();
	test_v41_flash();
	test_fixture_store();
	return dsvt_finish(n_fail);
}

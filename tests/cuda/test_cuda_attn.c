/*
 * test_cuda_attn.c — the CUDA module's attention over device KV pages
 * (cw_cuda_attn.c through cw_cuda_module_open: the cw_attn_fn computed's
 * forward pass calls once per layer, cw_model.h) on a GPU:
 *   - a layer of several tokens whose rows are mixed: rows in device
 *     memory (a device "page pool") and host rows (pages kvd could not
 *     place, the step's own rows), every KV dtype, a GQA geometry of the
 *     tiny fixture and a production one (32 / 8 heads of 128);
 *   - every output element is within cw_cu_attend's bound (cw_cu.h) of
 *     the exact (double) attention over the same decoded rows, and so is
 *     the CPU attention's (the steps of cw_model.c attend);
 *   - the same layer with every row on the host gives the same bits (the
 *     staging copies the row bytes exactly, the kernel is the same);
 *   - a refused layer (a token without rows) returns an error, counts a
 *     failure, and later layers are refused too (the model then computes
 *     on the CPU).
 * Without a CUDA device it exits 77.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_test_util.h"
#include "cw_cu.h"
#include "cw_cuda_experts.h"
#include "cw_kvrow.h"
#include "cw_model.h"
#include "st_error.h"

static int failures;
static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;

	printf("FAIL: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	failures++;
}

static float frand(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (float)((rng_state * 2685821657736338717ull) >> 40) /
	       (float)(1u << 24) * 2.0f - 1.0f;
}

static void *xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p) {
		printf("FAIL: out of memory\n");
		exit(1);
	}
	return p;
}

/* Checks out[n_heads * hd] of one token against the exact attention with
 * cw_cu.h's bound; cpu the same for the CPU attention. */
static void check_token(const struct cw_kvrow_fmt *f, int n_heads,
			const float *q, const uint8_t *const *rows,
			int n_rows, const float *out, const char *what)
{
	const int hd = f->head_dim, nkv = f->n_kv_heads;
	float *sc = xmalloc(sizeof(float) * n_rows), *cpu = xmalloc(4 * hd);
	char msg[200];

	for (int h = 0; h < n_heads; h++) {
		const int kvh = h / (n_heads / nkv);
		const float *qh = q + (size_t)h * hd;

		cudat_attend_head(f, rows, n_rows, qh, kvh, sc, cpu);
		if (cudat_check_head(f, rows, n_rows, qh, kvh,
				     out + (size_t)h * hd, cpu, msg,
				     sizeof(msg)) < 0) {
			fail("%s: head %d %s", what, h, msg);
			break;
		}
	}
	free(sc);
	free(cpu);
}

struct acase {
	enum st_dtype dt;
	int n_heads, nkv, hd;
	int n_tok;
	int rows[4];
};

static void run_case(const struct cw_cuda_module_ops *ops,
		     const struct acase *ac)
{
	const size_t qd = (size_t)ac->n_heads * ac->hd;
	struct cw_kvrow_fmt f;
	struct cw_cuda_attn *a = NULL;
	struct cw_attn_tok toks[4];
	struct st_diag d = { "" };
	size_t rb, total = 0, off = 0;
	uint8_t *pool, *on_dev, *on_host;
	void *pool_d = NULL;
	const uint8_t **rows_mixed, **rows_host;
	float *q, *out_mixed, *out_host, *k, *v;
	char what[128];
	uint64_t layers, failed;

	snprintf(what, sizeof(what), "%s %d/%d heads of %d, %d tokens",
		 cw_kvrow_dtype_name(ac->dt), ac->n_heads, ac->nkv, ac->hd,
		 ac->n_tok);
	if (cw_kvrow_init(&f, ac->dt, ac->nkv, ac->hd) < 0) {
		fail("%s: cw_kvrow_init", what);
		return;
	}
	rb = cw_kvrow_bytes(&f);
	for (int t = 0; t < ac->n_tok; t++)
		total += (size_t)ac->rows[t];
	pool = xmalloc(rb * total);
	on_dev = xmalloc(total);
	on_host = xmalloc(total);
	rows_mixed = xmalloc(sizeof(*rows_mixed) * total);
	rows_host = xmalloc(sizeof(*rows_host) * total);
	q = xmalloc(4 * qd * ac->n_tok);
	out_mixed = xmalloc(4 * qd * ac->n_tok);
	out_host = xmalloc(4 * qd * ac->n_tok);
	k = xmalloc(4 * (size_t)ac->nkv * ac->hd);
	v = xmalloc(4 * (size_t)ac->nkv * ac->hd);
	for (size_t i = 0; i < qd * ac->n_tok; i++)
		q[i] = frand() * 2.0f;
	for (size_t j = 0; j < total; j++) {
		for (int i = 0; i < ac->nkv * ac->hd; i++) {
			k[i] = frand();
			v[i] = frand() * 3.0f;
		}
		cw_kvrow_write(&f, pool + rb * j, k, v);
	}
	if (cw_cu_alloc(&pool_d, rb * total, &d) < 0 ||
	    cw_cu_h2d(pool_d, pool, rb * total, &d) < 0) {
		fail("%s: device pool: %s", what, d.msg);
		goto out;
	}
	for (int t = 0; t < ac->n_tok; t++) {
		for (int j = 0; j < ac->rows[t]; j++) {
			size_t x = off + (size_t)j;
			/* two of three older rows on the device; the last
			 * one (the step's own row) always a host row */
			int dev = j < ac->rows[t] - 1 && j % 3 != 1;

			on_dev[x] = (uint8_t)dev;
			on_host[x] = 0;
			rows_host[x] = pool + rb * x;
			rows_mixed[x] = dev ? (uint8_t *)pool_d + rb * x :
					      pool + rb * x;
		}
		toks[t].q = q + qd * t;
		toks[t].n_rows = (uint32_t)ac->rows[t];
		off += (size_t)ac->rows[t];
	}
	if (ops->attn_create(&a, ac->dt, ac->n_heads, ac->nkv, ac->hd,
			     &d) < 0) {
		fail("%s: attn_create: %s", what, d.msg);
		goto out;
	}
	if (!ops->attn_stream(a))
		fail("%s: the attention has no stream", what);
	off = 0;
	for (int t = 0; t < ac->n_tok; t++) {
		toks[t].rows = rows_mixed + off;
		toks[t].on_dev = on_dev + off;
		toks[t].out = out_mixed + qd * t;
		off += (size_t)ac->rows[t];
	}
	if (ops->attn(a, 3, ac->n_tok, toks) != 0) {
		fail("%s: the mixed layer failed", what);
		goto out;
	}
	off = 0;
	for (int t = 0; t < ac->n_tok; t++) {
		toks[t].rows = rows_host + off;
		toks[t].on_dev = on_host + off;
		toks[t].out = out_host + qd * t;
		off += (size_t)ac->rows[t];
	}
	if (ops->attn(a, 3, ac->n_tok, toks) != 0) {
		fail("%s: the host-rows layer failed", what);
		goto out;
	}
	if (memcmp(out_mixed, out_host, 4 * qd * ac->n_tok))
		fail("%s: device and host placement of the same rows give "
		     "different bits", what);
	off = 0;
	for (int t = 0; t < ac->n_tok; t++) {
		char w2[160];

		snprintf(w2, sizeof(w2), "%s, token %d (%d rows)", what, t,
			 ac->rows[t]);
		check_token(&f, ac->n_heads, q + qd * t,
			    rows_host + off, ac->rows[t], out_mixed + qd * t,
			    w2);
		off += (size_t)ac->rows[t];
	}
	ops->attn_counts(a, &layers, &failed);
	if (layers != 2 || failed != 0)
		fail("%s: counts %llu layers, %llu failed; want 2, 0", what,
		     (unsigned long long)layers, (unsigned long long)failed);
	/* a refused layer: a token without rows; later ones refused too */
	toks[0].n_rows = 0;
	if (ops->attn(a, 4, 1, toks) == 0)
		fail("%s: a token without rows was accepted", what);
	toks[0].n_rows = (uint32_t)ac->rows[0];
	toks[0].rows = rows_host;
	toks[0].on_dev = on_host;
	if (ops->attn(a, 5, 1, toks) == 0)
		fail("%s: a layer after a failure was accepted", what);
	ops->attn_counts(a, &layers, &failed);
	if (failed != 1)
		fail("%s: %llu failures counted, want 1", what,
		     (unsigned long long)failed);
	printf("%s: within cw_cu_attend's bound, mixed = host placement "
	       "bit for bit\n", what);
out:
	if (a)
		ops->attn_destroy(a);
	cw_cu_free(pool_d);
	free(pool);
	free(on_dev);
	free(on_host);
	free(rows_mixed);
	free(rows_host);
	free(q);
	free(out_mixed);
	free(out_host);
	free(k);
	free(v);
}

int main(void)
{
	static const struct acase cases[] = {
		{ ST_DTYPE_F32, 4, 2, 32, 3, { 1, 37, 300 } },
		{ ST_DTYPE_F16, 4, 2, 32, 2, { 17, 64 } },
		{ ST_DTYPE_BF16, 4, 2, 32, 2, { 5, 129 } },
		{ ST_DTYPE_F8_E4M3, 4, 2, 32, 2, { 33, 2 } },
		{ ST_DTYPE_BF16, 32, 8, 128, 4, { 1000, 1, 16, 4097 } },
	};
	struct cw_cuda_module_handle h;
	int rc;

	if ((rc = cudat_module_open(&h)) != 0)
		return rc;
	if (!h.ops->attn_create || !h.ops->attn) {
		printf("FAIL: the module has no attention\n");
		return 1;
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(h.ops, &cases[i]);
	cw_cuda_module_close(&h);
	if (failures)
		printf("%d failures\n", failures);
	return failures ? 1 : 0;
}

/*
 * cw_dsv41_rows.c — DeepSeek-V4.1's KV rows (cw_dsv41_int.h): where each
 * row of a layer's streams lives and in which format (model doc 3.7-3.8,
 * st_kvfmt_v41.h).
 */
#include "cw_dsv41_int.h"

#include <errno.h>
#include <string.h>

#include "kv_client.h"
#include "st_kvfmt_v41.h"

/*
 * Row access.  The forward reads and writes every row of the state through
 * these, so the process-local and the kvd state run the same code.  In
 * kvd, a row lives in the sequence's page row (row p of a per-token stream
 * is position p's; of a pooled one, group p), stored in the V4.1 format of
 * its stream when its QAT flag is on (st_kvfmt_v41.h: encoded bytes,
 * decoded on read; decode(encode(x)) is the QAT round trip the
 * process-local state applies, so both give the same bits) and as F32
 * otherwise.  A row kvd does not map sets row_missing and reads zeros: the
 * eval then fails.
 */
/* A kvd state's window row of position r is in the replay rings. */
static int in_ov(const struct cw_dsv_state *s, int64_t r)
{
	return r >= s->ov_lo && r < s->ov_hi;
}

static uint8_t *prow(struct cw_dsv_state *s, int l, int kind, int64_t r,
		     int write)
{
	int st = s->ls[l].kvs[kind];
	uint8_t *p = write ? kv_client_row_writable(s->q.kv, s->q.seq, st,
						    (uint32_t)r) :
			     kv_client_row(s->q.kv, s->q.seq, st, (uint32_t)r);

	if (!p)
		s->q.row_missing = 1;
	return p;
}

/* The QAT flag of a stream kind (0: stored as F32). */
static unsigned kind_qat(int kind)
{
	return kind == CW_DSV41_S_WINDOW ? CW_DSV41_QAT_WINDOW_FP8 :
	       kind == CW_DSV41_S_CROW   ? CW_DSV41_QAT_CROW_FP4 :
	       kind == CW_DSV41_S_IKEY   ? CW_DSV41_QAT_INDEX_FP4 : 0;
}

/* Encodes/rounds row x (n elements) of `kind` in its QAT format:
 * in place (process-local) or into the page bytes `out`. */
static int qat_store(int kind, float *x, size_t n, uint8_t *out)
{
	switch (kind) {
	case CW_DSV41_S_WINDOW:
		return out ? st_kv41_fp8_encode(x, n, out, out + n) :
			     st_kv41_fp8_roundtrip(x, n);
	case CW_DSV41_S_CROW:
		return out ? st_kv41_crow_encode(x, n, out, out + n / 2) :
			     st_kv41_crow_roundtrip(x, n);
	default:
		return out ? st_kv41_idx_encode(x, n, out, out + n / 2) :
			     st_kv41_idx_roundtrip(x, n);
	}
}

static int kind_elems(const struct st_dsv_config *c, int kind)
{
	return kind == CW_DSV41_S_IKEY ? c->index_head_dim : c->head_dim;
}

/* Where row r of `kind` of layer l is to be computed: the array row
 * (process-local; the window ring at r mod W), the replay ring (kvd,
 * window rows of a replayed prefix), or `scratch` (kvd). */
float *cw_dsv41_row_begin(const struct cw_dsv_model *m,
			struct cw_dsv_state *s, int l, int kind, int64_t r,
			float *scratch)
{
	const struct st_dsv_config *c = &m->cfg;
	struct cw_dsv_lstate *ls = &s->ls[l];

	if (kind == CW_DSV41_S_WINDOW && (!s->q.kv || in_ov(s, r)))
		return ls->kv + (size_t)(r % (c->sliding_window +
					      CW_DSV_ROLLBACK_MAX)) *
					c->head_dim;
	if (s->q.kv)
		return scratch;
	return (kind == CW_DSV41_S_CROW ? ls->crow : ls->ikey) +
	       (size_t)r * kind_elems(c, kind);
}

/* Stores row r computed at x (from row_begin): applies the stream's QAT
 * (in place when process-local) or writes the page row in its format.
 * 0, or -EINVAL (width not a multiple of the format's block). */
int cw_dsv41_row_end(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		   int l, int kind, int64_t r, float *x)
{
	const size_t n = (size_t)kind_elems(&m->cfg, kind);
	const int q = (s->q.kv ? s->qat : m->qat) & kind_qat(kind);
	uint8_t *p;

	if (!s->q.kv || (kind == CW_DSV41_S_WINDOW && in_ov(s, r)))
		return q ? qat_store(kind, x, n, NULL) : 0;
	p = prow(s, l, kind, r, 1);
	if (!p)
		return 0;
	if (q)
		return qat_store(kind, x, n, p);
	memcpy(p, x, n * sizeof(float));
	return 0;
}

/* Row r of `kind` of layer l for reading: the array row, or the page row
 * (F32 in place, or decoded into buf). */
const float *cw_dsv41_row_get(const struct cw_dsv_model *m,
			    struct cw_dsv_state *s, int l, int kind,
			    int64_t r, float *buf)
{
	const struct st_dsv_config *c = &m->cfg;
	const size_t n = (size_t)kind_elems(c, kind);
	const uint8_t *p;
	int rc = 0;

	if (!s->q.kv || (kind == CW_DSV41_S_WINDOW && in_ov(s, r)))
		return cw_dsv41_row_begin(m, s, l, kind, r, NULL);
	p = prow(s, l, kind, r, 0);
	if (!p)
		return s->zero_row;
	if (!(s->qat & kind_qat(kind)))
		return (const float *)(const void *)p;
	switch (kind) {
	case CW_DSV41_S_WINDOW:
		rc = st_kv41_fp8_decode(p, p + n, n, buf);
		break;
	case CW_DSV41_S_CROW:
		rc = st_kv41_crow_decode(p, p + n / 2, n, buf);
		break;
	default:
		rc = st_kv41_idx_decode(p, p + n / 2, n, buf);
	}
	if (rc < 0) { /* widths were checked by the encode: a bug */
		s->q.row_missing = 1;
		return s->zero_row;
	}
	return buf;
}

/* The group-input slot of position p of KV source l (2 hd floats):
 * process-local ring, or the page row (ratio > 1) / scratch (ratio 1). */
float *cw_dsv41_grp_slot(const struct cw_dsv_model *m,
		       struct cw_dsv_state *s, int l, int64_t p, int write)
{
	struct cw_dsv_lstate *ls = &s->ls[l];
	const int mr = m->layers[l].ratio;
	uint8_t *q;

	if (!s->q.kv)
		return ls->grp + (size_t)(p % (mr + CW_DSV_ROLLBACK_MAX)) * 2 *
					 m->cfg.head_dim;
	if (mr == 1)
		return ls->grp;
	q = prow(s, l, CW_DSV41_S_GROUP, p, write);
	return q ? (float *)(void *)q : s->zero_row;
}


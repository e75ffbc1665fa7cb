/*
 * es_actstats.c — decayed activation counts per (layer, expert) and their
 * file (es_actstats.h).
 */
#include "es_actstats.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_util.h"

#define MAGIC "STACTS1"
#define VERSION 1
#define HEAD_BYTES (8 + 4 * 4 + 8 + 8 + 8)
/* Rescale when an activation would weigh more than this. */
#define INC_MAX 1e150

int es_actstats_init(struct es_actstats *s, uint32_t n_layers,
		     uint32_t n_experts, double half_life, uint64_t store_id)
{
	memset(s, 0, sizeof(*s));
	if (!n_layers || !n_experts || !(half_life > 0) ||
	    (uint64_t)n_layers * n_experts > (1u << 26))
		return -EINVAL;
	s->count = calloc((size_t)n_layers * n_experts, sizeof(double));
	if (!s->count)
		return -ENOMEM;
	s->n_layers = n_layers;
	s->n_experts = n_experts;
	s->half_life = half_life;
	s->step = exp2(1.0 / half_life);
	s->inc = 1.0;
	s->store_id = store_id;
	return 0;
}

void es_actstats_fini(struct es_actstats *s)
{
	free(s->count);
	s->count = NULL;
}

static void rescale(struct es_actstats *s)
{
	size_t n = (size_t)s->n_layers * s->n_experts;

	for (size_t i = 0; i < n; i++)
		s->count[i] /= s->inc;
	s->inc = 1.0;
}

void es_actstats_tokens(struct es_actstats *s, uint64_t n)
{
	s->tokens += n;
	s->inc *= pow(s->step, (double)n);
	if (s->inc > INC_MAX || !isfinite(s->inc))
		rescale(s);
}

void es_actstats_add(struct es_actstats *s, uint32_t l, uint32_t e)
{
	s->count[(size_t)l * s->n_experts + e] += s->inc;
}

double es_actstats_value(const struct es_actstats *s, uint32_t l, uint32_t e)
{
	return s->count[(size_t)l * s->n_experts + e] / s->inc;
}

double es_actstats_mass(const struct es_actstats *s)
{
	double a = -M_LN2 / s->half_life;

	if (!s->tokens)
		return 0;
	/* (1 - 2^(-T/h)) / (1 - 2^(-1/h)), with expm1 for large h */
	return expm1(a * (double)s->tokens) / expm1(a);
}

double es_actstats_rate(const struct es_actstats *s, uint32_t l, uint32_t e)
{
	double mass = es_actstats_mass(s);

	return mass > 0 ? es_actstats_value(s, l, e) / mass : 0;
}

void es_actstats_top(const struct es_actstats *s, uint32_t l, uint32_t n,
		     uint32_t *ret)
{
	const double *c = s->count + (size_t)l * s->n_experts;

	/* selection of n from n_experts (n_experts is at most a few
	 * hundred): insertion into a sorted prefix */
	uint32_t have = 0;

	if (!n)
		return;
	for (uint32_t e = 0; e < s->n_experts; e++) {
		uint32_t i;

		if (have < n)
			i = have++;
		else if (c[e] > c[ret[n - 1]])
			i = n - 1;
		else
			continue;
		/* shift smaller ones down; equal ones (lower ids) stay */
		while (i > 0 && c[e] > c[ret[i - 1]]) {
			ret[i] = ret[i - 1];
			i--;
		}
		ret[i] = e;
	}
}

static void put32(uint8_t *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *b)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++)
		v |= (uint32_t)b[i] << (8 * i);
	return v;
}

static uint64_t get64(const uint8_t *b)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)b[i] << (8 * i);
	return v;
}

static uint64_t dbits(double d)
{
	uint64_t u;

	memcpy(&u, &d, 8);
	return u;
}

static double bitsd(uint64_t u)
{
	double d;

	memcpy(&d, &u, 8);
	return d;
}

int es_actstats_save(const struct es_actstats *s, const char *path,
		     struct st_diag *diag)
{
	size_t n = (size_t)s->n_layers * s->n_experts;
	size_t len = HEAD_BYTES + 8 * n + 8;
	uint8_t *b = malloc(len), *q;
	int r;

	if (!b)
		return -ENOMEM;
	memcpy(b, MAGIC, 8);
	put32(b + 8, VERSION);
	put32(b + 12, s->n_layers);
	put32(b + 16, s->n_experts);
	put32(b + 20, 0);
	put64(b + 24, dbits(s->half_life));
	put64(b + 32, s->tokens);
	put64(b + 40, s->store_id);
	q = b + HEAD_BYTES;
	for (size_t i = 0; i < n; i++)
		put64(q + 8 * i, dbits(s->count[i] / s->inc));
	put64(b + len - 8, st_xxh3(b, len - 8));
	/* a unique temporary name and the directory synced after the
	 * rename: two savers never mix their bytes, and a crash leaves the
	 * old statistics or the new ones */
	r = st_write_file_durable(path, b, len, 0644);
	free(b);
	if (r) {
		return st_diag_set(diag, r, "cannot write activation "
				   "statistics %s: %s", path, strerror(-r));
	}
	return 0;
}

int es_actstats_load(struct es_actstats *s, const char *path,
		     int expect_geometry, struct st_diag *diag)
{
	char *txt = NULL;
	const uint8_t *b;
	size_t len = 0, n;
	uint32_t nl, ne;
	uint64_t sid;
	int r = st_read_file(path, &txt, &len);

	if (r < 0)
		return st_diag_set(diag, r, "cannot read activation statistics "
				   "%s: %s", path, st_strerror(r));
	b = (const uint8_t *)txt;
	if (len < HEAD_BYTES + 8 || memcmp(b, MAGIC, 8) != 0) {
		r = st_diag_set(diag, -ST_E_BADMAGIC, "%s is not a strata "
				"activation statistics file", path);
		goto out;
	}
	nl = get32(b + 12);
	ne = get32(b + 16);
	sid = get64(b + 40);
	if (get32(b + 8) != VERSION || !nl || !ne ||
	    (uint64_t)nl * ne > (1u << 26) ||
	    len != HEAD_BYTES + 8 * (size_t)nl * ne + 8) {
		r = st_diag_set(diag, -ST_E_FORMAT, "%s: version %u, %u x %u "
				"counts and %zu bytes do not fit together "
				"(truncated?)", path, get32(b + 8), nl, ne, len);
		goto out;
	}
	if (st_xxh3(b, len - 8) != get64(b + len - 8)) {
		r = st_diag_set(diag, -ST_E_CHECKSUM, "%s: checksum mismatch "
				"(file damaged); delete it to start the "
				"statistics afresh", path);
		goto out;
	}
	if (expect_geometry) {
		if (nl != s->n_layers || ne != s->n_experts ||
		    sid != s->store_id) {
			r = st_diag_set(diag, -ST_E_STALE, "%s holds statistics "
					"of another model (%u x %u experts, "
					"store id %016llx); ignored", path, nl,
					ne, (unsigned long long)sid);
			goto out;
		}
	} else {
		double h = s->half_life > 0 ? s->half_life :
					      bitsd(get64(b + 24));

		es_actstats_fini(s);
		r = es_actstats_init(s, nl, ne, h > 0 ? h :
				     ES_ACTSTATS_DEFAULT_HALF_LIFE, sid);
		if (r < 0)
			goto out;
	}
	n = (size_t)nl * ne;
	s->inc = 1.0;
	s->tokens = get64(b + 32);
	for (size_t i = 0; i < n; i++) {
		double v = bitsd(get64(b + HEAD_BYTES + 8 * i));

		s->count[i] = isfinite(v) && v > 0 ? v : 0;
	}
out:
	free(txt);
	return r;
}

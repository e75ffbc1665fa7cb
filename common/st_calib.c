/*
 * st_calib.c — activation statistics file of the calibrated scale search
 * (format in st_calib.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_calib.h"
#include "st_util.h"

#define HEAD_BYTES 64

int st_calib_init(struct st_calib *c, uint32_t n_layers, uint32_t n_experts,
		  uint32_t hidden, uint32_t inter)
{
	return st_calib_init_full(c, n_layers, n_experts, hidden, inter, 0);
}

int st_calib_init_full(struct st_calib *c, uint32_t n_layers,
		       uint32_t n_experts, uint32_t hidden, uint32_t inter,
		       int full)
{
	size_t le;

	memset(c, 0, sizeof(*c));
	if (!n_layers || !n_experts || !hidden || !inter ||
	    n_layers > 4096 || n_experts > 4096 || hidden > (1u << 20) ||
	    inter > (1u << 20))
		return -EINVAL;
	le = (size_t)n_layers * n_experts;
	c->n_layers = n_layers;
	c->n_experts = n_experts;
	c->hidden = hidden;
	c->inter = inter;
	c->count = calloc(le, sizeof(*c->count));
	c->sum_x2 = calloc(le * hidden, sizeof(double));
	c->sum_a2 = calloc(le * inter, sizeof(double));
	if (full) {
		c->sum_xx = calloc(le * hidden * hidden, sizeof(double));
		c->sum_aa = calloc(le * inter * inter, sizeof(double));
	}
	if (!c->count || !c->sum_x2 || !c->sum_a2 ||
	    (full && (!c->sum_xx || !c->sum_aa))) {
		st_calib_free(c);
		return -ENOMEM;
	}
	return 0;
}

void st_calib_free(struct st_calib *c)
{
	free(c->count);
	free(c->sum_x2);
	free(c->sum_a2);
	free(c->sum_xx);
	free(c->sum_aa);
	memset(c, 0, sizeof(*c));
}

static int in_range(const struct st_calib *c, int layer, int expert)
{
	return layer >= 0 && (uint32_t)layer < c->n_layers && expert >= 0 &&
	       (uint32_t)expert < c->n_experts;
}

/* s[i][j] += v_i v_j for j >= i. */
static void outer_upper(double *s, const float *v, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		const double vi = v[i];
		double *row = s + (size_t)i * n;

		for (uint32_t j = i; j < n; j++)
			row[j] += vi * (double)v[j];
	}
}

int st_calib_add(struct st_calib *c, int layer, int expert, const float *x,
		 const float *a)
{
	size_t le = (size_t)layer * c->n_experts + (size_t)expert;
	double *sx, *sa;

	if (!in_range(c, layer, expert))
		return -EINVAL;
	sx = c->sum_x2 + le * c->hidden;
	sa = c->sum_a2 + le * c->inter;
	for (uint32_t i = 0; i < c->hidden; i++)
		sx[i] += (double)x[i] * (double)x[i];
	for (uint32_t i = 0; i < c->inter; i++)
		sa[i] += (double)a[i] * (double)a[i];
	if (c->sum_xx) {
		outer_upper(c->sum_xx + le * c->hidden * c->hidden, x, c->hidden);
		outer_upper(c->sum_aa + le * c->inter * c->inter, a, c->inter);
	}
	c->count[le]++;
	return 0;
}

int st_calib_weights(const struct st_calib *c, int layer, int expert, int m,
		     uint64_t min_tokens, float *ret)
{
	size_t le = (size_t)layer * c->n_experts + (size_t)expert;
	const double *s;
	uint32_t n;
	uint64_t cnt;

	if (!in_range(c, layer, expert) || m < 0 || m > 2)
		return -EINVAL;
	cnt = c->count[le];
	if (cnt == 0 || cnt < min_tokens)
		return 0;
	n = m == 2 ? c->inter : c->hidden;
	s = m == 2 ? c->sum_a2 + le * c->inter : c->sum_x2 + le * c->hidden;
	for (uint32_t i = 0; i < n; i++)
		ret[i] = (float)(s[i] / (double)cnt);
	return 1;
}

int st_calib_second_moment(const struct st_calib *c, int layer, int expert,
			   int m, uint64_t min_tokens, double *ret)
{
	size_t le = (size_t)layer * c->n_experts + (size_t)expert;
	const double *s;
	uint64_t cnt;
	uint32_t n;

	if (!in_range(c, layer, expert) || m < 0 || m > 2)
		return -EINVAL;
	cnt = c->count[le];
	if (!c->sum_xx || cnt == 0 || cnt < min_tokens)
		return 0;
	n = m == 2 ? c->inter : c->hidden;
	s = m == 2 ? c->sum_aa + le * c->inter * c->inter :
		     c->sum_xx + le * c->hidden * c->hidden;
	for (uint32_t i = 0; i < n; i++)
		for (uint32_t j = i; j < n; j++)
			ret[(size_t)i * n + j] = ret[(size_t)j * n + i] =
				s[(size_t)i * n + j] / (double)cnt;
	return 1;
}

/* Bytes of a file with these dimensions, or 0 when it would not fit. */
static uint64_t file_bytes(uint64_t L, uint64_t E, uint64_t H, uint64_t I,
			   int full)
{
	uint64_t le = L * E;

	if (!L || !E || !H || !I || L > 4096 || E > 4096 || H > (1u << 20) ||
	    I > (1u << 20) || (full && (H > 65536 || I > 65536)))
		return 0;
	return HEAD_BYTES + le * 8 + le * (H + I) * 8 +
	       (full ? le * (H * H + I * I) * 8 : 0) + 8;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

int st_calib_write(const struct st_calib *c, const char *path,
		   struct st_diag *diag)
{
	uint64_t total = file_bytes(c->n_layers, c->n_experts, c->hidden,
				    c->inter, c->sum_xx != NULL);
	size_t le = (size_t)c->n_layers * c->n_experts, off = HEAD_BYTES;
	uint8_t *buf;
	int r = 0;

	if (!total || !c->count)
		return st_diag_set(diag, -EINVAL, "calibration statistics: "
				   "bad dimensions");
	buf = calloc(1, total);
	if (!buf)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	memcpy(buf, ST_CALIB_MAGIC, 8);
	put32(buf + 8, ST_CALIB_VERSION);
	put32(buf + 12, c->n_layers);
	put32(buf + 16, c->n_experts);
	put32(buf + 20, c->hidden);
	put32(buf + 24, c->inter);
	put32(buf + 28, c->sum_xx ? 1 : 0);
	put64(buf + 32, c->model_id);
	put64(buf + 40, c->text_xxh3);
	put64(buf + 48, c->n_tokens);
	put64(buf + 56, c->n_windows);
	memcpy(buf + off, c->count, le * 8);
	off += le * 8;
	for (size_t i = 0; i < le; i++) {
		memcpy(buf + off, c->sum_x2 + i * c->hidden, c->hidden * 8u);
		off += c->hidden * 8u;
		memcpy(buf + off, c->sum_a2 + i * c->inter, c->inter * 8u);
		off += c->inter * 8u;
	}
	if (c->sum_xx) {
		/* full symmetric matrices from the upper triangles (in memory
		 * only those are summed; a file read back has both, equal) */
		for (size_t i = 0; i < le; i++)
			for (int k = 0; k < 2; k++) {
				uint32_t n = k ? c->inter : c->hidden;
				const double *s = k ? c->sum_aa + i * n * n :
						      c->sum_xx + i * n * n;
				double *o = (double *)(void *)(buf + off);

				for (uint32_t a = 0; a < n; a++)
					for (uint32_t b = a; b < n; b++) {
						double v = s[(size_t)a * n + b];

						memcpy(o + (size_t)a * n + b, &v, 8);
						memcpy(o + (size_t)b * n + a, &v, 8);
					}
				off += (size_t)n * n * 8;
			}
	}
	put64(buf + off, st_xxh3(buf, off));
	r = st_write_file_durable(path, buf, total, 0644);
	free(buf);
	if (r)
		return st_diag_set(diag, r, "cannot write %s: %s", path,
				   st_strerror(r));
	return 0;
}

int st_calib_read(const char *path, struct st_calib *ret,
		  uint64_t *ret_file_xxh3, struct st_diag *diag)
{
	char *buf = NULL;
	size_t len = 0, le, off = HEAD_BYTES;
	uint64_t want;
	const uint8_t *b;
	struct st_calib c;
	int r = st_read_file(path, &buf, &len);

	memset(ret, 0, sizeof(*ret));
	if (r < 0)
		return st_diag_set(diag, r, "cannot read calibration statistics "
				   "%s: %s", path, st_strerror(r));
	b = (const uint8_t *)buf;
	if (len < HEAD_BYTES + 8 || memcmp(b, ST_CALIB_MAGIC, 8)) {
		free(buf);
		return st_diag_set(diag, -ST_E_FORMAT, "%s is not a calibration "
				   "statistics file (write one with strata "
				   "calibrate)", path);
	}
	{
		uint32_t v = get32(b + 8), L = get32(b + 12), E = get32(b + 16);
		uint32_t H = get32(b + 20), I = get32(b + 24);
		uint32_t flags = get32(b + 28);

		if (v != ST_CALIB_VERSION) {
			free(buf);
			return st_diag_set(diag, -ST_E_FORMAT, "%s: statistics "
					   "version %u, this strata reads %d: run "
					   "strata calibrate again", path, v,
					   ST_CALIB_VERSION);
		}
		if (flags & ~1u) {
			free(buf);
			return st_diag_set(diag, -ST_E_FORMAT, "%s: unknown flags "
					   "%#x", path, flags);
		}
		want = file_bytes(L, E, H, I, flags & 1);
		if (!want || want != len) {
			free(buf);
			return st_diag_set(diag, -ST_E_FORMAT, "%s: %zu bytes, "
					   "but its dimensions (%u layers, %u "
					   "experts, %u, %u) need %llu: truncated "
					   "or corrupt", path, len, L, E, H, I,
					   (unsigned long long)want);
		}
	}
	if (st_xxh3(b, len - 8) != get64(b + len - 8)) {
		free(buf);
		return st_diag_set(diag, -ST_E_CHECKSUM, "%s: checksum mismatch "
				   "(corrupt): run strata calibrate again", path);
	}
	r = st_calib_init_full(&c, get32(b + 12), get32(b + 16), get32(b + 20),
			       get32(b + 24), get32(b + 28) & 1);
	if (r < 0) {
		free(buf);
		return st_diag_set(diag, r, "%s: %s", path, st_strerror(r));
	}
	c.model_id = get64(b + 32);
	c.text_xxh3 = get64(b + 40);
	c.n_tokens = get64(b + 48);
	c.n_windows = get64(b + 56);
	le = (size_t)c.n_layers * c.n_experts;
	memcpy(c.count, b + off, le * 8);
	off += le * 8;
	for (size_t i = 0; i < le; i++) {
		memcpy(c.sum_x2 + i * c.hidden, b + off, c.hidden * 8u);
		off += c.hidden * 8u;
		memcpy(c.sum_a2 + i * c.inter, b + off, c.inter * 8u);
		off += c.inter * 8u;
	}
	if (c.sum_xx)
		for (size_t i = 0; i < le; i++) {
			memcpy(c.sum_xx + i * c.hidden * c.hidden, b + off,
			       (size_t)c.hidden * c.hidden * 8);
			off += (size_t)c.hidden * c.hidden * 8;
			memcpy(c.sum_aa + i * c.inter * c.inter, b + off,
			       (size_t)c.inter * c.inter * 8);
			off += (size_t)c.inter * c.inter * 8;
		}
	for (size_t i = 0; i < le * c.hidden; i++)
		if (!(c.sum_x2[i] >= 0.0) || isinf(c.sum_x2[i]))
			r = -ST_E_FORMAT;
	for (size_t i = 0; i < le * c.inter; i++)
		if (!(c.sum_a2[i] >= 0.0) || isinf(c.sum_a2[i]))
			r = -ST_E_FORMAT;
	if (ret_file_xxh3)
		*ret_file_xxh3 = st_xxh3(b, len);
	free(buf);
	if (r < 0) {
		st_calib_free(&c);
		return st_diag_set(diag, r, "%s: a sum of squares is negative "
				   "or not finite", path);
	}
	*ret = c;
	return 0;
}

uint64_t st_calib_model_id(const struct st_checkpoint *ck, const char *config,
			   size_t config_len)
{
	uint64_t h = st_xxh3(config, config_len);
	static const char suffix[] = ".gate.weight";
	const size_t sl = sizeof(suffix) - 1;

	for (int i = 0; i < ck->n_tensors; i++) {
		const struct st_tensor_info *t = &ck->tensors[i];
		size_t nl = strlen(t->name);
		const void *d;

		if (nl < sl || strcmp(t->name + nl - sl, suffix))
			continue;
		d = st_checkpoint_data(ck, t);
		if (!d)
			continue;
		/* order-dependent combination (tensors are name-sorted) */
		h = (h ^ st_xxh3(t->name, nl)) * 0x9E3779B185EBCA87ull;
		h = (h ^ st_xxh3(d, (size_t)t->n_bytes)) * 0xC2B2AE3D27D4EB4Full;
	}
	return h;
}

/*
 * cuda_test_util.c — the GPU tests' shared helpers (cuda_test_util.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_test_util.h"

void cudat_attend_head(const struct cw_kvrow_fmt *f,
		       const uint8_t *const *rows, int n_rows,
		       const float *qh, int kvh, float *sc, float *oh)
{
	const int hd = f->head_dim;
	const float scale = 1.0f / sqrtf((float)hd);
	float kv[512], mx = -INFINITY;
	double sum = 0.0;

	for (int j = 0; j < n_rows; j++) {
		float d = 0.0f;

		cw_kvrow_read_head(f, rows[j], 0, kvh, kv);
		for (int i = 0; i < hd; i++)
			d += qh[i] * kv[i];
		sc[j] = d * scale;
		mx = fmaxf(mx, sc[j]);
	}
	for (int j = 0; j < n_rows; j++) {
		sc[j] = expf(sc[j] - mx);
		sum += sc[j];
	}
	for (int i = 0; i < hd; i++)
		oh[i] = 0.0f;
	for (int j = 0; j < n_rows; j++) {
		const float p = (float)(sc[j] / sum);

		cw_kvrow_read_head(f, rows[j], 1, kvh, kv);
		for (int i = 0; i < hd; i++)
			oh[i] += p * kv[i];
	}
}

int cudat_check_head(const struct cw_kvrow_fmt *f,
		     const uint8_t *const *rows, int n_rows, const float *qh,
		     int kvh, const float *gh, const float *ch, char *msg,
		     size_t cap)
{
	const int hd = f->head_dim;
	double *s = malloc(sizeof(double) * (size_t)(n_rows ? n_rows : 1));
	double mx = -INFINITY, sum = 0.0, E = 0.0;
	float kd[512], vd[512];
	int r = 0;

	if (!s) {
		snprintf(msg, cap, "out of memory");
		return -1;
	}
	for (int j = 0; j < n_rows; j++) {
		double dot = 0.0, absdot = 0.0;

		cw_kvrow_read_head(f, rows[j], 0, kvh, kd);
		for (int i = 0; i < hd; i++) {
			dot += (double)qh[i] * kd[i];
			absdot += fabs((double)qh[i] * kd[i]);
		}
		s[j] = dot / sqrt((double)hd);
		E = fmax(E, ((hd + 8) * absdot / sqrt((double)hd) +
			     4 * fabs(s[j])) * 0x1p-24);
		mx = fmax(mx, s[j]);
	}
	for (int j = 0; j < n_rows; j++)
		sum += exp(s[j] - mx);
	for (int i = 0; i < hd && r == 0; i++) {
		double exact = 0.0, tol = 0.0;

		for (int j = 0; j < n_rows; j++) {
			const double p = exp(s[j] - mx) / sum;

			cw_kvrow_read_head(f, rows[j], 1, kvh, vd);
			exact += p * vd[i];
			tol += p * fabs(vd[i]) * (2 * E +
				(mx - s[j] + n_rows + 16) * 0x1p-24);
		}
		tol *= 2;
		if (!(fabs(gh[i] - exact) <= tol) ||
		    !(fabs(ch[i] - exact) <= tol)) {
			snprintf(msg, cap, "[%d]: device %.9g cpu %.9g exact "
				 "%.9g (tol %.3g)", i, gh[i], ch[i], exact,
				 tol);
			r = -1;
		}
	}
	free(s);
	return r;
}

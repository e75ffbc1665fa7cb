/*
 * cuda_test_util.c — the GPU tests' shared helpers (cuda_test_util.h).
 */
#include <math.h>
#include <stdio.h>

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

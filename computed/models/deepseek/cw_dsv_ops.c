/*
 * cw_dsv_ops.c — the numeric pieces of the DeepSeek-V4 forward pass
 * (cw_dsv_ops.h; formulas: MODEL_FAMILY_DEEPSEEK_V4.md 2.4-2.5).  Reference
 * mode: float32 storage, double accumulation.
 */
#include "cw_dsv_ops.h"

#include <math.h>
#include <string.h>

#include "st_formats.h"

void cw_dsv_rmsnorm(const float *x, const float *w, int n, double eps,
		     float *y)
{
	double ss = 0.0, r;

	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	r = 1.0 / sqrt(ss / n + eps);
	for (int i = 0; i < n; i++)
		y[i] = (float)(x[i] * r * (w ? w[i] : 1.0f));
}

void cw_dsv_rope_freqs(const struct st_dsv_config *c, int compress,
			double *inv_freq)
{
	int d = c->rope_dim, half = d / 2;
	double base = compress ? c->compress_rope_theta : c->rope_theta;

	for (int i = 0; i < half; i++)
		inv_freq[i] = 1.0 / pow(base, 2.0 * i / d);
	/* no YaRN without original_max_position_embeddings (the official
	 * precompute_freqs_cis: original_seq_len 0) */
	if (!compress || c->yarn_orig_max_pos <= 0)
		return;
	/* YaRN (HF modeling_rope_utils._compute_yarn_parameters, truncate):
	 * correction dims from original_max_position_embeddings. */
	{
		double lo = floor(d * log(c->yarn_orig_max_pos /
					  (c->yarn_beta_fast * 2 * M_PI)) /
				  (2 * log(base)));
		double hi = ceil(d * log(c->yarn_orig_max_pos /
					 (c->yarn_beta_slow * 2 * M_PI)) /
				 (2 * log(base)));

		if (lo < 0)
			lo = 0;
		if (hi > d - 1)
			hi = d - 1;
		if (hi == lo)
			hi += 0.001;
		for (int i = 0; i < half; i++) {
			double ramp = (i - lo) / (hi - lo);

			ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
			/* ramp 0: extrapolation (unscaled); 1: / factor */
			inv_freq[i] = inv_freq[i] / c->yarn_factor * ramp +
				      inv_freq[i] * (1.0 - ramp);
		}
	}
}

void cw_dsv_rope(float *x, int dim, int n_pairs, const double *inv_freq,
		  int64_t pos, int inverse)
{
	float *t = x + dim - 2 * n_pairs;

	for (int i = 0; i < n_pairs; i++) {
		double a = (double)pos * inv_freq[i];
		double cs = cos(a), sn = inverse ? -sin(a) : sin(a);
		double x0 = t[2 * i], x1 = t[2 * i + 1];

		t[2 * i] = (float)(x0 * cs - x1 * sn);
		t[2 * i + 1] = (float)(x1 * cs + x0 * sn);
	}
}

static double sigmoid(double x)
{
	return 1.0 / (1.0 + exp(-x));
}

void cw_dsv_hc_pre(const float *X, int n, int D, const float *fn,
		    const float *base, const float *scale, int iters,
		    double eps, double rms_eps, float *pre, float *post,
		    float *comb)
{
	int nd = n * D, nmu = (2 + n) * n;
	double mu[nmu], M[n][n], ss = 0.0, r;

	for (int i = 0; i < nd; i++)
		ss += (double)X[i] * X[i];
	r = 1.0 / sqrt(ss / nd + rms_eps);
	for (int k = 0; k < nmu; k++) {
		double acc = 0.0;

		for (int i = 0; i < nd; i++)
			acc += (double)fn[(size_t)k * nd + i] * X[i];
		mu[k] = acc * r;
	}
	for (int k = 0; k < n; k++) {
		pre[k] = (float)(sigmoid(mu[k] * scale[0] + base[k]) + eps);
		post[k] = (float)(2.0 * sigmoid(mu[n + k] * scale[1] +
						base[n + k]));
	}
	/* Sinkhorn: row softmax + eps, one column normalisation, then
	 * iters-1 rounds of row then column normalisation (+eps in each
	 * denominator). */
	for (int i = 0; i < n; i++) {
		double mx = -INFINITY, s = 0.0;

		for (int j = 0; j < n; j++) {
			M[i][j] = mu[2 * n + i * n + j] * scale[2] +
				  base[2 * n + i * n + j];
			if (M[i][j] > mx)
				mx = M[i][j];
		}
		for (int j = 0; j < n; j++)
			s += (M[i][j] = exp(M[i][j] - mx));
		for (int j = 0; j < n; j++)
			M[i][j] = M[i][j] / s + eps;
	}
	for (int it = 0; it < iters; it++) {
		if (it > 0) {
			for (int i = 0; i < n; i++) {
				double s = 0.0;

				for (int j = 0; j < n; j++)
					s += M[i][j];
				for (int j = 0; j < n; j++)
					M[i][j] /= s + eps;
			}
		}
		for (int j = 0; j < n; j++) {
			double s = 0.0;

			for (int i = 0; i < n; i++)
				s += M[i][j];
			for (int i = 0; i < n; i++)
				M[i][j] /= s + eps;
		}
	}
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			comb[i * n + j] = (float)M[i][j];
}

void cw_dsv_hc_post(float *X, int n, int D, const float *y,
		     const float *post, const float *comb)
{
	float old[n * D];

	memcpy(old, X, sizeof(old));
	for (int j = 0; j < n; j++)
		for (int d = 0; d < D; d++) {
			double acc = (double)post[j] * y[d];

			for (int i = 0; i < n; i++)
				acc += (double)comb[i * n + j] * old[i * D + d];
			X[j * D + d] = (float)acc;
		}
}

static double softplus(double x)
{
	return x > 30 ? x : log1p(exp(x));
}

void cw_dsv_route_topk(const float *logits, int n_experts, int top_k,
		   const int32_t *hash_ids, const float *bias, int normalise,
		   double scale, int32_t *ids, float *weights)
{
	double s[n_experts], sum = 0.0;
	unsigned char used[n_experts];

	for (int e = 0; e < n_experts; e++)
		s[e] = sqrt(softplus(logits[e]));
	memset(used, 0, sizeof(used));
	for (int k = 0; k < top_k; k++) {
		if (hash_ids) {
			ids[k] = hash_ids[k];
			continue;
		}
		int best = -1;
		double bv = -INFINITY;

		for (int e = 0; e < n_experts; e++) {
			double v = s[e] + (bias ? bias[e] : 0.0);

			if (!used[e] && (best < 0 || v > bv)) {
				best = e;
				bv = v;
			}
		}
		used[best] = 1;
		ids[k] = best;
	}
	for (int k = 0; k < top_k; k++)
		sum += s[ids[k]];
	for (int k = 0; k < top_k; k++)
		weights[k] = (float)((normalise ? s[ids[k]] / (sum + 1e-20) :
					  s[ids[k]]) * scale);
}

void cw_dsv_swiglu_clip(float *g, const float *u, int n, double limit)
{
	for (int i = 0; i < n; i++) {
		double a = g[i] < limit ? g[i] : limit;
		double b = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];

		g[i] = (float)(a / (1.0 + exp(-a)) * b);
	}
}

void cw_dsv_pool(const float *const *c, const float *const *z, int n_slots,
		  int width, float *out)
{
	for (int j = 0; j < width; j++) {
		double mx = -INFINITY, den = 0.0, num = 0.0;

		for (int s = 0; s < n_slots; s++)
			if (z[s][j] > mx)
				mx = z[s][j];
		for (int s = 0; s < n_slots; s++) {
			double e = exp(z[s][j] - mx);

			den += e;
			num += e * c[s][j];
		}
		out[j] = (float)(num / den);
	}
}

void cw_dsv_sink_attn(const float *q, const float *const *rows, int n_rows,
		       int dim, float sink, float *out)
{
	double sc[n_rows > 0 ? n_rows : 1], mx = sink, den, acc[dim];
	double k = 1.0 / sqrt((double)dim);

	for (int r = 0; r < n_rows; r++) {
		double d = 0.0;

		for (int i = 0; i < dim; i++)
			d += (double)q[i] * rows[r][i];
		sc[r] = d * k;
		if (sc[r] > mx)
			mx = sc[r];
	}
	den = exp(sink - mx);
	memset(acc, 0, sizeof(acc));
	for (int r = 0; r < n_rows; r++) {
		double e = exp(sc[r] - mx);

		den += e;
		for (int i = 0; i < dim; i++)
			acc[i] += e * rows[r][i];
	}
	for (int i = 0; i < dim; i++)
		out[i] = (float)(acc[i] / den);
}

void cw_dsv_fp8_dequant(const uint8_t *w, const uint8_t *scale, int rows,
			 int cols, int b0, int b1, float *out)
{
	int sc = (cols + b1 - 1) / b1;

	for (int o = 0; o < rows; o++)
		for (int i = 0; i < cols; i++)
			out[(size_t)o * cols + i] =
				st_e4m3_to_f32(w[(size_t)o * cols + i]) *
				st_e8m0_to_f32(scale[(size_t)(o / b0) * sc +
						     i / b1]);
}

void cw_dsv_fp8_roundtrip(float *x, int n, int block)
{
	for (int b0 = 0; b0 < n; b0 += block) {
		int b1 = b0 + block < n ? b0 + block : n;
		double amax = 1e-4, s;

		for (int i = b0; i < b1; i++)
			if (fabs(x[i]) > amax)
				amax = fabs(x[i]);
		s = ldexp(1.0, (int)ceil(log2(amax / 448.0)));
		for (int i = b0; i < b1; i++) {
			double v = x[i] / s;

			v = v > 448 ? 448 : v < -448 ? -448 : v;
			x[i] = (float)(st_e4m3_to_f32(st_f32_to_e4m3_sat((float)v)) *
				       s);
		}
	}
}

void cw_dsv_fp4_roundtrip(float *x, int n, int block)
{
	for (int b0 = 0; b0 < n; b0 += block) {
		int b1 = b0 + block < n ? b0 + block : n;
		double amax = 6.0 * ldexp(1.0, -126), s;

		for (int i = b0; i < b1; i++)
			if (fabs(x[i]) > amax)
				amax = fabs(x[i]);
		s = ldexp(1.0, (int)ceil(log2(amax / 6.0)));
		for (int i = b0; i < b1; i++) {
			double v = x[i] / s;

			v = v > 6 ? 6 : v < -6 ? -6 : v;
			x[i] = (float)(st_e2m1_to_f32(st_f32_to_e2m1((float)v)) *
				       s);
		}
	}
}

void cw_dsv_hadamard(float *x, int n)
{
	double k = 1.0 / sqrt((double)n);

	for (int h = 1; h < n; h *= 2)
		for (int i = 0; i < n; i += 2 * h)
			for (int j = i; j < i + h; j++) {
				float a = x[j], b = x[j + h];

				x[j] = a + b;
				x[j + h] = a - b;
			}
	for (int i = 0; i < n; i++)
		x[i] = (float)(x[i] * k);
}

void cw_dsv_collapse(const float *X, const float *pre, int n, int D,
		      float *u)
{
	for (int d = 0; d < D; d++) {
		double acc = 0.0;

		for (int k = 0; k < n; k++)
			acc += (double)pre[k] * X[k * D + d];
		u[d] = (float)acc;
	}
}

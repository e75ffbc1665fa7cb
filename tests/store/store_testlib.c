/* store_testlib.c — see store_testlib.h. */
#include "store_testlib.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <xxhash.h>

static void die(const char *what, const char *detail)
{
	fprintf(stderr, "store test helper: %s: %s\n", what, detail);
	abort();
}

uint8_t *tst_read(const char *path, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf;
	long n;

	if (!f)
		die(path, strerror(errno));
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n)
		die(path, "read failed");
	buf[n] = 0;
	fclose(f);
	*ret_len = (size_t)n;
	return buf;
}

void tst_write(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");

	if (!f)
		die(path, strerror(errno));
	if (fwrite(buf, 1, len, f) != len || fclose(f))
		die(path, "write failed");
}

void tst_sft_load(const char *path, struct tst_sft *ret)
{
	struct tst_sft s = { 0 };
	uint64_t hlen = 0;
	json_error_t jerr;
	json_t *root, *v;
	const char *key;
	int i = 0;

	s.buf = tst_read(path, &s.len);
	if (s.len < 8)
		die(path, "too short");
	for (int b = 7; b >= 0; b--)
		hlen = hlen << 8 | s.buf[b];
	if (hlen > s.len - 8)
		die(path, "header length");
	s.data_start = 8 + hlen;
	root = json_loadb((const char *)s.buf + 8, hlen, 0, &jerr);
	if (!root)
		die(path, jerr.text);
	s.t = calloc(json_object_size(root), sizeof(*s.t));
	json_object_foreach(root, key, v) {
		struct tst_tensor *t;
		json_t *shape, *offs;

		if (!strcmp(key, "__metadata__")) {
			s.metadata_json = json_dumps(v, JSON_COMPACT |
							JSON_SORT_KEYS);
			continue;
		}
		t = &s.t[i++];
		snprintf(t->name, sizeof(t->name), "%s", key);
		snprintf(t->dtype, sizeof(t->dtype), "%s",
			 json_string_value(json_object_get(v, "dtype")));
		shape = json_object_get(v, "shape");
		t->n_dims = (int)json_array_size(shape);
		for (int d = 0; d < t->n_dims; d++)
			t->shape[d] = json_integer_value(json_array_get(shape,
									(size_t)d));
		offs = json_object_get(v, "data_offsets");
		t->begin = (uint64_t)json_integer_value(json_array_get(offs, 0));
		t->end = (uint64_t)json_integer_value(json_array_get(offs, 1));
		if (t->end < t->begin || s.data_start + t->end > s.len)
			die(path, key);
	}
	s.n = i;
	json_decref(root);
	*ret = s;
}

void tst_sft_free(struct tst_sft *s)
{
	free(s->buf);
	free(s->t);
	free(s->metadata_json);
	memset(s, 0, sizeof(*s));
}

const struct tst_tensor *tst_sft_find(const struct tst_sft *s,
				      const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(s->t[i].name, name))
			return &s->t[i];
	return NULL;
}

const uint8_t *tst_sft_data(const struct tst_sft *s,
			    const struct tst_tensor *t)
{
	return s->buf + s->data_start + t->begin;
}

static int sft_write(const char *path, const struct tst_sft *s,
		     int (*keep)(const char *name, void *arg), void *arg,
		     const char *reshape, const int64_t new_shape[2])
{
	json_t *root = json_object();
	uint64_t off = 0, hlen;
	char *header;
	FILE *f;

	if (s->metadata_json)
		json_object_set_new(root, "__metadata__",
				    json_loads(s->metadata_json, 0, NULL));
	for (int i = 0; i < s->n; i++) {
		const struct tst_tensor *t = &s->t[i];
		json_t *o, *shape, *offs;

		if (!keep(t->name, arg))
			continue;
		o = json_object();
		shape = json_array();
		offs = json_array();
		if (reshape && !strcmp(t->name, reshape)) {
			json_array_append_new(shape, json_integer(new_shape[0]));
			json_array_append_new(shape, json_integer(new_shape[1]));
		} else {
			for (int d = 0; d < t->n_dims; d++)
				json_array_append_new(shape,
						      json_integer(t->shape[d]));
		}
		json_array_append_new(offs, json_integer((json_int_t)off));
		json_array_append_new(offs, json_integer((json_int_t)(off + t->end -
								    t->begin)));
		json_object_set_new(o, "dtype", json_string(t->dtype));
		json_object_set_new(o, "shape", shape);
		json_object_set_new(o, "data_offsets", offs);
		json_object_set_new(root, t->name, o);
		off += t->end - t->begin;
	}
	header = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	hlen = strlen(header);
	f = fopen(path, "wb");
	if (!f) {
		free(header);
		return -1;
	}
	for (int b = 0; b < 8; b++)
		fputc((int)(hlen >> (8 * b)) & 0xff, f);
	fwrite(header, 1, hlen, f);
	free(header);
	for (int i = 0; i < s->n; i++) {
		const struct tst_tensor *t = &s->t[i];

		if (!keep(t->name, arg))
			continue;
		fwrite(tst_sft_data(s, t), 1, t->end - t->begin, f);
	}
	return fclose(f) ? -1 : 0;
}

static int keep_all_but(const char *name, void *arg)
{
	return !arg || strcmp(name, arg);
}

int tst_sft_write(const char *path, const struct tst_sft *s, const char *skip,
		  const char *reshape, const int64_t new_shape[2])
{
	return sft_write(path, s, keep_all_but, (void *)skip, reshape,
			 new_shape);
}

int tst_sft_write_subset(const char *path, const struct tst_sft *s,
			 int (*keep)(const char *name, void *arg), void *arg)
{
	return sft_write(path, s, keep, arg, NULL, NULL);
}

void tst_model_links(const char *src, const char *dir, const char *omit)
{
	static const char *names[] = { "config.json", "generation_config.json",
				       "tokenizer.json",
				       "tokenizer_config.json" };

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char from[4096], to[4096];

		if (omit && !strcmp(omit, names[i]))
			continue;
		snprintf(from, sizeof(from), "%s/%s", src, names[i]);
		snprintf(to, sizeof(to), "%s/%s", dir, names[i]);
		if (access(from, R_OK) == 0 && symlink(from, to) < 0)
			die(to, strerror(errno));
	}
}

/* E2M1 magnitudes by code 0..7 (OCP MX v1.0 table: E2M1, bias 1). */
static const double e2m1_mag[8] = { 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0 };

/* Nearest E2M1 code to v, ties to the even code (mantissa bit 0), clamped
 * to the largest normal (6); sign kept (so -0.1 gives code 8, -0). */
static uint8_t ref_e2m1(double v, int *n_ties)
{
	uint8_t sign = signbit(v) ? 8 : 0;
	double a = fabs(v), best_d = INFINITY;
	int best = 0;

	if (a >= 6.0)
		return sign | 7;
	for (int i = 0; i < 8; i++) {
		double d = fabs(a - e2m1_mag[i]);

		if (d < best_d) {
			best_d = d;
			best = i;
		} else if (d == best_d) {
			(*n_ties)++;
			if ((i & 1) == 0)
				best = i;
		}
	}
	return sign | (uint8_t)best;
}

void tst_ref_mxfp4_block(const float x[32], uint8_t *ret_scale,
			 uint8_t codes[16], int *ret_n_ties)
{
	double amax = 0.0;
	int e = 0, shared, byte;
	int n_ties = 0;

	for (int i = 0; i < 32; i++)
		amax = fmax(amax, fabs((double)x[i]));
	if (amax == 0.0) {
		byte = 0;
	} else {
		/* amax = f * 2^e, f in [0.5, 1): floor(log2 amax) = e - 1;
		 * shared exponent = floor(log2 amax) - emax(E2M1) = e - 1 - 2 */
		frexp(amax, &e);
		shared = e - 1 - 2;
		byte = shared + 127;
		if (byte < 0)
			byte = 0;
		if (byte > 254)
			byte = 254;
	}
	*ret_scale = (uint8_t)byte;
	for (int j = 0; j < 16; j++) {
		uint8_t lo = ref_e2m1(ldexp((double)x[2 * j], 127 - byte), &n_ties);
		uint8_t hi = ref_e2m1(ldexp((double)x[2 * j + 1], 127 - byte),
				      &n_ties);

		codes[j] = (uint8_t)(lo | hi << 4);
	}
	if (ret_n_ties)
		*ret_n_ties += n_ties;
}

uint8_t tst_ref_e2m1(double v)
{
	int ties = 0;

	return isnan(v) ? 0 : ref_e2m1(v, &ties);
}

double tst_e2m1_value(uint8_t code)
{
	return (code & 8 ? -1.0 : 1.0) * e2m1_mag[code & 7];
}

/* OFP8 E4M3 (bias 7): exponent field e, mantissa m; e = 0 subnormal
 * m/8 * 2^-6; S.1111.111 NaN. */
double tst_e4m3_value(uint8_t b)
{
	int e = (b >> 3) & 15, m = b & 7;
	double v;

	if (e == 15 && m == 7)
		return NAN;
	v = e == 0 ? m / 8.0 * ldexp(1.0, -6) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
	return b & 0x80 ? -v : v;
}

uint8_t tst_ref_e4m3(double v)
{
	uint8_t sign = signbit(v) ? 0x80 : 0;
	double a = fabs(v);
	int lo = 0, hi = 0x7e;

	if (isnan(v))
		return 0x7f;
	if (a >= 448.0)
		return sign | 0x7e;
	/* the non-negative finite codes 0x00..0x7e increase with their value:
	 * find the last one <= a by bisection, then the nearer of it and the
	 * next; on a tie the code with mantissa bit 0 (even) wins */
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;

		if (tst_e4m3_value((uint8_t)mid) <= a)
			lo = mid;
		else
			hi = mid - 1;
	}
	if (lo < 0x7e) {
		double dl = a - tst_e4m3_value((uint8_t)lo);
		double dh = tst_e4m3_value((uint8_t)(lo + 1)) - a;

		if (dh < dl || (dh == dl && ((lo + 1) & 1) == 0))
			lo++;
	}
	return sign | (uint8_t)lo;
}

void tst_ref_nvfp4_block(const float x[16], float global, uint8_t *ret_scale,
			 uint8_t codes[8])
{
	float amax = 0.0f, q, d;
	uint8_t s;

	for (int i = 0; i < 16; i++)
		amax = fmaxf(amax, fabsf(x[i]));
	/* the float32 operations the format defines: (amax / 6) / global */
	q = amax / 6.0f;
	q = q / global;
	s = tst_ref_e4m3(q);
	*ret_scale = s;
	d = (float)tst_e4m3_value(s) * global;
	for (int j = 0; j < 8; j++) {
		uint8_t lo = d == 0.0f ? 0 : tst_ref_e2m1(x[2 * j] / d);
		uint8_t hi = d == 0.0f ? 0 : tst_ref_e2m1(x[2 * j + 1] / d);

		codes[j] = (uint8_t)(lo | hi << 4);
	}
}

void tst_ref_e2m1f16_group(const float *x, int n, uint16_t *ret_scale,
			   uint8_t *codes)
{
	float amax = 0.0f, s;
	_Float16 h;
	uint16_t bits;

	for (int i = 0; i < n; i++)
		amax = fmaxf(amax, fabsf(x[i]));
	/* binary16 by the compiler's own conversion (nearest-even) */
	h = (_Float16)(amax / 6.0f);
	if ((float)h > 65504.0f)
		h = (_Float16)65504.0f;
	memcpy(&bits, &h, 2);
	*ret_scale = bits;
	s = (float)h;
	for (int i = 0; i < n; i++)
		codes[i] = s == 0.0f ? 0 : tst_ref_e2m1(x[i] / s);
}

void tst_ref_fp8_block(const float *x, int n, float *ret_scale, uint8_t *codes)
{
	float amax = 0.0f, s;

	for (int i = 0; i < n; i++)
		amax = fmaxf(amax, fabsf(x[i]));
	s = amax / 448.0f;
	*ret_scale = s;
	for (int i = 0; i < n; i++)
		codes[i] = s == 0.0f ? 0 : tst_ref_e4m3(x[i] / s);
}

float tst_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(a, b);
}

void tst_snapshot(const char *dir, struct tst_snap *ret)
{
	DIR *d = opendir(dir);
	struct dirent *de;

	memset(ret, 0, sizeof(*ret));
	if (!d)
		die(dir, strerror(errno));
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		if (ret->n == 64)
			die(dir, "too many files");
		snprintf(ret->names[ret->n++], 256, "%s", de->d_name);
	}
	closedir(d);
	qsort(ret->names, (size_t)ret->n, 256, cmp_str);
	for (int i = 0; i < ret->n; i++) {
		char path[4096];
		size_t len;
		uint8_t *b;

		snprintf(path, sizeof(path), "%s/%s", dir, ret->names[i]);
		b = tst_read(path, &len);
		ret->sizes[i] = len;
		ret->hashes[i] = XXH3_64bits(b, len);
		free(b);
	}
}

int tst_snap_equal(const struct tst_snap *a, const struct tst_snap *b)
{
	if (a->n != b->n)
		return 0;
	for (int i = 0; i < a->n; i++)
		if (strcmp(a->names[i], b->names[i]) ||
		    a->sizes[i] != b->sizes[i] || a->hashes[i] != b->hashes[i])
			return 0;
	return 1;
}

int tst_dirs_differ(const char *a, const char *b)
{
	struct tst_snap sa, sb;
	int bad = 0;

	tst_snapshot(a, &sa);
	tst_snapshot(b, &sb);
	if (sa.n != sb.n) {
		fprintf(stderr, "%s has %d files, %s has %d\n", a, sa.n, b, sb.n);
		return 1;
	}
	for (int i = 0; i < sa.n; i++) {
		char pa[4096], pb[4096];
		uint8_t *ba, *bb;
		size_t la, lb;

		if (strcmp(sa.names[i], sb.names[i])) {
			fprintf(stderr, "file %s vs %s\n", sa.names[i],
				sb.names[i]);
			bad++;
			continue;
		}
		snprintf(pa, sizeof(pa), "%s/%s", a, sa.names[i]);
		snprintf(pb, sizeof(pb), "%s/%s", b, sb.names[i]);
		ba = tst_read(pa, &la);
		bb = tst_read(pb, &lb);
		if (la != lb || memcmp(ba, bb, la)) {
			fprintf(stderr, "%s differs\n", sa.names[i]);
			bad++;
		}
		free(ba);
		free(bb);
	}
	return bad;
}

void tst_flip_byte(const char *path, uint64_t off)
{
	FILE *f = fopen(path, "r+b");
	int c;

	if (!f)
		die(path, strerror(errno));
	fseek(f, (long)off, SEEK_SET);
	c = fgetc(f);
	if (c == EOF)
		die(path, "offset past the end");
	fseek(f, (long)off, SEEK_SET);
	fputc(c ^ 1, f);
	fclose(f);
}

int tst_count_prefix(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)))
		n += !strncmp(de->d_name, prefix, strlen(prefix));
	closedir(d);
	return n;
}

/*
 * store_testlib.h — helpers of the store tests, independent of the code
 * under test: a minimal safetensors reader and writer (to read reference
 * bytes and to build broken checkpoints), a reference MXFP4 quantizer
 * written from the OCP MX v1.0 spec, and directory snapshots.
 */
#ifndef STORE_TESTLIB_H
#define STORE_TESTLIB_H

#include <stddef.h>
#include <stdint.h>

struct tst_tensor {
	char name[256];
	char dtype[16];
	int n_dims;
	int64_t shape[8];
	uint64_t begin, end;  /* offsets relative to the data section */
};

struct tst_sft {
	uint8_t *buf;          /* the whole file */
	size_t len;
	uint64_t data_start;   /* 8 + header length */
	int n;
	struct tst_tensor *t;
	char *metadata_json;   /* "__metadata__" object as JSON, or NULL */
};

/* Reads and parses a safetensors file; aborts the test on any problem. */
void tst_sft_load(const char *path, struct tst_sft *ret);
void tst_sft_free(struct tst_sft *s);
const struct tst_tensor *tst_sft_find(const struct tst_sft *s,
				      const char *name);
const uint8_t *tst_sft_data(const struct tst_sft *s,
			    const struct tst_tensor *t);

/*
 * Writes a safetensors file holding the tensors of `s` except `skip`
 * (name or NULL); if `reshape` is non-NULL, that tensor gets the shape
 * new_shape[0..1] (same byte count).  Returns 0 or -1.
 */
int tst_sft_write(const char *path, const struct tst_sft *s, const char *skip,
		  const char *reshape, const int64_t new_shape[2]);

/* Writes the tensors for which keep(name, arg) is true.  0 or -1. */
int tst_sft_write_subset(const char *path, const struct tst_sft *s,
			 int (*keep)(const char *name, void *arg), void *arg);

/* Makes dir a checkpoint: symlinks to src's config.json, tokenizer files
 * and generation_config.json (those present); the caller writes the
 * safetensors.  Skips `omit` (base name or NULL). */
void tst_model_links(const char *src, const char *dir, const char *omit);

/* Reference MXFP4 quantization of one 32-element block (OCP MX v1.0,
 * section 6.3): scale byte and 16 code bytes in OCP nibble order. */
void tst_ref_mxfp4_block(const float x[32], uint8_t *ret_scale,
			 uint8_t codes[16], int *ret_n_ties);

/* E2M1 (OCP MX v1.0): nearest code to v, ties to the even code, clamped
 * at +-6, sign kept (-0.1 gives code 8); NaN gives 0.  And a code's value. */
uint8_t tst_ref_e2m1(double v);
double tst_e2m1_value(uint8_t code);

/* E4M3 (OFP8 v1.0): a byte's value (NaN for 0x7F/0xFF), and the nearest
 * code to v (bisection over the codes in value order, then the nearer
 * neighbour), ties to the even code, saturating at +-448
 * (PITFALLS P9); NaN gives 0x7F. */
double tst_e4m3_value(uint8_t b);
uint8_t tst_ref_e4m3(double v);

/*
 * Reference quantizers of the expert formats, written from their
 * definitions (st_formats.h documents the same float32 operations) with
 * the roundings above:
 *  - NVFP4 block of 16 with tensor scale `global`: scale byte
 *    e4m3((amax / 6) / global), codes e2m1(x / (e4m3(scale) * global))
 *    in OCP nibble order (0 when that product is 0);
 *  - E2M1 with FP16 group scale: fp16(amax / 6) (the compiler's
 *    _Float16 conversion, clamped to 65504), one code per element
 *    (unpacked) e2m1(x / scale), 0 when the scale is 0;
 *  - FP8 with FP32 block scale: amax / 448, codes e4m3(x / scale), 0 when
 *    the scale is 0.
 */
void tst_ref_nvfp4_block(const float x[16], float global, uint8_t *ret_scale,
			 uint8_t codes[8]);
void tst_ref_e2m1f16_group(const float *x, int n, uint16_t *ret_scale,
			   uint8_t *codes);
void tst_ref_fp8_block(const float *x, int n, float *ret_scale,
		       uint8_t *codes);

/* BF16 bits -> float (the upper half of binary32). */
float tst_bf16(uint16_t h);

/* Snapshot of a directory: sorted file names with sizes and XXH3. */
struct tst_snap {
	int n;
	char names[64][256];
	uint64_t sizes[64], hashes[64];
};
void tst_snapshot(const char *dir, struct tst_snap *ret);
int tst_snap_equal(const struct tst_snap *a, const struct tst_snap *b);

/* Byte-compares every file of two directories (same names).  Returns the
 * number of differing / missing files, printing each. */
int tst_dirs_differ(const char *a, const char *b);

/* Reads a whole file (aborts on failure); *ret_len its size. */
uint8_t *tst_read(const char *path, size_t *ret_len);
void tst_write(const char *path, const void *buf, size_t len);

/* Flips bit 0 of the byte at `off` of a file. */
void tst_flip_byte(const char *path, uint64_t off);

/* Number of entries of `dir` whose name starts with `prefix`. */
int tst_count_prefix(const char *dir, const char *prefix);

#endif

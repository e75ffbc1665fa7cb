/*
 * st_engram_hash.h — the DeepSeek-V4.1 Engram n-gram hash: which rows of
 * an Engram layer's embedding table a position reads
 * (../shared/MODEL_FAMILY_DEEPSEEK_V4.md section 3.5; HF
 * DeepseekV41NgramHashState).
 *
 * The hash inputs (compressed token map, multipliers, primes, offsets) are
 * frozen at conversion time: they come from engram_hash.json next to the
 * checkpoint (the tiny fixture ships one) and travel in the store as a
 * binary file with a checksum (st_engram_hash_save / st_engram_hash_load).
 * A runtime never rebuilds the token map (it needs Unicode normalisation).
 *
 * For the n-gram ending at position p and Engram layer li:
 *   tok[s] = map[token[p - s]] for s = 0 .. max_ngram-1; when p < s or a
 *            DEAD token is met, that slot and every larger one take the
 *            compressed pad id (the block is sticky);
 *   prod[s] = tok[s] * mult[li][s] (int64; cannot overflow: validated
 *            mult <= (2^63-1)/C);
 *   rho = prod[0]; for n = 1 .. max_ngram-1: rho ^= prod[n]; for each
 *            head h: row = rho mod prime[li][n-1][h] + offset[li][(n-1)*heads + h].
 * Each layer's table is addressed from its own row 0; its row count is the
 * sum of the layer's primes (config engram_num_embeddings).
 */
#ifndef ST_ENGRAM_HASH_H
#define ST_ENGRAM_HASH_H

#include <stdint.h>

#include "st_error.h"

/* A token id that marks a DEAD position (image span, padding): it and all
 * older slots hash as the compressed pad id. */
#define ST_ENGRAM_TOKEN_DEAD (-1)

/* Name of the hash file inside a store directory. */
#define ST_ENGRAM_HASH_FILE "engram_hash.bin"

struct st_engram_hash;

/*
 * Reads engram_hash.json (keys: token_map [vocab] ints, compressed_vocab_size
 * C, compressed_pad_id, pad_token_id, layer_ids [L], max_ngram_size,
 * n_heads, multipliers [L][max_ngram], primes [L][max_ngram-1][heads],
 * offsets [L][(max_ngram-1)*heads]) with jansson.
 * Validates: every map entry in [0, C); compressed_pad_id < C and equal to
 * map[pad_token_id]; 0 < mult <= (2^63-1)/C; primes > 0; offsets[0] == 0
 * and offsets[c] == offsets[c-1] + primes[c-1] (so a layer's rows are
 * [0, sum of its primes)).
 * On success *ret is owned by the caller (st_engram_hash_free).
 * Returns 0, -errno reading the file, -ST_E_FORMAT (not JSON, a key
 * missing or of the wrong shape), -ST_E_CONFIG (a value out of range), or
 * -ENOMEM; diag says which key is wrong.
 */
int st_engram_hash_load_json(const char *path, struct st_engram_hash **ret,
			     struct st_diag *diag);

/* Frees a hash (NULL is fine). */
void st_engram_hash_free(struct st_engram_hash *h);

/* Heads per n-gram size (engram_n_heads). */
int st_engram_hash_heads(const struct st_engram_hash *h);

/* Rows one position reads per Engram layer: (max_ngram - 1) x heads
 * (6 for the tiny fixture, 24 for V4.1-Flash). */
int st_engram_hash_rows_per_pos(const struct st_engram_hash *h);

/* Number of Engram layers the hash describes (engram_layer_ids). */
int st_engram_hash_n_layers(const struct st_engram_hash *h);

/* Model layer id of Engram layer li (0 .. n_layers-1), or -1 out of range. */
int st_engram_hash_layer_id(const struct st_engram_hash *h, int li);

/* Rows of Engram layer li's table (sum of its primes), or -1 out of range. */
int64_t st_engram_hash_table_rows(const struct st_engram_hash *h, int li);

/* Vocabulary size the token map covers (token ids [0, vocab)). */
int st_engram_hash_vocab(const struct st_engram_hash *h);

/*
 * Checks the hash against the model config: n_layers layer ids equal to
 * `layer_ids`, and each layer's table rows equal to num_embeddings[li]
 * (config engram_num_embeddings).  0 or -ST_E_CONFIG naming the mismatch.
 */
int st_engram_hash_check_config(const struct st_engram_hash *h, int n_layers,
				const int *layer_ids,
				const int64_t *num_embeddings,
				struct st_diag *diag);

/*
 * Table row ids (offsets added) of the n-grams ending at position p, Engram
 * layer index li (0 .. n_layers-1); tokens[0..p] are the sequence's token
 * ids (not compressed; ST_ENGRAM_TOKEN_DEAD marks a DEAD position).  Only
 * tokens[p-max_ngram+1 .. p] are read, so a caller may pass a pointer into
 * a longer history.  Writes rows_per_pos ids to out_rows, ordered
 * (n-gram size 2..max_ngram) x head, each in [0, table_rows(li)).
 * Returns rows_per_pos, or -EINVAL (li or p out of range, a token id
 * outside [0, vocab) that is not DEAD).
 */
int st_engram_hash_rows(const struct st_engram_hash *h, int li,
			const int32_t *tokens, int p, int64_t *out_rows);

/*
 * Writes the hash as a little-endian binary file (magic "STENGH01",
 * version, sizes, layer ids, multipliers, primes, offsets, token map, then
 * an XXH3-64 of every preceding byte).  Byte-identical for equal hashes.
 * Returns 0 or -errno.
 */
int st_engram_hash_save(const struct st_engram_hash *h, const char *path,
			struct st_diag *diag);

/*
 * Reads a file written by st_engram_hash_save and validates it as
 * st_engram_hash_load_json does.  On success *ret is owned by the caller.
 * Returns 0, -errno, -ST_E_BADMAGIC, -ST_E_VERSION, -ST_E_CHECKSUM (say:
 * re-run strata convert), -ST_E_FORMAT / -ST_E_CONFIG, -ENOMEM.
 */
int st_engram_hash_load(const char *path, struct st_engram_hash **ret,
			struct st_diag *diag);

#endif

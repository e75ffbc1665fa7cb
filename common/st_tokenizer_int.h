/*
 * st_tokenizer_int.h — private structures of the tokenizer (st_tokenizer*.c
 * only; the public API is st_tokenizer.h).
 *
 * The tokenizer is split by job, following the Hugging Face `tokenizers`
 * pipeline:
 *   st_tokenizer_map.c     open-addressing hash maps (string -> id,
 *                          id pair -> merge), growable byte buffers;
 *   st_tokenizer_text.c    normalizers and pre-tokenizers (PCRE2, utf8proc);
 *   st_tokenizer_bpe.c     the BPE model (vocabulary, merges, byte fallback);
 *   st_tokenizer_decode.c  decoders, the streaming detokenizer, decode();
 *   st_tokenizer.c         loading tokenizer.json / tokenizer_config.json,
 *                          added tokens, the post-processor, encode().
 *
 * Every component is loaded once and immutable afterwards, so one tokenizer
 * can be used from several threads at once.  There is no word cache: the
 * heap-based merge is fast enough (1 MiB of prose in 0.07-0.36 s of CPU,
 * docs/BENCHMARKS.md "Tokenizer encode").
 */
#ifndef ST_TOKENIZER_INT_H
#define ST_TOKENIZER_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "st_error.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* Largest token id accepted from a file (real vocabularies stay far below;
 * the bound keeps a hostile file from sizing the id tables). */
#define STK_MAX_ID (1 << 24)

/* ---- growable byte buffer and id vector ------------------------------- */

/* A zeroed stk_buf is empty and grows on the heap.  One set up with
 * stk_buf_init_local() starts in the caller's storage and moves to the heap
 * only when that is outgrown, so short-lived buffers on hot paths (a token
 * of the streaming detokenizer, a word of the pre-tokenizer) cost no
 * allocation.  stk_buf_free() frees only what is on the heap. */
struct stk_buf {
	char *p;
	size_t len, cap;
	char *local;            /* the caller's storage, or NULL */
};

/* Starts b empty in storage (cap bytes, owned by the caller, which must
 * outlive b's use; cap 0 is a zeroed buffer). */
void stk_buf_init_local(struct stk_buf *b, char *storage, size_t cap);
int stk_buf_put(struct stk_buf *b, const void *src, size_t n);
int stk_buf_putc(struct stk_buf *b, char c);
void stk_buf_free(struct stk_buf *b);

struct stk_ids {
	int32_t *p;
	size_t n, cap;
};

int stk_ids_push(struct stk_ids *v, int32_t id);

/* A list of byte ranges into one buffer (pieces of text being split). */
struct stk_piece {
	size_t off, len;
};

struct stk_pieces {
	struct stk_buf text;
	struct stk_piece *p;
	size_t n, cap;
};

int stk_pieces_add(struct stk_pieces *ps, size_t off, size_t len);
/* Appends len bytes of src to the text and adds them as one piece. */
int stk_pieces_add_text(struct stk_pieces *ps, const char *src, size_t len);
void stk_pieces_free(struct stk_pieces *ps);

/* ---- hash maps --------------------------------------------------------- */

/* String -> int32 map; keys are copied into an arena. */
struct stk_strmap {
	struct stk_strmap_slot {
		uint64_t hash;
		uint32_t off;   /* key offset in arena */
		uint32_t len;   /* UINT32_MAX: empty slot */
		int32_t val;
	} *slots;
	size_t cap;             /* power of two */
	size_t n;
	struct stk_buf arena;
};

int stk_strmap_init(struct stk_strmap *m, size_t expect);
void stk_strmap_free(struct stk_strmap *m);
/* Inserts or overwrites.  0 or -ENOMEM. */
int stk_strmap_put(struct stk_strmap *m, const char *key, size_t len,
		   int32_t val);
/* Value for key, or -1. */
int32_t stk_strmap_get(const struct stk_strmap *m, const char *key, size_t len);

/* (id a, id b) -> (merge rank, merged id). */
struct stk_pairmap {
	struct stk_pair_slot {
		uint64_t key;   /* (a << 32) | b; UINT64_MAX: empty */
		uint32_t rank;
		int32_t new_id;
	} *slots;
	size_t cap;
	size_t n;
};

int stk_pairmap_init(struct stk_pairmap *m, size_t expect);
void stk_pairmap_free(struct stk_pairmap *m);
int stk_pairmap_put(struct stk_pairmap *m, int32_t a, int32_t b,
		    uint32_t rank, int32_t new_id);
/* 1 with *rank and *new_id set if the pair merges, else 0. */
int stk_pairmap_get(const struct stk_pairmap *m, int32_t a, int32_t b,
		    uint32_t *rank, int32_t *new_id);

/* ---- UTF-8 helpers ----------------------------------------------------- */

/*
 * Classifies the n >= 1 bytes at s (Unicode 15, table 3-7, well-formed
 * UTF-8): > 0, the length of the complete character there; 0 when all n
 * bytes are a well-formed but incomplete start of a character; < 0, minus
 * the length of the maximal ill-formed subpart (replaced by one U+FFFD, as
 * Rust's from_utf8_lossy and the WHATWG decoder do).
 */
int stk_utf8_step(const uint8_t *s, size_t n);
/* Encodes code point cp; returns the number of bytes (1..4). */
size_t stk_utf8_put(uint32_t cp, char *out);
/* Decodes the (valid) character at s into *cp; returns its length. */
size_t stk_utf8_get(const char *s, size_t n, uint32_t *cp);
/* Copies text, replacing every invalid sequence (maximal subpart) by U+FFFD. */
int stk_utf8_sanitize(const char *s, size_t n, struct stk_buf *out);

/* True for code points with Unicode's White_Space property (Rust's
 * char::is_whitespace, used by the HF normalizers and added tokens). */
int stk_is_space(uint32_t cp);

/* GPT-2 byte <-> unicode map (bytes_to_unicode of GPT-2's encoder.py). */
uint32_t stk_byte_to_cp(uint8_t b);
/* Byte for code point cp, or -1 when cp is not in the map. */
int stk_cp_to_byte(uint32_t cp);

/* ---- normalizers and pre-tokenizers (st_tokenizer_text.c) -------------- */

enum stk_norm_kind {
	STK_NORM_NFC, STK_NORM_NFD, STK_NORM_NFKC, STK_NORM_NFKD,
	STK_NORM_LOWERCASE, STK_NORM_PREPEND, STK_NORM_REPLACE,
	STK_NORM_STRIP, STK_NORM_STRIP_ACCENTS,
};

struct stk_norm {
	enum stk_norm_kind kind;
	char *str;              /* Prepend text, Replace String pattern */
	char *content;          /* Replace content */
	pcre2_code *re;         /* Replace Regex pattern */
	int left, right;        /* Strip */
};

enum stk_split_behavior {
	STK_SPLIT_REMOVED, STK_SPLIT_ISOLATED, STK_SPLIT_MERGED_PREV,
	STK_SPLIT_MERGED_NEXT, STK_SPLIT_CONTIGUOUS,
};

enum stk_pre_kind {
	STK_PRE_SPLIT, STK_PRE_BYTELEVEL, STK_PRE_METASPACE,
};

enum stk_prepend_scheme { STK_PREPEND_ALWAYS, STK_PREPEND_FIRST, STK_PREPEND_NEVER };

struct stk_pre {
	enum stk_pre_kind kind;
	/* Split: a regex or a literal string */
	pcre2_code *re;
	char *literal;
	enum stk_split_behavior behavior;
	int invert;
	/* ByteLevel */
	int add_prefix_space, use_regex;
	/* Metaspace */
	char rep[8];            /* replacement character, UTF-8 */
	enum stk_prepend_scheme prepend;
	int split;
};

struct stk_text {
	struct stk_norm *norm;
	int n_norm;
	struct stk_pre *pre;
	int n_pre;
	pcre2_code *gpt2_re;    /* compiled when a ByteLevel step uses it */
	char byte_chars[256][2];/* GPT-2 code point of each byte, as UTF-8 */
	uint8_t byte_nchars[256];
};

/* Parses the "normalizer" and "pre_tokenizer" objects (either may be null). */
int stk_text_load(struct stk_text *tx, json_t *normalizer, json_t *pre,
		  struct st_diag *diag);
void stk_text_free(struct stk_text *tx);
/* Applies the normalizers to len bytes of s, into out (replaced). */
int stk_text_normalize(const struct stk_text *tx, const char *s, size_t len,
		       struct stk_buf *out);
/* Pre-tokenizes one segment into pieces (out is reset first).  first: the
 * segment starts at offset 0 of the original text (Metaspace "first"). */
int stk_text_pretokenize(const struct stk_text *tx, const char *s, size_t len,
			 int first, struct stk_pieces *out);

/* ---- BPE model (st_tokenizer_bpe.c) ------------------------------------ */

#define STK_CHAR_IDS 0x800      /* code points with a char_ids entry */

struct stk_bpe {
	struct stk_strmap vocab;
	struct stk_pairmap merges;
	int32_t unk_id;         /* -1 when none */
	int byte_fallback, fuse_unk, ignore_merges;
	char *cont_prefix;      /* continuing_subword_prefix or NULL */
	char *eow_suffix;       /* end_of_word_suffix or NULL */
	int32_t byte_ids[256];  /* ids of <0xXX> tokens, -1 if absent */
	/* id of each one-character token below U+0800 (ASCII, GPT-2's byte
	 * characters, most alphabets), -1 if absent: a word's characters are
	 * looked up here instead of hashed (the vocabulary says the same) */
	int32_t char_ids[STK_CHAR_IDS];
	int32_t max_id;         /* largest id in the vocabulary */
};

int stk_bpe_load(struct stk_bpe *m, json_t *model, struct st_diag *diag);
void stk_bpe_free(struct stk_bpe *m);
/* Tokenizes one pre-token word, appending ids to out. */
int stk_bpe_word(const struct stk_bpe *m, const char *w, size_t len,
		 struct stk_ids *out);

/* ---- decoders (st_tokenizer_decode.c) ---------------------------------- */

enum stk_dec_kind {
	STK_DEC_BYTELEVEL, STK_DEC_REPLACE, STK_DEC_BYTEFALLBACK, STK_DEC_FUSE,
	STK_DEC_STRIP, STK_DEC_METASPACE,
};

struct stk_dec {
	enum stk_dec_kind kind;
	char *pattern, *content;        /* Replace; Strip content (one char) */
	int start, stop;                /* Strip */
	int joined;                     /* Strip after Fuse/ByteLevel: whole text */
	char rep[8];                    /* Metaspace replacement */
	int prepend;                    /* Metaspace prepend_scheme != never */
};

struct stk_decoder {
	struct stk_dec *d;
	int n;
	int strip_start;        /* chars stripped at the start of the whole text */
	char strip_content[8];
	int strip_stop;         /* chars stripped at the end (full decode only) */
	int join_space;         /* no decoder: tokens joined with " " (HF) */
	int16_t cp_byte[0x144]; /* ByteLevel: code point -> byte, -1 if none */
};

int stk_decoder_load(struct stk_decoder *dc, json_t *decoder,
		     struct st_diag *diag);
void stk_decoder_free(struct stk_decoder *dc);

/* ---- the tokenizer ----------------------------------------------------- */

struct stk_added {
	char *content;
	size_t len;
	int32_t id;
	int special, lstrip, rstrip, normalized, single_word;
};

struct st_tokenizer {
	struct stk_bpe bpe;
	struct stk_text text;
	struct stk_decoder dec;

	/* sorted by first byte, then longest first; added_first[b] is the
	 * index of the first one starting with byte b (n_added if none) */
	struct stk_added *added;
	int n_added;
	int added_first[257];

	/* id -> token string (vocabulary or added) at id_arena.p + id_off[id],
	 * id_len[id] bytes; id_len UINT32_MAX where the id has no string */
	uint32_t *id_off;
	uint32_t *id_len;
	uint8_t *id_special;
	int32_t n_ids;                  /* largest known id + 1 */
	struct stk_buf id_arena;

	int32_t bos_id, eos_id;
	int32_t *prefix_ids, *suffix_ids;       /* added by add_special */
	int n_prefix, n_suffix;
};

/* Token string of id, or NULL (unknown / padding id). */
static inline const char *stk_id_str(const struct st_tokenizer *t, int32_t id,
				     size_t *ret_len)
{
	if (id < 0 || id >= t->n_ids || t->id_len[id] == UINT32_MAX)
		return NULL;
	*ret_len = t->id_len[id];
	return t->id_arena.p + t->id_off[id];
}

#endif

/*
 * st_tokenizer.h — text <-> token ids with a checkpoint's tokenizer.json.
 *
 * Supported (Hugging Face `tokenizers` semantics):
 *  - model BPE with merges (as "a b" strings or ["a", "b"] pairs), optional
 *    byte_fallback (<0xXX> tokens) and unk_token / fuse_unk;
 *  - normalizers: null, NFC (utf8proc), Prepend, Replace (String pattern),
 *    Sequence of these;
 *  - pre-tokenizers: null, ByteLevel (GPT-2 byte-to-unicode map; use_regex
 *    with the GPT-2 regex; add_prefix_space), Split with a Regex pattern
 *    (PCRE2, behaviour Isolated), Metaspace (replacement, prepend_scheme),
 *    Sequence of these;
 *  - decoders: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
 *    Sequence;
 *  - post-processor TemplateProcessing / tokenizer_config.json add_bos_token
 *    (BOS added only when tokenizer_config.json says so: kjv-moe no, Mixtral
 *    yes, Qwen no);
 *  - added tokens (special or not) matched in the input text before the
 *    model runs, longest first, when parse_special is set (PITFALLS P3:
 *    user content is encoded with parse_special = 0).
 */
#ifndef ST_TOKENIZER_H
#define ST_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

struct st_tokenizer;

/*
 * Loads DIR/tokenizer.json and DIR/tokenizer_config.json (the latter
 * optional).  *ret owned by the caller (st_tokenizer_free).
 * Errors: -ENOENT, -ST_E_TOKENIZER (unsupported component, named in diag).
 */
int st_tokenizer_load(const char *dir, struct st_tokenizer **ret,
		      struct st_diag *diag);
void st_tokenizer_free(struct st_tokenizer *t);

/*
 * Encodes len bytes of UTF-8 text.  add_special: add BOS (and whatever the
 * post-processor template adds) as tokenizer_config.json says;
 * parse_special: recognise added/special tokens spelled in the text.
 * *ret_ids is malloc'd (caller frees), *ret_n its length.
 * Errors: -EINVAL (invalid UTF-8 is replaced, not an error: HF behaviour is
 * to keep bytes), -ENOMEM, -ST_E_TOKENIZER.
 */
int st_tokenizer_encode(const struct st_tokenizer *t, const char *text,
			size_t len, int add_special, int parse_special,
			int32_t **ret_ids, size_t *ret_n);

/*
 * Decodes ids to text (malloc'd, NUL-terminated, caller frees).
 * skip_special: drop special tokens' text.  Ids without text (padding rows
 * beyond the vocabulary, or out of range) produce nothing, never a crash.
 */
int st_tokenizer_decode(const struct st_tokenizer *t, const int32_t *ids,
			size_t n, int skip_special, char **ret_text);

/* Streaming detokenizer: emits only complete UTF-8 characters, holding back
 * a character split across tokens until its last byte arrives. */
struct st_detok {
	const struct st_tokenizer *tok;
	int skip_special;
	int n_emitted_tokens;   /* for decoders that strip the first space */
	uint8_t pending[16];    /* incomplete UTF-8 bytes held back */
	int n_pending;
};

void st_detok_init(struct st_detok *d, const struct st_tokenizer *t,
		   int skip_special);
/*
 * Pushes one id; writes the newly completed text into out (capacity cap
 * bytes, NUL-terminated) and returns its length (>= 0), or -ENOSPC.
 * cap of 256 is always enough for one token.
 */
int st_detok_push(struct st_detok *d, int32_t id, char *out, size_t cap);
/* Flushes held-back bytes (as U+FFFD for an incomplete character). */
int st_detok_flush(struct st_detok *d, char *out, size_t cap);

/* Vocabulary size the tokenizer knows (model vocab + added tokens; may be
 * smaller than the model's embedding rows). */
int st_tokenizer_n_vocab(const struct st_tokenizer *t);
/* BOS id, or -1.  EOS id from tokenizer_config.json, or -1. */
int st_tokenizer_bos_id(const struct st_tokenizer *t);
int st_tokenizer_eos_id(const struct st_tokenizer *t);
/* Id of an exact token string (vocab or added), or -1. */
int st_tokenizer_token_id(const struct st_tokenizer *t, const char *token);
/* 1 if id is a special added token. */
int st_tokenizer_is_special(const struct st_tokenizer *t, int32_t id);

#endif

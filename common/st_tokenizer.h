/*
 * st_tokenizer.h — text <-> token ids with a checkpoint's tokenizer.json.
 *
 * Supported (Hugging Face `tokenizers` semantics):
 *  - model BPE with merges (as "a b" strings or ["a", "b"] pairs), optional
 *    byte_fallback (<0xXX> tokens) and unk_token / fuse_unk;
 *  - normalizers: null, NFC / NFD / NFKC / NFKD (utf8proc), Lowercase,
 *    StripAccents, Strip, Prepend, Replace (String or Regex pattern),
 *    Sequence of these;
 *  - pre-tokenizers: null, ByteLevel (GPT-2 byte-to-unicode map; use_regex
 *    with the GPT-2 regex; add_prefix_space), Split with a Regex (PCRE2,
 *    UTF + UCP) or String pattern and any behaviour / invert, Metaspace
 *    (replacement, prepend_scheme, split), Digits, Punctuation,
 *    Whitespace, WhitespaceSplit, Sequence of these;
 *  - decoders: ByteLevel, Replace (String), ByteFallback, Fuse, Strip,
 *    Metaspace, Sequence;
 *  - BOS / EOS: tokenizer_config.json's add_bos_token / add_eos_token when
 *    it has either flag (kjv-moe no, Mixtral yes, Qwen no), else the
 *    post_processor (TemplateProcessing "single", Roberta / Bert
 *    processing; ByteLevel and Sequence are understood);
 *  - added tokens matched in the input text before the model runs,
 *    leftmost and then longest first, with lstrip / rstrip / single_word /
 *    normalized: special ones only when parse_special is set (PITFALLS P3:
 *    user content is encoded with parse_special = 0); non-special added
 *    tokens (Qwen's <think>) always, as HF and llama.cpp do.
 *
 * Not supported (load fails with -ST_E_TOKENIZER naming the component):
 * WordPiece / Unigram / WordLevel models, the Precompiled and Bert
 * normalizers, BPE dropout (ignored: encoding is deterministic), decoders
 * other than those above.  A loaded tokenizer is immutable; encode and
 * decode may run from several threads at once.
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
 * parse_special: recognise special tokens spelled in the text (non-special
 * added tokens are always recognised, see above).
 * *ret_ids is malloc'd (caller frees; allocated even when *ret_n is 0),
 * *ret_n its length.  Invalid UTF-8 is replaced by U+FFFD, not an error.
 * Errors: -EINVAL (NULL arguments), -ENOMEM, -ST_E_TOKENIZER (a regex
 * failed, e.g. PCRE2's match limit).
 */
int st_tokenizer_encode(const struct st_tokenizer *t, const char *text,
			size_t len, int add_special, int parse_special,
			int32_t **ret_ids, size_t *ret_n);

/*
 * Decodes ids to text (malloc'd, NUL-terminated, caller frees).
 * skip_special: drop special tokens' text.  Ids without text (padding rows
 * beyond the vocabulary, or out of range) produce nothing, never a crash.
 * Ill-formed UTF-8 from byte tokens becomes U+FFFD (one per maximal
 * ill-formed subpart); a decoded U+0000 stays in the text (and cuts it for
 * strlen).  The result equals the concatenation of st_detok chunks.
 * Errors: -EINVAL, -ENOMEM.
 */
int st_tokenizer_decode(const struct st_tokenizer *t, const int32_t *ids,
			size_t n, int skip_special, char **ret_text);

/* Streaming detokenizer: emits only complete UTF-8 characters, holding back
 * a character split across tokens until its last byte arrives.  Plain data,
 * no resources: copy or drop it freely; st_detok_init starts a stream. */
struct st_detok {
	const struct st_tokenizer *tok;
	int skip_special;
	int n_emitted_tokens;   /* tokens decoded so far (Metaspace: token 0) */
	uint8_t pending[16];    /* incomplete UTF-8 bytes held back */
	int n_pending;
	int strip_left;         /* Strip decoder: leading chars still to drop */
};

/* Starts a stream over t's decoder; skip_special as in decode. */
void st_detok_init(struct st_detok *d, const struct st_tokenizer *t,
		   int skip_special);
/*
 * Pushes one id; writes the newly completed text into out (capacity cap
 * bytes, NUL-terminated) and returns its length (>= 0), or -ENOSPC.
 * cap of 256 is always enough for one token (checked for every id of the
 * fixtures' vocabularies).  On -ENOSPC nothing is consumed: push the same
 * id again with more room.  -EINVAL for a detok without tokenizer.
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

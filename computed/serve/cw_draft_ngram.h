/*
 * cw_draft_ngram.h — prompt-lookup (n-gram) drafts for speculative
 * decoding (issue 22 §1a): no extra weights, every model family.
 *
 * The sequence's tokens so far (prompt and generated) are searched for an
 * earlier occurrence of their last n tokens, n from max_ngram down to
 * min_ngram; the tokens that followed the most recent such occurrence are
 * the draft.  This is the prompt-lookup decoding of llama.cpp
 * (`--lookup`, common/ngram-cache) and vLLM's ngram speculator
 * (`prompt_lookup_max` / `prompt_lookup_min`): the draft is deterministic,
 * so its proposal distribution q is a point mass on each draft token.
 */
#ifndef CW_DRAFT_NGRAM_H
#define CW_DRAFT_NGRAM_H

#include <stdint.h>

#define CW_DRAFT_MAX 16        /* draft tokens per step at most */
#define CW_DRAFT_NGRAM_MAX 3   /* longest n-gram matched (default) */
#define CW_DRAFT_NGRAM_MIN 1   /* shortest n-gram matched (default) */
#define CW_DRAFT_DEFAULT_K 4   /* `ngram` without a length */

/*
 * Proposes up to max_draft tokens into ret_draft[max_draft] from
 * ids[0..n) (the sequence so far, borrowed): for n-gram length g from
 * max_ngram down to min_ngram (1 <= min_ngram <= max_ngram), the most
 * recent earlier start j < n - g with ids[j..j+g) == ids[n-g..n) gives the
 * draft ids[j+g .. min(j+g+max_draft, n)).  The first g with a match wins;
 * a match whose continuation is empty does not count.
 * Returns the draft length (0..max_draft; 0: no match, or n <= min_ngram),
 * or -EINVAL for max_draft < 0, min_ngram < 1 or max_ngram < min_ngram.
 * O(n * max_ngram) per call, no allocation.
 */
int cw_draft_ngram(const int32_t *ids, int n, int min_ngram, int max_ngram,
		   int max_draft, int32_t *ret_draft);

/*
 * Parses a --speculate value: "off" (0), "ngram" (CW_DRAFT_DEFAULT_K) or
 * "ngram:K" (K draft tokens, 1..CW_DRAFT_MAX) into *ret_draft_max.
 * 0 or -EINVAL (the caller names the option).
 */
int cw_draft_parse(const char *spec, int *ret_draft_max);

/*
 * As cw_draft_parse, also accepting "auto" (CW_DRAFT_DEFAULT_K) and
 * "auto:K": n-gram drafts of up to K tokens whose length is priced in
 * step time and expert bytes (cw_draft_price.h), *ret_priced 1 (else 0).
 * 0 or -EINVAL.
 */
int cw_draft_parse_mode(const char *spec, int *ret_draft_max,
			int *ret_priced);

/*
 * As cw_draft_parse_mode, also accepting "mtp" (CW_DRAFT_DEFAULT_K) and
 * "mtp:K": drafts from the model's multi-token-prediction block
 * (DeepSeek-V4's mtp.0; cw_model_has_mtp), *ret_mtp 1 (else 0; *ret_priced
 * 0).  0 or -EINVAL.
 */
int cw_draft_parse_src(const char *spec, int *ret_draft_max, int *ret_priced,
		       int *ret_mtp);

#endif

/*
 * fuzz_tokenizer.c — encode and decode with real tokenizers on any input:
 * the text a client sends (prompts, stop strings) and token ids.
 *
 * Tokenizers: the directories in STRATA_FUZZ_TOKENIZERS (colon-separated),
 * else the repository's kjv-moe and the ../shared fixtures that exist
 * (tiny-mixtral: Metaspace + byte fallback, tiny-qwen3moe: ByteLevel with
 * the GPT-2 regex, tiny-deepseek-v4).
 *
 * Input: byte 0 picks the tokenizer (bits 0-1), add_special (bit 2),
 * parse_special (bit 3), skip_special (bit 4) and text or ids (bit 5); the
 * rest is UTF-8-ish text, or little-endian int32 ids (any value).  Checks:
 * encoded ids are inside the vocabulary, and the streaming detokenizer
 * gives the same text as st_tokenizer_decode (st_tokenizer.h promises it).
 */
#include <errno.h>
#include <string.h>

#include "fuzz.h"
#include "st_build_config.h"
#include "st_tokenizer.h"

#define FUZZ_MAX_TOK 4

/* The loaded tokenizers: process-lifetime state of this fuzz target (set
 * once in LLVMFuzzerInitialize, read-only afterwards). */
static struct st_tokenizer *g_tok[FUZZ_MAX_TOK];
static int g_n_tok;

static void load_one(const char *dir)
{
	struct st_diag diag = { { 0 } };
	int r;

	if (g_n_tok == FUZZ_MAX_TOK)
		return;
	r = st_tokenizer_load(dir, &g_tok[g_n_tok], &diag);
	if (r == 0)
		g_n_tok++;
	else if (r != -ENOENT)
		fprintf(stderr, "fuzz_tokenizer: %s: %s\n", dir, diag.msg);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *env = getenv("STRATA_FUZZ_TOKENIZERS");

	if (env && *env) {
		char *list = strdup(env), *save = NULL;

		if (!list)
			return 1;
		for (char *d = strtok_r(list, ":", &save); d;
		     d = strtok_r(NULL, ":", &save))
			load_one(d);
		free(list);
	} else {
		static const char *const dirs[] = {
			ST_SOURCE_ROOT "/models/kjv-moe",
			ST_SOURCE_ROOT "/../shared/fixtures/models/tiny-mixtral",
			ST_SOURCE_ROOT "/../shared/fixtures/models/tiny-qwen3moe",
			ST_SOURCE_ROOT "/../shared/fixtures/models/tiny-deepseek-v4",
		};

		for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
			load_one(dirs[i]);
	}
	if (g_n_tok == 0) {
		fprintf(stderr, "fuzz_tokenizer: no tokenizer loaded (set "
			"STRATA_FUZZ_TOKENIZERS=DIR[:DIR...])\n");
		return 1;
	}
	return 0;
}

/* Appends n bytes to the growing buffer *buf (capacity *cap); 0, or -1
 * out of memory. */
static int append(char **buf, size_t *len, size_t *cap, const char *src,
		  size_t n)
{
	if (n == 0)
		return 0;
	if (*len + n > *cap) {
		size_t c = *cap ? *cap : 256;
		char *p;

		while (c < *len + n)
			c *= 2;
		if (!(p = realloc(*buf, c)))
			return -1;
		*buf = p;
		*cap = c;
	}
	memcpy(*buf + *len, src, n);
	*len += n;
	return 0;
}

/* Decodes ids both ways and checks the two texts agree.  The stream's text
 * goes to a buffer grown as it comes (sized for the worst case, 255 bytes a
 * token, it cost a large allocation per input, most of the run's time). */
static void check_decode(const struct st_tokenizer *t, const int32_t *ids,
			 size_t n, int skip_special)
{
	struct st_detok d;
	char *dec = NULL, *cat = NULL, piece[256];
	size_t cat_len = 0, cat_cap = 0, dec_len;
	int r = st_tokenizer_decode(t, ids, n, skip_special, &dec);

	if (r == -ENOMEM)
		return;
	FUZZ_CHECK(r == 0 && dec, "decode of %zu ids: %d", n, r);
	st_detok_init(&d, t, skip_special);
	for (size_t i = 0; i <= n; i++) {
		int m = i < n ? st_detok_push(&d, ids[i], piece, sizeof(piece))
			      : st_detok_flush(&d, piece, sizeof(piece));

		FUZZ_CHECK(m >= 0 && m < (int)sizeof(piece),
			   "detok of id %zu: %d", i, m);
		if (append(&cat, &cat_len, &cat_cap, piece, (size_t)m)) {
			free(cat);
			free(dec);
			return;
		}
	}
	/* a decoded U+0000 cuts dec for strlen, not the stream */
	dec_len = strlen(dec);
	FUZZ_CHECK(dec_len <= cat_len &&
		   (dec_len == 0 || !memcmp(dec, cat, dec_len)) &&
		   (dec_len == cat_len || cat[dec_len] == '\0'),
		   "decode gave %zu bytes, the stream %zu, and they differ",
		   dec_len, cat_len);
	free(cat);
	free(dec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct st_tokenizer *t;
	int add_special, parse_special, skip_special;

	if (size < 1 || g_n_tok == 0)
		return 0;
	t = g_tok[(data[0] & 3) % g_n_tok];
	add_special = !!(data[0] & 4);
	parse_special = !!(data[0] & 8);
	skip_special = !!(data[0] & 16);
	data++;
	size--;
	if (data[-1] & 32) {
		size_t n = size / 4;
		int32_t *ids = malloc(n ? 4 * n : 4);

		if (!ids)
			return 0;
		memcpy(ids, data, 4 * n);
		check_decode(t, ids, n, skip_special);
		free(ids);
	} else {
		int32_t *ids = NULL;
		size_t n = 0;
		int r = st_tokenizer_encode(t, (const char *)data, size,
					    add_special, parse_special, &ids,
					    &n);
		const int n_vocab = st_tokenizer_n_vocab(t);

		if (r == 0) {
			for (size_t i = 0; i < n; i++)
				FUZZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab,
					   "id %d of %zu outside vocab %d",
					   ids[i], n, n_vocab);
			check_decode(t, ids, n, skip_special);
		} else {
			FUZZ_CHECK(r == -ENOMEM || r == -ST_E_TOKENIZER,
				   "encode: %d", r);
		}
		free(ids);
	}
	return 0;
}

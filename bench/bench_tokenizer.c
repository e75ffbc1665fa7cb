/*
 * strata-bench-tokenizer — encode throughput of real tokenizers, and a dump
 * of the ids they give, to check that a change to the tokenizer keeps every
 * id (issue 20 §5: the tokenizer is on every request's path).
 *
 *   strata-bench-tokenizer [--bytes N] [--text FILE] [--dump] [--file F]... DIR...
 *
 * For each tokenizer directory it encodes a set of texts of about N bytes
 * each (default 1 MiB): prose (FILE, repeated to N bytes; default the
 * repository's kjv-moe valid.txt), runs of one character (BPE's worst case:
 * one pre-token of N bytes, or N one-byte pieces), random valid UTF-8 and
 * random bytes (seeded, the same on every run), and prints one line per text:
 *   DIR-BASENAME  TEXT  BYTES  TOKENS  SECONDS  TOKENS/S  MB/S  IDS-HASH
 * (the best of three encodes, in CPU seconds of the encoding thread, so
 * that other load on the machine disturbs the figures less; IDS-HASH is
 * FNV-1a of the ids, to compare builds).  --dump instead prints, per tokenizer, text
 * and special-token mode (add_special, parse_special: 00, 11), the ids as
 * text lines, for diff against a dump from another build; --file adds a
 * file's bytes, as they are, to the texts (e.g. the fuzz corpus).
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "st_build_config.h"
#include "st_error.h"
#include "st_tokenizer.h"
#include "st_util.h"

#define MAX_TEXTS 64

struct text {
	char name[64];
	char *p;
	size_t len;
};

struct texts {
	struct text t[MAX_TEXTS];
	int n;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: strata-bench-tokenizer [--bytes N] [--text FILE] [--dump] [--file F]... DIR...\n"
		"Encodes prose, one-character runs, random UTF-8 and random bytes of about\n"
		"N bytes each with the tokenizer of each DIR and prints tokens/s.\n"
		"  --bytes N   size of each generated text (default 1MiB)\n"
		"  --text F    the prose (default models/kjv-moe/valid.txt)\n"
		"  --file F    also encode F's bytes as they are (repeatable)\n"
		"  --dump      print the ids of every text instead of timings\n");
}

/* xorshift64*: a fixed sequence, so the random texts are the same each run */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

static struct text *add(struct texts *ts, const char *name, size_t len)
{
	struct text *t;

	if (ts->n == MAX_TEXTS)
		return NULL;
	t = &ts->t[ts->n];
	snprintf(t->name, sizeof(t->name), "%s", name);
	if (!(t->p = malloc(len ? len : 1)))
		return NULL;
	t->len = len;
	ts->n++;
	return t;
}

/* Fills a text with copies of the character chr (UTF-8) up to len bytes. */
static int add_run(struct texts *ts, const char *name, const char *chr,
		   size_t len)
{
	size_t cl = strlen(chr), n = len / cl * cl;
	struct text *t = add(ts, name, n);

	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < n; i += cl)
		memcpy(t->p + i, chr, cl);
	return 0;
}

/* Random scalar values (any plane, no surrogates), encoded as UTF-8. */
static int add_utf8(struct texts *ts, size_t len, uint64_t seed)
{
	struct text *t = add(ts, "random-utf8", len);
	size_t i = 0;

	if (!t)
		return -ENOMEM;
	while (i + 4 <= len) {
		uint64_t r = rnd(&seed);
		/* mostly small code points, as text has, some from every plane */
		uint32_t cp = (r & 3) == 0 ? (uint32_t)(r >> 8) % 0x80 :
			      (r & 3) == 1 ? (uint32_t)(r >> 8) % 0x800 :
			      (r & 3) == 2 ? (uint32_t)(r >> 8) % 0x10000 :
					     (uint32_t)(r >> 8) % 0x110000;

		if (cp >= 0xD800 && cp < 0xE000)
			cp = ' ';
		if (cp < 0x80) {
			t->p[i++] = (char)cp;
		} else if (cp < 0x800) {
			t->p[i++] = (char)(0xC0 | cp >> 6);
			t->p[i++] = (char)(0x80 | (cp & 0x3F));
		} else if (cp < 0x10000) {
			t->p[i++] = (char)(0xE0 | cp >> 12);
			t->p[i++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			t->p[i++] = (char)(0x80 | (cp & 0x3F));
		} else {
			t->p[i++] = (char)(0xF0 | cp >> 18);
			t->p[i++] = (char)(0x80 | ((cp >> 12) & 0x3F));
			t->p[i++] = (char)(0x80 | ((cp >> 6) & 0x3F));
			t->p[i++] = (char)(0x80 | (cp & 0x3F));
		}
	}
	t->len = i;
	return 0;
}

static int add_bytes(struct texts *ts, size_t len, uint64_t seed)
{
	struct text *t = add(ts, "random-bytes", len);

	if (!t)
		return -ENOMEM;
	for (size_t i = 0; i < len; i++)
		t->p[i] = (char)(rnd(&seed) >> 56);
	return 0;
}

/* The prose file, repeated up to len bytes (cut at a line end). */
static int add_prose(struct texts *ts, const char *path, size_t len)
{
	char *buf;
	size_t n, i = 0;
	struct text *t;
	int r = st_read_file(path, &buf, &n);

	if (r) {
		fprintf(stderr, "strata-bench-tokenizer: %s: %s\n", path,
			st_strerror(r));
		return r;
	}
	if (!n || !(t = add(ts, "prose", len))) {
		free(buf);
		return n ? -ENOMEM : -EINVAL;
	}
	while (i < len) {
		size_t c = n < len - i ? n : len - i;

		memcpy(t->p + i, buf, c);
		i += c;
	}
	free(buf);
	return 0;
}

static int add_file(struct texts *ts, const char *path)
{
	char *buf;
	size_t n;
	const char *base = strrchr(path, '/');
	struct text *t;
	int r = st_read_file(path, &buf, &n);

	if (r) {
		fprintf(stderr, "strata-bench-tokenizer: %s: %s\n", path,
			st_strerror(r));
		return r;
	}
	if (!(t = add(ts, base ? base + 1 : path, n))) {
		free(buf);
		return -ENOMEM;
	}
	memcpy(t->p, buf, n);
	free(buf);
	return 0;
}

/* CPU time of this thread, in seconds */
static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* FNV-1a over the ids: a short fingerprint to compare builds with. */
static uint32_t ids_hash(const int32_t *ids, size_t n)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < n; i++)
		for (int k = 0; k < 4; k++) {
			h ^= (uint8_t)((uint32_t)ids[i] >> (8 * k));
			h *= 16777619u;
		}
	return h;
}

/* FNV-1a over n bytes. */
static uint32_t ids_hash_bytes(const char *p, size_t n)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)p[i];
		h *= 16777619u;
	}
	return h;
}

/* Prints the decoded text of ids (skip_special as given) as its length
 * and FNV-1a hash, whole (st_tokenizer_decode) and streamed (st_detok). */
static void dump_decode(const struct st_tokenizer *tok, const int32_t *ids,
			size_t n, int skip_special)
{
	char *text = NULL, piece[256];
	struct st_detok d;
	uint32_t h = 2166136261u;
	size_t len = 0;
	int r = st_tokenizer_decode(tok, ids, n, skip_special, &text);

	printf("decode: %d %zu %08x\n", r, r ? 0 : strlen(text),
	       r ? 0 : ids_hash_bytes(text, strlen(text)));
	free(text);
	st_detok_init(&d, tok, skip_special);
	for (size_t i = 0; i <= n; i++) {
		int m = i < n ? st_detok_push(&d, ids[i], piece, sizeof(piece)) :
				st_detok_flush(&d, piece, sizeof(piece));

		if (m < 0) {
			printf("stream: id %zu: %d\n", i, m);
			return;
		}
		for (int k = 0; k < m; k++) {
			h ^= (uint8_t)piece[k];
			h *= 16777619u;
		}
		len += (size_t)m;
	}
	printf("stream: %zu %08x\n", len, h);
}

static int dump(const char *dir, const struct st_tokenizer *tok,
		const struct text *t)
{
	for (int mode = 0; mode < 2; mode++) {
		int32_t *ids = NULL;
		size_t n = 0;
		int r = st_tokenizer_encode(tok, t->p, t->len, mode, mode,
					    &ids, &n);

		printf("%s %s %d%d: %d %zu ids\n", dir, t->name, mode, mode,
		       r, n);
		for (size_t i = 0; !r && i < n; i++)
			printf("%d%c", ids[i], i % 32 == 31 || i + 1 == n ?
			       '\n' : ' ');
		/* and the decoder, whole and streamed, on those ids */
		if (!r)
			dump_decode(tok, ids, n, mode);
		free(ids);
	}
	return 0;
}

static int bench(const char *dir, const struct st_tokenizer *tok,
		 const struct text *t)
{
	double best = 1e30;
	uint32_t hash = 0;
	size_t n = 0;

	for (int rep = 0; rep < 3; rep++) {
		int32_t *ids = NULL;
		double t0 = now_s(), dt;
		int r = st_tokenizer_encode(tok, t->p, t->len, 0, 0, &ids, &n);

		dt = now_s() - t0;
		if (!r)
			hash = ids_hash(ids, n);
		free(ids);
		if (r) {
			fprintf(stderr, "strata-bench-tokenizer: %s: %s: %s\n",
				dir, t->name, st_strerror(r));
			return r;
		}
		if (dt < best)
			best = dt;
		/* one pass is enough for what takes seconds */
		if (dt > 2)
			break;
	}
	printf("%-18s %-14s %9zu %9zu %8.4f %11.0f %8.2f %08x\n", dir,
	       t->name, t->len, n, best, n / best, t->len / best / 1e6, hash);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "bytes", required_argument, NULL, 'b' },
		{ "text", required_argument, NULL, 't' },
		{ "file", required_argument, NULL, 'f' },
		{ "dump", no_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static struct texts ts;
	const char *prose = ST_SOURCE_ROOT "/models/kjv-moe/valid.txt";
	uint64_t bytes = 1 << 20;
	int do_dump = 0, c, r = 0;

	while ((c = getopt_long(argc, argv, "b:t:f:dh", opts, NULL)) != -1) {
		switch (c) {
		case 'b':
			if (st_parse_size(optarg, &bytes) < 0 || bytes < 16 ||
			    bytes > (1ull << 30)) {
				fprintf(stderr, "strata-bench-tokenizer: --bytes "
					"%s: want 16 B .. 1 GiB\n", optarg);
				return 2;
			}
			break;
		case 't':
			prose = optarg;
			break;
		case 'f':
			if (add_file(&ts, optarg))
				return 1;
			break;
		case 'd':
			do_dump = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind == argc) {
		usage(stderr);
		return 2;
	}
	if (add_prose(&ts, prose, bytes) ||
	    add_run(&ts, "run-a", "a", bytes) ||
	    add_run(&ts, "run-space", " ", bytes) ||
	    add_run(&ts, "run-newline", "\n", bytes) ||
	    add_run(&ts, "run-digit", "7", bytes) ||
	    add_run(&ts, "run-bang", "!", bytes) ||
	    add_run(&ts, "run-e-acute", "\xc3\xa9", bytes) ||
	    add_run(&ts, "run-han", "\xe4\xb8\xad", bytes) ||
	    add_run(&ts, "run-a-space", "a ", bytes) ||
	    add_utf8(&ts, bytes, 0x9E3779B97F4A7C15ull) ||
	    add_bytes(&ts, bytes, 0xD1B54A32D192ED03ull)) {
		fprintf(stderr, "strata-bench-tokenizer: cannot make the texts\n");
		return 1;
	}
	if (!do_dump)
		printf("%-18s %-14s %9s %9s %8s %11s %8s %8s\n", "tokenizer",
		       "text", "bytes", "tokens", "seconds", "tokens/s", "MB/s",
		       "ids-hash");
	for (int i = optind; !r && i < argc; i++) {
		struct st_tokenizer *tok = NULL;
		struct st_diag diag = { { 0 } };
		const char *base = strrchr(argv[i], '/');

		base = base && base[1] ? base + 1 : argv[i];
		if ((r = st_tokenizer_load(argv[i], &tok, &diag))) {
			fprintf(stderr, "strata-bench-tokenizer: %s\n", diag.msg);
			break;
		}
		for (int k = 0; !r && k < ts.n; k++)
			r = do_dump ? dump(base, tok, &ts.t[k]) :
				      bench(base, tok, &ts.t[k]);
		st_tokenizer_free(tok);
	}
	for (int k = 0; k < ts.n; k++)
		free(ts.t[k].p);
	return r ? 1 : 0;
}

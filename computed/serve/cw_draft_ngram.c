/* cw_draft_ngram.c — see cw_draft_ngram.h. */
#include "cw_draft_ngram.h"
#include "cw_proto.h"

_Static_assert(CW_DRAFT_MAX == CW_PROTO_MAX_DRAFT,
	       "GEN_START's draft field carries CW_DRAFT_MAX");

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Most recent start j < n - g with ids[j..j+g) equal to the last g ids,
 * or -1. */
static int find_last(const int32_t *ids, int n, int g)
{
	const int32_t *tail = ids + n - g;

	for (int j = n - g - 1; j >= 0; j--)
		if (ids[j] == tail[0] &&
		    !memcmp(ids + j, tail, sizeof(int32_t) * (size_t)g))
			return j;
	return -1;
}

int cw_draft_ngram(const int32_t *ids, int n, int min_ngram, int max_ngram,
		   int max_draft, int32_t *ret_draft)
{
	if (max_draft < 0 || min_ngram < 1 || max_ngram < min_ngram)
		return -EINVAL;
	if (max_draft == 0)
		return 0;
	for (int g = max_ngram < n - 1 ? max_ngram : n - 1; g >= min_ngram;
	     g--) {
		int j = find_last(ids, n, g), k;

		if (j < 0)
			continue;
		/* j + g <= n - 1: the continuation holds a token at least */
		k = n - (j + g);
		if (k > max_draft)
			k = max_draft;
		memcpy(ret_draft, ids + j + g, sizeof(int32_t) * (size_t)k);
		return k;
	}
	return 0;
}

int cw_draft_parse(const char *spec, int *ret_draft_max)
{
	char *end;
	long k;

	if (!strcmp(spec, "off")) {
		*ret_draft_max = 0;
		return 0;
	}
	if (!strcmp(spec, "ngram")) {
		*ret_draft_max = CW_DRAFT_DEFAULT_K;
		return 0;
	}
	if (strncmp(spec, "ngram:", 6) != 0)
		return -EINVAL;
	k = strtol(spec + 6, &end, 10);
	if (end == spec + 6 || *end || k < 1 || k > CW_DRAFT_MAX)
		return -EINVAL;
	*ret_draft_max = (int)k;
	return 0;
}

int cw_draft_parse_src(const char *spec, int *ret_draft_max, int *ret_priced,
		       int *ret_mtp)
{
	char buf[32];
	int r;

	if (strcmp(spec, "mtp") && strncmp(spec, "mtp:", 4)) {
		r = cw_draft_parse_mode(spec, ret_draft_max, ret_priced);
		if (r == 0)
			*ret_mtp = 0;
		return r;
	}
	/* mtp[:K] reads as ngram[:K] */
	if (strlen(spec) >= sizeof(buf) - 2)
		return -EINVAL;
	snprintf(buf, sizeof(buf), "ngram%s", spec + 3);
	r = cw_draft_parse(buf, ret_draft_max);
	if (r == 0) {
		*ret_priced = 0;
		*ret_mtp = 1;
	}
	return r;
}

int cw_draft_parse_mode(const char *spec, int *ret_draft_max,
			int *ret_priced)
{
	char buf[32];
	int r;

	if (strcmp(spec, "auto") && strncmp(spec, "auto:", 5)) {
		r = cw_draft_parse(spec, ret_draft_max);
		if (r == 0)
			*ret_priced = 0;
		return r;
	}
	/* auto[:K] reads as ngram[:K] */
	if (strlen(spec) >= sizeof(buf) - 1)
		return -EINVAL;
	snprintf(buf, sizeof(buf), "ngram%s", spec + 4);
	r = cw_draft_parse(buf, ret_draft_max);
	if (r == 0)
		*ret_priced = 1;
	return r;
}

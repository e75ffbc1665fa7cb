/*
 * st_tokenizer_heap.h — the BPE model's queue of merge candidates: a 4-ary
 * min-heap of (key, new_id), key = rank << 32 | position (st_tokenizer*.c
 * only).
 *
 * The merge loop (st_tokenizer_bpe.c) pops the candidate with the lowest
 * rank, leftmost first, as HF's Word::merge_all does with a BinaryHeap
 * ordered on (rank, pos).  Packing both into one 64-bit key makes that
 * order one integer compare.  Four children per node halve the depth of a
 * binary heap, and a node's children are adjacent, so a pop touches about
 * half the cache lines: a long word (a prompt without a pre-tokenizer is one
 * word, e.g. Mistral's) has millions of candidates, and the merge was bound
 * by the binary heap's cache misses.  Candidates queued in one go are
 * heapified bottom-up, O(n) instead of n sift-ups.
 *
 * Entries with equal keys are interchangeable (a rank names one pair, so
 * one new_id), so the order among them does not change the merges.
 *
 * The storage may start in the caller's array (no allocation for the short
 * words that are most of a text) and moves to the heap when outgrown.
 */
#ifndef ST_TOKENIZER_HEAP_H
#define ST_TOKENIZER_HEAP_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct stk_cand {
	uint64_t key;           /* rank << 32 | position of the left symbol */
	int32_t new_id;         /* the merged token */
};

struct stk_heap {
	struct stk_cand *p;
	size_t n, cap;
	struct stk_cand *local; /* the caller's storage, or NULL */
};

/* Starts h empty in storage (cap entries, owned by the caller; cap 0 and
 * NULL: grows on the heap from the first entry). */
static inline void stk_heap_init_local(struct stk_heap *h,
				       struct stk_cand *storage, size_t cap)
{
	h->p = h->local = storage;
	h->n = 0;
	h->cap = cap;
}

/* Frees what is on the heap; h is empty afterwards. */
static inline void stk_heap_free(struct stk_heap *h)
{
	if (h->p != h->local)
		free(h->p);
	h->p = h->local = NULL;
	h->n = h->cap = 0;
}

/* Appends an entry without restoring the heap order (see stk_heap_make).
 * 0, or -ENOMEM (h unchanged). */
static inline int stk_heap_append(struct stk_heap *h, uint64_t key,
				  int32_t new_id)
{
	if (h->n == h->cap) {
		size_t c = h->cap ? h->cap * 2 : 64;
		struct stk_cand *q;

		if (c > SIZE_MAX / 2 / sizeof(*q))
			return -ENOMEM;
		if (h->p == h->local) {
			if (!(q = malloc(c * sizeof(*q))))
				return -ENOMEM;
			if (h->n)
				memcpy(q, h->p, h->n * sizeof(*q));
		} else if (!(q = realloc(h->p, c * sizeof(*q)))) {
			return -ENOMEM;
		}
		h->p = q;
		h->cap = c;
	}
	h->p[h->n].key = key;
	h->p[h->n].new_id = new_id;
	h->n++;
	return 0;
}

/* Moves entry i down to its place below (children 4i+1 .. 4i+4). */
static inline void stk_heap_sift_down(struct stk_heap *h, size_t i)
{
	struct stk_cand e = h->p[i];
	size_t n = h->n;

	for (;;) {
		size_t c = 4 * i + 1, m, end;

		if (c >= n)
			break;
		end = c + 4 < n ? c + 4 : n;
		m = c;
		for (size_t k = c + 1; k < end; k++)
			if (h->p[k].key < h->p[m].key)
				m = k;
		if (h->p[m].key >= e.key)
			break;
		h->p[i] = h->p[m];
		i = m;
	}
	h->p[i] = e;
}

/* Restores the heap order over every entry (after stk_heap_append), in
 * O(n). */
static inline void stk_heap_make(struct stk_heap *h)
{
	if (h->n < 2)
		return;
	for (size_t i = (h->n - 2) / 4 + 1; i-- > 0;)
		stk_heap_sift_down(h, i);
}

/* Adds an entry in order.  0, or -ENOMEM (h unchanged). */
static inline int stk_heap_push(struct stk_heap *h, uint64_t key,
				int32_t new_id)
{
	struct stk_cand e = { key, new_id };
	size_t i;
	int r;

	if ((r = stk_heap_append(h, key, new_id)))
		return r;
	for (i = h->n - 1; i > 0;) {
		size_t parent = (i - 1) / 4;

		if (h->p[parent].key <= key)
			break;
		h->p[i] = h->p[parent];
		i = parent;
	}
	h->p[i] = e;
	return 0;
}

/* Removes and returns the entry with the smallest key; h must not be
 * empty. */
static inline struct stk_cand stk_heap_pop(struct stk_heap *h)
{
	struct stk_cand top = h->p[0];

	h->p[0] = h->p[--h->n];
	if (h->n > 1)
		stk_heap_sift_down(h, 0);
	return top;
}

/* Replaces the entry with the smallest key by (key, new_id): a pop and a
 * push in one sift (the merge loop's step); h must not be empty. */
static inline void stk_heap_replace_top(struct stk_heap *h, uint64_t key,
					int32_t new_id)
{
	h->p[0].key = key;
	h->p[0].new_id = new_id;
	stk_heap_sift_down(h, 0);
}

#endif

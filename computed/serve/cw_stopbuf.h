/*
 * cw_stopbuf.h — stop strings over streamed text.  Text is pushed piece by
 * piece (as tokens are decoded); what can no longer be the beginning of a
 * stop string is released, the rest is held back.  When a stop string
 * appears (possibly across pieces) the text before it is released and
 * everything from the stop string on is dropped (PITFALLS P13: pieces
 * "DEF","G","HI","J","KL" with stop "DEFGHIJ" release nothing; with stop
 * "HIJ" they release exactly "DEFG").
 */
#ifndef CW_STOPBUF_H
#define CW_STOPBUF_H

#include <stddef.h>

#define CW_STOPBUF_MAX 4

struct cw_stopbuf {
	int n_stop;
	char *stop[CW_STOPBUF_MAX]; /* owned copies */
	char *held;                 /* owned, NUL-terminated */
	size_t held_len, held_cap;
	int stopped;                /* 1 once a stop string was found */
};

/* Copies the n stop strings (each non-empty).  0, -EINVAL or -ENOMEM. */
int cw_stopbuf_init(struct cw_stopbuf *b, int n, const char *const *stop);
void cw_stopbuf_fini(struct cw_stopbuf *b);

/*
 * Appends n bytes and writes what is released into out (cap bytes,
 * NUL-terminated).  final = 1 releases everything still held (end of the
 * generation).  Returns the number of bytes released (>= 0) or -ENOMEM /
 * -ENOSPC (out too small: nothing is consumed).  After a stop string was
 * found every call releases 0 bytes.
 */
int cw_stopbuf_push(struct cw_stopbuf *b, const char *text, size_t n,
		    int final, char *out, size_t cap);

#endif

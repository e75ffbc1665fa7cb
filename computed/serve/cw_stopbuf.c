/* cw_stopbuf.c — see cw_stopbuf.h. */
#include "cw_stopbuf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int cw_stopbuf_init(struct cw_stopbuf *b, int n, const char *const *stop)
{
	memset(b, 0, sizeof(*b));
	if (n < 0 || n > CW_STOPBUF_MAX)
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		if (!stop[i] || !stop[i][0]) {
			cw_stopbuf_fini(b);
			return -EINVAL;
		}
		b->stop[i] = strdup(stop[i]);
		if (!b->stop[i]) {
			cw_stopbuf_fini(b);
			return -ENOMEM;
		}
		b->n_stop = i + 1;
	}
	return 0;
}

void cw_stopbuf_fini(struct cw_stopbuf *b)
{
	for (int i = 0; i < CW_STOPBUF_MAX; i++)
		free(b->stop[i]);
	free(b->held);
	memset(b, 0, sizeof(*b));
}

int cw_stopbuf_push(struct cw_stopbuf *b, const char *text, size_t n,
		    int final, char *out, size_t cap)
{
	size_t emit;

	if (cap == 0)
		return -ENOSPC;
	out[0] = 0;
	if (b->stopped)
		return 0;
	if (b->held_len + n + 1 > b->held_cap) {
		size_t c = (b->held_len + n + 1) * 2;
		char *h = realloc(b->held, c);

		if (!h)
			return -ENOMEM;
		b->held = h;
		b->held_cap = c;
	}
	memcpy(b->held + b->held_len, text, n);
	b->held_len += n;
	b->held[b->held_len] = 0;
	emit = b->held_len;
	/* the earliest complete stop string ends the text */
	for (int i = 0; i < b->n_stop; i++) {
		const char *hit = strstr(b->held, b->stop[i]);

		if (hit && (size_t)(hit - b->held) < emit) {
			emit = (size_t)(hit - b->held);
			b->stopped = 1;
		}
	}
	if (!b->stopped && !final) {
		/* hold back the longest suffix that is a proper prefix of a
		 * stop string */
		for (int i = 0; i < b->n_stop; i++) {
			size_t sl = strlen(b->stop[i]);
			size_t k = sl - 1 < b->held_len ? sl - 1 : b->held_len;

			for (; k > 0; k--)
				if (!memcmp(b->held + b->held_len - k,
					    b->stop[i], k))
					break;
			if (b->held_len - k < emit)
				emit = b->held_len - k;
		}
	}
	if (emit + 1 > cap) {
		b->held_len -= n; /* nothing consumed */
		b->held[b->held_len] = 0;
		return -ENOSPC;
	}
	memcpy(out, b->held, emit);
	out[emit] = 0;
	if (b->stopped) {
		b->held_len = 0;
	} else {
		memmove(b->held, b->held + emit, b->held_len - emit);
		b->held_len -= emit;
	}
	b->held[b->held_len] = 0;
	return (int)emit;
}

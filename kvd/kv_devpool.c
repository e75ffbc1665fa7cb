/*
 * kv_devpool.c — kvd's device KV page pool import (kv_devpool.h).
 */
#include <errno.h>
#include <stdlib.h>

#include "kv_daemon.h"
#include "kv_devpool.h"
#include "st_devimporter.h"

int kv_devpool_handle(struct kv_server *s, uint16_t type, const uint8_t *p,
		      size_t len, struct st_wbuf *rep, struct st_diag *diag)
{
	int reset;

	if (!s->dev) {
		s->dev = calloc(1, sizeof(*s->dev));
		if (!s->dev)
			return st_diag_set(diag, -ENOMEM, "out of memory");
		/* the host KV pool (the whole segment) is what page copies
		 * read and write: pinned at the first import */
		st_devimporter_init(s->dev, ST_DEVPOOL_KV, s->cfg.instance,
				    s->have_pool ? s->shm.base : NULL,
				    s->have_pool ? s->shm.size : 0);
	}
	return st_devimporter_handle(s->dev, type, p, len, rep, &reset, diag);
}

void kv_devpool_tick(struct kv_server *s)
{
	if (s->dev)
		(void)st_devimporter_tick(s->dev);
}

void kv_devpool_fini(struct kv_server *s, int destroy_table)
{
	if (!s->dev)
		return;
	st_devimporter_fini(s->dev, destroy_table);
	free(s->dev);
	s->dev = NULL;
}

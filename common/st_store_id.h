/*
 * st_store_id.h — the identity of a converted store: XXH3-64 of its
 * manifest.json, which lists the xxh3 of every expert record and dense
 * tensor (st_store.h), so two stores share it only when they hold the same
 * weights in the same formats.  expertd's pool is keyed by it, and so is
 * the prefix cache's model id (cw_model.c): KV pages computed with other
 * weights are never reused.
 */
#ifndef ST_STORE_ID_H
#define ST_STORE_ID_H

#include <stdint.h>

#include "st_error.h"
#include "st_store.h"

/* *ret = XXH3-64 of s's manifest.json.  0, or a negative code with the
 * message in diag (the file cannot be read). */
int st_store_id(const struct st_store *s, uint64_t *ret,
		struct st_diag *diag);

#endif

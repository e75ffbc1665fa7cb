/*
 * st_store_engram.h — the "engram" section of a DeepSeek-V4.1 store's
 * manifest (st_store.h, st_engram_file.h): read at st_store_open, checked
 * by st_store_verify.  Internal to common/st_store*.c.
 */
#ifndef ST_STORE_ENGRAM_H
#define ST_STORE_ENGRAM_H

#include <jansson.h>

#include "st_store.h"

/*
 * Reads manifest section "engram" of a V4.1 store (s->is_dsv41, s->dsv41
 * parsed): the file name and size, one layout per Engram layer (equal to
 * st_engram_layout_init of the config's layer ids, engram_num_embeddings
 * and engram_head_dim), engram.bin's size and header block, and the hash
 * file (engram_hash.bin, listed in "files") loaded and checked against the
 * config.  Fills s->engram*, s->engram_hash.  Returns 0, -ST_E_FORMAT,
 * -ST_E_CONFIG, -ST_E_CHECKSUM, -errno, -ENOMEM with diag naming the store.
 */
int st_store_engram_parse(struct st_store *s, json_t *root,
			  struct st_diag *diag);

/*
 * Re-reads engram.bin: every block's own checksum and each layer's XXH3
 * against the manifest.  Returns 0 or the first error (-ST_E_CHECKSUM
 * naming layer and block, -errno); *ret_n_bad counts bad layers.
 */
int st_store_engram_verify(const struct st_store *s, int *ret_n_bad,
			   struct st_diag *diag);

#endif

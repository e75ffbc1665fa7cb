/*
 * es_devpool.h — expertd's side of the device expert pool (issue 10,
 * DESIGN.md sections 1 and 3): imports the slot pool computed exported
 * (st_devimporter.h), and copies experts from its host pool into device
 * slots on its own CUDA stream, recording each slot's event lane before it
 * publishes the slot READY in the device slot table
 * (/strata.<instance>.devexperts, st_devpool.h), so computed's stream waits
 * for that one copy only.
 *
 * What goes to the device: every expert a client ACQUIREs (demand, first)
 * and the gate look-ahead hints of ROUTE (prefetch, after the demand ones),
 * once its host slot is READY.  Victims: a clock over the device slots;
 * a slot computed has pinned is never taken (st_devslot_claim).  The host
 * slot a copy reads keeps a pin (of the client that wanted it) until the
 * copy stream has passed the copy.
 *
 * Device slot keys: st_devkey(layer, expert) = es_key(layer, expert) + 1
 * (0 means none), the same in computed.
 * In a build without CUDA, EXPORT is answered with -ST_E_UNSUPPORTED and
 * nothing else changes.
 */
#ifndef ES_DEVPOOL_H
#define ES_DEVPOOL_H

#include <stdint.h>

#include "st_devpool.h"
#include "st_proto.h"

struct es_daemon;
struct es_devpool;

/* Most wanted experts queued for the device (older ones are dropped). */
#define ES_DEV_WANT_MAX 4096

/*
 * Handles DEV_EXPORT / DEV_REVOKE (creating d->dev at the first): the
 * reply payload is appended to rep.  0 or a negative code with diag.
 */
int es_devpool_handle(struct es_daemon *d, uint16_t type,
		      const uint8_t *payload, size_t len, struct st_wbuf *rep,
		      struct st_diag *diag);

/* Client c wants (layer, expert) on the device; prefetch: a hint (queued
 * after the demand ones).  No-op while nothing is imported. */
void es_devpool_want(struct es_daemon *d, int c, uint32_t layer,
		     uint32_t expert, int prefetch);

/* Server loop: peer death, finished copies (host pins dropped), queued
 * copies started.  Returns the ms until it wants to run again (-1: no
 * opinion). */
int es_devpool_tick(struct es_daemon *d);

/* Shutdown: drains, closes the import, removes the table when
 * destroy_table. */
void es_devpool_fini(struct es_daemon *d, int destroy_table);

#endif

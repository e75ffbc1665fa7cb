/*
 * kv_devpool.h — kvd's side of the device KV page pool (issue 10): imports
 * the pool computed exported (st_devimporter.h: CUDA IPC handles, its own
 * copy stream, the KV pool segment registered as pinned memory, the device
 * slot table /strata.<instance>.devkv), answers DEV_EXPORT / DEV_REVOKE and
 * drops the import when computed dies.  Page copies between T1 and T0
 * (st_cuda_import_h2d / _d2h on that stream) are not issued yet: computed
 * still reads KV rows from the host pool.  In a build without CUDA,
 * EXPORT is answered with -ST_E_UNSUPPORTED.
 */
#ifndef KV_DEVPOOL_H
#define KV_DEVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "st_devpool.h"
#include "st_error.h"
#include "st_proto.h"

struct kv_server;

/* Handles DEV_EXPORT / DEV_REVOKE; reply payload appended to rep.  0 or a
 * negative code with diag. */
int kv_devpool_handle(struct kv_server *s, uint16_t type, const uint8_t *p,
		      size_t len, struct st_wbuf *rep, struct st_diag *diag);
/* Server loop: drops the import when the exporter died. */
void kv_devpool_tick(struct kv_server *s);
/* Shutdown: drains and closes; destroy_table removes the table segment. */
void kv_devpool_fini(struct kv_server *s, int destroy_table);

#endif

/*
 * es_client_int.h — what es_client.c lends the other client files
 * (es_client_engram.c); not for callers of the client library.
 */
#ifndef ES_CLIENT_INT_H
#define ES_CLIENT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "es_client.h"
#include "st_proto.h"

struct es_client_engram;

/* One request/reply on the handle's socket (serialized with the others;
 * restarts and errors as es_client.c's rpc).  On success *ret_buf (owned
 * by the caller, may be NULL to drop the reply) holds the reply and
 * *ret_p / *ret_len its payload. */
int es_client_rpc(struct es_client *c, uint16_t type, const struct st_wbuf *pl,
		  void **ret_buf, const uint8_t **ret_p, size_t *ret_len,
		  struct st_diag *diag);

/* The handle's instance name and request time-out. */
const char *es_client_instance(const struct es_client *c);
int es_client_timeout_ms(const struct es_client *c);

/* Where the handle keeps its Engram state (NULL until first used). */
struct es_client_engram **es_client_engram_ptr(struct es_client *c);

/* Frees the Engram state (detaches its segment).  NULL is fine. */
void es_client_engram_fini(struct es_client_engram *g);

#endif

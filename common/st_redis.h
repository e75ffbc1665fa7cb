/*
 * st_redis.h — strata's one door to Redis (hiredis): a blocking connection
 * whose connect and every command are bounded by a timeout, and the few
 * pipelined commands kvd's remote KV tier needs (kvd/kv_remote.h).  Anything
 * speaking the Redis protocol (Valkey, a managed Redis) serves as well.
 *
 * A connection that saw an I/O error or a timeout is broken for good (the
 * replies in flight can no longer be matched to their commands): the
 * caller closes it and opens a new one later.
 */
#ifndef ST_REDIS_H
#define ST_REDIS_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

/* Where a Redis is: redis://HOST[:PORT][/DB]. */
struct st_redis_url {
	char host[256];
	uint16_t port;   /* default 6379 */
	uint32_t db;     /* default 0 */
};

struct st_redis;

/*
 * Parses "redis://HOST[:PORT][/DB]" (HOST a name or an IPv4 address; no
 * password, no TLS).  0, or -EINVAL with diag saying what is wrong.
 */
int st_redis_url_parse(const char *url, struct st_redis_url *ret,
		       struct st_diag *diag);

/*
 * Connects to u within timeout_ms, sets timeout_ms as the bound of every
 * later command's send and receive, and selects u->db.  *ret owned by the
 * caller (st_redis_close).  0, -ST_E_TIMEOUT, -ST_E_PEERGONE (refused,
 * reset), -ST_E_PROTO (SELECT refused), -ENOMEM, with diag.
 */
int st_redis_open(const struct st_redis_url *u, uint32_t timeout_ms,
		  struct st_redis **ret, struct st_diag *diag);

/* Closes and frees; NULL is fine. */
void st_redis_close(struct st_redis *r);

/*
 * GET of n keys (NUL-terminated strings) in one pipeline.  ret_vals[i] is
 * a malloc'd copy of key i's value (owned by the caller, free()) and
 * ret_lens[i] its length in bytes, or NULL / 0 when the key is absent.
 * On error every ret_vals[i] is NULL.  0, or -ST_E_TIMEOUT, -ST_E_PEERGONE,
 * -ST_E_PROTO (an unexpected reply), -ENOMEM, with diag; the connection is
 * then broken (st_redis_broken).
 */
int st_redis_get(struct st_redis *r, uint32_t n, const char *const *keys,
		 uint8_t **ret_vals, size_t *ret_lens, struct st_diag *diag);

/*
 * EXPIRE key ttl_s for n keys in one pipeline: ret_exists[i] = 1 when key i
 * existed (its time to live is now ttl_s), 0 when it did not.  Errors as
 * st_redis_get.
 */
int st_redis_touch(struct st_redis *r, uint32_t n, const char *const *keys,
		   uint32_t ttl_s, uint8_t *ret_exists, struct st_diag *diag);

/*
 * SET key value EX ttl_s for n keys in one pipeline (vals[i] of lens[i]
 * bytes, borrowed).  Returns the number stored; a key Redis refused (out
 * of memory under maxmemory + noeviction, read-only replica) is not
 * stored and makes the call return -ENOSPC after every reply was read,
 * with diag quoting Redis (the connection stays usable).  Other errors as
 * st_redis_get.
 */
int st_redis_set(struct st_redis *r, uint32_t n, const char *const *keys,
		 const uint8_t *const *vals, const size_t *lens,
		 uint32_t ttl_s, struct st_diag *diag);

/* DEL key.  0 (whether it existed or not), errors as st_redis_get. */
int st_redis_del(struct st_redis *r, const char *key, struct st_diag *diag);

/* True when the connection saw an I/O error or timeout (close it). */
int st_redis_broken(const struct st_redis *r);

#endif

/*
 * st_redis.c — the hiredis door (st_redis.h): blocking connection with
 * SO_SNDTIMEO / SO_RCVTIMEO bounds (hiredis' redisSetTimeout), pipelined
 * GET / EXPIRE / SET, and hiredis' errors mapped to strata's codes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "st_redis.h"

struct st_redis {
	redisContext *c;
	int broken;
};

int st_redis_url_parse(const char *url, struct st_redis_url *ret,
		       struct st_diag *diag)
{
	static const char scheme[] = "redis://";
	const char *h, *end;
	size_t n;

	memset(ret, 0, sizeof(*ret));
	ret->port = 6379;
	if (!url || strncmp(url, scheme, sizeof(scheme) - 1))
		return st_diag_set(diag, -EINVAL, "remote KV URL '%s': use "
				   "redis://HOST[:PORT][/DB]", url ? url : "");
	h = url + sizeof(scheme) - 1;
	end = h + strcspn(h, ":/");
	n = (size_t)(end - h);
	if (n == 0 || n >= sizeof(ret->host) || memchr(h, '@', n))
		return st_diag_set(diag, -EINVAL, "remote KV URL '%s': no host "
				   "(or a password, which is not supported)",
				   url);
	memcpy(ret->host, h, n);
	if (*end == ':') {
		char *e;
		unsigned long v;

		errno = 0;
		v = strtoul(end + 1, &e, 10);
		if (errno || e == end + 1 || v == 0 || v > 65535 ||
		    (*e && *e != '/'))
			return st_diag_set(diag, -EINVAL, "remote KV URL '%s': "
					   "port must be 1..65535", url);
		ret->port = (uint16_t)v;
		end = e;
	}
	if (*end == '/' && end[1]) {
		char *e;
		unsigned long v;

		errno = 0;
		v = strtoul(end + 1, &e, 10);
		if (errno || e == end + 1 || *e || v > 65535)
			return st_diag_set(diag, -EINVAL, "remote KV URL '%s': "
					   "database must be a number", url);
		ret->db = (uint32_t)v;
	} else if (*end && strcmp(end, "/")) {
		return st_diag_set(diag, -EINVAL, "remote KV URL '%s': "
				   "unexpected '%s'", url, end);
	}
	return 0;
}

/* strata's code of a hiredis context error (errno as hiredis left it). */
static int ctx_error(struct st_redis *r, int saved_errno, const char *what,
		     struct st_diag *diag)
{
	redisContext *c = r->c;
	int code = -ST_E_PEERGONE;

	r->broken = 1;
	if (c->err == REDIS_ERR_IO &&
	    (saved_errno == EAGAIN || saved_errno == EWOULDBLOCK ||
	     saved_errno == ETIMEDOUT || saved_errno == EINPROGRESS))
		code = -ST_E_TIMEOUT;
	else if (c->err == REDIS_ERR_OOM)
		code = -ENOMEM;
	else if (c->err == REDIS_ERR_PROTOCOL)
		code = -ST_E_PROTO;
	return st_diag_set(diag, code, "redis %s: %s", what,
			   code == -ST_E_TIMEOUT ? "timed out" :
			   c->errstr[0] ? c->errstr : "connection lost");
}

int st_redis_open(const struct st_redis_url *u, uint32_t timeout_ms,
		  struct st_redis **ret, struct st_diag *diag)
{
	struct timeval tv = { (time_t)(timeout_ms / 1000),
			      (suseconds_t)(timeout_ms % 1000) * 1000 };
	struct st_redis *r = calloc(1, sizeof(*r));
	redisReply *rep;
	char what[300], db[16];
	const char *argv[2] = { "SELECT", db };
	size_t lens[2];
	int e;

	*ret = NULL;
	if (!r)
		return -ENOMEM;
	snprintf(what, sizeof(what), "%s:%u", u->host, u->port);
	errno = 0;
	r->c = redisConnectWithTimeout(u->host, u->port, tv);
	e = errno;
	if (!r->c) {
		free(r);
		return st_diag_set(diag, -ENOMEM, "redis %s: out of memory",
				   what);
	}
	if (r->c->err) {
		int code = ctx_error(r, e, what, diag);

		st_redis_close(r);
		return code;
	}
	if (redisSetTimeout(r->c, tv) != REDIS_OK) {
		int code = ctx_error(r, errno, what, diag);

		st_redis_close(r);
		return code;
	}
	if (u->db) {
		snprintf(db, sizeof(db), "%u", u->db);
		lens[0] = 6;
		lens[1] = strlen(db);
		errno = 0;
		rep = redisCommandArgv(r->c, 2, argv, lens);
		e = errno;
		if (!rep) {
			int code = ctx_error(r, e, what, diag);

			st_redis_close(r);
			return code;
		}
		if (rep->type == REDIS_REPLY_ERROR) {
			st_diag_set(diag, -ST_E_PROTO, "redis %s: SELECT %u: %s",
				    what, u->db, rep->str);
			freeReplyObject(rep);
			st_redis_close(r);
			return -ST_E_PROTO;
		}
		freeReplyObject(rep);
	}
	*ret = r;
	return 0;
}

void st_redis_close(struct st_redis *r)
{
	if (!r)
		return;
	if (r->c)
		redisFree(r->c);
	free(r);
}

int st_redis_broken(const struct st_redis *r)
{
	return !r || r->broken;
}

/* Reads the next reply of a pipeline. */
static int next_reply(struct st_redis *r, const char *what, redisReply **ret,
		      struct st_diag *diag)
{
	void *p = NULL;
	int e;

	errno = 0;
	if (redisGetReply(r->c, &p) != REDIS_OK || !p) {
		e = errno;
		if (p)
			freeReplyObject(p);
		return ctx_error(r, e, what, diag);
	}
	*ret = p;
	return 0;
}

/* Appends one command of argc arguments (lengths given). */
static int append(struct st_redis *r, int argc, const char **argv,
		  const size_t *lens, struct st_diag *diag)
{
	if (redisAppendCommandArgv(r->c, argc, argv, lens) != REDIS_OK)
		return ctx_error(r, errno, "append", diag);
	return 0;
}

/* Reads and drops the replies left of a pipeline after an error, so the
 * connection stays usable when it is not broken. */
static void drain(struct st_redis *r, uint32_t left)
{
	for (uint32_t i = 0; i < left && !r->broken; i++) {
		redisReply *rep;

		if (next_reply(r, "drain", &rep, NULL) == 0)
			freeReplyObject(rep);
	}
}

int st_redis_get(struct st_redis *r, uint32_t n, const char *const *keys,
		 uint8_t **vals, size_t *lens, struct st_diag *diag)
{
	int err = 0;

	for (uint32_t i = 0; i < n; i++) {
		vals[i] = NULL;
		lens[i] = 0;
	}
	if (st_redis_broken(r))
		return st_diag_set(diag, -ST_E_PEERGONE, "redis: not connected");
	for (uint32_t i = 0; i < n; i++) {
		const char *argv[2] = { "GET", keys[i] };
		size_t l[2] = { 3, strlen(keys[i]) };

		err = append(r, 2, argv, l, diag);
		if (err < 0)
			return err;
	}
	for (uint32_t i = 0; i < n; i++) {
		redisReply *rep;

		err = next_reply(r, "GET", &rep, diag);
		if (err < 0)
			break;
		if (rep->type == REDIS_REPLY_STRING) {
			vals[i] = malloc(rep->len ? rep->len : 1);
			if (!vals[i]) {
				freeReplyObject(rep);
				drain(r, n - i - 1);
				err = -ENOMEM;
				break;
			}
			memcpy(vals[i], rep->str, rep->len);
			lens[i] = rep->len;
		} else if (rep->type != REDIS_REPLY_NIL) {
			err = st_diag_set(diag, -ST_E_PROTO, "redis GET %s: "
					  "unexpected reply type %d%s%s",
					  keys[i], rep->type,
					  rep->type == REDIS_REPLY_ERROR ?
						  ": " : "",
					  rep->type == REDIS_REPLY_ERROR ?
						  rep->str : "");
			freeReplyObject(rep);
			drain(r, n - i - 1);
			break;
		}
		freeReplyObject(rep);
	}
	if (err < 0)
		for (uint32_t i = 0; i < n; i++) {
			free(vals[i]);
			vals[i] = NULL;
			lens[i] = 0;
		}
	return err;
}

int st_redis_touch(struct st_redis *r, uint32_t n, const char *const *keys,
		   uint32_t ttl_s, uint8_t *exists, struct st_diag *diag)
{
	char ttl[16];
	int err;

	if (st_redis_broken(r))
		return st_diag_set(diag, -ST_E_PEERGONE, "redis: not connected");
	snprintf(ttl, sizeof(ttl), "%u", ttl_s);
	for (uint32_t i = 0; i < n; i++) {
		const char *argv[3] = { "EXPIRE", keys[i], ttl };
		size_t l[3] = { 6, strlen(keys[i]), strlen(ttl) };

		err = append(r, 3, argv, l, diag);
		if (err < 0)
			return err;
	}
	for (uint32_t i = 0; i < n; i++) {
		redisReply *rep;

		err = next_reply(r, "EXPIRE", &rep, diag);
		if (err < 0)
			return err;
		if (rep->type != REDIS_REPLY_INTEGER) {
			err = st_diag_set(diag, -ST_E_PROTO, "redis EXPIRE %s: "
					  "%s", keys[i],
					  rep->type == REDIS_REPLY_ERROR ?
						  rep->str : "unexpected reply");
			freeReplyObject(rep);
			drain(r, n - i - 1);
			return err;
		}
		exists[i] = rep->integer == 1;
		freeReplyObject(rep);
	}
	return 0;
}

int st_redis_set(struct st_redis *r, uint32_t n, const char *const *keys,
		 const uint8_t *const *vals, const size_t *lens,
		 uint32_t ttl_s, struct st_diag *diag)
{
	char ttl[16];
	int err, stored = 0, refused = 0;

	if (st_redis_broken(r))
		return st_diag_set(diag, -ST_E_PEERGONE, "redis: not connected");
	snprintf(ttl, sizeof(ttl), "%u", ttl_s);
	for (uint32_t i = 0; i < n; i++) {
		const char *argv[5] = { "SET", keys[i], (const char *)vals[i],
					"EX", ttl };
		size_t l[5] = { 3, strlen(keys[i]), lens[i], 2, strlen(ttl) };

		err = append(r, 5, argv, l, diag);
		if (err < 0)
			return err;
	}
	for (uint32_t i = 0; i < n; i++) {
		redisReply *rep;

		err = next_reply(r, "SET", &rep, diag);
		if (err < 0)
			return err;
		if (rep->type == REDIS_REPLY_STATUS) {
			stored++;
		} else if (!refused) {
			refused = 1;
			st_diag_set(diag, -ENOSPC, "redis SET %s refused: %s",
				    keys[i], rep->type == REDIS_REPLY_ERROR ?
						     rep->str : "unexpected reply");
		}
		freeReplyObject(rep);
	}
	return refused ? -ENOSPC : stored;
}

int st_redis_del(struct st_redis *r, const char *key, struct st_diag *diag)
{
	const char *argv[2] = { "DEL", key };
	size_t l[2] = { 3, strlen(key) };
	redisReply *rep;
	int err;

	if (st_redis_broken(r))
		return st_diag_set(diag, -ST_E_PEERGONE, "redis: not connected");
	err = append(r, 2, argv, l, diag);
	if (err < 0)
		return err;
	err = next_reply(r, "DEL", &rep, diag);
	if (err < 0)
		return err;
	if (rep->type == REDIS_REPLY_ERROR)
		err = st_diag_set(diag, -ST_E_PROTO, "redis DEL %s: %s", key,
				  rep->str);
	freeReplyObject(rep);
	return err;
}

/*
 * kv_remote.c — the remote KV tier (kv_remote.h): connection and back-off,
 * the value format and its checks, publishing groups and restoring a
 * chain of them into the local prefix cache.  Redis itself is reached
 * through st_redis.h only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_daemon.h"
#include "kv_remote.h"
#include "st_log.h"
#include "st_le.h"
#include "st_util.h"

#define BACKOFF_MIN_NS (1000ull * 1000 * 1000)
#define BACKOFF_MAX_NS (30ull * 1000 * 1000 * 1000)
/* Groups per pipeline, and the bytes one pipeline's values may take. */
#define BATCH_GROUPS 16u
#define BATCH_BYTES (32ull << 20)
#define KEY_BYTES 64

static const uint8_t k_magic[8] = { 's', 't', 'r', 'a', 't', 'a', 'K', 'V' };

/* ---- value format -------------------------------------------------------- */

/* XXH3 of page_rows and the stream declarations as explicit LE bytes. */
static uint64_t decl_hash(const struct kv_pool *p)
{
	uint8_t buf[8 + 16 * KV_MAX_STREAMS], *q = buf;

	st_put_le32(q, p->lay.page_rows);
	st_put_le32(q + 4, p->lay.n_streams);
	q += 8;
	for (uint32_t s = 0; s < p->lay.n_streams; s++, q += 16) {
		st_put_le32(q, p->streams[s].row_bytes);
		st_put_le32(q + 4, p->streams[s].tokens_per_row);
		st_put_le32(q + 8, p->streams[s].window_rows);
		st_put_le32(q + 12, p->streams[s].flags);
	}
	return st_xxh3(buf, (size_t)(q - buf));
}

/* Bytes of a page of stream s that a value carries (as the spill file). */
static uint32_t stream_len(const struct kv_pool *p, uint32_t s)
{
	return kv_stream_page_capacity(&p->streams[s], p->lay.page_rows) *
	       p->streams[s].row_bytes;
}

static size_t header_len(const struct kv_pool *p)
{
	return 40 + 16 * (size_t)p->lay.n_streams;
}

static size_t value_len(const struct kv_pool *p)
{
	size_t n = header_len(p);

	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		n += stream_len(p, s);
	return n;
}

int kv_remote_key(const struct kv_pool *p, uint64_t key, char *buf,
		  size_t cap)
{
	return snprintf(buf, cap, "strata:kv:%u:%016" PRIx64 ":%016" PRIx64,
			KV_REMOTE_FORMAT, decl_hash(p), key);
}

/* Writes group (key, pages[n_streams]) as a value into v (value_len). */
static void value_encode(const struct kv_pool *p, uint64_t key, uint64_t dh,
			 const uint32_t *pages, uint8_t *v)
{
	uint8_t *data = v + header_len(p);

	memcpy(v, k_magic, 8);
	st_put_le32(v + 8, KV_REMOTE_FORMAT);
	st_put_le32(v + 12, p->lay.n_streams);
	st_put_le64(v + 16, key);
	st_put_le64(v + 24, dh);
	st_put_le32(v + 32, p->lay.page_rows);
	st_put_le32(v + 36, (uint32_t)header_len(p));
	for (uint32_t s = 0; s < p->lay.n_streams; s++) {
		uint32_t len = stream_len(p, s);
		uint8_t *h = v + 40 + 16 * (size_t)s;

		memcpy(data, kv_page_data(p, pages[s]), len);
		st_put_le32(h, len);
		st_put_le32(h + 4, 0);
		st_put_le64(h + 8, st_xxh3(data, len));
		data += len;
	}
}

/* Why value v (len bytes, found under key) may not be used, or NULL. */
static const char *value_check(const struct kv_pool *p, uint64_t key,
			       uint64_t dh, const uint8_t *v, size_t len)
{
	const uint8_t *data;

	if (len < 40 || memcmp(v, k_magic, 8))
		return "not a strata KV value (magic)";
	if (st_get_le32(v + 8) != KV_REMOTE_FORMAT)
		return "another value format (another strata version)";
	if (len != value_len(p) || st_get_le32(v + 12) != p->lay.n_streams ||
	    st_get_le32(v + 32) != p->lay.page_rows ||
	    st_get_le32(v + 36) != header_len(p))
		return "the value's length or shape differs";
	if (st_get_le64(v + 16) != key)
		return "the value's prefix key differs";
	if (st_get_le64(v + 24) != dh)
		return "the value's stream declaration differs";
	data = v + header_len(p);
	for (uint32_t s = 0; s < p->lay.n_streams; s++) {
		const uint8_t *h = v + 40 + 16 * (size_t)s;
		uint32_t sl = stream_len(p, s);

		if (st_get_le32(h) != sl)
			return "a stream's length differs";
		if (st_get_le64(h + 8) != st_xxh3(data, sl))
			return "checksum mismatch";
		data += sl;
	}
	return NULL;
}

size_t kv_group_value_len(const struct kv_pool *p)
{
	return value_len(p);
}

void kv_group_value_encode(const struct kv_pool *p, uint64_t key,
			   const uint32_t *pages, uint8_t *v)
{
	value_encode(p, key, decl_hash(p), pages, v);
}

const char *kv_group_value_check(const struct kv_pool *p, uint64_t key,
				 const uint8_t *v, size_t len)
{
	return value_check(p, key, decl_hash(p), v, len);
}

uint64_t kv_pool_decl_hash(const struct kv_pool *p)
{
	return decl_hash(p);
}

/* ---- connection ----------------------------------------------------------- */

int kv_remote_init(struct kv_remote *rm, const struct kv_remote_config *cfg,
		   struct st_diag *diag)
{
	int r;

	memset(rm, 0, sizeof(*rm));
	rm->cfg = *cfg;
	rm->backoff_ns = BACKOFF_MIN_NS;
	if (cfg->ttl_s == 0 || cfg->timeout_ms == 0)
		return st_diag_set(diag, -EINVAL, "remote KV tier: TTL and "
				   "timeout must be above 0");
	r = st_redis_url_parse(cfg->url, &rm->url, diag);
	return r;
}

void kv_remote_fini(struct kv_remote *rm)
{
	st_redis_close(rm->conn);
	rm->conn = NULL;
}

/* Counts and logs a failure, drops the connection, backs off. */
static void fail(struct kv_remote *rm, const char *what,
		 const struct st_diag *d)
{
	rm->stats.errors++;
	st_warn("remote KV tier %s:%u: %s: %s; local prefix cache only for "
		"%llu ms", rm->url.host, rm->url.port, what,
		d->msg[0] ? d->msg : "error",
		(unsigned long long)(rm->backoff_ns / 1000000));
	st_redis_close(rm->conn);
	rm->conn = NULL;
	rm->retry_ns = st_now_ns() + rm->backoff_ns;
	rm->backoff_ns = ST_MIN(rm->backoff_ns * 2, BACKOFF_MAX_NS);
}

/* A usable connection, or NULL while backing off or when connecting
 * failed (counted). */
static struct st_redis *conn(struct kv_remote *rm)
{
	struct st_diag d = { { 0 } };

	if (rm->conn && !st_redis_broken(rm->conn))
		return rm->conn;
	if (rm->conn) {
		st_redis_close(rm->conn);
		rm->conn = NULL;
	}
	if (st_now_ns() < rm->retry_ns)
		return NULL;
	if (st_redis_open(&rm->url, rm->cfg.timeout_ms, &rm->conn, &d) < 0) {
		fail(rm, "connect", &d);
		return NULL;
	}
	st_info("remote KV tier: connected to %s:%u db %u", rm->url.host,
		rm->url.port, rm->url.db);
	return rm->conn;
}

/* After a call that worked: the next failure backs off from the start. */
static void ok(struct kv_remote *rm)
{
	rm->backoff_ns = BACKOFF_MIN_NS;
}

/* ---- publish -------------------------------------------------------------- */

/* Publishes groups [0, n) of one batch (n <= BATCH_GROUPS, their values
 * at most BATCH_BYTES unless one alone is larger). */
static uint32_t publish_batch(struct kv_pool *p, struct kv_remote *rm,
			      uint32_t n, const uint64_t *keys,
			      const uint32_t *pages)
{
	const uint32_t ns = p->lay.n_streams;
	const uint64_t dh = decl_hash(p);
	const size_t vl = value_len(p);
	char names[BATCH_GROUPS][KEY_BYTES];
	const char *np[BATCH_GROUPS], *sp[BATCH_GROUPS];
	const uint8_t *vp[BATCH_GROUPS];
	size_t lens[BATCH_GROUPS];
	uint8_t exists[BATCH_GROUPS], *buf;
	struct st_redis *c = conn(rm);
	struct st_diag d = { { 0 } };
	uint64_t now = st_now_ns();
	uint32_t m = 0;
	int r;

	if (!c)
		return 0;
	for (uint32_t i = 0; i < n; i++) {
		kv_remote_key(p, keys[i], names[i], KEY_BYTES);
		np[i] = names[i];
	}
	if (st_redis_touch(c, n, np, rm->cfg.ttl_s, exists, &d) < 0) {
		fail(rm, "publish (EXPIRE)", &d);
		return 0;
	}
	if (now - rm->window_ns >= (uint64_t)rm->cfg.ttl_s * 1000000000ull) {
		rm->window_ns = now;
		rm->window_bytes = 0;
	}
	buf = malloc(vl * n);
	if (!buf) {
		st_diag_set(&d, -ENOMEM, "out of memory for %u values", n);
		rm->stats.errors++;
		return 0;
	}
	for (uint32_t i = 0; i < n; i++) {
		if (exists[i])
			continue;
		if (rm->window_bytes + vl > rm->cfg.budget_bytes) {
			rm->stats.over_budget++;
			continue;
		}
		value_encode(p, keys[i], dh, pages + (size_t)i * ns,
			     buf + vl * m);
		sp[m] = np[i];
		vp[m] = buf + vl * m;
		lens[m] = vl;
		rm->window_bytes += vl;
		m++;
	}
	r = m ? st_redis_set(c, m, sp, vp, lens, rm->cfg.ttl_s, &d) : 0;
	free(buf);
	if (r < 0) {
		fail(rm, "publish (SET)", &d);
		return 0;
	}
	ok(rm);
	rm->stats.published += (uint64_t)r;
	rm->stats.bytes_out += (uint64_t)r * vl;
	return (uint32_t)r;
}

uint32_t kv_remote_publish(struct kv_pool *p, uint32_t n,
			   const uint64_t *keys, const uint32_t *pages)
{
	struct kv_remote *rm = p->remote;
	uint32_t done = 0, sent = 0, batch;

	if (!rm)
		return 0;
	batch = (uint32_t)ST_MAX(1ull, ST_MIN((uint64_t)BATCH_GROUPS,
					      BATCH_BYTES / value_len(p)));
	while (done < n && (rm->conn || st_now_ns() >= rm->retry_ns)) {
		uint32_t m = ST_MIN(n - done, batch);
		uint64_t errs = rm->stats.errors;

		sent += publish_batch(p, rm, m, keys + done,
				      pages + (size_t)done * p->lay.n_streams);
		if (rm->stats.errors != errs)
			break;
		done += m;
	}
	return sent;
}

/* ---- whole values (saved sessions) --------------------------------------- */

int kv_remote_blob_put(struct kv_remote *rm, const char *key,
		       const uint8_t *buf, size_t len, uint32_t ttl_s)
{
	struct st_redis *c = conn(rm);
	struct st_diag d = { { 0 } };
	int r;

	if (!c)
		return -ST_E_PEERGONE;
	r = st_redis_set(c, 1, &key, &buf, &len, ttl_s, &d);
	if (r < 0) {
		fail(rm, "SET of a session", &d);
		return r;
	}
	ok(rm);
	rm->stats.bytes_out += len;
	return 0;
}

int kv_remote_blob_get(struct kv_remote *rm, const char *key, uint8_t **ret,
		       size_t *ret_len)
{
	struct st_redis *c = conn(rm);
	struct st_diag d = { { 0 } };
	int r;

	*ret = NULL;
	*ret_len = 0;
	if (!c)
		return -ST_E_PEERGONE;
	r = st_redis_get(c, 1, &key, ret, ret_len, &d);
	if (r < 0) {
		fail(rm, "GET of a session", &d);
		return r;
	}
	ok(rm);
	rm->stats.bytes_in += *ret_len;
	return *ret != NULL;
}

int kv_remote_blob_del(struct kv_remote *rm, const char *key)
{
	struct st_redis *c = conn(rm);
	struct st_diag d = { { 0 } };
	uint8_t exists = 0;
	int r;

	if (!c)
		return -ST_E_PEERGONE;
	r = st_redis_touch(c, 1, &key, 60, &exists, &d);
	if (r >= 0)
		r = st_redis_del(c, key, &d);
	if (r < 0) {
		fail(rm, "DEL of a session", &d);
		return r;
	}
	ok(rm);
	return exists;
}

/* ---- restore -------------------------------------------------------------- */

/* Puts a verified value's pages into the pool as group `key` and into
 * sequence idx at page index pi.  0, or negative when no room or page. */
static int place(struct kv_pool *p, uint32_t idx, uint32_t pi, uint64_t key,
		 const uint8_t *v, uint32_t stamp)
{
	const uint32_t ns = p->lay.n_streams;
	const uint8_t *data = v + header_len(p);
	uint32_t pages[KV_MAX_STREAMS], k;
	struct st_diag d = { { 0 } };
	int r = 0;

	if (ns > kv_pool_free_pages(p)) {
		r = kv_pool_make_room(p, ns, stamp, "restoring a remote "
				      "prefix", &d);
		if (r < 0)
			return r;
	}
	for (k = 0; k < ns; k++) {
		r = kv_page_alloc(p, k, &pages[k]);
		if (r < 0)
			goto undo;
	}
	for (uint32_t s = 0; s < ns; s++) {
		uint32_t sl = stream_len(p, s);

		memcpy(kv_page_data(p, pages[s]), data, sl);
		data += sl;
	}
	r = kv_cache_insert(p, key, pages);
	if (r != 1) {
		r = r < 0 ? r : -EEXIST;
		goto undo;
	}
	for (uint32_t s = 0; s < ns; s++)
		kv_table_set(p, idx, s, pi, pages[s]);
	return 0;
undo:
	for (uint32_t i = 0; i < k; i++)
		kv_page_unref(p, pages[i]);
	return r;
}

uint32_t kv_remote_restore_chain(struct kv_pool *p, uint32_t idx,
				 uint32_t first, const uint64_t *keys,
				 uint32_t n, uint32_t stamp)
{
	struct kv_remote *rm = p->remote;
	const uint64_t dh = decl_hash(p);
	const size_t vl = value_len(p);
	uint32_t batch, got = 0;
	int stop = 0;

	if (!rm || n == 0)
		return 0;
	batch = (uint32_t)ST_MAX(1ull, ST_MIN((uint64_t)BATCH_GROUPS,
					      BATCH_BYTES / vl));
	while (!stop && got < n) {
		uint32_t m = ST_MIN(batch, n - got);
		char names[BATCH_GROUPS][KEY_BYTES];
		const char *np[BATCH_GROUPS];
		uint8_t *vals[BATCH_GROUPS];
		size_t lens[BATCH_GROUPS];
		struct st_redis *c = conn(rm);
		struct st_diag d = { { 0 } };

		if (!c)
			break;
		for (uint32_t i = 0; i < m; i++) {
			kv_remote_key(p, keys[got + i], names[i], KEY_BYTES);
			np[i] = names[i];
		}
		if (st_redis_get(c, m, np, vals, lens, &d) < 0) {
			fail(rm, "lookup (GET)", &d);
			break;
		}
		ok(rm);
		for (uint32_t i = 0; i < m; i++) {
			const char *why;

			if (stop || !vals[i]) {
				if (!stop && got == 0)
					rm->stats.misses++;
				stop = 1;
				free(vals[i]);
				continue;
			}
			rm->stats.bytes_in += lens[i];
			why = value_check(p, keys[got], dh, vals[i], lens[i]);
			if (why) {
				struct st_diag dd = { { 0 } };

				rm->stats.rejected++;
				rm->stats.errors++;
				st_warn("remote KV tier: value under %s "
					"rejected (%s); deleted, computed "
					"again locally", names[i], why);
				if (st_redis_del(c, names[i], &dd) < 0)
					fail(rm, "delete of a bad value", &dd);
				stop = 1;
			} else if (place(p, idx, first + got, keys[got],
					 vals[i], stamp) < 0) {
				stop = 1;
			} else {
				rm->stats.hits++;
				got++;
			}
			free(vals[i]);
		}
	}
	return got;
}

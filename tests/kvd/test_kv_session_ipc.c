/*
 * test_kv_session_ipc.c — saved sessions between real kvd processes
 * (issue 23 item 4), without a model: rows a client of kvd A wrote and
 * published are saved under a name, kvd A goes away with its pool, and a
 * fresh kvd B (another instance and pool, the same --session-dir) loads
 * the session into its prefix cache: a prompt starting with the session's
 * ids maps its rows byte for byte.  A session of another model, store, KV
 * dtype, page size or stream declaration is refused with an error naming
 * what differs; a corrupted or truncated file is refused and nothing of it
 * is used; names that could leave the directory are refused; ls and rm.
 * With the remote KV tier (a real redis-server on a free loopback port;
 * that case is skipped without one): node A's saved session loads in node
 * B that has no file of it, a corrupted value is refused, rm removes the
 * Redis copy.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_client.h"
#include "kv_test_util.h"
#include "st_formats.h"
#include "st_redis.h"
#include "st_util.h"

#define MODEL 0x5eed5eed12345678ull
#define PAGE_ROWS 4u
#define N_IDS 13u         /* 3 full pages (P10: 12 rows mapped) */
#define TIMEOUT_MS 5000
/* the file: 144 header bytes, 13 ids, 3 group values of 40 + 16 x 2
 * header bytes and 4 rows of 64 + 32 bytes (kv_session.h, kv_remote.h) */
#define GROUP_BYTES (72u + 4u * (64u + 32u))
#define FILE_BYTES (144u + 4u * N_IDS + 3u * GROUP_BYTES)

static const uint32_t rb[2] = { 64, 32 };

struct fix {
	char dir[256];    /* the shared --session-dir */
	struct kvt_redis redis; /* test_remote's redis-server */
};

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/tmp/strata-sess-test.XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	kvt_redis_stop(&f->redis);
	st_rm_rf(f->dir);
	free(f);
	return 0;
}

static void start(struct kvd_inst *k, const char *tag, const struct fix *f)
{
	kvd_inst_init(k, tag);
	k->extra[0] = "--session-dir";
	k->extra[1] = f->dir;
	assert_int_equal(kvd_start(k, NULL), 0);
}

static struct kv_client *client(struct kvd_inst *k, const uint32_t *rbytes,
				uint32_t page_rows)
{
	struct kv_stream_decl s[2];
	struct kv_client *c = NULL;
	struct st_diag d = { { 0 } };

	for (int i = 0; i < 2; i++)
		s[i] = (struct kv_stream_decl){ rbytes[i], 1, 0, 0 };
	assert_int_equal(kv_client_open(k->run_dir, k->name, "session-test",
					TIMEOUT_MS, &c, &d), 0);
	assert_int_equal(kv_client_declare_model(c, 2, s, page_rows, MODEL,
						 &d), 0);
	return c;
}

static struct kv_session_ident ident(void)
{
	struct kv_session_ident id = { MODEL, 0xabcdef0123456789ull,
				       ST_DTYPE_F32, PAGE_ROWS, "tiny-test" };
	return id;
}

static uint8_t pattern(uint32_t s, uint32_t r, uint32_t i)
{
	return (uint8_t)(s * 31 + r * 7 + i + 5);
}

/* The conversation ids[N_IDS] written (every row) and published with
 * flags (KV_PUBLISH_F_PRIVATE: not to the remote tier's prefix keys). */
static void compute_flags(struct kv_client *c, const int32_t *ids,
			  uint32_t flags)
{
	struct st_diag d = { { 0 } };
	uint32_t seq, cached, n = N_IDS;

	assert_int_equal(kv_client_seq_create_prefix(c, ids, N_IDS, &seq,
						     &cached, &d), 0);
	assert_int_equal(cached, 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &seq, &n, &d), 0);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < N_IDS; r++) {
			uint8_t *p = kv_client_row_writable(c, seq, (int)s, r);

			assert_non_null(p);
			for (uint32_t i = 0; i < rb[s]; i++)
				p[i] = pattern(s, r, i);
		}
	assert_int_equal(kv_client_seq_publish_flags(c, seq, ids, N_IDS, flags,
						     &d), 3);
	assert_int_equal(kv_client_seq_free(c, seq), 0);
}

static void compute(struct kv_client *c, const int32_t *ids)
{
	compute_flags(c, ids, 0);
}

/* Rows mapped by a prompt of ids; when 12, checked byte for byte. */
static uint32_t mapped(struct kv_client *c, const int32_t *ids)
{
	struct st_diag d = { { 0 } };
	uint32_t seq, cached;

	assert_int_equal(kv_client_seq_create_prefix(c, ids, N_IDS, &seq,
						     &cached, &d), 0);
	for (uint32_t s = 0; s < 2 && cached; s++)
		for (uint32_t r = 0; r < cached; r++) {
			const uint8_t *q = kv_client_row(c, seq, (int)s, r);

			assert_non_null(q);
			for (uint32_t i = 0; i < rb[s]; i++)
				assert_int_equal(q[i], pattern(s, r, i));
		}
	assert_int_equal(kv_client_seq_free(c, seq), 0);
	return cached;
}

static void ids_of(int32_t *ids)
{
	for (uint32_t i = 0; i < N_IDS; i++)
		ids[i] = (int32_t)(4242 + 3 * i);
}

/* Saves "conv-1" through a kvd that then exits with its pool. */
static void save_one(const struct fix *f)
{
	struct kvd_inst a;
	struct kv_client *c;
	struct kv_session_ident id = ident();
	struct st_diag d = { { 0 } };
	int32_t ids[N_IDS];
	uint32_t groups = 0;
	char path[512];
	struct stat st;

	ids_of(ids);
	start(&a, "ssa", f);
	c = client(&a, rb, PAGE_ROWS);
	compute(c, ids);
	assert_int_equal(kv_client_session_save(c, "conv-1", &id, ids, N_IDS,
						&groups, &d), 0);
	assert_int_equal(groups, 3);
	snprintf(path, sizeof(path), "%s/conv-1.kvs", f->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_size, FILE_BYTES);
	kv_client_close(c);
	kvd_cleanup(&a);
}

static void test_save_load(void **state)
{
	struct fix *f = *state;
	struct kvd_inst b;
	struct kv_client *c;
	struct kv_session_ident id = ident();
	struct kv_session_info v[4];
	struct st_diag d = { { 0 } };
	int32_t ids[N_IDS], *got = NULL;
	uint32_t placed, rows, n_got, n;

	ids_of(ids);
	save_one(f);
	/* a fresh kvd, a fresh pool: nothing cached until the load */
	start(&b, "ssb", f);
	c = client(&b, rb, PAGE_ROWS);
	assert_int_equal(mapped(c, ids), 0);
	assert_int_equal(kv_client_session_list(c, 4, v, &n, &d), 0);
	assert_int_equal(n, 1);
	assert_string_equal(v[0].name, "conv-1");
	assert_string_equal(v[0].model, "tiny-test");
	assert_int_equal(v[0].n_rows, 12);
	assert_int_equal(v[0].file_bytes, FILE_BYTES);
	assert_int_equal(kv_client_session_load(c, "conv-1", &id, &placed,
						&rows, &got, &n_got, &d), 0);
	assert_int_equal(placed, 3);
	assert_int_equal(rows, 12);
	assert_int_equal(n_got, N_IDS);
	assert_memory_equal(got, ids, sizeof(ids));
	free(got);
	assert_int_equal(mapped(c, ids), 12);
	/* loading again places nothing new, the rows stay mapped */
	assert_int_equal(kv_client_session_load(c, "conv-1", &id, &placed,
						&rows, &got, &n_got, &d), 0);
	assert_int_equal(placed, 0);
	free(got);
	assert_int_equal(mapped(c, ids), 12);
	/* rm, then ls shows none and load finds none */
	assert_int_equal(kv_client_session_remove(c, "conv-1", &d), 0);
	assert_int_equal(kv_client_session_list(c, 4, v, &n, &d), 0);
	assert_int_equal(n, 0);
	assert_int_equal(kv_client_session_load(c, "conv-1", &id, &placed,
						&rows, &got, &n_got, &d),
			 -ST_E_NOTFOUND);
	assert_non_null(strstr(d.msg, "session 'conv-1' does not exist"));
	assert_int_equal(kv_client_session_remove(c, "conv-1", &d),
			 -ST_E_NOTFOUND);
	kv_client_close(c);
	kvd_cleanup(&b);
}

/* Load of session `name` with ident id into client c: the error, and
 * diag must contain `says`. */
static void refused_name(struct kv_client *c, const char *name,
			 const struct kv_session_ident *id, int err,
			 const char *says)
{
	struct st_diag d = { { 0 } };
	int32_t *got = NULL;
	uint32_t placed = 9, rows, n_got;

	assert_int_equal(kv_client_session_load(c, name, id, &placed,
						&rows, &got, &n_got, &d), err);
	assert_int_equal(placed, 0);
	assert_null(got);
	if (!strstr(d.msg, says))
		fail_msg("'%s' does not say '%s'", d.msg, says);
}

static void refused(struct kv_client *c, const struct kv_session_ident *id,
		    int err, const char *says)
{
	refused_name(c, "conv-1", id, err, says);
}

static void test_refused(void **state)
{
	static const uint32_t rb_other[2] = { 64, 16 };
	struct fix *f = *state;
	struct kvd_inst b, e;
	struct kv_client *c, *ce;
	struct kv_session_ident id = ident();
	int32_t ids[N_IDS];
	char path[512];

	ids_of(ids);
	save_one(f);
	start(&b, "ssc", f);
	c = client(&b, rb, PAGE_ROWS);
	id = ident();
	snprintf(id.model, sizeof(id.model), "other-model");
	refused(c, &id, -ST_E_CONFIG, "is of model 'tiny-test'; this "
		"instance serves 'other-model'");
	id = ident();
	id.store_id ^= 1;
	refused(c, &id, -ST_E_CONFIG, "another store of 'tiny-test'");
	id = ident();
	id.kv_dtype = ST_DTYPE_BF16;
	refused(c, &id, -ST_E_CONFIG, "KV dtype F32; this instance uses BF16");
	id = ident();
	id.model_id ^= 2;
	refused(c, &id, -ST_E_CONFIG, "another model id");
	/* nothing of it was used */
	assert_int_equal(mapped(c, ids), 0);
	kv_client_close(c);
	kvd_cleanup(&b);

	/* a pool of another page size, then another row size */
	start(&e, "ssd", f);
	ce = client(&e, rb, 8);
	id = ident();
	id.page_rows = 8;
	refused(ce, &id, -ST_E_CONFIG, "page size of 4 rows; this instance "
		"uses 8");
	kv_client_close(ce);
	kvd_cleanup(&e);
	start(&e, "sse", f);
	ce = client(&e, rb_other, PAGE_ROWS);
	id = ident();
	refused(ce, &id, -ST_E_CONFIG, "another KV stream declaration");
	kv_client_close(ce);
	kvd_cleanup(&e);

	/* a flipped bit in the last group's rows, in an id, a cut file */
	start(&b, "ssf", f);
	c = client(&b, rb, PAGE_ROWS);
	snprintf(path, sizeof(path), "%s/conv-1.kvs", f->dir);
	assert_int_equal(kvd_flip_byte(path, FILE_BYTES - 10), 0);
	id = ident();
	refused(c, &id, -ST_E_CHECKSUM, "page group 2 of 3: checksum "
		"mismatch");
	assert_int_equal(mapped(c, ids), 0);
	assert_int_equal(kvd_flip_byte(path, FILE_BYTES - 10), 0);
	assert_int_equal(kvd_flip_byte(path, 144 + 4 * 5), 0);
	refused(c, &id, -ST_E_CHECKSUM, "header checksum mismatch");
	assert_int_equal(kvd_flip_byte(path, 144 + 4 * 5), 0);
	assert_int_equal(truncate(path, FILE_BYTES - 1), 0);
	refused(c, &id, -ST_E_FORMAT, "does not match its header");
	assert_int_equal(mapped(c, ids), 0);
	kv_client_close(c);
	kvd_cleanup(&b);
}

static void test_names(void **state)
{
	static const char *bad[] = { "", "../x", "a/b", ".hidden", "..",
				     "sp ace", "x\n",
				     "0123456789012345678901234567890123456789"
				     "0123456789012345678901234" };
	struct fix *f = *state;
	struct kvd_inst b;
	struct kv_client *c;
	struct kv_session_ident id = ident();
	struct st_diag d = { { 0 } };
	int32_t ids[N_IDS];
	uint32_t groups = 7;

	ids_of(ids);
	start(&b, "ssg", f);
	c = client(&b, rb, PAGE_ROWS);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(kv_session_name_ok(bad[i], NULL), 0);
		assert_int_equal(kv_client_session_save(c, bad[i], &id, ids,
							N_IDS, &groups, &d),
				 -EINVAL);
		assert_int_equal(kv_client_session_remove(c, bad[i], &d),
				 -EINVAL);
	}
	assert_int_equal(kv_session_name_ok("chat_2026-12.v1", NULL), 1);
	/* nothing cached: nothing to save, no file */
	assert_int_equal(kv_client_session_save(c, "empty", &id, ids, N_IDS,
						&groups, &d), -ST_E_NOTFOUND);
	assert_int_equal(groups, 0);
	/* says what to do: run the conversation first (was "publish its
	 * rows first", which a user cannot act on) */
	assert_non_null(strstr(d.msg, "KV is not cached"));
	assert_non_null(strstr(d.msg, "run a completion of exactly this "
			       "prompt"));
	assert_null(strstr(d.msg, "publish"));
	kv_client_close(c);
	kvd_cleanup(&b);
}

/* ---- the remote tier (a real redis-server; skipped without one) ---- */

/* kvd with its own session directory `sub` of f->dir and the tier. */
static void start_remote(struct kvd_inst *k, const char *tag,
			 const struct fix *f, const char *sub, char *dir,
			 const char *url)
{
	snprintf(dir, 300, "%s/%s", f->dir, sub);
	kvd_inst_init(k, tag);
	k->extra[0] = "--session-dir";
	k->extra[1] = dir;
	k->extra[2] = "--remote-kv";
	k->extra[3] = url;
	k->extra[4] = "--remote-kv-timeout";
	k->extra[5] = "2000";
	assert_int_equal(kvd_start(k, NULL), 0);
}

static void test_remote(void **state)
{
	struct fix *f = *state;
	struct kvd_inst a, b, c;
	struct kv_client *ca, *cb, *cc;
	struct kv_session_ident id = ident();
	struct st_diag d = { { 0 } };
	struct st_redis_url u;
	struct st_redis *rd = NULL;
	int32_t ids[N_IDS], *got = NULL;
	uint32_t groups, placed, rows, n_got;
	char da[300], db[300], dc[300];
	const char *url;
	const char *key = "strata:session:1:shared-1";
	uint8_t *val = NULL;
	size_t len = 0;

	if (system("command -v redis-server >/dev/null 2>&1") != 0) {
		printf("skip: redis-server not installed: no remote-tier "
		       "session test\n");
		return;
	}
	assert_int_equal(kvt_redis_start(&f->redis), 0);
	url = f->redis.url;
	assert_int_equal(st_redis_url_parse(url, &u, NULL), 0);
	assert_int_equal(st_redis_open(&u, 200, &rd, NULL), 0);
	assert_non_null(rd);

	/* node A saves: its file, and the value in Redis */
	ids_of(ids);
	start_remote(&a, "ssra", f, "node-a", da, url);
	ca = client(&a, rb, PAGE_ROWS);
	/* private: the prefix pages stay out of the tier, so rows mapped
	 * elsewhere can only come from the session */
	compute_flags(ca, ids, KV_PUBLISH_F_PRIVATE);
	assert_int_equal(kv_client_session_save(ca, "shared-1", &id, ids,
						N_IDS, &groups, &d), 0);
	assert_int_equal(groups, 3);
	assert_int_equal(st_redis_get(rd, 1, &key, &val, &len, &d), 0);
	assert_non_null(val);
	assert_int_equal(len, FILE_BYTES);
	kv_client_close(ca);
	kvd_cleanup(&a);

	/* node B, no file of it: loads it from Redis, rows byte for byte */
	start_remote(&b, "ssrb", f, "node-b", db, url);
	cb = client(&b, rb, PAGE_ROWS);
	assert_int_equal(kv_client_session_load(cb, "shared-1", &id, &placed,
						&rows, &got, &n_got, &d), 0);
	assert_int_equal(placed, 3);
	assert_int_equal(rows, 12);
	free(got);
	assert_int_equal(mapped(cb, ids), 12);

	/* a corrupted value in Redis: refused, nothing used */
	start_remote(&c, "ssrc", f, "node-c", dc, url);
	cc = client(&c, rb, PAGE_ROWS);
	val[len - 3] ^= 0x40;
	assert_int_equal(st_redis_set(rd, 1, &key,
				      (const uint8_t *const *)&val, &len, 60,
				      &d), 1);
	refused_name(cc, "shared-1", &id, -ST_E_CHECKSUM, "checksum mismatch");
	assert_int_equal(mapped(cc, ids), 0);
	free(val);

	/* rm on B (no file there) removes the Redis copy: C finds none */
	assert_int_equal(kv_client_session_remove(cb, "shared-1", &d), 0);
	assert_int_equal(kv_client_session_load(cc, "shared-1", &id, &placed,
						&rows, &got, &n_got, &d),
			 -ST_E_NOTFOUND);
	assert_int_equal(kv_client_session_remove(cb, "shared-1", &d),
			 -ST_E_NOTFOUND);
	kv_client_close(cb);
	kv_client_close(cc);
	kvd_cleanup(&b);
	kvd_cleanup(&c);
	st_redis_close(rd);
	kvt_redis_stop(&f->redis);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_save_load),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_remote),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * test_kv_remote_ipc.c — kvd's remote KV tier between real kvd processes
 * and a real redis-server on a free loopback port (issue 23), without a
 * model: rows written by a client of kvd A come back byte for byte in a
 * sequence of kvd B (another instance and pool) that maps the prefix from
 * Redis; a private sequence's pages are not published unless kvd runs with
 * --remote-kv-share-private 1; a pool of another stream declaration maps
 * nothing and rejects nothing (other keys).  Skips (77) without
 * redis-server.
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
#include <sys/wait.h>
#include <unistd.h>

#include "kv_client.h"
#include "kv_test_util.h"
#include "st_redis.h"
#include "st_util.h"

#define MODEL 0x5eed5eed12345678ull
#define PAGE_ROWS 4u
#define N_IDS 13u         /* 3 full pages shareable (P10: 12 rows) */
#define TIMEOUT_MS 5000

static const uint32_t rb[2] = { 64, 32 };

struct fix {
	struct kvt_redis redis;
};

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	assert_int_equal(kvt_redis_start(&f->redis), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	kvt_redis_stop(&f->redis);
	free(f);
	return 0;
}

/* kvd on its own instance with the tier (and `more` options, or NULL). */
static void start(struct kvd_inst *k, const char *tag, const struct fix *f,
		  const char *more, const char *more_val)
{
	kvd_inst_init(k, tag);
	k->extra[0] = "--remote-kv";
	k->extra[1] = f->redis.url;
	k->extra[2] = more;
	k->extra[3] = more ? more_val : NULL;
	assert_int_equal(kvd_start(k, NULL), 0);
}

static struct kv_client *client(struct kvd_inst *k, const uint32_t *rbytes)
{
	struct kv_stream_decl s[2];
	struct kv_client *c = NULL;
	struct st_diag d = { { 0 } };

	for (int i = 0; i < 2; i++)
		s[i] = (struct kv_stream_decl){ rbytes[i], 1, 0, 0 };
	assert_int_equal(kv_client_open(k->run_dir, k->name, "remote-test",
					TIMEOUT_MS, &c, &d), 0);
	assert_int_equal(kv_client_declare_model(c, 2, s, PAGE_ROWS, MODEL,
						 &d), 0);
	return c;
}

static uint8_t pattern(uint32_t tag, uint32_t s, uint32_t r, uint32_t i)
{
	return (uint8_t)(tag * 131 + s * 31 + r * 7 + i);
}

/* A sequence of the prompt ids[N_IDS] with every row written (tag), and
 * its pages published with `flags`.  Returns the sequence. */
static uint32_t compute(struct kv_client *c, const int32_t *ids,
			uint32_t tag, uint32_t flags)
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
				p[i] = pattern(tag, s, r, i);
		}
	assert_int_equal(kv_client_seq_publish_flags(c, seq, ids, N_IDS, flags,
						     &d), 3);
	return seq;
}

static void ids_of(uint32_t tag, int32_t *ids)
{
	for (uint32_t i = 0; i < N_IDS; i++)
		ids[i] = (int32_t)(tag * 1000 + i);
}

static void test_share(void **state)
{
	struct fix *f = *state;
	struct kvd_inst a, b, p;
	struct kv_client *ca, *cb, *cp;
	struct kv_stats st;
	struct st_diag d = { { 0 } };
	int32_t pub[N_IDS], priv[N_IDS];
	uint32_t seq, cached;

	ids_of(1, pub);
	ids_of(2, priv);
	/* node A: a private prompt stays local, a plain one is published */
	start(&a, "rka", f, NULL, NULL);
	ca = client(&a, rb);
	compute(ca, priv, 2, KV_PUBLISH_F_PRIVATE);
	assert_int_equal(kv_client_stats(ca, &st), 0);
	assert_int_equal(st.remote_on, 1);
	assert_int_equal(st.remote_published, 0);
	assert_int_equal(st.remote_bytes_out, 0);
	compute(ca, pub, 1, 0);
	assert_int_equal(kv_client_stats(ca, &st), 0);
	assert_int_equal(st.remote_published, 3);
	/* each value: 40 + 16 x 2 header bytes, 4 rows of 64 + 32 bytes */
	assert_int_equal(st.remote_bytes_out, 3 * (72 + 4 * (64 + 32)));
	assert_int_equal(st.remote_errors, 0);

	/* node B: the published prefix comes back byte for byte */
	start(&b, "rkb", f, NULL, NULL);
	cb = client(&b, rb);
	assert_int_equal(kv_client_seq_create_prefix(cb, pub, N_IDS, &seq,
						     &cached, &d), 0);
	assert_int_equal(cached, 12);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 12; r++) {
			const uint8_t *q = kv_client_row(cb, seq, (int)s, r);

			assert_non_null(q);
			for (uint32_t i = 0; i < rb[s]; i++)
				assert_int_equal(q[i], pattern(1, s, r, i));
		}
	/* ... and the private one does not */
	assert_int_equal(kv_client_seq_create_prefix(cb, priv, N_IDS, &seq,
						     &cached, &d), 0);
	assert_int_equal(cached, 0);
	assert_int_equal(kv_client_stats(cb, &st), 0);
	assert_int_equal(st.remote_hits, 3);
	assert_int_equal(st.remote_misses, 1);
	assert_int_equal(st.remote_bytes_in, 3 * (72 + 4 * (64 + 32)));
	assert_int_equal(st.remote_errors, 0);
	/* the restored groups are in B's local cache now: no second fetch */
	assert_int_equal(kv_client_seq_create_prefix(cb, pub, N_IDS, &seq,
						     &cached, &d), 0);
	assert_int_equal(cached, 12);
	assert_int_equal(kv_client_stats(cb, &st), 0);
	assert_int_equal(st.remote_hits, 3);

	/* a kvd asked to share private sequences publishes them */
	start(&p, "rkp", f, "--remote-kv-share-private", "1");
	cp = client(&p, rb);
	ids_of(3, priv);
	compute(cp, priv, 3, KV_PUBLISH_F_PRIVATE);
	assert_int_equal(kv_client_stats(cp, &st), 0);
	assert_int_equal(st.remote_published, 3);

	kv_client_close(ca);
	kv_client_close(cb);
	kv_client_close(cp);
	kvd_cleanup(&a);
	kvd_cleanup(&b);
	kvd_cleanup(&p);
}

static void test_other_declaration(void **state)
{
	static const uint32_t rb_other[2] = { 64, 16 };
	struct fix *f = *state;
	struct kvd_inst a, b;
	struct kv_client *ca, *cb;
	struct kv_stats st;
	struct st_diag d = { { 0 } };
	int32_t ids[N_IDS];
	uint32_t seq, cached;

	ids_of(7, ids);
	start(&a, "rkc", f, NULL, NULL);
	ca = client(&a, rb);
	compute(ca, ids, 7, 0);
	/* same model id and ids, rows of another size: other keys */
	start(&b, "rkd", f, NULL, NULL);
	cb = client(&b, rb_other);
	assert_int_equal(kv_client_seq_create_prefix(cb, ids, N_IDS, &seq,
						     &cached, &d), 0);
	assert_int_equal(cached, 0);
	assert_int_equal(kv_client_stats(cb, &st), 0);
	assert_int_equal(st.remote_hits, 0);
	assert_int_equal(st.remote_misses, 1);
	assert_int_equal(st.remote_errors, 0);
	kv_client_close(ca);
	kv_client_close(cb);
	kvd_cleanup(&a);
	kvd_cleanup(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_share),
		cmocka_unit_test(test_other_declaration),
	};

	if (system("command -v redis-server >/dev/null 2>&1") != 0) {
		printf("SKIP: redis-server not installed (scripts/setup-debian.sh "
		       "installs it)\n");
		return 77;
	}
	return cmocka_run_group_tests(tests, setup, teardown);
}

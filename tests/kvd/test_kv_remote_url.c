/*
 * test_kv_remote_url.c — the remote KV tier's configuration (no Redis
 * needed): redis:// URLs parsed into host, port and database or refused
 * with a message, and kv_remote_init refusing a zero TTL or timeout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "kv_remote.h"
#include "st_redis.h"

static void test_url_good(void **state)
{
	struct st_redis_url u;
	struct st_diag d = { { 0 } };

	(void)state;
	assert_int_equal(st_redis_url_parse("redis://10.1.2.3:7001/5", &u, &d),
			 0);
	assert_string_equal(u.host, "10.1.2.3");
	assert_int_equal(u.port, 7001);
	assert_int_equal(u.db, 5);
	assert_int_equal(st_redis_url_parse("redis://cache.local", &u, &d), 0);
	assert_string_equal(u.host, "cache.local");
	assert_int_equal(u.port, 6379);
	assert_int_equal(u.db, 0);
	assert_int_equal(st_redis_url_parse("redis://h:1/", &u, &d), 0);
	assert_int_equal(u.port, 1);
	assert_int_equal(u.db, 0);
	assert_int_equal(st_redis_url_parse("redis://h/12", &u, &d), 0);
	assert_int_equal(u.port, 6379);
	assert_int_equal(u.db, 12);
}

static void test_url_bad(void **state)
{
	static const char *const bad[] = {
		"http://h:1/0", "redis://", "redis://:6379/0",
		"redis://h:0/0", "redis://h:65536/0", "redis://h:12x/0",
		"redis://h:1/db", "redis://h:1/0/1", "redis://pw@h:1/0",
		"redis://h:1/70000", "",
	};
	struct st_redis_url u;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct st_diag d = { { 0 } };

		assert_int_equal(st_redis_url_parse(bad[i], &u, &d), -EINVAL);
		/* the message names the URL given */
		assert_non_null(strstr(d.msg, "remote KV URL"));
	}
}

static void test_init(void **state)
{
	struct kv_remote_config c = { "redis://127.0.0.1:1/0", 60, 1 << 20,
				      100, 0 };
	struct kv_remote rm;
	struct st_diag d = { { 0 } };

	(void)state;
	assert_int_equal(kv_remote_init(&rm, &c, &d), 0);
	assert_int_equal(rm.url.port, 1);
	assert_null(rm.conn); /* connects at first use only */
	kv_remote_fini(&rm);
	c.ttl_s = 0;
	assert_int_equal(kv_remote_init(&rm, &c, &d), -EINVAL);
	c.ttl_s = 60;
	c.timeout_ms = 0;
	assert_int_equal(kv_remote_init(&rm, &c, &d), -EINVAL);
	kv_remote_fini(&rm);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_url_good),
		cmocka_unit_test(test_url_bad),
		cmocka_unit_test(test_init),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

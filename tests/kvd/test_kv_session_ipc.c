/*
 * test_kv_session_ipc.c — saved sessions between real kvd processes
 * (issue 23 item 4), without a model: rows a client of kvd A wrote and
 * published are saved under a name, kvd A goes away with its pool, and a
 * fresh kvd B (another instance and pool, the same --session-dir) loads
 * the session into its prefix cache: a prompt starting with the session's
 * ids maps its rows byte for byte.  A session of another model, store, KV
 * dtype, page size or stream declaration is refused with an error naming
 * what differs; a corrupted or truncated file is refused and nothing of it
 * is used; names that could leave the directory are refused; ls and rm;
 * ls lists corrupt files as such, links are never followed, saving over
 * a name says what it replaced.
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
						&groups, NULL, &d), 0);
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
	/* a flipped byte in the format field is corruption, not another
	 * format: the checksum is checked before any field is believed */
	assert_int_equal(kvd_flip_byte(path, 9), 0);
	refused(c, &id, -ST_E_CHECKSUM, "header checksum mismatch (corrupt "
		"file)");
	assert_int_equal(kvd_flip_byte(path, 9), 0);
	assert_int_equal(truncate(path, FILE_BYTES - 1), 0);
	refused(c, &id, -ST_E_FORMAT, "size 1563, header says 1564");
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
							N_IDS, &groups, NULL,
							&d),
				 -EINVAL);
		assert_int_equal(kv_client_session_remove(c, bad[i], &d),
				 -EINVAL);
	}
	assert_int_equal(kv_session_name_ok("chat_2026-12.v1", NULL), 1);
	/* nothing cached: nothing to save, no file */
	assert_int_equal(kv_client_session_save(c, "empty", &id, ids, N_IDS,
						&groups, NULL, &d),
			 -ST_E_NOTFOUND);
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

/* Copies the first n bytes of file `from` to `to` (n = -1: all), then
 * appends `extra` bytes of 0x5a. */
static void copy_file(const char *from, const char *to, long n, int extra)
{
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	int c;

	assert_non_null(a);
	assert_non_null(b);
	while ((n < 0 || n-- > 0) && (c = fgetc(a)) != EOF)
		fputc(c, b);
	while (extra-- > 0)
		fputc(0x5a, b);
	fclose(a);
	fclose(b);
}

/* The LIST entry of `name` in v[n] (fails when absent). */
static const struct kv_session_info *entry(const struct kv_session_info *v,
					   uint32_t n, const char *name)
{
	for (uint32_t i = 0; i < n; i++)
		if (!strcmp(v[i].name, name))
			return &v[i];
	fail_msg("no entry '%s' in the list", name);
	return v; /* not reached */
}

/* Saving over a name says what it replaced; ls checks every file
 * (corrupt, truncated, grown, another format byte, empty, garbage) and
 * lists a bad one as such, never as a session; kvd does not follow a
 * symbolic link in its session directory (ls, load, rm, save); a
 * --session-dir that is a regular file fails saves, loads and lists with
 * an error naming it. */
static void test_files(void **state)
{
	struct fix *f = *state;
	struct kvd_inst b;
	struct kv_client *c;
	struct kv_session_ident id = ident();
	struct kv_session_info v[16];
	const struct kv_session_info *e;
	struct st_diag d = { { 0 } };
	int32_t ids[N_IDS], replaced = 7;
	uint32_t groups = 0, n = 0;
	char dir[300], p[400], q[400], tgt[400], link[400];
	FILE *fp;

	ids_of(ids);
	snprintf(dir, sizeof(dir), "%s/files", f->dir);
	assert_int_equal(mkdir(dir, 0700), 0);
	kvd_inst_init(&b, "ssh");
	b.extra[0] = "--session-dir";
	b.extra[1] = dir;
	assert_int_equal(kvd_start(&b, NULL), 0);
	c = client(&b, rb, PAGE_ROWS);
	compute(c, ids);
	assert_int_equal(kv_client_session_save(c, "conv-1", &id, ids, N_IDS,
						&groups, &replaced, &d), 0);
	assert_int_equal(replaced, -1);
	/* the same name again: replaced, with the old session's rows */
	assert_int_equal(kv_client_session_save(c, "conv-1", &id, ids, N_IDS,
						&groups, &replaced, &d), 0);
	assert_int_equal(groups, 3);
	assert_int_equal(replaced, 12);

	snprintf(p, sizeof(p), "%s/conv-1.kvs", dir);
	snprintf(q, sizeof(q), "%s/cut.kvs", dir);
	copy_file(p, q, FILE_BYTES / 2, 0);
	snprintf(q, sizeof(q), "%s/grown.kvs", dir);
	copy_file(p, q, -1, 1);
	snprintf(q, sizeof(q), "%s/fmt.kvs", dir);
	copy_file(p, q, -1, 0);
	assert_int_equal(kvd_flip_byte(q, 9), 0);
	snprintf(q, sizeof(q), "%s/empty.kvs", dir);
	copy_file(p, q, 0, 0);
	snprintf(q, sizeof(q), "%s/junk.kvs", dir);
	copy_file(p, q, 0, 300);
	/* a link to a good session file, and one to a file outside */
	snprintf(link, sizeof(link), "%s/link.kvs", dir);
	assert_int_equal(symlink(p, link), 0);
	snprintf(tgt, sizeof(tgt), "%s/outside", f->dir);
	fp = fopen(tgt, "w");
	assert_non_null(fp);
	fputs("root:x:0:0\n", fp);
	fclose(fp);
	snprintf(q, sizeof(q), "%s/passwd.kvs", dir);
	assert_int_equal(symlink(tgt, q), 0);

	assert_int_equal(kv_client_session_list(c, 16, v, &n, &d), 0);
	assert_int_equal(n, 8);
	e = entry(v, n, "conv-1");
	assert_string_equal(e->bad, "");
	assert_int_equal(e->n_rows, 12);
	e = entry(v, n, "cut");
	assert_string_equal(e->bad, "size 782, header says 1564");
	assert_int_equal(e->n_rows, 0);
	assert_string_equal(e->model, "");
	e = entry(v, n, "grown");
	assert_string_equal(e->bad, "size 1565, header says 1564");
	assert_int_equal(e->n_rows, 0);
	e = entry(v, n, "fmt");
	assert_string_equal(e->bad, "header checksum mismatch");
	e = entry(v, n, "empty");
	assert_string_equal(e->bad, "not a strata session file");
	e = entry(v, n, "junk");
	assert_string_equal(e->bad, "not a strata session file");
	e = entry(v, n, "link");
	assert_non_null(strstr(e->bad, "a symbolic link"));
	assert_int_equal(e->n_rows, 0);
	e = entry(v, n, "passwd");
	assert_non_null(strstr(e->bad, "a symbolic link"));

	refused_name(c, "link", &id, -ELOOP, "a symbolic link");
	refused_name(c, "grown", &id, -ST_E_FORMAT, "size 1565, header says "
		     "1564 (corrupt file)");
	refused_name(c, "fmt", &id, -ST_E_CHECKSUM, "header checksum "
		     "mismatch");
	assert_int_equal(mapped(c, ids), 12); /* conv-1's own, computed */
	/* rm and save leave a link alone (and what it points to) */
	assert_int_equal(kv_client_session_remove(c, "link", &d), -ELOOP);
	assert_non_null(strstr(d.msg, "a symbolic link"));
	assert_int_equal(access(link, F_OK), 0);
	assert_int_equal(kv_client_session_save(c, "passwd", &id, ids, N_IDS,
						&groups, &replaced, &d),
			 -EEXIST);
	assert_non_null(strstr(d.msg, "a symbolic link"));
	fp = fopen(tgt, "r");
	assert_non_null(fp);
	assert_non_null(fgets(q, sizeof(q), fp));
	fclose(fp);
	assert_string_equal(q, "root:x:0:0\n");
	/* a corrupt file of that name is replaced (0 old rows) */
	assert_int_equal(kv_client_session_save(c, "cut", &id, ids, N_IDS,
						&groups, &replaced, &d), 0);
	assert_int_equal(replaced, 0);
	kv_client_close(c);
	kvd_cleanup(&b);

	/* --session-dir a regular file: every operation names it */
	snprintf(q, sizeof(q), "%s/a-file", f->dir);
	copy_file(p, q, 0, 10);
	kvd_inst_init(&b, "ssi");
	b.extra[0] = "--session-dir";
	b.extra[1] = q;
	assert_int_equal(kvd_start(&b, NULL), 0);
	c = client(&b, rb, PAGE_ROWS);
	compute(c, ids);
	assert_true(kv_client_session_save(c, "conv-1", &id, ids, N_IDS,
					   &groups, &replaced, &d) < 0);
	assert_non_null(strstr(d.msg, q));
	assert_non_null(strstr(d.msg, "is not a directory"));
	refused_name(c, "conv-1", &id, -ENOTDIR, "is not a directory");
	assert_int_equal(kv_client_session_list(c, 16, v, &n, &d), -ENOTDIR);
	assert_non_null(strstr(d.msg, q));
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
						N_IDS, &groups, NULL, &d), 0);
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
		cmocka_unit_test(test_files),
		cmocka_unit_test(test_remote),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * test_store_errors.c — what goes wrong, and that it is said clearly and
 * loses nothing: corrupted records and files (checksums, verify), truncated
 * files, malformed manifests, converting over an existing store or into a
 * read-only place, a convert killed half-way, broken checkpoints (missing
 * tensor, wrong shape, unknown architecture, no tokenizer, a tokenizer that
 * does not load, NaN / infinite weights).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "es_convert.h"
#include "st_safetensors.h"
#include "st_store.h"
#include "st_util.h"
#include "store_testlib.h"
#include "test_util.h"

static char g_mixtral[4096];

/* One converted store shared by the read-side tests (each test works on a
 * private copy made by copying the files). */
static char g_tmp[4096], g_store[4200];

static void must(int r, const struct st_diag *d, const char *what)
{
	if (r)
		fail_msg("%s: %s (%s)", what, d->msg, st_strerror(r));
}

static void copy_dir(const char *from, const char *to)
{
	struct tst_snap s;

	assert_int_equal(mkdir(to, 0755), 0);
	tst_snapshot(from, &s);
	for (int i = 0; i < s.n; i++) {
		char a[4400], b[4400];
		size_t len;
		uint8_t *buf;

		snprintf(a, sizeof(a), "%s/%s", from, s.names[i]);
		snprintf(b, sizeof(b), "%s/%s", to, s.names[i]);
		buf = tst_read(a, &len);
		tst_write(b, buf, len);
		free(buf);
	}
}

static void fresh_copy(char *buf, size_t len, const char *tag)
{
	snprintf(buf, len, "%s/%s", g_tmp, tag);
	st_rm_rf(buf);
	copy_dir(g_store, buf);
}

/* A copy of text with the first `from` replaced by `to` (must occur). */
static char *replace(const char *text, const char *from, const char *to)
{
	const char *p = strstr(text, from);
	size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
	char *out = malloc(n);

	assert_non_null(p);
	snprintf(out, n, "%.*s%s%s", (int)(p - text), text, to,
		 p + strlen(from));
	return out;
}

static void expect_msg(const struct st_diag *d, const char *a, const char *b)
{
	if (a && !strstr(d->msg, a))
		fail_msg("message \"%s\" does not mention \"%s\"", d->msg, a);
	if (b && !strstr(d->msg, b))
		fail_msg("message \"%s\" does not mention \"%s\"", d->msg, b);
}

static int group_setup(void **state)
{
	struct st_diag d = { { 0 } };
	int r;

	st_test_tmpdir(g_tmp, sizeof(g_tmp));
	chmod(g_tmp, 0755); /* the unprivileged child below must enter it */
	snprintf(g_store, sizeof(g_store), "%s/store", g_tmp);
	r = es_convert(g_mixtral, g_store, NULL, &d);
	if (r) {
		fprintf(stderr, "convert: %s\n", d.msg);
		return -1;
	}
	return 0;
}

static int group_teardown(void **state)
{
	st_rm_rf(g_tmp);
	return 0;
}

/* --- corruption ---------------------------------------------------------- */

static void flipped_record_byte(void **state)
{
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	char dir[4300], path[4400];
	uint8_t *rec;
	int fd, n_bad = -1;

	fresh_copy(dir, sizeof(dir), "flip");
	must(st_store_open(dir, &s, &d), &d, "open");
	snprintf(path, sizeof(path), "%s/experts-001.bin", dir);
	tst_flip_byte(path, 3 * s->layers[1].record_bytes + 100);

	rec = aligned_alloc(4096, s->record_bytes);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(st_store_read_record(s, fd, 1, 3, rec, &d),
			 -ST_E_CHECKSUM);
	expect_msg(&d, "experts-001.bin", "record 3");
	expect_msg(&d, "re-run strata convert", NULL);
	/* its neighbours are fine */
	must(st_store_read_record(s, fd, 1, 2, rec, &d), &d, "record 2");
	must(st_store_read_record(s, fd, 1, 4, rec, &d), &d, "record 4");
	/* out of range is refused, not read */
	assert_int_equal(st_store_read_record(s, fd, 1, s->n_experts, rec, &d),
			 -EINVAL);
	assert_int_equal(st_store_read_record(s, fd, -1, 0, rec, &d), -EINVAL);
	close(fd);
	free(rec);
	st_store_close(s);

	memset(&d, 0, sizeof(d));
	assert_int_equal(st_store_verify(dir, NULL, NULL, &n_bad, &d),
			 -ST_E_CHECKSUM);
	assert_int_equal(n_bad, 1);
	expect_msg(&d, "experts-001.bin", "record 3");
	st_rm_rf(dir);
}

static void flipped_dense_and_copy(void **state)
{
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	const struct st_store_tensor *t;
	char dir[4300], path[4400];
	int n_bad = -1;

	fresh_copy(dir, sizeof(dir), "flipdense");
	must(st_store_open(dir, &s, &d), &d, "open");
	t = st_store_find_dense(s, "model.layers.2.self_attn.k_proj.weight");
	assert_non_null(t);
	snprintf(path, sizeof(path), "%s/dense.bin", dir);
	tst_flip_byte(path, t->offset + 7);
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	tst_flip_byte(path, 1000);
	st_store_close(s);

	assert_int_equal(st_store_verify(dir, NULL, NULL, &n_bad, &d),
			 -ST_E_CHECKSUM);
	assert_int_equal(n_bad, 2);
	/* the first problem found is the dense tensor */
	expect_msg(&d, "dense.bin", "model.layers.2.self_attn.k_proj.weight");
	st_rm_rf(dir);
}

struct vprog {
	int calls;
	uint64_t last, total;
};

static void vprogress(uint64_t done, uint64_t total, void *arg)
{
	struct vprog *p = arg;

	p->calls++;
	p->last = done;
	p->total = total;
}

static void verify_clean_progress(void **state)
{
	struct st_diag d = { { 0 } };
	struct vprog p = { 0 };
	int n_bad = -1;

	assert_int_equal(st_store_verify(g_store, vprogress, &p, &n_bad, &d), 0);
	assert_int_equal(n_bad, 0);
	assert_true(p.calls > 32);
	assert_true(p.total > 0);
	assert_int_equal(p.last, p.total);
}

static void truncated_and_missing_files(void **state)
{
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	char dir[4300], path[4400];
	struct stat st;
	int n_bad = -1;

	fresh_copy(dir, sizeof(dir), "trunc");
	snprintf(path, sizeof(path), "%s/experts-002.bin", dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(truncate(path, st.st_size - 4096), 0);
	assert_int_equal(st_store_open(dir, &s, &d), -ST_E_FORMAT);
	assert_null(s);
	expect_msg(&d, "experts-002.bin", "truncated");
	assert_int_equal(st_store_verify(dir, NULL, NULL, &n_bad, &d),
			 -ST_E_FORMAT);
	assert_int_equal(n_bad, 1);
	expect_msg(&d, "experts-002.bin", NULL);
	st_rm_rf(dir);

	fresh_copy(dir, sizeof(dir), "nodense");
	snprintf(path, sizeof(path), "%s/dense.bin", dir);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(st_store_open(dir, &s, &d), -ENOENT);
	expect_msg(&d, "dense.bin", NULL);
	st_rm_rf(dir);

	/* no manifest: not a store */
	fresh_copy(dir, sizeof(dir), "nomanifest");
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(st_store_open(dir, &s, &d), -ENOENT);
	expect_msg(&d, "manifest.json", "not a strata store");
	st_rm_rf(dir);
}

/* --- malformed manifests ------------------------------------------------- */

/* Applies `edit` to the manifest of a fresh copy and expects st_store_open
 * to fail with `err` and a message containing `needle`. */
static void manifest_case(const char *tag, void (*edit)(json_t *root),
			  const char *raw, int err, const char *needle)
{
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	char dir[4300], path[4400];
	int r;

	fresh_copy(dir, sizeof(dir), tag);
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	if (raw) {
		tst_write(path, raw, strlen(raw));
	} else {
		json_t *root = json_load_file(path, 0, NULL);

		assert_non_null(root);
		edit(root);
		assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
		json_decref(root);
	}
	r = st_store_open(dir, &s, &d);
	if (r != err)
		fail_msg("case %s: got %d (%s: %s), expected %d", tag, r,
			 st_strerror(r), d.msg, err);
	assert_null(s);
	expect_msg(&d, needle, "manifest.json");
	st_rm_rf(dir);
}

static json_t *experts(json_t *root) { return json_object_get(root, "experts"); }
static json_t *tensor0(json_t *root)
{
	return json_array_get(json_object_get(json_object_get(root, "dense"),
					      "tensors"), 0);
}

static void e_version(json_t *r) { json_object_set_new(r, "version", json_integer(1)); }
static void e_version2(json_t *r) { json_object_set_new(r, "version", json_integer(2)); }
static void e_version4(json_t *r) { json_object_set_new(r, "version", json_integer(4)); }
static void e_format(json_t *r) { json_object_set_new(r, "format", json_string("gguf")); }
static void e_record(json_t *r)
{
	json_t *ex = experts(r);

	json_object_set_new(ex, "record_bytes",
			    json_integer(json_integer_value(json_object_get(
						 ex, "record_bytes")) + 4096));
}
static void e_n_experts(json_t *r) { json_object_set_new(experts(r), "n_experts", json_integer(7)); }
static void e_negative(json_t *r) { json_object_set_new(experts(r), "n_layers", json_integer(-3)); }
static void e_string_num(json_t *r) { json_object_set_new(experts(r), "n_layers", json_string("4")); }
static void e_tensor_bytes(json_t *r)
{
	json_t *t = tensor0(r);

	json_object_set_new(t, "bytes", json_integer(json_integer_value(
					json_object_get(t, "bytes")) - 2));
}
static void e_tensor_offset(json_t *r)
{
	json_object_set_new(tensor0(r), "offset", json_integer(100));
}
static void e_tensor_outside(json_t *r)
{
	json_object_set_new(tensor0(r), "offset", json_integer(INT64_C(1) << 40));
}
static void e_checksum(json_t *r)
{
	json_t *sums = json_object_get(json_array_get(json_object_get(experts(r),
								      "layers"), 1),
				       "xxh3");

	json_array_set_new(sums, 0, json_string("not-hex"));
}
static void e_too_few_sums(json_t *r)
{
	json_t *sums = json_object_get(json_array_get(json_object_get(experts(r),
								      "layers"), 0),
				       "xxh3");

	json_array_remove(sums, 0);
}
static void e_path(json_t *r)
{
	json_t *f = json_array_get(json_object_get(r, "files"), 0);

	json_object_set_new(f, "name", json_string("../../etc/passwd"));
}
static void e_expert_name(json_t *r)
{
	json_t *f = json_array_get(json_object_get(experts(r), "layers"), 0);

	json_object_set_new(f, "file", json_string("experts-001.bin"));
}
static void e_config(json_t *r)
{
	/* a config that no longer matches the store's config.json */
	const char *c = json_string_value(json_object_get(r, "config"));
	char *x = replace(c, "\"intermediate_size\": 128",
			  "\"intermediate_size\": 256");

	json_object_set_new(r, "config", json_string(x));
	free(x);
}
static void e_config_bad(json_t *r)
{
	json_object_set_new(r, "config", json_string("{\"architectures\": "
						     "[\"LlamaForCausalLM\"]}"));
}
static json_t *mat(json_t *r, int l, int m)
{
	return json_array_get(json_object_get(json_array_get(json_object_get(
			experts(r), "layers"), (size_t)l), "matrices"), (size_t)m);
}
static void e_mat_layout(json_t *r)
{
	json_object_set_new(mat(r, 0, 1), "layout", json_string("gguf"));
}
/* another format whose sizes differ from the records on disk */
static void e_mat_format(json_t *r)
{
	json_object_set_new(mat(r, 1, 0), "format", json_string("e2m1-g32"));
	json_object_set_new(mat(r, 1, 0), "scale", json_string("f16"));
	/* e2m1 codes are row-major ("ocp"); only MXFP4 is interleaved */
	json_object_set_new(mat(r, 1, 0), "layout", json_string("ocp"));
}
static void e_mat_unknown(json_t *r)
{
	json_object_set_new(mat(r, 2, 2), "format", json_string("fp5"));
}
static void e_mat_block(json_t *r)
{
	json_object_set_new(mat(r, 0, 2), "block", json_integer(64));
}
static void e_mat_scale(json_t *r)
{
	json_object_set_new(mat(r, 3, 1), "scale", json_string("f16"));
}
static void e_layer_record(json_t *r)
{
	json_t *ly = json_array_get(json_object_get(experts(r), "layers"), 2);

	json_object_set_new(ly, "record_bytes", json_integer(json_integer_value(
				json_object_get(ly, "record_bytes")) + 4096));
}
static void e_no_policy(json_t *r) { json_object_del(experts(r), "policy"); }
static void e_policy_format(json_t *r)
{
	json_object_set_new(json_object_get(experts(r), "policy"), "default",
			    json_string("int4"));
}
static void e_dup_tensor(json_t *r)
{
	json_t *arr = json_object_get(json_object_get(r, "dense"), "tensors");

	json_array_append(arr, json_array_get(arr, 0));
}
static void e_drop_tensor(json_t *r)
{
	json_t *arr = json_object_get(json_object_get(r, "dense"), "tensors");
	size_t i;
	json_t *t;

	json_array_foreach(arr, i, t)
		if (!strcmp(json_string_value(json_object_get(t, "name")),
			    "model.norm.weight")) {
			json_array_remove(arr, i);
			return;
		}
	fail_msg("no model.norm.weight");
}

/* The embedded config and the store's config.json both say KEY: TO
 * instead of KEY: FROM (same length, so the file size still matches):
 * the geometry no longer fits the records / tensors. */
static void geometry_mismatch(const char *key, const char *from,
			      const char *to, const char *needle)
{
	struct st_diag d = { { 0 } };
	struct st_store *s = NULL;
	char dir[4300], path[4400], kf[128], kt[128];
	json_t *root;
	char *cfg;
	int r;

	snprintf(kf, sizeof(kf), "\"%s\": %s,", key, from);
	snprintf(kt, sizeof(kt), "\"%s\": %s,", key, to);
	fresh_copy(dir, sizeof(dir), "geometry");
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	root = json_load_file(path, 0, NULL);
	assert_non_null(root);
	cfg = replace(json_string_value(json_object_get(root, "config")), kf,
		      kt);
	json_object_set_new(root, "config", json_string(cfg));
	assert_int_equal(json_dump_file(root, path, JSON_INDENT(1)), 0);
	json_decref(root);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	tst_write(path, cfg, strlen(cfg));
	free(cfg);
	r = st_store_open(dir, &s, &d);
	if (r != -ST_E_FORMAT)
		fail_msg("%s %s: got %d (%s)", key, to, r, d.msg);
	expect_msg(&d, needle, NULL);
	st_rm_rf(dir);
}

static void malformed_manifests(void **state)
{
	manifest_case("badjson", NULL, "{\"format\": \"strata-store\", \"ver",
		      -ST_E_FORMAT, "line");
	manifest_case("notobject", NULL, "[1, 2]", -ST_E_FORMAT, "object");
	manifest_case("version", e_version, NULL, -ST_E_VERSION,
		      "re-run strata convert");
	manifest_case("version4", e_version4, NULL, -ST_E_VERSION, "version 4");
	/* a version-2 store (row-major MXFP4) names the command that makes
	 * it again, with the policy its manifest holds */
	manifest_case("version2", e_version2, NULL, -ST_E_VERSION,
		      "strata convert --model MODEL_DIR --out ");
	manifest_case("version2b", e_version2, NULL, -ST_E_VERSION,
		      "--force --experts mxfp4");
	manifest_case("format", e_format, NULL, -ST_E_FORMAT, "strata-store");
	manifest_case("record", e_record, NULL, -ST_E_FORMAT, "record_bytes");
	manifest_case("nexperts", e_n_experts, NULL, -ST_E_FORMAT, "n_experts");
	manifest_case("negative", e_negative, NULL, -ST_E_FORMAT, "n_layers");
	manifest_case("stringnum", e_string_num, NULL, -ST_E_FORMAT, "n_layers");
	manifest_case("tbytes", e_tensor_bytes, NULL, -ST_E_FORMAT, "bytes");
	manifest_case("toffset", e_tensor_offset, NULL, -ST_E_FORMAT, "aligned");
	manifest_case("toutside", e_tensor_outside, NULL, -ST_E_FORMAT,
		      "outside");
	manifest_case("checksum", e_checksum, NULL, -ST_E_FORMAT, "xxh3[0]");
	manifest_case("fewsums", e_too_few_sums, NULL, -ST_E_FORMAT, "xxh3");
	manifest_case("path", e_path, NULL, -ST_E_FORMAT, "../../etc/passwd");
	manifest_case("ename", e_expert_name, NULL, -ST_E_FORMAT,
		      "experts-000.bin");
	manifest_case("config", e_config, NULL, -ST_E_FORMAT, "config");
	manifest_case("configbad", e_config_bad, NULL, -ST_E_UNSUPPORTED,
		      "LlamaForCausalLM");
	manifest_case("layout", e_mat_layout, NULL, -ST_E_FORMAT, "layout");
	manifest_case("matformat", e_mat_format, NULL, -ST_E_FORMAT,
		      "experts.layers[1].matrices[0].scale_bytes");
	manifest_case("matunknown", e_mat_unknown, NULL, -ST_E_FORMAT, "fp5");
	manifest_case("matblock", e_mat_block, NULL, -ST_E_FORMAT,
		      "layers[0].matrices[2].block");
	manifest_case("matscale", e_mat_scale, NULL, -ST_E_FORMAT,
		      "layers[3].matrices[1].scale");
	manifest_case("layerrecord", e_layer_record, NULL, -ST_E_FORMAT,
		      "layers[2].record_bytes");
	manifest_case("nopolicy", e_no_policy, NULL, -ST_E_FORMAT, "policy");
	manifest_case("policyfmt", e_policy_format, NULL, -ST_E_FORMAT, "int4");
	manifest_case("duptensor", e_dup_tensor, NULL, -ST_E_FORMAT, "overlap");
	manifest_case("droptensor", e_drop_tensor, NULL, -ST_E_FORMAT,
		      "model.norm.weight");
	geometry_mismatch("intermediate_size", "128", "256", "record_bytes");
	geometry_mismatch("num_hidden_layers", "4", "3", "n_layers");
	geometry_mismatch("num_local_experts", "8", "9", "gate.weight");
	geometry_mismatch("hidden_size", "64", "32", "model.embed_tokens.weight");
}

/* Random byte edits of the manifest (fixed seed): st_store_open returns
 * an error or a store that is consistent, and never crashes (this test
 * is most useful under ASan). */
static void manifest_mutations(void **state)
{
	struct st_diag d = { { 0 } };
	char dir[4300], path[4400];
	uint64_t x = 0x9e3779b97f4a7c15u;
	size_t len;
	uint8_t *orig, *buf;
	int n_ok = 0, n_err = 0;

	fresh_copy(dir, sizeof(dir), "mutate");
	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	orig = tst_read(path, &len);
	buf = malloc(len);
	for (int i = 0; i < 300; i++) {
		struct st_store *s = NULL;
		int r, n_edits = 1 + i % 3;

		d.msg[0] = 0;
		memcpy(buf, orig, len);
		for (int k = 0; k < n_edits; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			buf[(x >> 8) % len] = (uint8_t)"0123456789-\"{}[],:x9\n"[x % 21];
		}
		tst_write(path, buf, len);
		r = st_store_open(dir, &s, &d);
		if (r == 0) {
			assert_non_null(s);
			assert_int_equal(s->n_layers, s->cfg.n_layers);
			assert_int_equal(s->n_experts, s->cfg.n_experts);
			assert_int_equal(s->record_bytes % 4096, 0);
			st_store_close(s);
			n_ok++;
		} else {
			assert_true(r < 0);
			assert_null(s);
			assert_true(d.msg[0] != 0);
			n_err++;
		}
	}
	/* most edits break something; some only touch a checksum digit or
	 * a string and open fine */
	assert_true(n_err > 100);
	free(buf);
	free(orig);
	st_rm_rf(dir);
}

/* --- converting over / into things --------------------------------------- */

static void existing_store_untouched(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	struct tst_snap before, after;
	char dir[4300], other[4300], path[4400];
	struct st_store *s = NULL;

	fresh_copy(dir, sizeof(dir), "existing");
	tst_snapshot(dir, &before);
	es_convert_opts_init(&o);
	o.expert_dtype = ST_DTYPE_BF16;
	assert_int_equal(es_convert(g_mixtral, dir, &o, &d), -EEXIST);
	expect_msg(&d, dir, "force");
	tst_snapshot(dir, &after);
	assert_true(tst_snap_equal(&before, &after));
	assert_int_equal(tst_count_prefix(g_tmp, "existing.tmp-"), 0);

	/* with force it is replaced by the new store, atomically */
	o.force = 1;
	must(es_convert(g_mixtral, dir, &o, &d), &d, "convert --force");
	must(st_store_open(dir, &s, &d), &d, "open");
	for (int l = 0; l < s->n_layers; l++)
		assert_int_equal(s->layers[l].mat[0].fmt.dtype, ST_DTYPE_BF16);
	st_store_close(s);
	assert_int_equal(tst_count_prefix(g_tmp, "existing.tmp-"), 0);
	assert_int_equal(tst_count_prefix(g_tmp, "existing.old-"), 0);

	/* force never replaces something that is not a store */
	snprintf(other, sizeof(other), "%s/notastore", g_tmp);
	assert_int_equal(mkdir(other, 0755), 0);
	snprintf(path, sizeof(path), "%s/precious.txt", other);
	tst_write(path, "keep me", 7);
	assert_int_equal(es_convert(g_mixtral, other, &o, &d), -EEXIST);
	expect_msg(&d, "not a strata store", NULL);
	assert_int_equal(access(path, R_OK), 0);
	st_rm_rf(other);
	st_rm_rf(dir);
}

static void read_only_parent(void **state)
{
	char ro[4300], out[4400];
	pid_t pid;
	int status;

	snprintf(ro, sizeof(ro), "%s/readonly", g_tmp);
	assert_int_equal(mkdir(ro, 0755), 0);
	assert_int_equal(chmod(ro, 0555), 0);
	snprintf(out, sizeof(out), "%s/store", ro);
	/* root ignores permissions: run the convert as "nobody" */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct st_diag d = { { 0 } };
		int r;

		char probe[4400];

		if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
			_exit(3);
		snprintf(probe, sizeof(probe), "%s/model.safetensors", g_mixtral);
		if (access(probe, R_OK)) {
			fprintf(stderr, "SKIP sub-case: user nobody cannot read "
				"the fixture\n");
			_exit(77);
		}
		r = es_convert(g_mixtral, out, NULL, &d);
		if (r != -EACCES) {
			fprintf(stderr, "read-only parent: %d %s\n", r, d.msg);
			_exit(1);
		}
		if (!strstr(d.msg, ro)) {
			fprintf(stderr, "message does not name the place: %s\n",
				d.msg);
			_exit(2);
		}
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) != 77)
		assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_not_equal(access(out, F_OK), 0);
	assert_int_equal(tst_count_prefix(ro, ""), 2); /* "." and ".." */
	chmod(ro, 0755);
	st_rm_rf(ro);

	/* a parent that does not exist */
	{
		struct st_diag d = { { 0 } };

		snprintf(out, sizeof(out), "%s/no/such/dir/store", g_tmp);
		assert_int_equal(es_convert(g_mixtral, out, NULL, &d), -ENOENT);
		expect_msg(&d, "no/such/dir", NULL);
	}
}

/* A convert killed half-way leaves no store, only its temporary directory,
 * which the next convert removes. */
static void kill_progress(uint64_t done, uint64_t total, void *arg)
{
	if (done > total / 2)
		raise(SIGKILL);
}

static void killed_convert(void **state)
{
	struct st_diag d = { { 0 } };
	char out[4300], keep[4400], path[4500];
	pid_t pid, live = getppid();
	int status;

	snprintf(out, sizeof(out), "%s/killed", g_tmp);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct es_convert_opts o;

		es_convert_opts_init(&o);
		o.progress = kill_progress;
		es_convert(g_mixtral, out, &o, &d);
		_exit(0); /* not reached */
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	assert_int_not_equal(access(out, F_OK), 0);
	assert_int_equal(tst_count_prefix(g_tmp, "killed.tmp-"), 1);

	/* a temporary directory of a convert still running (a live pid) is
	 * left alone */
	snprintf(keep, sizeof(keep), "%s.tmp-%d", out, (int)live);
	assert_int_equal(mkdir(keep, 0755), 0);
	must(es_convert(g_mixtral, out, NULL, &d), &d, "convert after kill");
	assert_int_equal(tst_count_prefix(g_tmp, "killed.tmp-"), 1);
	assert_int_equal(access(keep, F_OK), 0);
	snprintf(path, sizeof(path), "%s/manifest.json", out);
	assert_int_equal(access(path, R_OK), 0);
	assert_int_equal(tst_dirs_differ(out, g_store), 0);
	rmdir(keep);
	st_rm_rf(out);
}

/* --- broken checkpoints -------------------------------------------------- */

/* Builds a checkpoint in TMP/tag: links to the fixture's small files
 * (without `omit`) and a safetensors without `skip` / with `reshape`. */
static void broken_model(const char *tag, const char *omit, const char *skip,
			 const char *reshape, const int64_t shape[2],
			 char *dir, size_t len)
{
	struct tst_sft s;
	char path[4400];

	snprintf(dir, len, "%s/%s", g_tmp, tag);
	assert_int_equal(mkdir(dir, 0755), 0);
	tst_model_links(g_mixtral, dir, omit);
	snprintf(path, sizeof(path), "%s/model.safetensors", g_mixtral);
	tst_sft_load(path, &s);
	if (skip)
		assert_non_null(tst_sft_find(&s, skip));
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	assert_int_equal(tst_sft_write(path, &s, skip, reshape, shape), 0);
	tst_sft_free(&s);
}

static void expect_convert_error(const char *model, int err, const char *a,
				 const char *b)
{
	struct st_diag d = { { 0 } };
	char out[4300];
	int r;

	snprintf(out, sizeof(out), "%s/out-broken", g_tmp);
	r = es_convert(model, out, NULL, &d);
	if (r != err)
		fail_msg("convert %s: got %d (%s), expected %d", model, r, d.msg,
			 err);
	expect_msg(&d, a, b);
	assert_int_not_equal(access(out, F_OK), 0);
	assert_int_equal(tst_count_prefix(g_tmp, "out-broken"), 0);
}

/* Writes the BF16 bits `bits` over element k of tensor `name` in dir's
 * model.safetensors (a rewritten copy, not a link). */
static void poke_bf16(const char *dir, const char *name, uint64_t k,
		      uint16_t bits)
{
	struct st_checkpoint *ck = NULL;
	struct st_diag d = { { 0 } };
	const struct st_tensor_info *t;
	char path[4400];
	uint64_t off;
	int fd;

	must(st_checkpoint_open(dir, &ck, &d), &d, "open the copy");
	t = st_checkpoint_find(ck, name);
	assert_non_null(t);
	assert_int_equal(t->dtype, ST_DTYPE_BF16);
	assert_true(k < t->n_elems);
	off = t->file_offset + k * 2;
	st_checkpoint_close(ck);
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, &bits, 2, (off_t)off), 2);
	close(fd);
}

/* NaN / infinite weights and broken tokenizers: refused by the checks,
 * naming the tensor and its file (element, [row, col]) or the tokenizer
 * file, with nothing written (no store, no temporary directory) and an
 * existing store left as it was. */
static void damaged_checkpoints(void **state)
{
	static const char *expert = "model.layers.1.block_sparse_moe.experts.3."
				    "w1.weight";
	char dir[4300], path[4400];
	size_t len;
	char *text;

	(void)state;
	broken_model("nan", NULL, NULL, NULL, NULL, dir, sizeof(dir));
	poke_bf16(dir, expert, 64 * 5 + 7, 0x7fc0);
	expect_convert_error(dir, -ST_E_FORMAT, expert, "a NaN at element 327");
	expect_convert_error(dir, -ST_E_FORMAT, "file model.safetensors",
			     "[5, 7]");
	st_rm_rf(dir);

	broken_model("inf", NULL, NULL, NULL, NULL, dir, sizeof(dir));
	poke_bf16(dir, "model.norm.weight", 3, 0xff80); /* -inf */
	expect_convert_error(dir, -ST_E_FORMAT, "model.norm.weight",
			     "an infinity at element 3");
	st_rm_rf(dir);

	/* a large finite value is fine (only all-ones exponents refused) */
	broken_model("big", NULL, NULL, NULL, NULL, dir, sizeof(dir));
	poke_bf16(dir, "model.norm.weight", 3, 0x7f7f);
	{
		struct st_diag d = { { 0 } };
		char out[4400];

		snprintf(out, sizeof(out), "%s/big-store", g_tmp);
		must(es_convert(dir, out, NULL, &d), &d, "largest finite bf16");
		st_rm_rf(out);
	}
	st_rm_rf(dir);

	/* tokenizer.json cut in half: does not load */
	broken_model("halftok", "tokenizer.json", NULL, NULL, NULL, dir,
		     sizeof(dir));
	snprintf(path, sizeof(path), "%s/tokenizer.json", g_mixtral);
	text = (char *)tst_read(path, &len);
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	tst_write(path, text, len / 2);
	expect_convert_error(dir, -ST_E_TOKENIZER, "tokenizer.json",
			     "cannot be loaded");
	st_rm_rf(dir);

	/* tokenizer_config.json that is not JSON */
	broken_model("badtokcfg", "tokenizer_config.json", NULL, NULL, NULL,
		     dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	tst_write(path, "{\"bos_token\": ", 14);
	expect_convert_error(dir, -ST_E_TOKENIZER, "tokenizer_config.json",
			     "cannot be loaded");
	free(text);
	st_rm_rf(dir);
}

/* --- expert format options ---------------------------------------------- */

/* Keep specs: what parses, what is refused (nothing appended then), the
 * canonical form written to the manifest, and the layer each rule hits. */
static void keep_specs(void **state)
{
	static const char *const bad[] = {
		"", "first", "=fp8", "first=", "first=int4", "a=fp8", "3-1=bf16",
		"first,=fp8", ",first=fp8", "1-=fp8", "first;last=fp8",
		"first=fp8;", "firstx=fp8", "-1=bf16", "1 =bf16", "12345678=f32",
		"first=fp8=bf16",
	};
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	struct st_wformat f;
	char buf[256];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		es_convert_opts_init(&o);
		d.msg[0] = 0;
		if (es_convert_parse_keep(bad[i], &o, &d) != -EINVAL)
			fail_msg("keep \"%s\" was accepted", bad[i]);
		assert_int_equal(o.n_keep, 0);
		assert_true(d.msg[0] != 0);
	}
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_keep("3-1=bf16", &o, &d), -EINVAL);
	expect_msg(&d, "3-1", "N-M");
	assert_int_equal(es_convert_parse_keep("first=int4", &o, &d), -EINVAL);
	expect_msg(&d, "int4", "nvfp4");

	/* default nvfp4; first and last fp8; 1-2 bf16; 2 back to e2m1-g64:
	 * later rules win */
	assert_int_equal(es_convert_parse_experts("nvfp4", &o, &d), 0);
	assert_int_equal(es_convert_parse_experts("nvfp5", &o, &d), -EINVAL);
	expect_msg(&d, "nvfp5", "e2m1-g32");
	assert_int_equal(o.expert_dtype, ST_DTYPE_NVFP4);
	assert_int_equal(es_convert_parse_keep("first,last=fp8", &o, &d), 2);
	assert_int_equal(es_convert_parse_keep("1-2=bf16;2=e2m1-g64", &o, &d), 2);
	assert_int_equal(o.n_keep, 4);
	assert_int_equal(es_convert_keep_str(&o, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "first,last=fp8;1-2=bf16;2=e2m1-g64");
	{
		char small[10];

		assert_int_equal(es_convert_keep_str(&o, small, sizeof(small)),
				 -ENAMETOOLONG);
		assert_string_equal(small, "");
	}
	{
		static const char *const want[5] = { "fp8", "bf16", "e2m1-g64",
						     "nvfp4", "fp8" };

		for (int l = 0; l < 5; l++) {
			char name[ST_WFORMAT_NAME_MAX];

			assert_int_equal(es_convert_layer_format(&o, 5, l, &f), 0);
			st_wformat_name(&f, name, sizeof(name));
			assert_string_equal(name, want[l]);
		}
	}
	/* a one-layer model: first and last are the same layer; a rule
	 * naming layer 2 does not fit */
	assert_int_equal(es_convert_layer_format(&o, 1, 0, &f), -EINVAL);
	assert_int_equal(es_convert_layer_format(&o, 3, 3, &f), -EINVAL);
	/* the canonical form reads back to the same rules */
	{
		struct es_convert_opts o2;
		char buf2[256];

		es_convert_opts_init(&o2);
		assert_int_equal(es_convert_parse_keep(buf, &o2, &d), 4);
		assert_int_equal(es_convert_keep_str(&o2, buf2, sizeof(buf2)), 0);
		assert_string_equal(buf, buf2);
	}
	/* at most ES_CONVERT_MAX_KEEP rules */
	es_convert_opts_init(&o);
	for (int i = 0; i < ES_CONVERT_MAX_KEEP; i++)
		assert_int_equal(es_convert_parse_keep("0=bf16", &o, &d), 1);
	assert_int_equal(es_convert_parse_keep("1=bf16", &o, &d), -ST_E_LIMIT);
	assert_int_equal(o.n_keep, ES_CONVERT_MAX_KEEP);
	/* an invalid default format in the struct */
	es_convert_opts_init(&o);
	o.expert_dtype = ST_DTYPE_MXFP4;
	o.expert_group = 64;
	assert_int_equal(es_convert_layer_format(&o, 4, 0, &f), -EINVAL);
}

/* Options the model does not fit: refused before anything is written. */
static void format_options_refused(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	char out[4400];

	snprintf(out, sizeof(out), "%s/never", g_tmp);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_keep("first,7=bf16", &o, &d), 2);
	assert_int_equal(es_convert(g_mixtral, out, &o, &d), -EINVAL);
	expect_msg(&d, "first,7=bf16", "4 layers");
	assert_int_not_equal(access(out, F_OK), 0);
	assert_int_equal(tst_count_prefix(g_tmp, "never.tmp-"), 0);

	es_convert_opts_init(&o);
	o.expert_dtype = ST_DTYPE_I8;
	assert_int_equal(es_convert(g_mixtral, out, &o, &d), -EINVAL);
	expect_msg(&d, "expert format", NULL);
	assert_int_not_equal(access(out, F_OK), 0);
}

static void broken_checkpoints(void **state)
{
	static const char *expert = "model.layers.2.block_sparse_moe.experts.5."
				    "w3.weight";
	const int64_t swapped[2] = { 128, 64 };
	char dir[4300];

	/* the test's writer, nothing removed: converts to the same data as
	 * the original file (only the manifest's source size may differ) */
	broken_model("rewritten", NULL, NULL, NULL, NULL, dir, sizeof(dir));
	{
		struct st_diag d = { { 0 } };
		struct tst_snap sa, sb;
		char out[4400];

		snprintf(out, sizeof(out), "%s/rewritten-store", g_tmp);
		must(es_convert(dir, out, NULL, &d), &d, "rewritten");
		tst_snapshot(out, &sa);
		tst_snapshot(g_store, &sb);
		assert_int_equal(sa.n, sb.n);
		for (int i = 0; i < sa.n; i++) {
			assert_string_equal(sa.names[i], sb.names[i]);
			if (strcmp(sa.names[i], "manifest.json"))
				assert_int_equal(sa.hashes[i], sb.hashes[i]);
		}
		st_rm_rf(out);
	}
	st_rm_rf(dir);

	broken_model("noexpert", NULL, expert, NULL, NULL, dir, sizeof(dir));
	expect_convert_error(dir, -ST_E_NOTFOUND, expert, "missing");
	st_rm_rf(dir);

	broken_model("nonorm", NULL, "model.norm.weight", NULL, NULL, dir,
		     sizeof(dir));
	expect_convert_error(dir, -ST_E_NOTFOUND, "model.norm.weight", "missing");
	st_rm_rf(dir);

	broken_model("shape", NULL, NULL,
		     "model.layers.1.block_sparse_moe.experts.0.w2.weight",
		     swapped, dir, sizeof(dir));
	expect_convert_error(dir, -ST_E_FORMAT, "[128, 64]", "[64, 128]");
	st_rm_rf(dir);

	broken_model("notok", "tokenizer.json", NULL, NULL, NULL, dir,
		     sizeof(dir));
	expect_convert_error(dir, -ST_E_NOTFOUND, "tokenizer.json", NULL);
	st_rm_rf(dir);

	/* unknown architecture */
	{
		char path[4400];
		size_t len;
		char *text, *a, *b;

		broken_model("arch", "config.json", NULL, NULL, NULL, dir,
			     sizeof(dir));
		snprintf(path, sizeof(path), "%s/config.json", g_mixtral);
		text = (char *)tst_read(path, &len);
		a = replace(text, "MixtralForCausalLM", "LlamaForCausalLM");
		b = replace(a, "\"model_type\": \"mixtral\"",
			    "\"model_type\": \"llama\"");
		snprintf(path, sizeof(path), "%s/config.json", dir);
		tst_write(path, b, strlen(b));
		free(text);
		free(a);
		free(b);
		expect_convert_error(dir, -ST_E_UNSUPPORTED, "LlamaForCausalLM",
				     NULL);
		st_rm_rf(dir);
	}

	/* no checkpoint at all */
	expect_convert_error("/nonexistent-model-dir", -ENOENT, NULL, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(flipped_record_byte),
		cmocka_unit_test(flipped_dense_and_copy),
		cmocka_unit_test(verify_clean_progress),
		cmocka_unit_test(truncated_and_missing_files),
		cmocka_unit_test(malformed_manifests),
		cmocka_unit_test(manifest_mutations),
		cmocka_unit_test(existing_store_untouched),
		cmocka_unit_test(read_only_parent),
		cmocka_unit_test(killed_convert),
		cmocka_unit_test(broken_checkpoints),
		cmocka_unit_test(damaged_checkpoints),
		cmocka_unit_test(keep_specs),
		cmocka_unit_test(format_options_refused),
	};

	st_test_fixture_model("tiny-mixtral", g_mixtral, sizeof(g_mixtral));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

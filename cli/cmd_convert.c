/* cmd_convert.c — `strata convert` and `strata verify`, and the shared
 * conversion helper used by `strata run`. */
#include <errno.h>
#include <jansson.h>
#include <sys/stat.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "es_convert.h"
#include "st_calib.h"
#include "st_config.h"
#include "st_safetensors.h"
#include "st_build_config.h"
#include "st_daemon.h"
#include "st_shm.h"
#include "st_store.h"
#include "st_util.h"

struct progress_bar {
	const char *what;
	int tty;
	int last_pct;
	uint64_t t0;
	int sigfd;            /* stop signals, or -1 */
	volatile int cancel;  /* set on a stop signal */
};

static void progress(uint64_t done, uint64_t total, void *arg)
{
	struct progress_bar *pb = arg;
	int pct = total ? (int)(done * 100 / total) : 100;
	char a[32], b[32];

	if (pb->sigfd >= 0 && !pb->cancel && st_stop_signals_pending(pb->sigfd))
		pb->cancel = 1;

	if (pct == pb->last_pct)
		return;
	pb->last_pct = pct;
	if (pb->tty) {
		int fill = pct / 4;

		fprintf(stderr, "\r%s [%.*s%*s] %3d%% %s / %s", pb->what, fill,
			"#########################", 25 - fill, "", pct,
			st_format_bytes(done, a, sizeof(a)),
			st_format_bytes(total, b, sizeof(b)));
		if (done >= total)
			fputc('\n', stderr);
	} else if (pct % 25 == 0) {
		fprintf(stderr, "%s: %d%%\n", pb->what, pct);
	}
}

int cli_default_store_dir(const char *model_dir, const char *experts,
			  char *buf, size_t len)
{
	char absdir[PATH_MAX], base[256], cache[4096];
	const char *e;
	uint64_t h;
	char *cfg = NULL;
	size_t cfg_len = 0;
	char cfgp[PATH_MAX + 16];

	if (!realpath(model_dir, absdir))
		return -errno;
	snprintf(cfgp, sizeof(cfgp), "%s/config.json", absdir);
	st_read_file(cfgp, &cfg, &cfg_len);
	/* the store name depends on where the model is and what its config
	 * says, so two different models never share a store */
	h = st_xxh3(absdir, strlen(absdir)) ^ (cfg ? st_xxh3(cfg, cfg_len) : 0);
	free(cfg);
	snprintf(base, sizeof(base), "%s", strrchr(absdir, '/') ?
		 strrchr(absdir, '/') + 1 : absdir);
	if ((e = getenv("STRATA_CACHE_DIR")) && *e)
		snprintf(cache, sizeof(cache), "%s", e);
	else if ((e = getenv("XDG_CACHE_HOME")) && *e)
		snprintf(cache, sizeof(cache), "%s/strata", e);
	else if ((e = getenv("HOME")) && *e)
		snprintf(cache, sizeof(cache), "%s/.cache/strata", e);
	else
		snprintf(cache, sizeof(cache), "/tmp/strata-cache-%u",
			 (unsigned)getuid());
	{
		char fmt[128];
		size_t i;

		/* "mxfp4:first,last=bf16" -> "mxfp4_first_last_bf16" */
		snprintf(fmt, sizeof(fmt), "%s", experts);
		for (i = 0; fmt[i]; i++)
			if (!((fmt[i] >= 'a' && fmt[i] <= 'z') ||
			      (fmt[i] >= 'A' && fmt[i] <= 'Z') ||
			      (fmt[i] >= '0' && fmt[i] <= '9') || fmt[i] == '-'))
				fmt[i] = '_';
		if (snprintf(buf, len, "%s/%s-%08x-%s.strata", cache, base,
			     (unsigned)(h & 0xffffffffu), fmt) >= (int)len)
			return -ENAMETOOLONG;
	}
	return st_mkdir_p(cache, 0755);
}

int cli_default_model_dir(char *buf, size_t len)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n > 0) {
		char *slash;

		exe[n] = 0;
		slash = strrchr(exe, '/');
		if (slash)
			*slash = 0;
		/* build tree: build/cli/strata -> ../../models/kjv-moe */
		snprintf(buf, len, "%s/../../models/kjv-moe", exe);
		if (st_path_exists(buf))
			return 0;
		/* installed: bin/strata -> ../share/strata/models/kjv-moe */
		snprintf(buf, len, "%s/../share/strata/models/kjv-moe", exe);
		if (st_path_exists(buf))
			return 0;
	}
	snprintf(buf, len, "%s/models/kjv-moe", ST_SOURCE_ROOT);
	return st_path_exists(buf) ? 0 : -ENOENT;
}

int cli_default_calib_path(const char *model_dir, char *buf, size_t len)
{
	static const char ext[] = ".strata";
	size_t n;
	int r = cli_default_store_dir(model_dir, "stats", buf, len);

	if (r < 0)
		return r;
	n = strlen(buf);
	if (n < sizeof(ext) || strcmp(buf + n - (sizeof(ext) - 1), ext))
		return -EINVAL;
	buf[n - (sizeof(ext) - 1)] = 0;
	if (n + 6 >= len)
		return -ENAMETOOLONG;
	strcat(buf, ".calib");
	return 0;
}

int cli_calib_model_id(const char *model_dir, uint64_t *ret,
		       struct st_diag *diag)
{
	struct st_checkpoint *ck = NULL;
	char path[PATH_MAX + 16], *cfg = NULL;
	size_t cfg_len = 0;
	int r;

	snprintf(path, sizeof(path), "%s/config.json", model_dir);
	r = st_read_file(path, &cfg, &cfg_len);
	if (r < 0)
		return st_diag_set(diag, r, "%s: %s", path, st_strerror(r));
	r = st_checkpoint_open(model_dir, &ck, diag);
	if (r == 0)
		*ret = st_calib_model_id(ck, cfg, cfg_len);
	st_checkpoint_close(ck);
	free(cfg);
	return r;
}

/* Applies an expert-format spec "FORMAT[:KEEP]" (see cli_cmds.h) to opts.
 * 0, or -EINVAL with diag. */
static int apply_experts(const char *spec, struct es_convert_opts *o,
			 struct st_diag *diag)
{
	char name[64], keep[400];
	const char *colon = strchr(spec, ':'), *slash = strrchr(spec, '/');
	size_t n = colon ? (size_t)(colon - spec) :
		   slash ? (size_t)(slash - spec) : strlen(spec);
	int r;

	if (n == 0 || n >= sizeof(name))
		return st_diag_set(diag, -EINVAL, "--experts '%s': no format",
				   spec);
	memcpy(name, spec, n);
	name[n] = 0;
	r = es_convert_parse_experts(name, o, diag);
	if (r == 0 && colon) {
		size_t kn = slash && slash > colon ? (size_t)(slash - colon - 1) :
						     strlen(colon + 1);

		if (kn >= sizeof(keep))
			return st_diag_set(diag, -EINVAL, "--keep-layers too long");
		memcpy(keep, colon + 1, kn);
		keep[kn] = 0;
		r = es_convert_parse_keep(keep, o, diag); /* rules added */
	}
	if (r >= 0 && slash)
		r = es_convert_parse_scale_search(slash + 1, o, diag);
	return r < 0 ? r : 0;
}

int cli_experts_spec(char *buf, size_t len, const char *experts,
		     const char *keep, const char *scale_search)
{
	int ss = scale_search && strcmp(scale_search, "none");

	if (snprintf(buf, len, "%s%s%s%s%s", experts, keep ? ":" : "",
		     keep ? keep : "", ss ? "/" : "", ss ? scale_search : "") >=
	    (int)len)
		return -ENAMETOOLONG;
	return 0;
}

int cli_convert(const char *model_dir, const char *store_dir,
		const char *experts, int dense_f32, int force, int sigfd)
{
	return cli_convert_calib(model_dir, store_dir, experts, NULL,
				 dense_f32, force, sigfd);
}

int cli_convert_calib(const char *model_dir, const char *store_dir,
		      const char *experts, const char *calib_path,
		      int dense_f32, int force, int sigfd)
{
	return cli_convert_kinds(model_dir, store_dir, experts, calib_path,
				 NULL, NULL, dense_f32, force, sigfd);
}

int cli_convert_kinds(const char *model_dir, const char *store_dir,
		      const char *experts, const char *calib_path,
		      const char *attention, const char *shared,
		      int dense_f32, int force, int sigfd)
{
	struct es_convert_opts o;
	struct progress_bar pb = { "converting", isatty(2), -1, st_now_ns(),
				   sigfd, 0 };
	struct st_diag diag = { "" };
	char stats[4096];
	int r;

	es_convert_opts_init(&o);
	if (apply_experts(experts, &o, &diag) < 0) {
		fprintf(stderr, "strata: %s\n", diag.msg);
		return 2;
	}
	o.dense_f32 = dense_f32 == CLI_DENSE_F32;
	o.dense_fp8 = dense_f32 == CLI_DENSE_FP8;
	if ((attention && es_convert_parse_attention(attention, &o, &diag) < 0) ||
	    (shared && es_convert_parse_shared_experts(shared, &o, &diag) < 0)) {
		fprintf(stderr, "strata: %s\n", diag.msg);
		return 2;
	}
	if (calib_path) {
		if (o.scale_search != ST_SCALE_SEARCH_GPTQ)
			o.scale_search = ST_SCALE_SEARCH_CALIBRATED;
		o.calib_path = calib_path;
	} else if (o.scale_search == ST_SCALE_SEARCH_CALIBRATED ||
		   o.scale_search == ST_SCALE_SEARCH_GPTQ) {
		if (cli_default_calib_path(model_dir, stats, sizeof(stats)) < 0 ||
		    !st_path_exists(stats)) {
			fprintf(stderr, "strata: the calibrated scale search "
				"needs activation statistics; none for %s yet "
				"(looked for %s): run strata calibrate --model "
				"%s --text FILE\n", model_dir, stats, model_dir);
			return 1;
		}
		o.calib_path = stats;
	}
	/* everything about the options and the model checked before the
	 * conversion starts (keep rules against the model's layers, the
	 * statistics against the checkpoint) */
	{
		struct st_model_config cfg;
		struct st_diag d2 = { "" };

		if (st_config_load(model_dir, &cfg, &d2) == 0 &&
		    es_convert_keep_overrides(&o, cfg.n_layers, &d2) == 1)
			fprintf(stderr, "strata: note: %s\n", d2.msg);
	}
	r = es_convert_check(model_dir, &o, &diag);
	if (r < 0) {
		fprintf(stderr, "strata: %s\n", diag.msg[0] ? diag.msg :
			st_strerror(r));
		return r == -EINVAL ? 2 : 1;
	}
	o.force = force;
	o.progress = progress;
	o.progress_arg = &pb;
	o.cancel = &pb.cancel;
	fprintf(stderr, "strata: converting %s -> %s (experts %s)\n",
		model_dir, store_dir, experts);
	r = es_convert(model_dir, store_dir, &o, &diag);
	if (r == -ECANCELED) {
		fprintf(stderr, "\nstrata: convert interrupted; %s was not "
			"written\n", store_dir);
		return 130;
	}
	if (r < 0) {
		fprintf(stderr, "strata: convert failed: %s\n", diag.msg[0] ?
			diag.msg : st_strerror(r));
		return 1;
	}
	fprintf(stderr, "strata: store written in %.1f s\n",
		(double)(st_now_ns() - pb.t0) / 1e9);
	return 0;
}

static void convert_usage(FILE *f)
{
	fprintf(f,
"Usage: strata convert --model DIR [--out DIR] [options]\n"
"\n"
"Turns a Hugging Face checkpoint (config.json + model.safetensors, or shards\n"
"with model.safetensors.index.json; F32/F16/BF16) into a strata store: a\n"
"manifest, dense.bin, and one 4 KiB-aligned record per (layer, expert).\n"
"Writes to a temporary directory and renames it at the end.\n"
"DeepSeek-V4 and V4.1 checkpoints (FP8 + E8M0 dense, MXFP4 experts) are\n"
"stored losslessly as they are: --experts, --keep-layers, --scale-search,\n"
"--attention, --dense and --shared-experts do not apply; V4.1's Engram\n"
"tables go to engram.bin (engram_hash.json must be beside config.json).\n"
"\n"
"Options:\n"
"  --model DIR       checkpoint directory (required)\n"
"  --out DIR         store directory (default: in the cache, see below)\n"
"  --experts FMT     mxfp4 (default; OCP MX: E2M1, 32-element blocks, E8M0\n"
"                    scale), nvfp4 (16-element blocks, E4M3 scale, FP32\n"
"                    tensor scale), e2m1-g32 / e2m1-g128 (FP16 scale per\n"
"                    group), fp8 (E4M3, FP32 scale per 128), bf16, f32\n"
"  --keep-layers SPEC  (or --keep) layers kept at another format, e.g.\n"
"                    first,last=bf16 or 0,5=fp8;3=bf16; may be repeated (all\n"
"                    rules count; for a layer named twice the later wins,\n"
"                    with a note)\n"

"  --scale-search M  none (default: the plain amax scale), mse: per block,\n"
"                    the scale with the least squared error (4-bit formats),\n"
"                    or calibrated: the same, each error weighted by the\n"
"                    activation statistics of strata calibrate (the model's\n"
"                    default statistics file unless --calibrate names one)\n"
"                    or gptq: GPTQ error compensation with the full second\n"
"                    moments of strata calibrate --covariance\n"
"  --calibrate STATS calibrated (or gptq) search with this statistics file\n"
"                    (strata calibrate --out STATS)\n"
"  --attention P     precision of the attention projections q, k, v, o:\n"
"                    auto (default: as the other dense weights), bf16,\n"
"                    f32, or fp8 (E4M3, an FP32 scale per row and 128\n"
"                    columns; the LM head stays as --dense says)\n"
"  --shared-experts FMT  format of the shared experts (Qwen2-MoE): bf16,\n"
"                    f32 or fp8 (default: as the other dense weights);\n"
"                    Mixtral and Qwen3-MoE have none (refused there)\n"
"  --dense-f32       keep dense weights in F32 (default: BF16 when the\n"
"                    checkpoint's are BF16)\n"
"  --dense fp8       attention projections and LM head in FP8 E4M3 with an\n"
"                    FP32 scale per row and 128 columns (the other dense\n"
"                    weights as by default); store name gets -dense-fp8\n"
"  --force           replace an existing store at --out\n"
"  -h, --help        this text\n"
"\n"
"Default --out: $STRATA_CACHE_DIR, $XDG_CACHE_HOME/strata or ~/.cache/strata,\n"
"named after the model and the expert format.  --experts also takes the\n"
"combined spec FMT[:KEEP][/SEARCH], e.g. nvfp4:first,last=fp8/cal.\n");
}

int cli_cmd_convert(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "out", required_argument, NULL, 'o' },
		{ "experts", required_argument, NULL, 'e' },
		{ "dense-f32", no_argument, NULL, 'd' },
		{ "dense", required_argument, NULL, 'D' },
		{ "keep", required_argument, NULL, 'k' },
		{ "keep-layers", required_argument, NULL, 'k' },
		{ "scale-search", required_argument, NULL, 'S' },
		{ "calibrate", required_argument, NULL, 'C' },
		{ "attention", required_argument, NULL, 'A' },
		{ "shared-experts", required_argument, NULL, 'X' },
		{ "force", no_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *model = NULL, *out = NULL, *experts = "mxfp4", *keep = NULL;
	const char *scale_search = NULL, *calib = NULL, *attention = NULL;
	const char *shared = NULL;
	char outbuf[4096], spec[512], keepbuf[1024];
	int dense_f32 = 0, force = 0, c;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'o': out = optarg; break;
		case 'e': experts = optarg; break;
		case 'd': dense_f32 = CLI_DENSE_F32; break;
		case 'D':
			if (strcmp(optarg, "fp8")) {
				fprintf(stderr, "strata convert: --dense '%s': "
					"only fp8 (or --dense-f32)\n", optarg);
				return 2;
			}
			dense_f32 = CLI_DENSE_FP8;
			break;
		case 'k':
			/* repeated --keep-layers: all rules count, in order
			 * (a layer named again with another format: the
			 * later wins, and a note says so) */
			if (keep) {
				char joined[sizeof(keepbuf)];

				if (snprintf(joined, sizeof(joined), "%s;%s",
					     keep, optarg) >= (int)sizeof(joined)) {
					fprintf(stderr, "strata convert: "
						"--keep-layers too long\n");
					return 2;
				}
				memcpy(keepbuf, joined, sizeof(keepbuf));
				optarg = keepbuf;
			}
			keep = optarg;
			break;
		case 'S': scale_search = optarg; break;
		case 'C': calib = optarg; break;
		case 'A': attention = optarg; break;
		case 'X': shared = optarg; break;
		case 'f': force = 1; break;
		case 'h': convert_usage(stdout); return 0;
		default: convert_usage(stderr); return 2;
		}
	}
	if (!model || optind < argc) {
		fprintf(stderr, "strata convert: --model DIR is required and "
			"nothing else may follow (see --help)\n");
		return 2;
	}
	if (calib && scale_search && strcmp(scale_search, "calibrated") &&
	    strcmp(scale_search, "cal") && strcmp(scale_search, "gptq")) {
		fprintf(stderr, "strata convert: --calibrate goes with the "
			"calibrated scale search, not --scale-search %s\n",
			scale_search);
		return 2;
	}
	if (calib && !st_path_exists(calib)) {
		fprintf(stderr, "strata convert: --calibrate %s: no such file "
			"(write it with strata calibrate --out)\n", calib);
		return 2;
	}
	if (calib && !(scale_search && !strcmp(scale_search, "gptq")))
		scale_search = "cal";
	if (cli_experts_spec(spec, sizeof(spec), experts, keep,
			     scale_search) < 0) {
		fprintf(stderr, "strata convert: --keep too long\n");
		return 2;
	}
	experts = spec;
	if (!out) {
		char name[600];
		int r;

		snprintf(name, sizeof(name), "%s%s", experts,
			 dense_f32 == CLI_DENSE_FP8 ? "-dense-fp8" : "");
		r = cli_default_store_dir(model, name, outbuf, sizeof(outbuf));

		if (r < 0) {
			fprintf(stderr, "strata convert: %s: %s\n", model,
				st_strerror(r));
			return 1;
		}
		out = outbuf;
	}
	{
		int sigfd = st_stop_signals_open();
		int rc;

		if (cli_check_common(NULL, NULL, NULL, NULL, experts,
				     "strata convert"))
			return 2;
		rc = cli_convert_kinds(model, out, experts, calib, attention,
				       shared, dense_f32, force, sigfd);
		if (sigfd >= 0)
			close(sigfd);
		if (rc)
			return rc;
	}
	printf("%s\n", out);
	return 0;
}

int cli_store_stale(const char *store_dir, const char *model_dir)
{
	char path[8300];
	json_t *m, *files;
	size_t i;
	int stale = 0;

	snprintf(path, sizeof(path), "%s/manifest.json", store_dir);
	m = json_load_file(path, 0, NULL);
	if (!m)
		return 1; /* not a readable store: make it again */
	/* a store written by another version of strata is made again */
	if (json_integer_value(json_object_get(m, "version")) != ST_STORE_VERSION) {
		json_decref(m);
		return 1;
	}
	/* a calibrated store is made again when the model's default
	 * statistics ("/cal") are not those it was made with (strata
	 * calibrate has rewritten them) */
	{
		json_t *cal = json_object_get(json_object_get(json_object_get(
			m, "experts"), "policy"), "calibration");
		const char *want = json_string_value(json_object_get(cal,
							"stats_xxh3"));
		char stats[4096], hex[17], *buf = NULL;
		size_t len = 0;

		if (want && cli_default_calib_path(model_dir, stats,
						   sizeof(stats)) == 0 &&
		    st_read_file(stats, &buf, &len) == 0) {
			snprintf(hex, sizeof(hex), "%016llx",
				 (unsigned long long)st_xxh3(buf, len));
			if (strcmp(hex, want))
				stale = 1;
			free(buf);
		}
	}
	files = json_object_get(json_object_get(m, "source"), "files");
	for (i = 0; i < json_array_size(files); i++) {
		json_t *f = json_array_get(files, i);
		const char *name = json_string_value(json_object_get(f, "name"));
		json_int_t bytes = json_integer_value(json_object_get(f, "bytes"));
		struct stat st;

		if (!name)
			continue;
		snprintf(path, sizeof(path), "%s/%s", model_dir, name);
		if (stat(path, &st) < 0 || (json_int_t)st.st_size != bytes)
			stale = 1;
	}
	json_decref(m);
	return stale;
}

int cli_check_common(const char *instance, const char *host_budget,
		     const char *kv_budget, const char *kv_dtype,
		     const char *experts, const char *who)
{
	char name[256];
	uint64_t bytes;
	double pct;

	if (instance && st_shm_name(instance, "x", name, sizeof(name)) < 0) {
		fprintf(stderr, "%s: --instance '%s': use 1 to 48 letters, "
			"digits, '_' or '-'\n", who, instance);
		return 1;
	}
	if (host_budget && st_parse_budget(host_budget, &bytes, &pct) < 0) {
		fprintf(stderr, "%s: --host-budget '%s': give bytes (512MiB, "
			"8GiB) or a share of all experts (25%%)\n", who,
			host_budget);
		return 1;
	}
	if (kv_budget && (st_parse_size(kv_budget, &bytes) < 0 || !bytes)) {
		fprintf(stderr, "%s: --kv-budget '%s': give a size in bytes "
			"(e.g. 256MiB)\n", who, kv_budget);
		return 1;
	}
	if (kv_dtype && strcmp(kv_dtype, "f32") && strcmp(kv_dtype, "f16") &&
	    strcmp(kv_dtype, "bf16") && strcmp(kv_dtype, "fp8")) {
		fprintf(stderr, "%s: --kv-dtype '%s': use f32 (reference "
			"mode), f16, bf16 or fp8\n", who, kv_dtype);
		return 1;
	}
	if (experts) {
		struct es_convert_opts o;
		struct st_diag d = { "" };

		es_convert_opts_init(&o);
		if (apply_experts(experts, &o, &d) < 0) {
			fprintf(stderr, "%s: %s\n", who, d.msg);
			return 1;
		}
	}
	return 0;
}

int cli_cmd_verify(int argc, char **argv)
{
	struct progress_bar pb = { "verifying", isatty(2), -1, st_now_ns(),
				   -1, 0 };
	struct st_diag diag = { "" };
	int n_bad = 0, r;
	const char *dir = NULL;

	/* strata verify STORE_DIR, or --store STORE_DIR as the other
	 * commands spell it */
	if (argc == 2 && strcmp(argv[1], "-h") && strcmp(argv[1], "--help") &&
	    strncmp(argv[1], "--", 2))
		dir = argv[1];
	else if (argc == 3 && !strcmp(argv[1], "--store"))
		dir = argv[2];
	else if (argc == 2 && !strncmp(argv[1], "--store=", 8) && argv[1][8])
		dir = argv[1] + 8;
	if (!dir) {
		int help = argc == 2 && (!strcmp(argv[1], "-h") ||
					 !strcmp(argv[1], "--help"));

		fprintf(help ? stdout : stderr,
			"Usage: strata verify STORE_DIR\n"
			"       strata verify --store STORE_DIR\n\n"
			"Re-checks every checksum (XXH3) of a store's dense "
			"tensors and expert\nrecords, and every file size. "
			"Exit status 0 when all are good.\n");
		return help ? 0 : 2;
	}
	if (!st_path_exists(dir)) {
		fprintf(stderr, "strata verify: %s does not exist\n", dir);
		return 1;
	}
	r = st_store_verify(dir, progress, &pb, &n_bad, &diag);
	if (r < 0) {
		fprintf(stderr, "strata verify: %s: %d problem(s); the first: "
			"%s\n", dir, n_bad ? n_bad : 1,
			diag.msg[0] ? diag.msg : st_strerror(r));
		return 1;
	}
	printf("%s: all checksums good\n", dir);
	return 0;
}

int cli_store_refuse_other(const char *store_dir, const char *model_dir,
			   const char *who)
{
	char a[256], b[256];

	if (!cli_store_other_model(store_dir, model_dir, a, sizeof(a),
				   b, sizeof(b)))
		return 0;
	fprintf(stderr, "%s: store %s holds another model (%s) than --model %s "
		"(%s); converting would replace it: give another --store, or "
		"--force to replace it\n", who, store_dir, a, model_dir, b);
	return 1;
}

/* "MixtralForCausalLM, 4 layers, hidden 64, vocab 32000" of a config. */
static void describe_config(json_t *c, char *ret, size_t cap)
{
	const char *arch = json_string_value(json_array_get(
		json_object_get(c, "architectures"), 0));

	snprintf(ret, cap, "%s, %lld layers, hidden %lld, vocab %lld",
		 arch ? arch : json_string_value(json_object_get(c,
		 "model_type")) ? json_string_value(json_object_get(c,
		 "model_type")) : "unknown architecture",
		 (long long)json_integer_value(json_object_get(c,
						"num_hidden_layers")),
		 (long long)json_integer_value(json_object_get(c, "hidden_size")),
		 (long long)json_integer_value(json_object_get(c, "vocab_size")));
}

int cli_store_other_model(const char *store_dir, const char *model_dir,
			  char *ret_store, size_t store_cap, char *ret_model,
			  size_t model_cap)
{
	/* what tells models apart (a re-trained checkpoint of the same
	 * model keeps them: that is a stale store, made again) */
	static const char *const keys[] = {
		"architectures", "model_type", "hidden_size",
		"num_hidden_layers", "vocab_size", "intermediate_size",
		"moe_intermediate_size", "num_local_experts", "num_experts",
		"n_routed_experts", "num_attention_heads",
		"num_key_value_heads",
	};
	char path[8300];
	json_t *m, *sc = NULL, *mc;
	int other = 0;

	ret_store[0] = ret_model[0] = 0;
	snprintf(path, sizeof(path), "%s/manifest.json", store_dir);
	m = json_load_file(path, 0, NULL);
	if (m) {
		const char *txt = json_string_value(json_object_get(m, "config"));

		sc = txt ? json_loads(txt, 0, NULL) :
			   json_incref(json_object_get(m, "config"));
	}
	snprintf(path, sizeof(path), "%s/config.json", model_dir);
	mc = json_load_file(path, 0, NULL);
	if (sc && json_is_object(sc) && mc) {
		for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
			json_t *a = json_object_get(sc, keys[i]),
			       *b = json_object_get(mc, keys[i]);

			if ((a || b) && !(a && b && json_equal(a, b)))
				other = 1;
		}
		describe_config(sc, ret_store, store_cap);
		describe_config(mc, ret_model, model_cap);
	}
	json_decref(sc);
	json_decref(mc);
	json_decref(m);
	return other;
}

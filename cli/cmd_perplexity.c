/*
 * cmd_perplexity.c — `strata perplexity`: runs a text file through the
 * model in windows, through the same daemons as generation, and prints
 * perplexity and mean NLL; against a base run saved with --save-kl-base
 * (e.g. the BF16 model), also the KL divergence and the share of positions
 * with the same top-1 token (as llama.cpp's perplexity tool does).
 *
 * Windowing (the rule of the kjv-moe fixture's README): the whole file is
 * tokenized (no BOS, no special tokens), cut into consecutive windows of
 * --window tokens from token 0 (the last holds the remainder, kept if it
 * has >= 2 tokens), each run from position 0 in a fresh sequence; in a
 * window of n tokens positions 1..n-1 are scored.  ppl = exp(total NLL /
 * scored tokens).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "cli_session.h"
#include "cw_client.h"
#include "st_config.h"
#include "st_config_dsv_family.h"
#include "st_config_dsv41.h"
#include "st_daemon.h"
#include "st_tokenizer.h"
#include "st_util.h"

#define KL_MAGIC "STKLBASE"

struct ppl_opts {
	struct cli_session_opts s;
	const char *file, *save_base, *kl_base, *keep_spec, *scale_search;
	int window, json, keep;
	char experts_spec[512];
	struct cli_tier_args tier;
};

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata perplexity (--model DIR | --store DIR) --file TEXT [options]\n"
"\n"
"Perplexity of a text file, through expertd, kvd and computed (a private\n"
"instance, or --instance NAME if it runs).  Windows of --window tokens, each\n"
"from position 0; positions 1..n-1 of each window are scored.\n"
"\n"
"  --model DIR / --store DIR / --experts FMT / --keep-layers SPEC /\n"
"  --scale-search M\n"
"                       as for strata run; M = none, mse or calibrated (the\n"
"                       statistics strata calibrate wrote for the model)\n"
"  --file FILE          the text to score (required)\n"
"  --window N           tokens per window (default: the model's context,\n"
"                       at most 512)\n"
"  --save-kl-base FILE  also save every position's log-probabilities (float32,\n"
"                       vocab per position: big) for later comparisons\n"
"  --kl-base FILE       compare with a saved base: mean KL divergence\n"
"                       KL(base || this) and the share of positions whose top-1\n"
"                       token is the same\n"
"  --kv-dtype T, --compute MODE, --host-budget B, --kv-budget B,\n"
"  --kv-spill-budget B,\n"
"  --instance NAME, --run-dir DIR,\n"
"  --timeout SEC        as for strata run\n"
"  --json               print the results as one JSON line on stdout\n"
CLI_TIER_HELP
"  -h, --help           this text\n"
"\n"
"Example (the FP4 cost on the trained fixture):\n"
"  strata perplexity --model models/kjv-moe --experts bf16 --file models/kjv-moe/valid.txt --save-kl-base /tmp/kjv.base\n"
"  strata perplexity --model models/kjv-moe --file models/kjv-moe/valid.txt --kl-base /tmp/kjv.base\n");
}

static int parse(struct ppl_opts *o, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "store", required_argument, NULL, 's' },
		{ "experts", required_argument, NULL, 'e' },
		{ "file", required_argument, NULL, 'f' },
		{ "window", required_argument, NULL, 'w' },
		{ "save-kl-base", required_argument, NULL, 'S' },
		{ "kl-base", required_argument, NULL, 'K' },
		{ "kv-dtype", required_argument, NULL, 'k' },
		{ "compute", required_argument, NULL, 'C' },
		{ "host-budget", required_argument, NULL, 'b' },
		{ "kv-budget", required_argument, NULL, 'B' },
		{ "kv-spill-budget", required_argument, NULL, 'O' },
		{ "instance", required_argument, NULL, 'i' },
		{ "run-dir", required_argument, NULL, 'r' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "json", no_argument, NULL, 'j' },
		{ "keep", no_argument, NULL, 'z' },
		{ "keep-layers", required_argument, NULL, 'L' },
		{ "scale-search", required_argument, NULL, 'Z' },
		CLI_TIER_LONGOPTS,
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int c;

	memset(o, 0, sizeof(*o));
	o->s.experts = "mxfp4";
	o->s.timeout_s = 600;
	o->s.who = "strata perplexity";
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o->s.model = optarg; break;
		case 's': o->s.store = optarg; break;
		case 'e': o->s.experts = optarg; break;
		case 'f': o->file = optarg; break;
		case 'w':
			o->window = atoi(optarg);
			if (o->window < 2 || o->window > CW_PROTO_MAX_SCORE) {
				fprintf(stderr, "strata perplexity: --window "
					"wants 2..%d\n", CW_PROTO_MAX_SCORE);
				return 2;
			}
			break;
		case 'S': o->save_base = optarg; break;
		case 'K': o->kl_base = optarg; break;
		case 'k': o->s.kv_dtype = optarg; break;
		case 'C': o->s.compute = optarg; break;
		case 'b': o->s.host_budget = optarg; break;
		case 'B': o->s.kv_budget = optarg; break;
		case 'O': o->s.kv_spill = optarg; break;
		case 'i': o->s.instance = optarg; break;
		case 'r': o->s.run_dir = optarg; break;
		case 'T': o->s.timeout_s = atoi(optarg) > 0 ? atoi(optarg) : 600; break;
		case 'j': o->json = 1; break;
		case 'z': o->keep = 1; break;
		case 'L': o->keep_spec = optarg; break;
		case 'Z': o->scale_search = optarg; break;
		case 'h': usage(stdout); exit(0);
		case CLI_OPT_EVICT ... CLI_OPT_ENGRAM_CACHE:
			if (cli_tier_opt(&o->tier, c, optarg) < 0)
				return 2;
			o->s.tier = &o->tier;
			break;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || !o->file || (!o->s.model && !o->s.store)) {
		fprintf(stderr, "strata perplexity: --file and --model or "
			"--store are required, also with --instance (the "
			"tokenizer and config are read from the store; see "
			"--help)\n");
		return 2;
	}
	if (!st_path_exists(o->file)) {
		fprintf(stderr, "strata perplexity: %s does not exist\n",
			o->file);
		return 2;
	}
	if (o->kl_base) {
		FILE *f = fopen(o->kl_base, "re");
		char magic[8];

		if (!f || fread(magic, 1, 8, f) != 8 ||
		    memcmp(magic, KL_MAGIC, 8)) {
			fprintf(stderr, "strata perplexity: %s is not a KL base "
				"file (make one with --save-kl-base)\n",
				o->kl_base);
			if (f)
				fclose(f);
			return 2;
		}
		fclose(f);
	}
	if (o->save_base) {
		char dir[4096], *slash;

		snprintf(dir, sizeof(dir), "%s", o->save_base);
		slash = strrchr(dir, '/');
		if (slash) {
			*slash = 0;
			if (dir[0] && !st_path_exists(dir)) {
				fprintf(stderr, "strata perplexity: directory "
					"%s does not exist\n", dir);
				return 2;
			}
		}
	}
	if (o->save_base && o->kl_base) {
		fprintf(stderr, "strata perplexity: --save-kl-base and "
			"--kl-base do not go together\n");
		return 2;
	}
	if (cli_experts_spec(o->experts_spec, sizeof(o->experts_spec),
			     o->s.experts, o->keep_spec, o->scale_search) < 0)
		return 2;
	o->s.experts = o->experts_spec;
	if (o->s.compute && strcmp(o->s.compute, "reference") &&
	    strcmp(o->s.compute, "fast")) {
		fprintf(stderr, "strata perplexity: --compute '%s': use "
			"reference or fast\n", o->s.compute);
		return 2;
	}
	return cli_check_common(o->s.instance, o->s.host_budget,
				o->s.kv_budget, o->s.kv_dtype, o->s.experts,
				"strata perplexity") ? 2 : 0;
}

/* The base file: "STKLBASE", u32 version 1, u32 vocab, u64 rows, then rows
 * of vocab float32 log-probabilities. */
static FILE *base_open(const char *path, int write, uint32_t vocab,
		       uint64_t n_rows)
{
	FILE *f = fopen(path, write ? "we" : "re");
	char magic[8];
	uint32_t ver = 1, v;
	uint64_t n;

	if (!f) {
		fprintf(stderr, "strata perplexity: %s: %s\n", path,
			strerror(errno));
		return NULL;
	}
	if (write) {
		if (fwrite(KL_MAGIC, 1, 8, f) != 8 || fwrite(&ver, 4, 1, f) != 1 ||
		    fwrite(&vocab, 4, 1, f) != 1 || fwrite(&n_rows, 8, 1, f) != 1) {
			fclose(f);
			return NULL;
		}
		return f;
	}
	if (fread(magic, 1, 8, f) != 8 || memcmp(magic, KL_MAGIC, 8) ||
	    fread(&ver, 4, 1, f) != 1 || ver != 1 || fread(&v, 4, 1, f) != 1 ||
	    fread(&n, 8, 1, f) != 1) {
		fprintf(stderr, "strata perplexity: %s is not a KL base file "
			"(make one with --save-kl-base)\n", path);
		fclose(f);
		return NULL;
	}
	if (v != vocab || n != n_rows) {
		fprintf(stderr, "strata perplexity: %s holds %llu scored "
			"positions (vocabulary %u); this run scores %llu "
			"positions (vocabulary %u): use the same model family, "
			"file and --window\n", path,
			(unsigned long long)n, v, (unsigned long long)n_rows,
			vocab);
		fclose(f);
		return NULL;
	}
	return f;
}

/* The geometry perplexity needs (vocabulary, context) of a store's
 * config.json: DeepSeek-V4 and V4.1 ones through their own parsers (whose
 * messages say what is wrong with them), others through st_config. */
static int load_cfg(const char *dir, struct st_model_config *cfg,
		    struct st_diag *diag)
{
	char path[4200], *text = NULL;
	size_t len;
	int r;

	snprintf(path, sizeof(path), "%s/config.json", dir);
	if (st_read_file(path, &text, &len) < 0 ||
	    (st_dsv_config_detect(text) != ST_DSV_REV_V41 &&
	     st_dsv_config_detect(text) != ST_DSV_REV_V4)) {
		free(text);
		return st_config_load(dir, cfg, diag);
	}
	if (st_dsv_config_detect(text) == ST_DSV_REV_V41) {
		struct st_dsv_config *v41 = calloc(1, sizeof(*v41));

		r = v41 ? st_dsv_config_parse(text, path,
					      ST_DSV_REV_V41, v41, diag) :
			  st_diag_set(diag, -ENOMEM, "out of memory");
		if (r == 0)
			st_dsv_expert_config(v41, cfg);
		free(v41);
	} else {
		struct st_dsv_config v4;

		r = st_dsv_config_parse(text, path, ST_DSV_REV_V4, &v4, diag);
		if (r == 0)
			st_dsv_expert_config(&v4, cfg);
	}
	free(text);
	return r;
}

/*
 * Before any daemon starts: the text's token count with the tokenizer the
 * scoring uses (parse() requires --model or --store: the given store's,
 * else the model directory's, which a store copies on conversion).
 * Returns the count, or -1 when no tokenizer loads here (a store yet to
 * be made from a model without one: the check after the start says it).
 */
static long count_tokens_early(const struct ppl_opts *o, const char *text,
			       size_t len)
{
	const char *dir = o->s.store && st_path_exists(o->s.store) ?
				  o->s.store : o->s.model;
	struct st_tokenizer *tok = NULL;
	struct st_diag diag = { "" };
	int32_t *ids = NULL;
	size_t n = 0;
	long ret = -1;

	if (!dir || st_tokenizer_load(dir, &tok, &diag) < 0)
		return -1;
	if (st_tokenizer_encode(tok, text, len, 0, 0, &ids, &n) == 0)
		ret = (long)n;
	free(ids);
	st_tokenizer_free(tok);
	return ret;
}

int cli_cmd_perplexity(int argc, char **argv)
{
	struct ppl_opts o;
	struct cli_instance inst;
	struct cw_client *cw = NULL;
	struct st_tokenizer *tok = NULL;
	struct st_model_config cfg;
	struct st_diag diag = { "" };
	char *text = NULL, dump_name[64], dump_path[4400];
	int32_t *ids = NULL;
	uint32_t *argmax = NULL;
	float *cur = NULL, *ref = NULL;
	FILE *base = NULL, *dump = NULL;
	size_t n_ids = 0, len;
	double nll = 0, kld = 0;
	uint64_t scored = 0, same_top1 = 0, n_rows = 0;
	int r, rc = 1, sigfd, window, tty = isatty(2), n_windows = 0;
	uint64_t t0 = st_now_ns();

	r = parse(&o, argc, argv);
	if (r)
		return r;
	memset(&inst, 0, sizeof(inst));
	sigfd = st_stop_signals_open();
	r = st_read_file(o.file, &text, &len);
	if (r < 0) {
		fprintf(stderr, "strata perplexity: cannot read %s: %s\n",
			o.file, st_strerror(r));
		goto out;
	}
	{
		/* too short to score: say so before starting three daemons
		 * (the same message as the check after scoring) */
		long nt = count_tokens_early(&o, text, len);

		if (nt >= 0 && nt < 2) {
			fprintf(stderr, "strata perplexity: %s has fewer than 2 "
				"tokens (%ld); nothing to score\n", o.file, nt);
			goto out;
		}
	}
	r = cli_session_start(&o.s, sigfd, &inst);
	if (r) {
		rc = r;
		goto stop;
	}
	if (!inst.store_dir[0]) {
		if (o.s.store)
			snprintf(inst.store_dir, sizeof(inst.store_dir), "%s",
				 o.s.store);
		else
			cli_default_store_dir(o.s.model, o.s.experts,
					      inst.store_dir,
					      sizeof(inst.store_dir));
	}
	if (load_cfg(inst.store_dir, &cfg, &diag) < 0 ||
	    st_tokenizer_load(inst.store_dir, &tok, &diag) < 0) {
		fprintf(stderr, "strata perplexity: store %s: %s\n",
			inst.store_dir, diag.msg);
		goto stop;
	}
	r = st_tokenizer_encode(tok, text, len, 0, 0, &ids, &n_ids);
	if (r < 0) {
		fprintf(stderr, "strata perplexity: cannot tokenize %s: %s\n",
			o.file, st_strerror(r));
		goto stop;
	}
	window = o.window ? o.window :
			    ST_MIN(cfg.max_position_embeddings, 512);
	if (window > cfg.max_position_embeddings) {
		fprintf(stderr, "strata perplexity: --window %d is longer than "
			"the model's context (%d)\n", window,
			cfg.max_position_embeddings);
		goto stop;
	}
	for (size_t w0 = 0; w0 < n_ids; w0 += (size_t)window)
		if (n_ids - w0 >= 2)
			n_rows += ST_MIN((size_t)window, n_ids - w0) - 1;
	argmax = malloc(sizeof(uint32_t) * (size_t)window);
	if (o.save_base || o.kl_base) {
		cur = malloc(sizeof(float) * (size_t)cfg.vocab_size);
		ref = malloc(sizeof(float) * (size_t)cfg.vocab_size);
		base = base_open(o.save_base ? o.save_base : o.kl_base,
				 !!o.save_base, (uint32_t)cfg.vocab_size, n_rows);
		if (!cur || !ref || !base)
			goto stop;
		snprintf(dump_name, sizeof(dump_name), "ppl-%d.logprobs",
			 (int)getpid());
		snprintf(dump_path, sizeof(dump_path), "%s/%s", inst.run_dir,
			 dump_name);
	}
	r = cw_client_open(inst.run_dir, o.s.timeout_s * 1000, &cw, &diag);
	if (r < 0) {
		fprintf(stderr, "strata perplexity: %s\n", diag.msg);
		goto stop;
	}
	fprintf(stderr, "strata perplexity: %s: %zu tokens, windows of %d\n",
		o.file, n_ids, window);
	/* tier figures of this run when tier options were given */
	struct cw_stats_wire ts0 = { 0 }, ts1 = { 0 };
	struct cli_tier_figures tf;
	int have_tier = o.s.tier && cw_client_stats(cw, &ts0) == 0;

	for (size_t w0 = 0; w0 < n_ids; w0 += (size_t)window) {
		uint32_t n = (uint32_t)ST_MIN((size_t)window, n_ids - w0);
		double wnll;

		if (n < 2)
			break;
		if (st_stop_signals_pending(sigfd)) {
			fprintf(stderr, "\nstrata perplexity: interrupted\n");
			rc = 130;
			goto stop;
		}
		r = cw_client_score(cw, ids + w0, n, base ? dump_name : NULL,
				    &wnll, argmax, &diag);
		if (r < 0) {
			fprintf(stderr, "\nstrata perplexity: %s\n", diag.msg);
			goto stop;
		}
		nll += wnll;
		scored += n - 1;
		n_windows++;
		if (base) {
			dump = fopen(dump_path, "re");
			if (!dump) {
				fprintf(stderr, "strata perplexity: %s: %s\n",
					dump_path, strerror(errno));
				goto stop;
			}
			for (uint32_t i = 0; i + 1 < n; i++) {
				size_t V = (size_t)cfg.vocab_size;

				if (fread(cur, sizeof(float), V, dump) != V) {
					fprintf(stderr, "strata perplexity: "
						"short log-prob dump\n");
					goto stop;
				}
				if (o.save_base) {
					if (fwrite(cur, sizeof(float), V, base) != V) {
						fprintf(stderr, "strata perplexity: "
							"cannot write %s\n",
							o.save_base);
						goto stop;
					}
					continue;
				}
				if (fread(ref, sizeof(float), V, base) != V) {
					fprintf(stderr, "strata perplexity: %s "
						"is truncated\n", o.kl_base);
					goto stop;
				}
				{
					double k = 0;
					int am = 0;

					for (size_t v = 0; v < V; v++) {
						k += exp((double)ref[v]) *
						     ((double)ref[v] - cur[v]);
						if (ref[v] > ref[am])
							am = (int)v;
					}
					kld += k;
					same_top1 += (uint32_t)am == argmax[i];
				}
			}
			fclose(dump);
			dump = NULL;
			unlink(dump_path);
		}
		if (tty)
			fprintf(stderr, "\r  %zu / %zu tokens, ppl %.4f", w0 + n,
				n_ids, exp(nll / (double)scored));
	}
	if (tty)
		fputc('\n', stderr);
	if (!scored) {
		fprintf(stderr, "strata perplexity: %s has fewer than 2 tokens\n",
			o.file);
		goto stop;
	}
	{
		/* with --json, stdout carries only the JSON line */
		FILE *h = o.json ? stderr : stdout;

		fprintf(h, "perplexity %.4f  (mean NLL %.6f nats over %llu "
			"scored tokens, %d window%s of %d, %.1f s)\n",
			exp(nll / (double)scored), nll / (double)scored,
			(unsigned long long)scored, n_windows,
			n_windows == 1 ? "" : "s", window,
			(double)(st_now_ns() - t0) / 1e9);
		if (o.kl_base)
			fprintf(h, "vs %s: mean KL divergence %.6f nats, same "
				"top-1 %.2f %%\n", o.kl_base,
				kld / (double)scored,
				100.0 * (double)same_top1 / (double)scored);
		if (o.save_base)
			fprintf(h, "log-probabilities of %llu positions saved "
				"to %s\n", (unsigned long long)scored,
				o.save_base);
		if (have_tier && cw_client_stats(cw, &ts1) == 0) {
			cli_tier_figures(&ts0, &ts1, &tf);
			cli_tier_per_token(&tf, scored,
					   (double)(st_now_ns() - t0) / 1e9);
			cli_tier_print(h, &tf);
		} else {
			have_tier = 0;
		}
	}
	if (o.json) {
		json_t *j = json_pack("{s:s, s:f, s:f, s:I, s:i, s:i}",
				      "file", o.file,
				      "ppl", exp(nll / (double)scored),
				      "nll", nll / (double)scored,
				      "scored_tokens", (json_int_t)scored,
				      "windows", n_windows, "window", window);

		if (o.kl_base) {
			json_object_set_new(j, "kld", json_real(kld / (double)scored));
			json_object_set_new(j, "same_top1",
					    json_real((double)same_top1 / (double)scored));
		}
		if (have_tier)
			cli_tier_json(j, &tf);
		json_dumpf(j, stdout, JSON_COMPACT | JSON_REAL_PRECISION(10));
		printf("\n");
		json_decref(j);
	}
	rc = 0;
stop:
	if (dump)
		fclose(dump);
	if (base && fclose(base) != 0 && rc == 0) {
		fprintf(stderr, "strata perplexity: cannot finish the base file\n");
		rc = 1;
	}
	cw_client_close(cw);
	cli_session_stop(&inst, rc, o.keep, o.s.instance || o.s.run_dir,
			 "strata perplexity");
out:
	if (sigfd >= 0)
		close(sigfd);
	st_tokenizer_free(tok);
	free(text);
	free(ids);
	free(argmax);
	free(cur);
	free(ref);
	return rc;
}

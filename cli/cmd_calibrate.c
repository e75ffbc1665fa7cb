/*
 * cmd_calibrate.c — `strata calibrate`: runs a calibration text through
 * the model (BF16 or F32 experts) and writes the activation statistics
 * (common/st_calib.h) that `strata convert --calibrate` uses to weight its
 * scale search (the idea of AWQ, arXiv:2306.00978: weight errors matter in
 * proportion to the activations they meet).
 *
 * The model runs in this process (cw_model, reference mode) on a private
 * expertd and kvd, with an activation observer (cw_model_set_act_fn) that
 * adds every routed token's expert inputs to the statistics.  Windowing is
 * that of `strata perplexity`: consecutive windows of --window tokens from
 * token 0, each from position 0 in a fresh sequence.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "cli_instance.h"
#include "cw_model.h"
#include "es_client.h"
#include "kv_client.h"
#include "st_calib.h"
#include "st_config.h"
#include "st_config_dsv_family.h"
#include "st_config_dsv41.h"
#include "st_daemon.h"
#include "st_safetensors.h"
#include "st_tokenizer.h"
#include "st_util.h"

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata calibrate --model DIR --text FILE [options]\n"
"\n"
"Runs FILE through the model (experts in BF16, or F32) and writes, per layer,\n"
"expert and input channel, the second moment E[x^2] of each expert matrix's\n"
"input (gate/up: the normed hidden state of the tokens routed to the expert;\n"
"down: its SwiGLU activation).  strata convert --calibrate STATS (or the\n"
"\"/cal\" suffix of --experts, which uses the default STATS) then weights the\n"
"scale search of the 4-bit formats by them.  Never calibrate on the text you\n"
"evaluate on.\n"
"\n"
"  --model DIR       checkpoint directory (required)\n"
"  --text FILE       calibration text (required; for models/kjv-moe:\n"
"                    scripts/kjv-calib-text.py > calib.txt, training books)\n"
"  --out STATS       statistics file (default: next to the model's stores in\n"
"                    the cache, where \"/cal\" looks for it)\n"
"  --experts FMT     bf16 (default) or f32: precision of the calibration run\n"
"  --window N        tokens per window (default: the model's context, at\n"
"                    most 512)\n"
"  --max-tokens N    stop after N tokens of the text (default: all)\n"
"  --covariance      also the full second-moment matrices E[x x^T] of every\n"
"                    expert's inputs, for --scale-search gptq (per expert\n"
"                    (hidden^2 + width^2) x 8 bytes: 41 MiB for kjv-moe)\n"
"  -h, --help        this text\n"
"\n"
"Example (models/kjv-moe):\n"
"  scripts/kjv-calib-text.py > /tmp/kjv-calib.txt\n"
"  strata calibrate --model models/kjv-moe --text /tmp/kjv-calib.txt\n"
"  strata perplexity --model models/kjv-moe --experts nvfp4/cal --file models/kjv-moe/valid.txt\n");
}

static void observe(void *arg, int layer, int expert, const float *x,
		    int x_len, const float *act, int act_len)
{
	struct st_calib *c = arg;

	if ((uint32_t)x_len == c->hidden && (uint32_t)act_len == c->inter)
		st_calib_add(c, layer, expert, x, act);
}

/* Runs ids[0..n) in windows with the observer set; 0 or exit code. */
static int run_windows(struct cw_model *m, struct kv_client *kv,
		       const int32_t *ids, size_t n, int window,
		       struct st_calib *cal, int sigfd)
{
	struct st_diag diag = { "" };
	float *logits = malloc(sizeof(float) *
			       (size_t)cw_model_config(m)->vocab_size);
	uint64_t t0 = st_now_ns();
	int tty = isatty(2), last_pct = -1;

	if (!logits) {
		fprintf(stderr, "strata calibrate: out of memory\n");
		return 1;
	}
	cw_model_set_act_fn(m, observe, cal);
	for (size_t w0 = 0; w0 < n; w0 += (size_t)window) {
		int wn = (int)ST_MIN((size_t)window, n - w0), pct, r;
		uint32_t seq;

		if (sigfd >= 0 && st_stop_signals_pending(sigfd)) {
			fprintf(stderr, "\nstrata calibrate: interrupted; "
				"nothing written\n");
			free(logits);
			return 130;
		}
		r = kv_client_seq_create(kv, &seq, &diag);
		if (r == 0) {
			r = cw_model_eval(m, seq, 0, ids + w0, wn, NULL, logits,
					  &diag);
			kv_client_seq_free(kv, seq);
		}
		if (r < 0) {
			fprintf(stderr, "\nstrata calibrate: window at token %zu: "
				"%s\n", w0, diag.msg[0] ? diag.msg :
				st_strerror(r));
			free(logits);
			return 1;
		}
		cal->n_tokens += (uint64_t)wn;
		cal->n_windows++;
		pct = (int)((w0 + (size_t)wn) * 100 / n);
		if (pct != last_pct && (tty || pct % 25 == 0)) {
			double s = (double)(st_now_ns() - t0) / 1e9;

			fprintf(stderr, "%scalibrating: %3d%% (%llu tokens, "
				"%.0f tokens/s)%s", tty ? "\r" : "", pct,
				(unsigned long long)cal->n_tokens,
				s > 0 ? (double)cal->n_tokens / s : 0.0,
				tty ? "" : "\n");
			last_pct = pct;
		}
	}
	if (tty)
		fputc('\n', stderr);
	cw_model_set_act_fn(m, NULL, NULL);
	free(logits);
	return 0;
}

/* Prints how the tokens spread over the experts. */
static void summary(const struct st_calib *c, const char *out)
{
	uint64_t lo = UINT64_MAX, hi = 0, few = 0;
	size_t le = (size_t)c->n_layers * c->n_experts;

	for (size_t i = 0; i < le; i++) {
		lo = ST_MIN(lo, c->count[i]);
		hi = ST_MAX(hi, c->count[i]);
		if (c->count[i] < ST_CALIB_MIN_TOKENS)
			few++;
	}
	printf("%s\n", out);
	fprintf(stderr, "strata calibrate: %llu tokens in %llu windows; tokens "
		"per expert %llu..%llu; %llu of %zu experts below %d tokens "
		"(they keep the plain MSE search)\n",
		(unsigned long long)c->n_tokens,
		(unsigned long long)c->n_windows, (unsigned long long)lo,
		(unsigned long long)hi, (unsigned long long)few, le,
		ST_CALIB_MIN_TOKENS);
}

int cli_cmd_calibrate(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "text", required_argument, NULL, 't' },
		{ "out", required_argument, NULL, 'o' },
		{ "experts", required_argument, NULL, 'e' },
		{ "window", required_argument, NULL, 'w' },
		{ "max-tokens", required_argument, NULL, 'n' },
		{ "covariance", no_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *model = NULL, *text_path = NULL, *out = NULL;
	const char *experts = "bf16";
	char outbuf[4096], *text = NULL;
	long window = 0, max_tokens = 0;
	struct cli_instance inst;
	struct st_diag diag = { "" };
	struct st_tokenizer *tok = NULL;
	struct es_client *es = NULL;
	struct kv_client *kv = NULL;
	struct cw_model *m = NULL;
	struct cw_model_opts mo = { .kv_dtype = ST_DTYPE_F32, .page_rows = 16,
				    .n_threads = 1 };
	struct st_calib cal;
	const struct st_model_config *cfg;
	int32_t *ids = NULL;
	size_t n_ids = 0, len = 0;
	uint64_t model_id = 0;
	int c, r, rc = 1, sigfd = -1, up = 0, full = 0;

	memset(&inst, 0, sizeof(inst));
	memset(&cal, 0, sizeof(cal));
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 't': text_path = optarg; break;
		case 'o': out = optarg; break;
		case 'e': experts = optarg; break;
		case 'w': window = strtol(optarg, NULL, 10); break;
		case 'n': max_tokens = strtol(optarg, NULL, 10); break;
		case 'c': full = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!model || !text_path || optind < argc) {
		fprintf(stderr, "strata calibrate: --model DIR and --text FILE "
			"are required, nothing else may follow (see --help)\n");
		return 2;
	}
	if (strcmp(experts, "bf16") && strcmp(experts, "f32")) {
		fprintf(stderr, "strata calibrate: --experts %s: calibrate on "
			"the unquantized model, bf16 or f32\n", experts);
		return 2;
	}
	{
		/* DeepSeek-V4 / V4.1: nothing to calibrate (convert keeps
		 * their MXFP4 experts as they are) */
		char path[4200], *cj = NULL;
		size_t cl;
		int v4 = 0, v41 = 0;

		snprintf(path, sizeof(path), "%s/config.json", model);
		if (st_read_file(path, &cj, &cl) == 0) {
			v4 = st_dsv_config_detect(cj) == ST_DSV_REV_V4;
			v41 = st_dsv_config_detect(cj) == ST_DSV_REV_V41;
		}
		free(cj);
		if (v4 || v41) {
			fprintf(stderr, "strata calibrate: %s is a DeepSeek-%s "
				"checkpoint: strata convert keeps its MXFP4 "
				"experts as they are (no scale search), so "
				"there is nothing to calibrate\n", model,
				v41 ? "V4.1" : "V4");
			return 2;
		}
	}
	if (window < 0 || window == 1 || window > 65536 || max_tokens < 0) {
		fprintf(stderr, "strata calibrate: --window wants 2..65536 and "
			"--max-tokens a count >= 0\n");
		return 2;
	}
	if (!out) {
		r = cli_default_calib_path(model, outbuf, sizeof(outbuf));
		if (r < 0) {
			fprintf(stderr, "strata calibrate: %s: %s\n", model,
				st_strerror(r));
			return 1;
		}
		out = outbuf;
	}
	r = st_read_file(text_path, &text, &len);
	if (r < 0 || len == 0) {
		fprintf(stderr, "strata calibrate: cannot read %s: %s\n",
			text_path, r < 0 ? st_strerror(r) : "empty file");
		free(text);
		return 1;
	}
	if (cli_calib_model_id(model, &model_id, &diag) < 0) {
		fprintf(stderr, "strata calibrate: %s\n", diag.msg);
		free(text);
		return 1;
	}
	sigfd = st_stop_signals_open();
	r = cli_default_store_dir(model, experts, inst.store_dir,
				  sizeof(inst.store_dir));
	if (r == 0 && (!st_path_exists(inst.store_dir) ||
		       cli_store_stale(inst.store_dir, model))) {
		rc = cli_convert(model, inst.store_dir, experts, 0,
				 st_path_exists(inst.store_dir), sigfd);
		if (rc)
			goto out;
		rc = 1;
	}
	if (st_tokenizer_load(inst.store_dir, &tok, &diag) < 0) {
		fprintf(stderr, "strata calibrate: store %s: %s\n",
			inst.store_dir, diag.msg);
		goto out;
	}
	r = st_tokenizer_encode(tok, text, len, 0, 0, &ids, &n_ids);
	if (r < 0 || n_ids < 2) {
		fprintf(stderr, "strata calibrate: cannot tokenize %s: %s\n",
			text_path, r < 0 ? st_strerror(r) : "too short");
		goto out;
	}
	if (max_tokens && (size_t)max_tokens < n_ids)
		n_ids = (size_t)max_tokens;

	snprintf(inst.name, sizeof(inst.name), "calib-%d", (int)getpid());
	st_run_dir_default(inst.name, inst.run_dir, sizeof(inst.run_dir));
	inst.tiers_only = 1;
	snprintf(inst.kv_budget, sizeof(inst.kv_budget), "256MiB");
	r = cli_instance_up(&inst, 300, &diag);
	if (r < 0) {
		fprintf(stderr, "strata calibrate: %s\n", diag.msg);
		goto out;
	}
	up = 1;
	r = es_client_open(inst.run_dir, inst.name, "calibrate", 60000, &es,
			   &diag);
	if (!r)
		r = kv_client_open(inst.run_dir, inst.name, "calibrate", 60000,
				   &kv, &diag);
	if (!r)
		r = cw_model_open(inst.store_dir, es, kv, &mo, &m, &diag);
	if (r < 0) {
		fprintf(stderr, "strata calibrate: %s\n", diag.msg);
		goto out;
	}
	cfg = cw_model_config(m);
	if (!window)
		window = ST_MIN(cfg->max_position_embeddings, 512);
	if (window > cfg->max_position_embeddings) {
		fprintf(stderr, "strata calibrate: --window %ld is longer than "
			"the model's context (%d)\n", window,
			cfg->max_position_embeddings);
		goto out;
	}
	r = st_calib_init_full(&cal, (uint32_t)cfg->n_layers,
			       (uint32_t)cfg->n_experts,
			       (uint32_t)cfg->hidden_size,
			       (uint32_t)cfg->expert_inter, full);
	if (r < 0) {
		fprintf(stderr, "strata calibrate: %s\n", st_strerror(r));
		goto out;
	}
	cal.model_id = model_id;
	cal.text_xxh3 = st_xxh3(text, len);
	fprintf(stderr, "strata calibrate: %zu tokens of %s, windows of %ld, "
		"%s experts\n", n_ids, text_path, window, experts);
	rc = run_windows(m, kv, ids, n_ids, (int)window, &cal, sigfd);
	if (rc)
		goto out;
	rc = 1;
	r = st_calib_write(&cal, out, &diag);
	if (r < 0) {
		fprintf(stderr, "strata calibrate: %s\n", diag.msg);
		goto out;
	}
	summary(&cal, out);
	rc = 0;
out:
	cw_model_close(m);
	kv_client_close(kv);
	es_client_close(es);
	if (up) {
		cli_instance_down(&inst);
		st_rm_rf(inst.run_dir);
	}
	if (sigfd >= 0)
		close(sigfd);
	st_calib_free(&cal);
	st_tokenizer_free(tok);
	free(ids);
	free(text);
	return rc;
}

/* cmd_info.c — `strata info STORE`: what a store holds — the model, the
 * expert format of every layer and the policy that chose it, record and
 * file sizes, the dense weights — read from its manifest (no weights are
 * read). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "cli_cmds.h"
#include "cw_dsv.h"
#include "kv_pool.h"
#include "st_store.h"
#include "st_util.h"

/* The conversion choices the store reader does not keep: scale search
 * (and the calibration statistics it used), attention precision, shared
 * experts; read from manifest.json's experts.policy. */
static void print_policy(const char *dir)
{
	char path[4200];
	json_t *m, *pol, *cal;
	const char *ss, *att, *sh;

	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	m = json_load_file(path, 0, NULL);
	pol = json_object_get(json_object_get(m, "experts"), "policy");
	ss = json_string_value(json_object_get(pol, "scale_search"));
	att = json_string_value(json_object_get(pol, "attention"));
	sh = json_string_value(json_object_get(pol, "shared_experts"));
	cal = json_object_get(pol, "calibration");
	printf("scales     search %s", ss ? ss : "none");
	if (cal)
		printf(" (statistics %s of %lld tokens, text %s; %lld experts "
		       "below %lld tokens: unweighted mse search)",
		       json_string_value(json_object_get(cal, "stats_xxh3")),
		       (long long)json_integer_value(json_object_get(cal,
								     "tokens")),
		       json_string_value(json_object_get(cal, "text_xxh3")),
		       (long long)json_integer_value(json_object_get(cal,
						"fallback_experts")),
		       (long long)json_integer_value(json_object_get(cal,
						"min_tokens")));
	printf("\n");
	printf("dense      attention %s; shared experts %s\n",
	       att ? att : "as the other dense tensors",
	       sh ? sh : "not recorded");
	json_decref(m);
}

int cli_cmd_info(int argc, char **argv)
{
	struct st_store *s = NULL;
	struct st_diag diag = { "" };
	uint64_t expert_bytes = 0, params = 0, dense_bytes = 0;
	char a[32], b[32];
	int r;

	/* strata info --store DIR, as strata verify takes it */
	if (argc == 3 && !strcmp(argv[1], "--store")) {
		argv++;
		argc--;
	}
	if (argc != 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
	    argv[1][0] == '-') {
		int help = argc == 2 && (!strcmp(argv[1], "-h") ||
					 !strcmp(argv[1], "--help"));

		if (!help && argc == 2)
			fprintf(stderr, "strata info: unknown option %s\n",
				argv[1]);
		fprintf(help ? stdout : stderr,
			"Usage: strata info STORE_DIR\n"
			"       strata info --store STORE_DIR\n\n"
			"Prints what a store holds: the model, each layer's "
			"expert format and the\npolicy that chose it (--experts, "
			"--keep-layers), record and file sizes.\n");
		return help ? 0 : 2;
	}
	r = st_store_open(argv[1], &s, &diag);
	if (r < 0) {
		fprintf(stderr, "strata info: %s\n", diag.msg[0] ? diag.msg :
			st_strerror(r));
		return 1;
	}
	printf("store      %s\n", s->dir);
	printf("model      %s: %d layers, hidden %d, %d heads (%d KV) x %d, "
	       "vocab %d, context %d\n", s->is_dsv4 ?
	       "DeepseekV4ForCausalLM" : s->is_dsv41 ?
	       "DeepseekV41ForCausalLM" : st_arch_name(s->cfg.arch),
	       s->cfg.n_layers, s->cfg.hidden_size, s->cfg.n_heads,
	       s->cfg.n_kv_heads, s->cfg.head_dim, s->cfg.vocab_size,
	       s->cfg.max_position_embeddings);
	if (s->is_dsv4)
		printf("v4         %d hash-routed layers, %d shared expert, "
		       "window %d, hc_mult %d, FP8 blocks %dx%d; lossless "
		       "(MXFP4 experts, FP8 + E8M0 dense as the checkpoint)\n",
		       s->dsv4.n_hash_layers, s->dsv4.n_shared,
		       s->dsv4.sliding_window, s->dsv4.hc_mult,
		       s->dsv4.fp8_block[0], s->dsv4.fp8_block[1]);
	if (s->is_dsv41) {
		const struct st_dsv_config *c = &s->dsv41;

		printf("v4.1       %d shared expert, window %d, hc_mult %d, "
		       "gate_temp %g, FP8 blocks %dx%d; lossless (MXFP4 "
		       "experts, FP8 + E8M0 dense as the checkpoint)\n",
		       c->n_shared, c->sliding_window, c->hc_mult,
		       c->gate_temp, c->fp8_block[0], c->fp8_block[1]);
		printf("layers     compress ratio / role:");
		for (int l = 0; l < c->n_layers; l++)
			printf(" %d%s%s%s%s", c->compress_ratio[l],
			       c->kv_source[l] ? "K" : "",
			       c->index_source[l] ? "I" : "",
			       l == c->candidate_source ? "C" : "",
			       st_dsv41_engram_index(c, l) >= 0 ? "E" : "");
		printf("  (K KV source, I index source, C candidate "
		       "source, E Engram)\n");
		for (int i = 0; i < s->n_engram; i++)
			printf("engram     layer %d: %lld rows x %d (E4M3 + E8M0 "
			       "per 32), %u B/row, %u rows per 4 KiB block, %s\n",
			       s->engram[i].layer, (long long)s->engram[i].rows,
			       s->engram[i].dim, s->engram[i].row_bytes,
			       s->engram[i].rows_per_block,
			       st_format_bytes(s->engram[i].n_blocks * 4096, a,
					       sizeof(a)));
	}
	if (s->is_dsv4) {
		struct kv_stream_decl d[KV_MAX_STREAMS];
		int n = cw_dsv_kv_decl(&s->dsv4, 0, 4, d, KV_MAX_STREAMS);

		/* the declaration cw_dsv_kv_declare sends to kvd */
		printf("kv         %d streams; per token %.1f B of pooled rows "
		       "and index keys (BF16 rows; F32: %.1f B), per sequence "
		       "%s (window %d rows, compressor states; BF16)\n", n,
		       cw_dsv4_kv_bytes_per_token(&s->dsv4, 2),
		       cw_dsv4_kv_bytes_per_token(&s->dsv4, 4),
		       st_format_bytes((uint64_t)cw_dsv4_fixed_bytes(&s->dsv4,
								     2),
				       a, sizeof(a)),
		       s->dsv4.sliding_window);
	}
	printf("experts    %d per layer, top-%d, %d wide; policy: default %s%s%s\n",
	       s->cfg.n_experts, s->cfg.top_k, s->cfg.expert_inter,
	       s->policy_default ? s->policy_default : "?",
	       s->policy_keep && s->policy_keep[0] ? ", keep " : "",
	       s->policy_keep && s->policy_keep[0] ? s->policy_keep : "");
	print_policy(s->dir);
	for (int l = 0; l < s->n_layers; l++) {
		const struct st_store_layer *ly = &s->layers[l];
		char f[3][ST_WFORMAT_NAME_MAX];

		for (int m = 0; m < 3; m++)
			st_wformat_name(&ly->mat[m].fmt, f[m], sizeof(f[m]));
		printf("  layer %3d  gate %s, up %s, down %s; record %s%s\n", l,
		       f[0], f[1], f[2],
		       st_format_bytes(ly->record_bytes, a, sizeof(a)),
		       l >= s->cfg.n_layers ? " (MTP draft block)" : "");
		expert_bytes += ly->record_bytes * (uint64_t)s->n_experts;
		for (int m = 0; m < 3; m++)
			params += (uint64_t)(ly->mat[m].rows * ly->mat[m].cols) *
				  (uint64_t)s->n_experts;
	}
	for (int i = 0; i < s->n_dense; i++)
		dense_bytes += s->dense[i].n_bytes;
	printf("sizes      experts %s for %llu parameters (%.3f bytes/param "
	       "with padding), dense %s in %d tensors\n",
	       st_format_bytes(expert_bytes, a, sizeof(a)),
	       (unsigned long long)params,
	       params ? (double)expert_bytes / (double)params : 0.0,
	       st_format_bytes(dense_bytes, b, sizeof(b)), s->n_dense);
	st_store_close(s);
	return 0;
}

/*
 * fuzz_config.c — the config.json parsers on any text: the Mixtral / Qwen
 * family one (st_config_parse) and the DeepSeek-V4 and V4.1 ones.  On
 * success the sizes must be inside the documented bounds (st_config.h:
 * [1, 2^30], top_k <= n_experts, n_heads % n_kv_heads == 0, token ids in the
 * vocabulary); on failure a message.
 */
#include <string.h>

#include "fuzz.h"
#include "st_config.h"
#include "st_config_dsv_family.h"
#include "st_config_dsv41.h"

static void check_mixtral(const struct st_model_config *c)
{
	const int sizes[] = { c->hidden_size, c->n_layers, c->n_heads,
			      c->n_kv_heads, c->head_dim, c->vocab_size,
			      c->n_experts, c->top_k, c->expert_inter };

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		FUZZ_CHECK(sizes[i] >= 1 && sizes[i] <= (1 << 30),
			   "size %zu = %d accepted", i, sizes[i]);
	FUZZ_CHECK(c->top_k <= c->n_experts, "top_k %d > %d experts",
		   c->top_k, c->n_experts);
	FUZZ_CHECK(c->n_heads % c->n_kv_heads == 0, "heads %d / kv %d",
		   c->n_heads, c->n_kv_heads);
	FUZZ_CHECK(c->n_eos >= 0 && c->n_eos <= ST_MAX_EOS, "%d eos", c->n_eos);
	for (int i = 0; i < c->n_eos; i++)
		FUZZ_CHECK(c->eos_token_ids[i] >= 0 &&
			   c->eos_token_ids[i] < c->vocab_size,
			   "eos %d outside vocab %d", c->eos_token_ids[i],
			   c->vocab_size);
	FUZZ_CHECK(c->bos_token_id >= -1 && c->bos_token_id < c->vocab_size,
		   "bos %d", c->bos_token_id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	struct st_diag diag = { { 0 } };
	struct st_model_config cfg;
	struct st_dsv_config c4;
	struct st_dsv_config c41;
	int r;

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';

	r = st_config_parse(text, "config.json", &cfg, &diag);
	if (r == 0)
		check_mixtral(&cfg);
	else
		FUZZ_CHECK(diag.msg[0], "mixtral/qwen: error %d, no message", r);

	memset(&diag, 0, sizeof(diag));
	r = st_dsv_config_parse(text, "config.json", ST_DSV_REV_V4, &c4, &diag);
	FUZZ_CHECK(r == 0 || diag.msg[0], "dsv4: error %d, no message", r);

	memset(&diag, 0, sizeof(diag));
	r = st_dsv_config_parse(text, "config.json",
				ST_DSV_REV_V41, &c41, &diag);
	FUZZ_CHECK(r == 0 || diag.msg[0], "dsv41: error %d, no message", r);

	free(text);
	return 0;
}

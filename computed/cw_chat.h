/*
 * cw_chat.h — chat templates of the supported model families, written in C
 * (no Jinja): Qwen / ChatML, Mixtral [INST], DeepSeek-V3.  The template is
 * chosen from tokenizer_config.json's chat_template when it is one of these
 * (or named with computed --chat-template).
 *
 * Messages are rendered straight to token ids: the template's scaffolding
 * becomes the special tokens' ids, and every message's text is encoded as
 * ordinary text in its own segment, so text that spells a special token
 * ("<|im_end|>") can never become one (PITFALLS P3).
 */
#ifndef CW_CHAT_H
#define CW_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_tokenizer.h"

enum cw_chat_template {
	CW_CHAT_NONE = 0,  /* the model has no (known) chat template */
	CW_CHAT_CHATML,    /* <|im_start|>role\ncontent<|im_end|>\n */
	CW_CHAT_MIXTRAL,   /* <s>[INST] user [/INST]answer</s> */
	CW_CHAT_DEEPSEEK,  /* <｜begin▁of▁sentence｜>system<｜User｜>..<｜Assistant｜> */
};

struct cw_chat_msg {
	const char *role;     /* system, user or assistant (borrowed) */
	const char *content;  /* UTF-8 text (borrowed) */
};

/* Which template tokenizer_config.json in dir asks for: CW_CHAT_NONE when
 * the file, or its chat_template, is absent or none of the three. */
enum cw_chat_template cw_chat_detect(const char *dir);

/* "chatml", "mixtral", "deepseek" (and "none"): 0 or -EINVAL. */
int cw_chat_parse(const char *name, enum cw_chat_template *ret);
const char *cw_chat_name(enum cw_chat_template t);

/*
 * Renders n messages and the assistant's generation prompt as token ids
 * (*ret_ids malloc'd, caller frees; *ret_n its length).
 * Errors: -EINVAL (unknown role, no messages), -ST_E_UNSUPPORTED (no
 * template, or a scaffolding token missing from the vocabulary), encoder
 * errors; each with diag.
 */
int cw_chat_encode(enum cw_chat_template t, const struct st_tokenizer *tok,
		   const struct cw_chat_msg *msgs, int n, int32_t **ret_ids,
		   size_t *ret_n, struct st_diag *diag);

#endif

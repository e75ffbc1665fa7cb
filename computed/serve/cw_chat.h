/*
 * cw_chat.h — chat templates of the supported model families, written in C
 * (no Jinja): Qwen / ChatML, Mixtral [INST], DeepSeek-V3, and "plain" (the
 * default of a model without a chat template: "System: ..\n\nUser: ..\n\n
 * Assistant:" as text, no special token beyond the tokenizer's own BOS
 * rule, so every vocabulary supports it).  The template is chosen from
 * tokenizer_config.json's chat_template when it is one of these (or named
 * with computed --chat-template); cw_chat_resolve checks at start-up that
 * the vocabulary has the chosen template's special tokens.
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
	CW_CHAT_PLAIN,     /* User: content\n\nAssistant: (text only) */
};

/* The stop string a plain-template answer ends at (the next turn), added
 * to a chat request's stops: a base model does not end its turn itself. */
#define CW_CHAT_PLAIN_STOP "\nUser:"


struct cw_chat_msg {
	const char *role;     /* system, user or assistant (borrowed) */
	const char *content;  /* UTF-8 text (borrowed) */
};

/* Which template tokenizer_config.json in dir asks for: CW_CHAT_NONE when
 * the file, or its chat_template, is absent or none of the three. */
enum cw_chat_template cw_chat_detect(const char *dir);

/* "chatml", "mixtral", "deepseek", "plain" (and "none"): 0 or -EINVAL. */
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

/*
 * 0 when tok's vocabulary has every special token template t renders (a
 * probe conversation of each role is encoded); -ST_E_UNSUPPORTED with
 * diag naming the missing token otherwise (CW_CHAT_NONE always passes).
 */
int cw_chat_check(enum cw_chat_template t, const struct st_tokenizer *tok,
		  struct st_diag *diag);

/*
 * The template computed serves chat with, chosen once at start-up:
 * name (--chat-template; NULL or "" = auto) when given, which must be
 * known and supported by tok's vocabulary (else -EINVAL /
 * -ST_E_UNSUPPORTED with diag: the caller refuses to start); auto: the
 * one tokenizer_config.json in dir names when the vocabulary supports it,
 * else CW_CHAT_PLAIN (*ret_note then says why, for a warning; "" when
 * there is nothing to say).  note: a buffer of note_cap bytes.
 */
int cw_chat_resolve(const char *dir, const char *name,
		    const struct st_tokenizer *tok,
		    enum cw_chat_template *ret, char *ret_note,
		    size_t note_cap, struct st_diag *diag);

#endif

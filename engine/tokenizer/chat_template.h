/* The Llama 3.2 Vision Instruct chat template, in C.
 *
 * Reproduces the hub chat_template.json of Llama-3.2-11B-Vision-Instruct as
 * rendered by transformers' apply_chat_template (engine/model/README.md §7), for messages of
 * text and image parts, without the tool-calling branches:
 *
 *   <|begin_of_text|>
 *   [no image anywhere:] <|start_header_id|>system<|end_header_id|>\n\n
 *       Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n{system}<|eot_id|>
 *   per message: <|start_header_id|>{role}<|end_header_id|>\n\n{parts}<|eot_id|>
 *   [add_generation_prompt:] <|start_header_id|>assistant<|end_header_id|>\n\n
 *
 * - A leading "system" message is taken out and its text trimmed (Jinja's
 *   `trim`, i.e. Python str.strip()); later system messages render like any
 *   other message. Message text is NOT trimmed.
 * - Parts are concatenated with no separator; an image part is "<|image|>".
 * - Images together with a non-blank system message are an error, as in the
 *   template ("Prompting with images is incompatible with system messages.").
 *   A system message that trims to "" is allowed with images.
 * - The date: the template writes strftime_now("%d %b %Y"), today's date,
 *   and "26 Jul 2024" only when it has no clock. Here it is the option: the
 *   caller passes today's (ml_chat_date_today) or a pinned one, and NULL
 *   gives the template's fallback, ML_CHAT_DEFAULT_DATE.
 *
 * Message text is never a special token. ml_chat_render emits it raw (the
 * rendered string cannot tell a user's "<|eot_id|>" from the template's),
 * and ml_chat_encode encodes it as text: only the template's own markers
 * (<|begin_of_text|>, the header ids, <|eot_id|>, and one <|image|> per image
 * part) become special ids, so a message cannot forge a turn or an image.
 * This departs from HF on purpose: apply_chat_template then tokenizer(prompt)
 * parses special-token text anywhere in the prompt, message text included
 * (vLLM and TGI do the same). For messages without special-token text the
 * ids are HF's. */
#ifndef ML_CHAT_TEMPLATE_H
#define ML_CHAT_TEMPLATE_H

#include <stddef.h>
#include <time.h>

#include "status.h"
#include "tokenizer/tokenizer.h"

typedef enum ml_chat_part_type {
    ML_CHAT_PART_TEXT,
    ML_CHAT_PART_IMAGE,
} ml_chat_part_type;

typedef struct ml_chat_part {
    ml_chat_part_type type;
    const char *text; /* borrowed, NUL-terminated; ML_CHAT_PART_TEXT only */
} ml_chat_part;

typedef struct ml_chat_message {
    const char *role; /* borrowed: "system", "user" or "assistant" */
    const ml_chat_part *parts; /* borrowed, n_parts entries */
    size_t n_parts;
} ml_chat_message;

typedef struct ml_chat_options {
    int add_generation_prompt;
    const char *date_string; /* borrowed; NULL means ML_CHAT_DEFAULT_DATE */
} ml_chat_options;

#define ML_CHAT_DEFAULT_DATE "26 Jul 2024"
/* Bytes of a date ml_chat_format_date writes, its NUL included ("01 Dec 2026"). */
#define ML_CHAT_DATE_BYTES 12

/* The template's strftime_now("%d %b %Y") for t, in UTC: the day of the month
 * zero-padded to 2 digits, the month's English abbreviation (the C locale's,
 * whatever the process locale is), the year in 4 digits: "01 Dec 2026".
 * Returns ML_OK, or ML_ERR_INVALID_ARG when t is not a date of the years
 * 1000 to 9999; out then holds ML_CHAT_DEFAULT_DATE. @locality any thread. */
ml_status ml_chat_format_date(time_t t, char out[ML_CHAT_DATE_BYTES]);

/* Today's date in UTC from the realtime clock, as ml_chat_format_date writes
 * it; ML_CHAT_DEFAULT_DATE (what the template writes without a clock) when
 * the clock cannot be read or gives no such date. Returns out.
 * UTC rather than the local time zone: workers in different zones serving
 * one topic then write the same prompt for the same request.
 * @locality any thread. */
const char *ml_chat_date_today(char out[ML_CHAT_DATE_BYTES]);

/* Render the prompt text. On success *prompt is a new NUL-terminated string
 * (owned by the caller: free()) of *len bytes. opt may be NULL (defaults:
 * no generation prompt, default date). Errors, with *prompt untouched:
 * ML_ERR_INVALID_ARG for no messages, a NULL role or text, a role other than
 * system/user/assistant, an image in the leading system message, or images
 * with a system message; ML_ERR_UNSUPPORTED for the tool roles "tool" and
 * "ipython"; ML_ERR_NOMEM. */
ml_status ml_chat_render(const ml_chat_message *msgs, size_t n_msgs, const ml_chat_options *opt,
                         char **prompt, size_t *len, char *err, size_t errlen);

/* Render and encode, appending the ids to *ids (the prompt already starts
 * with <|begin_of_text|>: no BOS is added). The template's markers become
 * their special ids; everything between two markers (template text and the
 * text of messages, the system message and the date alike) is encoded with
 * special parsing off, so every special id in the output is one the template
 * wrote, and decoding the ids gives ml_chat_render's prompt byte for byte.
 * Without special-token text in the messages and the date this is what HF's
 * processor does with add_special_tokens=False. Errors: as ml_chat_render;
 * ML_ERR_UNSUPPORTED when tok lacks one of the markers as a special token;
 * ML_ERR_NOMEM; *ids keeps its old contents on error. */
ml_status ml_chat_encode(const ml_tokenizer *tok, const ml_chat_message *msgs, size_t n_msgs,
                         const ml_chat_options *opt, ml_token_buf *ids, char *err, size_t errlen);

#endif

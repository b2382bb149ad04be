/* The Llama 3.2 Vision Instruct chat template, in C.
 *
 * Reproduces the hub chat_template.json of Llama-3.2-11B-Vision-Instruct as
 * rendered by transformers' apply_chat_template (engine/model/README.md §7;
 * the text: tests/golden/fixtures/tokenizer/llama32_vision_chat_template.jinja),
 * for messages of text and image parts, tools, assistant tool calls and tool
 * results:
 *
 *   <|begin_of_text|>
 *   [no image anywhere:] <|start_header_id|>system<|end_header_id|>\n\n
 *       [tools:] Environment: ipython\n
 *       Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n{system}<|eot_id|>
 *   [tools:] <|start_header_id|>user<|end_header_id|>\n\nGiven the following functions,
 *       ... Do not use variables.\n\n{tojson(tool, indent=4)}\n\n per tool
 *       {first user message, trimmed}<|eot_id|>
 *   per message: <|start_header_id|>{role}<|end_header_id|>\n\n{parts}<|eot_id|>
 *     an assistant call: <|start_header_id|>assistant<|end_header_id|>\n\n
 *       {"name": "{name}", "parameters": {tojson(arguments)}}<|eot_id|>
 *     a tool result ("tool" or "ipython"): <|start_header_id|>ipython<|end_header_id|>\n\n
 *       {tojson(content)}<|eot_id|>
 *   [add_generation_prompt:] <|start_header_id|>assistant<|end_header_id|>\n\n
 *
 * - A leading "system" message is taken out and its text trimmed (Jinja's
 *   `trim`, i.e. Python str.strip()); later system messages render like any
 *   other message. Message text is NOT trimmed, but for the first user
 *   message with tools, which the template trims too.
 * - Parts are concatenated with no separator; an image part is "<|image|>".
 * - Images together with a non-blank system message are an error, as in the
 *   template ("Prompting with images is incompatible with system messages.").
 *   A system message that trims to "" is allowed with images.
 * - The date: the template writes strftime_now("%d %b %Y"), today's date,
 *   and "26 Jul 2024" only when it has no clock. Here it is the option: the
 *   caller passes today's (ml_chat_date_today) or a pinned one, and NULL
 *   gives the template's fallback, ML_CHAT_DEFAULT_DATE.
 * - tojson is transformers' filter, Python's json.dumps(ensure_ascii=False)
 *   of the parsed value, done on the JSON text here (pyjson.h).
 *
 * Tools (n_tools > 0) depart from the template where it would render
 * nonsense or lose input; each of these is ML_ERR_INVALID_ARG instead:
 * - images anywhere (the template skips the system block, then renders the
 *   first user message's content list as Python text: the image is lost);
 * - no user message right after the (optional) system message (the
 *   template would render "None" or another role's content as the user's).
 * And the first user message's text parts are joined, then trimmed; the
 * template trims only a string content and renders a list of parts as a
 * Python list ("[{'type': 'text', ...}]"). No tools (n_tools == 0) renders
 * as the template does with tools=None; the template given tools=[] would
 * still write the tools' blocks, empty.
 * Other departures, refused as ML_ERR_INVALID_ARG: tool JSON that tojson
 * refuses (pyjson.h: duplicate keys, lone surrogates, ...), a tool or call
 * arguments that are not an object, a tool result's content_json that is
 * not a string, array or object.
 *
 * Message text is never a special token, and neither are the tools, tool
 * call names and arguments and tool results ("message text" below covers
 * them). ml_chat_render emits it raw (the rendered string cannot tell a
 * user's "<|eot_id|>" from the template's), and ml_chat_encode encodes it
 * as text: only the template's own markers (<|begin_of_text|>, the header
 * ids, <|eot_id|>, and one <|image|> per image part) become special ids,
 * so a message cannot forge a turn or an image.
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
    const char *role; /* borrowed: "system", "user", "assistant", "tool" or "ipython"
                         (both tool roles render the "ipython" header) */
    const ml_chat_part *parts; /* borrowed, n_parts entries */
    size_t n_parts;
    /* assistant only: the one call it made (the template renders exactly
     * one; its parts are then not rendered), or both NULL. */
    const char *tool_call_name;      /* borrowed, NUL-terminated; written as is */
    const char *tool_call_arguments; /* borrowed JSON text of the arguments (an object):
                                        OpenAI's `arguments` string, which tojson renders
                                        as the parsed object, as vLLM does */
    /* tool / ipython only: the JSON text of the content as the client sent
     * it (a string, an array or an object), rendered with tojson: a string
     * becomes a quoted JSON string, as in the template (a string is
     * `iterable`). NULL: the parts' text, as is, which the template does
     * for no content a client can send; pass content_json to match it. */
    const char *content_json;
} ml_chat_message;

typedef struct ml_chat_options {
    int add_generation_prompt;
    const char *date_string; /* borrowed; NULL means ML_CHAT_DEFAULT_DATE */
    /* borrowed: n_tools JSON texts, one tool object each, as the client
     * wrote it ({"type":"function","function":{...}}); n_tools == 0: no
     * tools (tools is then not read). */
    const char *const *tools;
    size_t n_tools;
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
 * no generation prompt, default date, no tools). Errors, with *prompt
 * untouched: ML_ERR_INVALID_ARG for no messages, a NULL role or text, a
 * role other than system/user/assistant/tool/ipython, an image in the
 * leading system message or in a tool result, images with a system
 * message, a tool call on a message other than an assistant's or with a
 * name but no arguments (or the reverse), content_json on a message other
 * than a tool result, n_tools with NULL tools or a NULL tool, and the tool
 * departures above; ML_ERR_NOMEM. */
ml_status ml_chat_render(const ml_chat_message *msgs, size_t n_msgs, const ml_chat_options *opt,
                         char **prompt, size_t *len, char *err, size_t errlen);

/* Render and encode, appending the ids to *ids (the prompt already starts
 * with <|begin_of_text|>: no BOS is added). The template's markers become
 * their special ids; everything between two markers (template text and the
 * text of messages, the system message, the tools' and calls' JSON and the
 * date alike) is encoded with
 * special parsing off, so every special id in the output is one the template
 * wrote, and decoding the ids gives ml_chat_render's prompt byte for byte.
 * Without special-token text in the messages and the date this is what HF's
 * processor does with add_special_tokens=False. Errors: as ml_chat_render;
 * ML_ERR_UNSUPPORTED when tok lacks one of the markers as a special token;
 * ML_ERR_NOMEM; *ids keeps its old contents on error. */
ml_status ml_chat_encode(const ml_tokenizer *tok, const ml_chat_message *msgs, size_t n_msgs,
                         const ml_chat_options *opt, ml_token_buf *ids, char *err, size_t errlen);

#endif

/* Fuzz target: the chat template's tojson (engine/tokenizer/pyjson.h) on
 * arbitrary bytes, and the template's tool branches that call it.
 *   - a refused input leaves the buffer as it was;
 *   - an accepted one gives well-formed UTF-8 that cJSON reads, with no raw
 *     control character (only the indent's line breaks);
 *   - the output is a fixed point: tojson of it is itself (Python's own
 *     output reads back to the same value and is written the same way);
 *   - indenting changes only the layout: tojson of the indented output
 *     (any indent, from the first byte) is the one-line output;
 *   - the bytes as the one tool of a chat: rendered exactly when tojson
 *     accepts them and they are an object, the prompt then holding their
 *     indented tojson; the same for a call's arguments (one line).
 * Aborts when one breaks. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/pyjson.h"
#include "tokenizer_util.h"

/* Indents the first byte picks from, 0 to this many spaces. */
#define MAX_FUZZ_INDENT 8
/* What the buffer holds before each call, to see it kept on refusal. */
static const char PREFIX[] = "[0]";
/* The indent the chat template gives the tools. */
#define TOOLS_INDENT 4

static void require(bool ok)
{
    if (!ok)
        abort();
}

/* tojson(text) appended after PREFIX: ML_OK and *out filled, or not OK
 * and *out holding PREFIX only. */
static ml_status dumps(const char *text, size_t n, int indent, ml_pyjson_buf *out)
{
    *out = (ml_pyjson_buf){0};
    require(ml_pyjson_dumps(PREFIX, strlen(PREFIX), ML_PYJSON_NO_INDENT, out, NULL, 0) == ML_OK);
    ml_status st = ml_pyjson_dumps(text, n, indent, out, NULL, 0);
    require(st == ML_OK || st == ML_ERR_INVALID_ARG);
    require(out->len >= strlen(PREFIX) && !memcmp(out->data, PREFIX, strlen(PREFIX)));
    require(st == ML_OK || out->len == strlen(PREFIX));
    return st;
}

static const char *body(const ml_pyjson_buf *b) { return b->data + strlen(PREFIX); }
static size_t body_len(const ml_pyjson_buf *b) { return b->len - strlen(PREFIX); }

static void check_output(const ml_pyjson_buf *b, bool indented)
{
    const char *s = body(b);
    size_t n = body_len(b);
    require(n > 0 && s[n] == '\0' && ml_tok_utf8_ok((const uint8_t *)s, n));
    for (size_t i = 0; i < n; i++)
        require((uint8_t)s[i] >= 0x20 || (indented && s[i] == '\n'));
    cJSON *v = cJSON_ParseWithLength(s, n);
    require(v != NULL);
    cJSON_Delete(v);
}

/* The bytes as a tool and as a call's arguments. line: their one-line
 * tojson when accepted, else NULL. */
static void fuzz_chat(const char *text, size_t n, const ml_pyjson_buf *line)
{
    char *json = malloc(n + 1);
    require(json != NULL);
    memcpy(json, text, n);
    json[n] = '\0';
    /* A NUL inside ends the C string the template reads. */
    bool whole = strlen(json) == n;
    bool object = whole && line && body(line)[0] == '{';
    ml_pyjson_buf indented;
    if (object)
        require(dumps(json, n, TOOLS_INDENT, &indented) == ML_OK);

    const char *tools[] = {json};
    const ml_chat_part user[] = {{ML_CHAT_PART_TEXT, "hi"}};
    const ml_chat_message msgs[] = {
        {.role = "user", .parts = user, .n_parts = 1},
        {.role = "assistant", .tool_call_name = "f", .tool_call_arguments = json}};
    const ml_chat_options opt = {.tools = tools, .n_tools = 1};
    char *prompt = NULL;
    size_t len = 0;
    ml_status st = ml_chat_render(msgs, 1, &opt, &prompt, &len, NULL, 0);
    if (whole)
        require((st == ML_OK) == object);
    if (st == ML_OK && object)
        require(strstr(prompt, body(&indented)) != NULL);
    free(prompt);
    prompt = NULL;
    st = ml_chat_render(msgs, 2, NULL, &prompt, &len, NULL, 0);
    if (whole)
        require((st == ML_OK) == object);
    if (st == ML_OK && object)
        require(strstr(prompt, body(line)) != NULL);
    free(prompt);
    if (object)
        ml_pyjson_buf_deinit(&indented);
    free(json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    ml_pyjson_buf line;
    if (dumps(text, size, ML_PYJSON_NO_INDENT, &line) != ML_OK) {
        ml_pyjson_buf indented;
        require(dumps(text, size, size ? data[0] % (MAX_FUZZ_INDENT + 1) : 0, &indented) !=
                ML_OK);
        ml_pyjson_buf_deinit(&indented);
        fuzz_chat(text, size, NULL);
        ml_pyjson_buf_deinit(&line);
        return 0;
    }
    check_output(&line, false);

    ml_pyjson_buf again;
    require(dumps(body(&line), body_len(&line), ML_PYJSON_NO_INDENT, &again) == ML_OK);
    require(body_len(&again) == body_len(&line) &&
            !memcmp(body(&again), body(&line), body_len(&line)));
    ml_pyjson_buf_deinit(&again);

    ml_pyjson_buf indented, flat;
    require(dumps(text, size, data[0] % (MAX_FUZZ_INDENT + 1), &indented) == ML_OK);
    check_output(&indented, true);
    require(dumps(body(&indented), body_len(&indented), ML_PYJSON_NO_INDENT, &flat) == ML_OK);
    require(body_len(&flat) == body_len(&line) &&
            !memcmp(body(&flat), body(&line), body_len(&line)));
    ml_pyjson_buf_deinit(&indented);
    ml_pyjson_buf_deinit(&flat);

    fuzz_chat(text, size, &line);
    ml_pyjson_buf_deinit(&line);
    return 0;
}

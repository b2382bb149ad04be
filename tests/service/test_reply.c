/* Reply records and headers (service/protocol/reply.c): every record shape parsed
 * back with cJSON, JSON escaping of arbitrary token bytes (the output must
 * be valid JSON and valid UTF-8), logprobs, buffer reuse, and the reply and
 * dead-letter header sets. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "harness.h"
#include "protocol/protocol.h"

static const svc_reply_ctx ctx = {
    .id = "req-1", .model = "llama-3.2-11b-vision", .created = 1700000000, .attempt = 2};

/* Parse a record, checking it is one valid JSON object in valid UTF-8. */
static cJSON *parse_record(const svc_buf *b, const char *what)
{
    check(b->data && strlen(b->data) == b->len, "%s: NUL-terminated, len matches", what);
    check(svc_utf8_valid(b->data, b->len, NULL), "%s: valid UTF-8", what);
    cJSON *root = cJSON_ParseWithLength(b->data, b->len);
    check(cJSON_IsObject(root), "%s: parses as a JSON object: %s", what, b->data);
    return root;
}

static const cJSON *path(const cJSON *root, const char *a, const char *b, const char *c)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, a);
    if (b)
        it = cJSON_GetObjectItemCaseSensitive(it, b);
    if (c)
        it = cJSON_GetObjectItemCaseSensitive(it, c);
    return it;
}

static const cJSON *choice(const cJSON *root)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "choices"), 0);
}

static bool str_is(const cJSON *it, const char *s)
{
    return cJSON_IsString(it) && !strcmp(it->valuestring, s);
}

static bool num_is(const cJSON *it, double v)
{
    return cJSON_IsNumber(it) && fabs(it->valuedouble - v) < 1e-6;
}

static void test_first_and_middle_chunks(void)
{
    svc_buf b;
    svc_buf_init(&b);
    svc_reply r = {.seq = 0, .content = "Hel", .content_len = 3};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "chunk 0");
    cJSON *root = parse_record(&b, "chunk 0");
    check(str_is(path(root, "id", NULL, NULL), "req-1") &&
              str_is(path(root, "object", NULL, NULL), "chat.completion.chunk") &&
              num_is(path(root, "created", NULL, NULL), 1700000000) &&
              str_is(path(root, "model", NULL, NULL), "llama-3.2-11b-vision") &&
              num_is(path(root, "seq", NULL, NULL), 0) &&
              num_is(path(root, "attempt", NULL, NULL), 2),
          "chunk 0 envelope: %s", b.data);
    const cJSON *c = choice(root);
    check(num_is(cJSON_GetObjectItem(c, "index"), 0) &&
              str_is(path(c, "delta", "role", NULL), "assistant") &&
              str_is(path(c, "delta", "content", NULL), "Hel") &&
              cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")) &&
              cJSON_IsNull(cJSON_GetObjectItem(c, "logprobs")),
          "chunk 0 choice");
    check(!cJSON_GetObjectItem(root, "usage") && !cJSON_GetObjectItem(root, "error"),
          "no usage or error mid-stream");
    cJSON_Delete(root);

    r = (svc_reply){.seq = 5, .content = "lo", .content_len = 2};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "chunk 5");
    root = parse_record(&b, "chunk 5");
    c = choice(root);
    check(!path(c, "delta", "role", NULL) && str_is(path(c, "delta", "content", NULL), "lo") &&
              num_is(path(root, "seq", NULL, NULL), 5),
          "later chunks have no role");
    cJSON_Delete(root);

    /* Reuse: no growth for a same-sized record. */
    size_t cap = b.cap;
    char *data = b.data;
    check(svc_reply_chunk(&b, &ctx, &r) == 0 && b.cap == cap && b.data == data,
          "buffer reused without reallocating");
    svc_buf_deinit(&b);
    check(b.data == NULL && b.len == 0 && b.cap == 0, "deinit empties");
}

static void test_final_chunk(void)
{
    svc_buf b = {0};
    svc_usage u = {.prompt_tokens = 1000, .prompt_tokens_cached = 992, .completion_tokens = 24,
                   .images = 2, .images_cached = 1};
    svc_timings t = {.queue_ms = 1.5, .vision_ms = 80.25, .prefill_ms = 30, .decode_ms = 400,
                     .ttft_ms = NAN};
    svc_reply r = {.seq = 24, .finish = SVC_FINISH_LENGTH, .usage = &u, .timings = &t};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "final chunk");
    cJSON *root = parse_record(&b, "final chunk");
    const cJSON *c = choice(root);
    check(str_is(cJSON_GetObjectItem(c, "finish_reason"), "length"), "finish_reason length");
    const cJSON *delta = cJSON_GetObjectItem(c, "delta");
    check(cJSON_IsObject(delta) && delta->child == NULL, "empty delta: %s", b.data);
    check(num_is(path(root, "usage", "prompt_tokens", NULL), 1000) &&
              num_is(path(root, "usage", "prompt_tokens_cached", NULL), 992) &&
              num_is(path(root, "usage", "completion_tokens", NULL), 24) &&
              num_is(path(root, "usage", "total_tokens", NULL), 1024) &&
              num_is(path(root, "usage", "images", NULL), 2) &&
              num_is(path(root, "usage", "images_cached", NULL), 1),
          "usage");
    check(num_is(path(root, "timings", "queue_ms", NULL), 1.5) &&
              num_is(path(root, "timings", "vision_ms", NULL), 80.25) &&
              num_is(path(root, "timings", "decode_ms", NULL), 400) &&
              num_is(path(root, "timings", "ttft_ms", NULL), 0),
          "timings (NaN written as 0)");
    cJSON_Delete(root);
    svc_buf_deinit(&b);
}

static void test_errors(void)
{
    svc_buf b = {0};
    check(svc_reply_error(&b, &ctx, true, 3, SVC_ERROR_INVALID_IMAGE,
                          "messages[0].content[1].image_url.url: \"bad\"") == 0,
          "error chunk");
    cJSON *root = parse_record(&b, "error chunk");
    check(str_is(path(root, "error", "code", NULL), "invalid_image") &&
              str_is(path(root, "error", "message", NULL),
                     "messages[0].content[1].image_url.url: \"bad\"") &&
              str_is(cJSON_GetObjectItem(choice(root), "finish_reason"), "error") &&
              num_is(path(root, "seq", NULL, NULL), 3),
          "error chunk fields: %s", b.data);
    cJSON_Delete(root);

    check(svc_reply_error(&b, &ctx, false, 0, SVC_ERROR_DEADLINE_EXCEEDED, NULL) == 0,
          "error completion");
    root = parse_record(&b, "error completion");
    check(str_is(path(root, "object", NULL, NULL), "chat.completion") &&
              str_is(path(root, "error", "code", NULL), "deadline_exceeded") &&
              str_is(path(root, "error", "message", NULL), "") &&
              str_is(cJSON_GetObjectItem(choice(root), "finish_reason"), "cancelled") &&
              str_is(path(choice(root), "message", "content", NULL), ""),
          "error completion fields: %s", b.data);
    cJSON_Delete(root);

    /* Unknown addressing is written as null, never as garbage. */
    svc_reply_ctx anon = ctx;
    anon.id = NULL;
    check(svc_reply_error(&b, &anon, true, 0, SVC_ERROR_INVALID_JSON, "x") == 0, "null id");
    root = parse_record(&b, "null id");
    check(cJSON_IsNull(path(root, "id", NULL, NULL)), "id null");
    cJSON_Delete(root);
    svc_buf_deinit(&b);
}

static void test_completion(void)
{
    svc_buf b = {0};
    svc_usage u = {.prompt_tokens = 10, .completion_tokens = 3};
    svc_reply r = {.content = "A cat.", .content_len = 6, .finish = SVC_FINISH_STOP, .usage = &u};
    check(svc_reply_completion(&b, &ctx, &r) == 0, "completion");
    cJSON *root = parse_record(&b, "completion");
    const cJSON *c = choice(root);
    check(str_is(path(root, "object", NULL, NULL), "chat.completion") &&
              str_is(path(c, "message", "role", NULL), "assistant") &&
              str_is(path(c, "message", "content", NULL), "A cat.") &&
              str_is(cJSON_GetObjectItem(c, "finish_reason"), "stop") &&
              num_is(path(root, "usage", "total_tokens", NULL), 13) &&
              num_is(path(root, "seq", NULL, NULL), 0) && !cJSON_GetObjectItem(root, "error"),
          "completion fields: %s", b.data);
    cJSON_Delete(root);
    svc_buf_deinit(&b);
}

/* A tool call in OpenAI's shapes: its head (index, id, type, name, the
 * arguments so far) where it begins, arguments alone after, and the whole
 * call in a completion's message, whose content is then null. */
static void test_tool_calls(void)
{
    svc_buf b = {0};
    svc_reply_call head = {.id = "call_0123456789abcdef01234567", .name = "get_weather",
                           .arguments = "{\"pl", .arguments_len = 4};
    svc_reply r = {.seq = 0, .call = &head};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "call head chunk");
    cJSON *root = parse_record(&b, "call head chunk");
    const cJSON *call = cJSON_GetArrayItem(path(choice(root), "delta", "tool_calls", NULL), 0);
    check(str_is(path(choice(root), "delta", "role", NULL), "assistant") &&
              num_is(cJSON_GetObjectItem(call, "index"), 0) &&
              str_is(cJSON_GetObjectItem(call, "id"), head.id) &&
              str_is(cJSON_GetObjectItem(call, "type"), "function") &&
              str_is(path(call, "function", "name", NULL), "get_weather") &&
              str_is(path(call, "function", "arguments", NULL), "{\"pl") &&
              !path(choice(root), "delta", "content", NULL),
          "call head: %s", b.data);
    cJSON_Delete(root);

    svc_reply_call more = {.id = head.id, .arguments = "ace\": \"Oslo\"}", .arguments_len = 13};
    r = (svc_reply){.seq = 3, .call = &more};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "call arguments chunk");
    root = parse_record(&b, "call arguments chunk");
    call = cJSON_GetArrayItem(path(choice(root), "delta", "tool_calls", NULL), 0);
    check(num_is(cJSON_GetObjectItem(call, "index"), 0) && !cJSON_GetObjectItem(call, "id") &&
              !path(call, "function", "name", NULL) &&
              str_is(path(call, "function", "arguments", NULL), "ace\": \"Oslo\"}"),
          "call arguments: %s", b.data);
    cJSON_Delete(root);

    r = (svc_reply){.seq = 9, .finish = SVC_FINISH_TOOL_CALLS};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "final chunk of a call");
    root = parse_record(&b, "final chunk of a call");
    check(str_is(cJSON_GetObjectItem(choice(root), "finish_reason"), "tool_calls"),
          "finish_reason tool_calls: %s", b.data);
    cJSON_Delete(root);

    svc_reply_call whole = {.id = head.id, .name = "get_weather",
                            .arguments = "{\"place\": \"Oslo\"}", .arguments_len = 17};
    r = (svc_reply){.call = &whole, .finish = SVC_FINISH_TOOL_CALLS};
    check(svc_reply_completion(&b, &ctx, &r) == 0, "completion with a call");
    root = parse_record(&b, "completion with a call");
    const cJSON *msg = path(choice(root), "message", NULL, NULL);
    call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    check(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")) &&
              !cJSON_GetObjectItem(call, "index") && str_is(cJSON_GetObjectItem(call, "id"), head.id) &&
              str_is(cJSON_GetObjectItem(call, "type"), "function") &&
              str_is(path(call, "function", "name", NULL), "get_weather") &&
              str_is(path(call, "function", "arguments", NULL), "{\"place\": \"Oslo\"}"),
          "completion's call: %s", b.data);
    cJSON_Delete(root);
    svc_buf_deinit(&b);
}

/* n choices: chunks carry their index, the role in each choice's first
 * chunk, and the request's final record has no choice; one completion
 * holds every choice. */
static void test_choices(void)
{
    svc_buf b = {0};
    svc_reply r = {.seq = 5, .index = 2, .role = true, .content = "Hi", .content_len = 2};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "choice 2's first chunk");
    cJSON *root = parse_record(&b, "choice 2's first chunk");
    check(cJSON_GetArraySize(cJSON_GetObjectItem(root, "choices")) == 1 &&
              num_is(cJSON_GetObjectItem(choice(root), "index"), 2) &&
              str_is(path(choice(root), "delta", "role", NULL), "assistant") &&
              str_is(path(choice(root), "delta", "content", NULL), "Hi") &&
              cJSON_IsNull(cJSON_GetObjectItem(choice(root), "finish_reason")),
          "choice 2's first chunk: %s", b.data);
    cJSON_Delete(root);

    r = (svc_reply){.seq = 6, .index = 1, .content = "!", .content_len = 1,
                    .finish = SVC_FINISH_STOP};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "choice 1's last chunk");
    root = parse_record(&b, "choice 1's last chunk");
    check(num_is(cJSON_GetObjectItem(choice(root), "index"), 1) &&
              !path(choice(root), "delta", "role", NULL) &&
              str_is(cJSON_GetObjectItem(choice(root), "finish_reason"), "stop") &&
              !cJSON_GetObjectItem(root, "usage"),
          "choice 1's last chunk: %s", b.data);
    cJSON_Delete(root);

    svc_usage u = {.prompt_tokens = 10, .completion_tokens = 9};
    svc_timings t = {.queue_ms = 1};
    r = (svc_reply){.seq = 7, .no_choices = true, .content = "x", .content_len = 1,
                    .finish = SVC_FINISH_STOP, .usage = &u, .timings = &t};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "final of n choices");
    root = parse_record(&b, "final of n choices");
    const cJSON *choices = cJSON_GetObjectItem(root, "choices");
    check(cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 0 &&
              num_is(path(root, "usage", "total_tokens", NULL), 19) &&
              num_is(path(root, "timings", "queue_ms", NULL), 1) &&
              num_is(path(root, "seq", NULL, NULL), 7),
          "final of n choices: %s", b.data);
    cJSON_Delete(root);

    svc_reply rs[3] = {
        {.content = "A", .content_len = 1, .finish = SVC_FINISH_STOP, .usage = &u},
        {.content = "B", .content_len = 1, .finish = SVC_FINISH_LENGTH},
        {.finish = SVC_FINISH_STOP},
    };
    check(svc_reply_completion_n(&b, &ctx, rs, 3) == 0, "completion of 3 choices");
    root = parse_record(&b, "completion of 3 choices");
    choices = cJSON_GetObjectItem(root, "choices");
    const char *content[] = {"A", "B", ""}, *finish[] = {"stop", "length", "stop"};
    check(cJSON_GetArraySize(choices) == 3, "3 choices: %s", b.data);
    for (int i = 0; i < 3; i++) {
        const cJSON *c = cJSON_GetArrayItem(choices, i);
        check(num_is(cJSON_GetObjectItem(c, "index"), i) &&
                  str_is(path(c, "message", "role", NULL), "assistant") &&
                  str_is(path(c, "message", "content", NULL), content[i]) &&
                  str_is(cJSON_GetObjectItem(c, "finish_reason"), finish[i]),
              "completion choice %d: %s", i, b.data);
    }
    check(num_is(path(root, "usage", "completion_tokens", NULL), 9), "usage once");
    cJSON_Delete(root);

    /* One choice: what svc_reply_completion writes. */
    svc_buf one = {0};
    check(svc_reply_completion_n(&b, &ctx, rs, 1) == 0 &&
              svc_reply_completion(&one, &ctx, rs) == 0 && b.len == one.len &&
              !memcmp(b.data, one.data, b.len),
          "completion of 1 choice is the completion");
    svc_buf_deinit(&one);
    svc_buf_deinit(&b);
}

static void test_escaping(void)
{
    /* Every byte value: quotes, backslash, controls, DEL, invalid UTF-8, and
     * a few valid multi-byte sequences. */
    char text[256 + 16];
    size_t n = 0;
    for (int c = 1; c < 256; c++) /* NUL separately: cJSON strings end there */
        text[n++] = (char)c;
    static const char valid[] = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"; /* é € 😀 */
    memcpy(text + n, valid, sizeof valid - 1);
    n += sizeof valid - 1;

    svc_buf b = {0};
    svc_reply r = {.seq = 1, .content = text, .content_len = n};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "escaped chunk");
    cJSON *root = parse_record(&b, "escaped chunk");
    const cJSON *content = path(choice(root), "delta", "content", NULL);
    check(cJSON_IsString(content), "content is a string");
    if (cJSON_IsString(content)) {
        const unsigned char *s = (const unsigned char *)content->valuestring;
        check(s[0] == 0x01 && s[1] == 0x02, "controls escaped and decoded back");
        check(strstr((const char *)s, " !\"#") != NULL, "quote round trip");
        check(strstr((const char *)s, "[\\]") != NULL, "backslash round trip");
        check(strstr((const char *)s, "~\x7f\xef\xbf\xbd") != NULL,
              "DEL kept, 0x80 replaced by U+FFFD");
        check(strstr((const char *)s, valid) != NULL, "valid multi-byte kept");
    }
    check(strstr(b.data, "\\u0001") && strstr(b.data, "\\n") && strstr(b.data, "\\t") &&
              strstr(b.data, "\\u001f"),
          "short and \\u escapes");
    cJSON_Delete(root);
    r.content = "\0x";
    r.content_len = 2;
    check(svc_reply_chunk(&b, &ctx, &r) == 0 && strstr(b.data, "\"content\":\"\\u0000x\""),
          "NUL escaped: %s", b.data);

    /* Invalid sequences, each replaced. */
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"\xc0\x80", "\xef\xbf\xbd\xef\xbf\xbd"},       /* overlong NUL */
        {"\xe0\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"a\xe2\x82", "a\xef\xbf\xbd\xef\xbf\xbd"},     /* truncated at the end */
        {"\xe2\x82\xac", "\xe2\x82\xac"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        r.content = cases[i].in;
        r.content_len = strlen(cases[i].in);
        check(svc_reply_chunk(&b, &ctx, &r) == 0, "case %zu", i);
        root = parse_record(&b, "invalid utf-8 case");
        check(str_is(path(choice(root), "delta", "content", NULL), cases[i].out),
              "utf-8 case %zu: %s", i, b.data);
        cJSON_Delete(root);
    }
    svc_buf_deinit(&b);
}

static void test_logprobs(void)
{
    svc_token_logprob top[2] = {{"Hel", 3, -0.25f}, {"\xe2\x82", 2, -INFINITY}};
    svc_logprob_entry e[2] = {
        {.chosen = {"Hel", 3, -0.25f}, .top = top, .n_top = 2},
        {.chosen = {"", 0, -1.0f}, .top = NULL, .n_top = 0},
    };
    svc_buf b = {0};
    svc_reply r = {.seq = 2, .content = "Hel", .content_len = 3, .logprobs = e, .n_logprobs = 2};
    check(svc_reply_chunk(&b, &ctx, &r) == 0, "logprobs chunk");
    cJSON *root = parse_record(&b, "logprobs chunk");
    const cJSON *content = path(choice(root), "logprobs", "content", NULL);
    check(cJSON_GetArraySize(content) == 2, "two entries: %s", b.data);
    const cJSON *e0 = cJSON_GetArrayItem(content, 0);
    check(str_is(cJSON_GetObjectItem(e0, "token"), "Hel") &&
              num_is(cJSON_GetObjectItem(e0, "logprob"), -0.25),
          "entry 0");
    const cJSON *bytes = cJSON_GetObjectItem(e0, "bytes");
    check(cJSON_GetArraySize(bytes) == 3 && num_is(cJSON_GetArrayItem(bytes, 0), 'H'),
          "entry 0 bytes");
    const cJSON *tops = cJSON_GetObjectItem(e0, "top_logprobs");
    const cJSON *t1 = cJSON_GetArrayItem(tops, 1);
    check(cJSON_GetArraySize(tops) == 2 && num_is(cJSON_GetObjectItem(t1, "logprob"), -9999.0) &&
              num_is(cJSON_GetArrayItem(cJSON_GetObjectItem(t1, "bytes"), 0), 0xe2) &&
              str_is(cJSON_GetObjectItem(t1, "token"), "\xef\xbf\xbd\xef\xbf\xbd"),
          "partial UTF-8 token: exact bytes, replaced text, -inf floored");
    const cJSON *e1 = cJSON_GetArrayItem(content, 1);
    check(str_is(cJSON_GetObjectItem(e1, "token"), "") &&
              cJSON_GetArraySize(cJSON_GetObjectItem(e1, "top_logprobs")) == 0,
          "entry 1 empty");
    cJSON_Delete(root);
    svc_buf_deinit(&b);
}

static void check_header(const svc_headers *hs, size_t i, const char *name, const char *value)
{
    check(i < hs->n && !strcmp(hs->h[i].name, name) && hs->h[i].len == strlen(value) &&
              !memcmp(hs->h[i].value, value, hs->h[i].len),
          "header %zu: want %s=%s, got %s=%.*s", i, name, value, i < hs->n ? hs->h[i].name : "-",
          i < hs->n ? (int)hs->h[i].len : 0, i < hs->n ? hs->h[i].value : "");
}

static void test_headers(void)
{
    svc_headers hs;
    svc_headers_reply(&hs, "req-1", 3, 4294967295u, true, true);
    check(hs.n == 5, "5 reply headers");
    check_header(&hs, 0, "request_id", "req-1");
    check_header(&hs, 1, "attempt", "3");
    check_header(&hs, 2, "seq", "4294967295");
    check_header(&hs, 3, "final", "true");
    check_header(&hs, 4, "reproducible", "true");
    svc_headers_reply(&hs, "req-1", 1, 0, false, false);
    check_header(&hs, 3, "final", "false");
    check_header(&hs, 4, "reproducible", "false");

    svc_headers_dlt(&hs, SVC_ERROR_INVALID_REQUEST, "reply_topic: missing", "llm.requests", 7,
                    INT64_MAX, "worker-0");
    check(hs.n == 6, "6 DLT headers");
    check_header(&hs, 0, "x-error-code", "invalid_request");
    check_header(&hs, 1, "x-original-topic", "llm.requests");
    check_header(&hs, 2, "x-original-partition", "7");
    check_header(&hs, 3, "x-original-offset", "9223372036854775807");
    check_header(&hs, 4, "x-worker", "worker-0");
    check_header(&hs, 5, "x-error-msg", "reply_topic: missing");

    /* A message longer than the store is cut on a UTF-8 boundary. */
    char msg[SVC_HEADERS_STORE * 2];
    size_t n = 0;
    while (n + 2 < sizeof msg) {
        msg[n++] = '\xc3';
        msg[n++] = '\xa9';
    }
    msg[n] = '\0';
    svc_headers_dlt(&hs, SVC_ERROR_TOO_MANY_ATTEMPTS, msg, "t", 0, 0, NULL);
    check(hs.n == 5, "no x-worker when NULL");
    check_header(&hs, 0, "x-error-code", "too_many_attempts");
    const svc_header *m = &hs.h[4];
    check(!strcmp(m->name, "x-error-msg") && m->len > 0 && m->len < SVC_HEADERS_STORE &&
              svc_utf8_valid(m->value, m->len, NULL),
          "long message truncated to valid UTF-8 (%zu bytes)", m->len);
}

static void test_utf8(void)
{
    size_t bad = 99;
    check(svc_utf8_valid("", 0, NULL) && svc_utf8_valid("abc\xc3\xa9", 5, NULL), "valid");
    check(!svc_utf8_valid("ab\xc3", 3, &bad) && bad == 2, "truncated at 2");
    check(!svc_utf8_valid("\xf8\x88\x80\x80\x80", 5, &bad) && bad == 0, "5-byte form");
    check(!svc_utf8_valid("x\xc1\xbf", 3, &bad) && bad == 1, "overlong 2-byte");
    check(!svc_utf8_valid("\xf0\x8f\xbf\xbf", 4, &bad) && bad == 0, "overlong 4-byte");
    check(svc_utf8_valid("\xf4\x8f\xbf\xbf", 4, NULL), "U+10FFFF");
    check(svc_utf8_valid("\xed\x9f\xbf", 3, NULL) && !svc_utf8_valid("\xed\xbf\xbf", 3, NULL),
          "surrogate boundary");
    check(!strcmp(svc_finish_name(SVC_FINISH_CANCELLED), "cancelled") &&
              svc_finish_name(SVC_FINISH_NONE) == NULL &&
              svc_error_finish(SVC_ERROR_CANCELLED) == SVC_FINISH_CANCELLED &&
              svc_error_finish(SVC_ERROR_INTERNAL) == SVC_FINISH_ERROR,
          "finish names");
}

int main(void)
{
    test_first_and_middle_chunks();
    test_final_chunk();
    test_errors();
    test_completion();
    test_tool_calls();
    test_choices();
    test_escaping();
    test_logprobs();
    test_headers();
    test_utf8();
    return check_done();
}

/* The gateway's reply-record state machine (service/gateway/gw_stream.c),
 * fed records the worker's own writer builds (svc_reply_chunk): a plain
 * stream, duplicates, a stale attempt interleaved, crash continuation,
 * divergence, error finals, include_usage, stream: false answers compared
 * byte for byte with svc_reply_completion, escaping, and the error table. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gateway/gw_stream.h"
#include "harness.h"
#include "protocol/protocol.h"

#define ID "chatcmpl-0123456789abcdef0123456789abcdef"
#define MODEL "llama-3.2-11b-vision"
#define CREATED 1700000000
/* What the worker writes in place of the gateway's id, model and created. */
#define WORKER_MODEL "worker-model"
#define WORKER_CREATED 1600000000

static const svc_usage usage = {.prompt_tokens = 12,
                                .prompt_tokens_cached = 8,
                                .completion_tokens = 5,
                                .images = 1,
                                .images_cached = 1};
static const svc_timings timings = {.queue_ms = 1, .prefill_ms = 2, .decode_ms = 3};

static gw_stream *stream_new(bool include_usage, bool completion_only)
{
    gw_stream_params p = {.id = ID,
                          .model = MODEL,
                          .created = CREATED,
                          .include_usage = include_usage,
                          .completion_only = completion_only};
    gw_stream *s = gw_stream_create(&p);
    check(s != NULL, "gw_stream_create");
    return s;
}

/* The record of one reply, written by the worker's writer. */
typedef struct rec {
    uint32_t attempt, seq;
    const char *content;
    svc_finish finish; /* NONE: not final */
    svc_error error;
    const svc_logprob_entry *lp;
    bool reproducible;
    const svc_reply_call *call;
} rec;

static gw_feed feed(gw_stream *s, rec r)
{
    svc_reply_ctx ctx = {
        .id = ID, .model = WORKER_MODEL, .created = WORKER_CREATED, .attempt = r.attempt};
    bool final = r.finish != SVC_FINISH_NONE;
    svc_reply reply = {.seq = r.seq,
                       .content = r.content,
                       .content_len = r.content ? strlen(r.content) : 0,
                       .call = r.call,
                       .logprobs = r.lp,
                       .n_logprobs = r.lp ? 1 : 0,
                       .finish = r.finish,
                       .usage = final ? &usage : NULL,
                       .timings = final ? &timings : NULL,
                       .error = r.error,
                       .error_message = r.error ? "worker says no" : NULL};
    svc_buf b;
    svc_buf_init(&b);
    check(svc_reply_chunk(&b, &ctx, &reply) == 0, "svc_reply_chunk");
    gw_record gr = {.attempt = r.attempt,
                    .seq = r.seq,
                    .final = final,
                    .reproducible = r.reproducible,
                    .value = b.data,
                    .len = b.len};
    gw_feed f = gw_stream_feed(s, &gr);
    svc_buf_deinit(&b);
    return f;
}

static gw_feed feed_raw(gw_stream *s, uint32_t attempt, uint32_t seq, bool final, const char *value)
{
    gw_record gr = {
        .attempt = attempt, .seq = seq, .final = final, .value = value, .len = strlen(value)};
    return gw_stream_feed(s, &gr);
}

/* Event i's JSON (NULL for [DONE]), after checking its framing. */
static cJSON *event_json(const gw_stream *s, size_t i)
{
    const char *data;
    size_t len;
    gw_stream_event(s, i, &data, &len);
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "id: %zu\ndata: ", i);
    check(len > (size_t)n + 2 && memcmp(data, prefix, (size_t)n) == 0 &&
              memcmp(data + len - 2, "\n\n", 2) == 0,
          "event %zu framing: %.*s", i, (int)len, data);
    check(memchr(data + n, '\n', len - (size_t)n - 2) == NULL, "event %zu on one line", i);
    const char *payload = data + n;
    size_t plen = len - (size_t)n - 2;
    if (plen == 6 && memcmp(payload, "[DONE]", 6) == 0)
        return NULL;
    check(svc_utf8_valid(payload, plen, NULL), "event %zu valid UTF-8", i);
    cJSON *j = cJSON_ParseWithLength(payload, plen);
    check(cJSON_IsObject(j), "event %zu is a JSON object: %.*s", i, (int)plen, payload);
    return j;
}

static bool str_is(const cJSON *it, const char *s)
{
    return cJSON_IsString(it) && strcmp(it->valuestring, s) == 0;
}

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static const cJSON *choice0(const cJSON *j)
{
    return cJSON_GetArrayItem(get(j, "choices"), 0);
}

/* Every event: framing, envelope, nothing of the worker's own. Returns the
 * text the client would show (the deltas' contents). */
static void check_events(const gw_stream *s, bool include_usage, svc_buf *text)
{
    text->len = 0;
    svc_buf_printf(text, "%s", "");
    size_t n = gw_stream_n_events(s);
    for (size_t i = 0; i < n; i++) {
        cJSON *j = event_json(s, i);
        check((j == NULL) == (gw_stream_done(s) && i + 1 == n), "[DONE] is event %zu of %zu", i, n);
        if (!j)
            continue;
        if (get(j, "error")) {
            cJSON_Delete(j);
            continue;
        }
        check(str_is(get(j, "id"), ID) && str_is(get(j, "model"), MODEL) &&
                  str_is(get(j, "object"), "chat.completion.chunk") &&
                  cJSON_IsNumber(get(j, "created")) && get(j, "created")->valuedouble == CREATED,
              "event %zu envelope", i);
        check(!get(j, "seq") && !get(j, "attempt") && !get(j, "timings"),
              "event %zu has no seq, attempt or timings", i);
        const cJSON *u = get(j, "usage");
        check(include_usage ? u != NULL : u == NULL, "event %zu usage only with include_usage", i);
        const cJSON *c = choice0(j);
        const cJSON *content = get(get(c, "delta"), "content");
        if (cJSON_IsString(content))
            svc_buf_printf(text, "%s", content->valuestring);
        cJSON_Delete(j);
    }
}

static void test_plain_stream(void)
{
    gw_stream *s = stream_new(false, false);
    check(feed(s, (rec){.attempt = 1, .seq = 0, .content = "Hel"}) == GW_FEED_EVENTS, "seq 0");
    check(feed(s, (rec){.attempt = 1, .seq = 1, .content = "lo"}) == GW_FEED_EVENTS, "seq 1");
    check(feed(s, (rec){.attempt = 1, .seq = 2, .content = " world"}) == GW_FEED_EVENTS, "seq 2");
    check(!gw_stream_done(s), "not done before the final");
    check(feed(s, (rec){.attempt = 1, .seq = 3, .content = "!", .finish = SVC_FINISH_STOP}) ==
              GW_FEED_DONE,
          "final");
    check(gw_stream_done(s) && gw_stream_n_events(s) == 5, "4 chunks and [DONE]: %zu",
          gw_stream_n_events(s));
    svc_buf text;
    svc_buf_init(&text);
    check_events(s, false, &text);
    check(strcmp(text.data, "Hello world!") == 0, "text: %s", text.data);
    cJSON *first = event_json(s, 0), *last = event_json(s, 3);
    check(str_is(get(get(choice0(first), "delta"), "role"), "assistant"), "role in seq 0");
    check(cJSON_IsNull(get(choice0(first), "finish_reason")), "no finish mid-stream");
    check(str_is(get(choice0(last), "finish_reason"), "stop"), "finish_reason stop");
    check(!get(last, "usage") && !get(last, "error"), "no usage without include_usage");
    cJSON_Delete(first);
    cJSON_Delete(last);
    check(feed(s, (rec){.attempt = 2, .seq = 0, .content = "late"}) == GW_FEED_IGNORED,
          "records after done are ignored");
    svc_buf_deinit(&text);
    gw_stream_destroy(s);
}

static void test_duplicates(void)
{
    gw_stream *s = stream_new(false, false);
    check(feed(s, (rec){.attempt = 1, .seq = 0, .content = "a"}) == GW_FEED_EVENTS, "seq 0");
    check(feed(s, (rec){.attempt = 1, .seq = 0, .content = "a"}) == GW_FEED_IGNORED, "seq 0 again");
    check(feed(s, (rec){.attempt = 1, .seq = 1, .content = "b"}) == GW_FEED_EVENTS, "seq 1");
    check(feed(s, (rec){.attempt = 1, .seq = 0, .content = "a"}) == GW_FEED_IGNORED,
          "seq 0 a third time");
    check(feed(s, (rec){.attempt = 1, .seq = 1, .content = "b"}) == GW_FEED_IGNORED, "seq 1 again");
    check(feed(s, (rec){.attempt = 1, .seq = 2, .content = NULL, .finish = SVC_FINISH_LENGTH}) ==
              GW_FEED_DONE,
          "final");
    check(feed(s, (rec){.attempt = 1, .seq = 2, .content = NULL, .finish = SVC_FINISH_LENGTH}) ==
              GW_FEED_IGNORED,
          "final again");
    check(gw_stream_n_events(s) == 4, "3 chunks and [DONE]");
    svc_buf text;
    svc_buf_init(&text);
    check_events(s, false, &text);
    check(strcmp(text.data, "ab") == 0, "text: %s", text.data);
    svc_buf_deinit(&text);
    gw_stream_destroy(s);
}

/* Two executions on different workers write the same reply partition: the
 * one that most recently sent seq 0 is followed, the other ignored. */
static void test_interleaved_stale_attempt(void)
{
    gw_stream *s = stream_new(false, false);
    check(feed(s, (rec){.attempt = 7, .seq = 0, .content = "The"}) == GW_FEED_EVENTS, "a7 seq 0");
    check(feed(s, (rec){.attempt = 7, .seq = 1, .content = " cat"}) == GW_FEED_EVENTS, "a7 seq 1");
    check(feed(s, (rec){.attempt = 9, .seq = 1, .content = " cat"}) == GW_FEED_IGNORED,
          "a9 seq 1 before its seq 0");
    check(feed(s, (rec){.attempt = 9, .seq = 0, .content = "The", .reproducible = true}) ==
              GW_FEED_CONTINUED,
          "a9 seq 0 takes over");
    check(feed(s, (rec){.attempt = 7, .seq = 2, .content = " sat"}) == GW_FEED_IGNORED,
          "a7 is stale now");
    check(feed(s, (rec){.attempt = 9, .seq = 1, .content = " cat", .reproducible = true}) ==
              GW_FEED_IGNORED,
          "a9 seq 1 equals what was sent");
    check(feed(s, (rec){.attempt = 9, .seq = 2, .content = " sat", .reproducible = true}) ==
              GW_FEED_EVENTS,
          "a9 seq 2 continues");
    check(feed(s, (rec){.attempt = 7, .seq = 3, .content = NULL, .finish = SVC_FINISH_STOP}) ==
              GW_FEED_IGNORED,
          "a7's final ignored");
    check(feed(s, (rec){.attempt = 7, .seq = 0, .content = "The"}) == GW_FEED_IGNORED,
          "a7 seq 0 again is not new");
    check(feed(s, (rec){.attempt = 9,
                        .seq = 3,
                        .content = ".",
                        .finish = SVC_FINISH_STOP,
                        .reproducible = true}) == GW_FEED_DONE,
          "a9's final");
    svc_buf text;
    svc_buf_init(&text);
    check_events(s, false, &text);
    check(strcmp(text.data, "The cat sat.") == 0, "text: %s", text.data);
    svc_buf_deinit(&text);
    gw_stream_destroy(s);
}

/* A worker died after three records; the new attempt reproduces them and
 * goes on: the reader sees no repeat and no gap. A gap in the dying
 * attempt's seqs stops it first. */
static void test_crash_continuation(void)
{
    static const char *tokens[] = {"Once", " upon", " a", " time", ","};
    gw_stream *s = stream_new(true, false);
    for (uint32_t i = 0; i < 3; i++)
        check(feed(s, (rec){.attempt = 1, .seq = i, .content = tokens[i]}) == GW_FEED_EVENTS,
              "a1 seq %u", i);
    check(feed(s, (rec){.attempt = 1, .seq = 4, .content = tokens[4]}) == GW_FEED_IGNORED,
          "a1 seq 4 after a gap");
    check(feed(s, (rec){.attempt = 1, .seq = 3, .content = tokens[3]}) == GW_FEED_IGNORED,
          "a1 is broken: seq 3 ignored");
    check(gw_stream_n_events(s) == 3, "three events sent");
    const char *first;
    size_t first_len;
    gw_stream_event(s, 0, &first, &first_len);
    check(feed(s, (rec){.attempt = 2, .seq = 0, .content = tokens[0], .reproducible = true}) ==
              GW_FEED_CONTINUED,
          "a2 takes over");
    for (uint32_t i = 1; i < 3; i++)
        check(feed(s, (rec){.attempt = 2, .seq = i, .content = tokens[i], .reproducible = true}) ==
                  GW_FEED_IGNORED,
              "a2 seq %u already sent", i);
    for (uint32_t i = 3; i < 5; i++)
        check(feed(s, (rec){.attempt = 2, .seq = i, .content = tokens[i], .reproducible = true}) ==
                  GW_FEED_EVENTS,
              "a2 seq %u continues", i);
    check(feed(s, (rec){.attempt = 2,
                        .seq = 5,
                        .content = " the end",
                        .finish = SVC_FINISH_STOP,
                        .reproducible = true}) == GW_FEED_DONE,
          "a2 final");
    const char *again;
    size_t again_len;
    gw_stream_event(s, 0, &again, &again_len);
    check(again == first && again_len == first_len, "sent events stay where they were");
    /* 6 chunks, the usage chunk, [DONE]. */
    check(gw_stream_n_events(s) == 8, "events: %zu", gw_stream_n_events(s));
    svc_buf text;
    svc_buf_init(&text);
    check_events(s, true, &text);
    check(strcmp(text.data, "Once upon a time, the end") == 0, "text: %s", text.data);
    svc_buf_deinit(&text);
    gw_stream_destroy(s);
}

/* The error event after the 200, then [DONE]. */
static void check_error_end(const gw_stream *s, const char *code, const char *type)
{
    size_t n = gw_stream_n_events(s);
    check(gw_stream_done(s) && n >= 2, "done with an error event");
    if (n < 2)
        return;
    cJSON *j = event_json(s, n - 2);
    const cJSON *e = get(j, "error");
    check(str_is(get(e, "code"), code) && str_is(get(e, "type"), type) &&
              cJSON_IsNull(get(e, "param")) && cJSON_IsString(get(e, "message")),
          "error event %s", code);
    check(cJSON_GetArraySize(j) == 1 && cJSON_GetArraySize(e) == 4, "error object shape");
    cJSON_Delete(j);
    check(event_json(s, n - 1) == NULL, "[DONE] last");
}

static void test_divergence(void)
{
    gw_stream *s = stream_new(false, false);
    check(feed(s, (rec){.attempt = 1, .seq = 0, .content = "Yes"}) == GW_FEED_EVENTS, "a1 seq 0");
    check(feed(s, (rec){.attempt = 1, .seq = 1, .content = ","}) == GW_FEED_EVENTS, "a1 seq 1");
    check(feed(s, (rec){.attempt = 2, .seq = 0, .content = "Yes", .reproducible = true}) ==
              GW_FEED_CONTINUED,
          "a2 seq 0");
    check(feed(s, (rec){.attempt = 2, .seq = 1, .content = "!", .reproducible = true}) ==
              GW_FEED_DIVERGED,
          "a2 seq 1 differs");
    check(gw_stream_n_events(s) == 4, "2 chunks, the error, [DONE]");
    check_error_end(s, "stream_diverged", "server_error");
    check(feed(s, (rec){.attempt = 2, .seq = 2, .content = "x", .reproducible = true}) ==
              GW_FEED_IGNORED,
          "then ignored");
    gw_stream_destroy(s);

    /* A final shorter than what was sent diverges too. */
    s = stream_new(false, false);
    feed(s, (rec){.attempt = 1, .seq = 0, .content = "A"});
    feed(s, (rec){.attempt = 1, .seq = 1, .content = "B"});
    feed(s, (rec){.attempt = 2, .seq = 0, .content = "A", .reproducible = true});
    check(feed(s, (rec){.attempt = 2,
                        .seq = 1,
                        .content = "B",
                        .finish = SVC_FINISH_STOP,
                        .reproducible = true}) == GW_FEED_DIVERGED,
          "a final where a chunk was sent");
    gw_stream_destroy(s);
}

static void test_not_reproducible(void)
{
    gw_stream *s = stream_new(false, false);
    check(feed(s, (rec){.attempt = 1, .seq = 0, .content = "Yes"}) == GW_FEED_EVENTS, "a1 seq 0");
    check(feed(s, (rec){.attempt = 2, .seq = 0, .content = "Yes"}) == GW_FEED_DIVERGED,
          "a2 not reproducible");
    check_error_end(s, "stream_diverged", "server_error");
    gw_stream_destroy(s);

    /* Before anything was sent a new attempt is simply followed. */
    s = stream_new(false, false);
    check(feed(s, (rec){.attempt = 1, .seq = 1, .content = "lost seq 0"}) == GW_FEED_IGNORED,
          "a1 without seq 0");
    check(feed(s, (rec){.attempt = 2, .seq = 0, .content = "Hi"}) == GW_FEED_EVENTS,
          "a2 is the first followed");
    gw_stream_destroy(s);
}

static void test_error_finals(void)
{
    gw_stream *s = stream_new(false, false);
    check(feed(s, (rec){.attempt = 1,
                        .seq = 0,
                        .content = NULL,
                        .finish = SVC_FINISH_ERROR,
                        .error = SVC_ERROR_CONTEXT_LENGTH_EXCEEDED}) == GW_FEED_DONE,
          "an error as the only record");
    check(gw_stream_n_events(s) == 2, "the error and [DONE]");
    check_error_end(s, "context_length_exceeded", "invalid_request_error");
    svc_buf b;
    svc_buf_init(&b);
    int status = 0;
    check(gw_stream_completion(s, &b, &status) == 0 && status == 400, "stream: false: 400");
    cJSON *j = cJSON_Parse(b.data);
    check(str_is(get(get(j, "error"), "code"), "context_length_exceeded") &&
              str_is(get(get(j, "error"), "message"), "worker says no"),
          "error body: %s", b.data);
    cJSON_Delete(j);
    gw_stream_destroy(s);

    s = stream_new(false, false);
    feed(s, (rec){.attempt = 1, .seq = 0, .content = "partial"});
    check(feed(s, (rec){.attempt = 1,
                        .seq = 1,
                        .content = NULL,
                        .finish = SVC_FINISH_CANCELLED,
                        .error = SVC_ERROR_DEADLINE_EXCEEDED}) == GW_FEED_DONE,
          "deadline after text");
    check_error_end(s, "deadline_exceeded", "server_error");
    check(gw_stream_completion(s, &b, &status) == 0 && status == 504, "deadline: 504");
    gw_stream_destroy(s);

    /* The gateway's own end, before any record. */
    s = stream_new(false, true);
    gw_stream_fail(s, "cancelled", "the client cancelled");
    check(gw_stream_n_events(s) == 2, "fail: error and [DONE]");
    check_error_end(s, "cancelled", "invalid_request_error");
    check(gw_stream_completion(s, &b, &status) == 0 && status == 409, "cancelled: 409");
    gw_stream_fail(s, "internal", "again");
    check(gw_stream_n_events(s) == 2, "fail once done is a no-op");
    gw_stream_destroy(s);

    /* A record that is not a chunk ends the stream as internal. */
    s = stream_new(false, false);
    check(feed_raw(s, 1, 0, false, "{\"choices\":[{\"delta\":{\"content\":1}}]}") == GW_FEED_DONE,
          "content not a string");
    check_error_end(s, "internal", "server_error");
    gw_stream_destroy(s);
    static const char *not_chunks[] = {
        "{\"choices\":[{\"delta\":{}}]} x",
        "[{\"choices\":[]}]",
        "{\"choices\":{}}",
        "{\"choices\":[]}",
        "{\"choices\":[1]}",
        "{\"choices\":[{}]}",
        "{\"choices\":[{\"delta\":{},\"logprobs\":5}]}",
        "{\"choices\":[{\"delta\":{},\"logprobs\":{\"content\":null}}]}",
        "{\"choices\":[{\"delta\":{}}],\"usage\":\"x\"}",
        "{\"choices\":[{\"delta\":{}}],\"error\":[]}",
    };
    for (size_t i = 0; i < sizeof not_chunks / sizeof not_chunks[0]; i++) {
        s = stream_new(false, false);
        check(feed_raw(s, 1, 0, false, not_chunks[i]) == GW_FEED_DONE, "not a chunk: %s",
              not_chunks[i]);
        check_error_end(s, "internal", "server_error");
        gw_stream_destroy(s);
    }

    /* A long message is cut, never inside a character. */
    char longmsg[2 * SVC_ERRMSG_MAX];
    for (size_t i = 0; i + 2 < sizeof longmsg; i += 2)
        memcpy(longmsg + i, "\xc3\xa9", 2);
    longmsg[sizeof longmsg - 2] = '\0';
    s = stream_new(false, true);
    gw_stream_fail(s, "internal", longmsg + 1); /* odd: starts inside a character */
    check(gw_stream_completion(s, &b, &status) == 0 && svc_utf8_valid(b.data, b.len, NULL) &&
              b.len < sizeof longmsg,
          "a long message cut to fit: %zu bytes", b.len);
    gw_stream_destroy(s);
    svc_buf_deinit(&b);
}

static void test_include_usage(void)
{
    gw_stream *s = stream_new(true, false);
    feed(s, (rec){.attempt = 1, .seq = 0, .content = "Hi"});
    check(feed(s, (rec){.attempt = 1, .seq = 1, .content = NULL, .finish = SVC_FINISH_STOP}) ==
              GW_FEED_DONE,
          "final");
    check(gw_stream_n_events(s) == 4, "2 chunks, the usage chunk, [DONE]");
    svc_buf text;
    svc_buf_init(&text);
    check_events(s, true, &text);
    svc_buf_deinit(&text);
    cJSON *mid = event_json(s, 0), *u = event_json(s, 2);
    check(cJSON_IsNull(get(mid, "usage")), "chunks carry usage: null");
    check(cJSON_GetArraySize(get(u, "choices")) == 0 && cJSON_IsArray(get(u, "choices")),
          "usage chunk: choices []");
    const cJSON *us = get(u, "usage");
    check(get(us, "prompt_tokens")->valuedouble == 12 &&
              get(us, "completion_tokens")->valuedouble == 5 &&
              get(us, "total_tokens")->valuedouble == 17 &&
              get(get(us, "prompt_tokens_details"), "cached_tokens")->valuedouble == 8,
          "usage numbers");
    cJSON_Delete(mid);
    cJSON_Delete(u);
    gw_stream_destroy(s);
}

/* The worker's stream: false record for the same tokens, as the worker
 * would write it with the gateway's id, model and created. */
static void worker_completion(svc_buf *b, const char *content, const svc_logprob_entry *lp,
                              size_t n_lp)
{
    svc_reply_ctx ctx = {.id = ID, .model = MODEL, .created = CREATED, .attempt = 1};
    svc_reply r = {.seq = 0,
                   .content = content,
                   .content_len = strlen(content),
                   .logprobs = lp,
                   .n_logprobs = n_lp,
                   .finish = SVC_FINISH_STOP,
                   .usage = &usage,
                   .timings = &timings};
    check(svc_reply_completion(b, &ctx, &r) == 0, "svc_reply_completion");
}

/* The gateway's answer equals the worker's byte for byte up to "usage",
 * and its usage is the worker's with prompt_tokens_details added. */
static void check_same_completion(const svc_buf *gw, const svc_buf *worker)
{
    const char *gu = strstr(gw->data, ",\"usage\":");
    const char *wu = strstr(worker->data, ",\"usage\":");
    check(gu && wu && gu - gw->data == wu - worker->data &&
              memcmp(gw->data, worker->data, (size_t)(gu - gw->data)) == 0,
          "same answer\n gw:     %s\n worker: %s", gw->data, worker->data);
    cJSON *g = cJSON_Parse(gw->data), *w = cJSON_Parse(worker->data);
    check(g && w, "both parse");
    cJSON_DeleteItemFromObject(w, "seq");
    cJSON_DeleteItemFromObject(w, "attempt");
    cJSON_DeleteItemFromObject(w, "timings");
    cJSON *details = cJSON_DetachItemFromObject(cJSON_GetObjectItemCaseSensitive(g, "usage"),
                                                "prompt_tokens_details");
    check(cJSON_IsNumber(get(details, "cached_tokens")) &&
              get(details, "cached_tokens")->valuedouble == usage.prompt_tokens_cached,
          "prompt_tokens_details.cached_tokens");
    check(cJSON_Compare(g, w, true), "the worker's record minus seq, attempt, timings");
    cJSON_Delete(details);
    cJSON_Delete(g);
    cJSON_Delete(w);
}

static void test_completion_with_logprobs(void)
{
    static const svc_token_logprob top[2][2] = {
        {{"Hi", 2, -0.25f}, {"Hey", 3, -1.5f}},
        {{"!", 1, -0.125f}, {".", 1, -3.0f}},
    };
    static const svc_logprob_entry lp[2] = {
        {{"Hi", 2, -0.25f}, top[0], 2},
        {{"!", 1, -0.125f}, top[1], 2},
    };
    gw_stream *s = stream_new(false, true);
    feed(s, (rec){.attempt = 1, .seq = 0, .content = "Hi", .lp = &lp[0]});
    feed(s, (rec){.attempt = 1, .seq = 1, .content = "!", .lp = &lp[1]});
    check(feed(s, (rec){.attempt = 1, .seq = 2, .content = NULL, .finish = SVC_FINISH_STOP}) ==
              GW_FEED_DONE,
          "final");
    svc_buf gw, worker;
    svc_buf_init(&gw);
    svc_buf_init(&worker);
    int status = 0;
    check(gw_stream_completion(s, &gw, &status) == 0 && status == 200, "answer: 200");
    worker_completion(&worker, "Hi!", lp, 2);
    check_same_completion(&gw, &worker);
    gw_stream_destroy(s);

    /* Without logprobs: "logprobs": null, as the worker writes it. */
    s = stream_new(false, true);
    feed(s, (rec){.attempt = 1, .seq = 0, .content = "Hi"});
    feed(s, (rec){.attempt = 1, .seq = 1, .content = "!", .finish = SVC_FINISH_STOP});
    check(gw_stream_completion(s, &gw, &status) == 0 && status == 200, "answer: 200");
    worker_completion(&worker, "Hi!", NULL, 0);
    check_same_completion(&gw, &worker);
    gw_stream_destroy(s);
    svc_buf_deinit(&gw);
    svc_buf_deinit(&worker);
}

/* stream: false with a tool call: the gateway's message is the worker's
 * own, the call's id and name from where it began and its arguments put
 * together from every chunk (escapes included), content null. */
static void test_completion_with_call(void)
{
    static const char id[] = "call_0123456789abcdef01234567";
    static const char args[] = "{\"place\": \"Oslo \\u00e9\", \"days\": 3}";
    svc_reply_call head = {.id = id, .name = "get_weather", .arguments = args, .arguments_len = 9};
    svc_reply_call more = {.id = id, .arguments = args + 9, .arguments_len = 12};
    svc_reply_call rest = {.id = id, .arguments = args + 21, .arguments_len = strlen(args) - 21};
    gw_stream *s = stream_new(false, true);
    feed(s, (rec){.attempt = 1, .seq = 0, .call = &head});
    feed(s, (rec){.attempt = 1, .seq = 1, .call = &more});
    feed(s, (rec){.attempt = 1, .seq = 2, .call = &rest});
    check(feed(s, (rec){.attempt = 1, .seq = 3, .finish = SVC_FINISH_TOOL_CALLS}) ==
              GW_FEED_DONE,
          "final of a call");
    svc_buf gw, worker;
    svc_buf_init(&gw);
    svc_buf_init(&worker);
    int status = 0;
    check(gw_stream_completion(s, &gw, &status) == 0 && status == 200, "answer: 200");
    svc_reply_ctx ctx = {.id = ID, .model = MODEL, .created = CREATED, .attempt = 1};
    svc_reply_call whole = {.id = id, .name = "get_weather", .arguments = args,
                            .arguments_len = strlen(args)};
    svc_reply r = {.call = &whole, .finish = SVC_FINISH_TOOL_CALLS, .usage = &usage,
                   .timings = &timings};
    check(svc_reply_completion(&worker, &ctx, &r) == 0, "svc_reply_completion");
    check_same_completion(&gw, &worker);
    gw_stream_destroy(s);
    svc_buf_deinit(&gw);
    svc_buf_deinit(&worker);
}

/* stream: false: a new attempt restarts the answer, reproducible or not. */
static void test_completion_restart(void)
{
    gw_stream *s = stream_new(false, true);
    feed(s, (rec){.attempt = 1, .seq = 0, .content = "first"});
    feed(s, (rec){.attempt = 1, .seq = 1, .content = " try"});
    check(feed(s, (rec){.attempt = 2, .seq = 0, .content = "Second"}) == GW_FEED_CONTINUED,
          "a2 restarts");
    check(gw_stream_n_events(s) == 3, "its first event follows the old ones");
    feed(s, (rec){.attempt = 1, .seq = 2, .content = " more"});
    check(feed(s, (rec){.attempt = 2, .seq = 1, .content = " answer", .finish = SVC_FINISH_STOP}) ==
              GW_FEED_DONE,
          "a2 final");
    svc_buf gw, worker;
    svc_buf_init(&gw);
    svc_buf_init(&worker);
    int status = 0;
    check(gw_stream_completion(s, &gw, &status) == 0 && status == 200, "answer: 200");
    worker_completion(&worker, "Second answer", NULL, 0);
    check_same_completion(&gw, &worker);
    svc_buf_deinit(&gw);
    svc_buf_deinit(&worker);
    gw_stream_destroy(s);
}

/* ---- n choices ---------------------------------------------------------------- */

/* A record of a request of several choices, as the worker writes it: a
 * chunk of choice `index` (its first when role; finish: its last), or,
 * with index -1, the final record without a choice. */
static gw_feed feed_choice(gw_stream *s, uint32_t attempt, uint32_t seq, int index, bool role,
                           const char *content, svc_finish finish, bool reproducible)
{
    svc_reply_ctx ctx = {
        .id = ID, .model = WORKER_MODEL, .created = WORKER_CREATED, .attempt = attempt};
    bool final = index < 0;
    svc_reply reply = {.seq = seq,
                       .index = final ? 0 : (uint32_t)index,
                       .role = role,
                       .no_choices = final,
                       .content = content,
                       .content_len = content ? strlen(content) : 0,
                       .finish = finish,
                       .usage = final ? &usage : NULL,
                       .timings = final ? &timings : NULL};
    svc_buf b;
    svc_buf_init(&b);
    check(svc_reply_chunk(&b, &ctx, &reply) == 0, "svc_reply_chunk");
    gw_record gr = {.attempt = attempt, .seq = seq, .final = final,
                    .reproducible = reproducible, .value = b.data, .len = b.len};
    gw_feed f = gw_stream_feed(s, &gr);
    svc_buf_deinit(&b);
    return f;
}

/* The text each choice's events put together, into text[index]. */
static void choice_texts(const gw_stream *s, svc_buf *text, int n)
{
    for (int i = 0; i < n; i++) {
        text[i].len = 0;
        svc_buf_printf(&text[i], "%s", "");
    }
    for (size_t e = 0; e < gw_stream_n_events(s); e++) {
        cJSON *j = event_json(s, e);
        const cJSON *c = j ? choice0(j) : NULL;
        const cJSON *index = get(c, "index"), *content = get(get(c, "delta"), "content");
        if (cJSON_IsNumber(index) && index->valueint < n && cJSON_IsString(content))
            svc_buf_printf(&text[index->valueint], "%s", content->valuestring);
        cJSON_Delete(j);
    }
}

/* Two choices: every event one choice with its index, the final record no
 * event of its own (the usage chunk with include_usage); a worker dying,
 * the new attempt interleaving the choices otherwise, is compared choice
 * by choice and continues (its first record new when its choice had sent
 * none); one that differs in a choice diverges; stream:
 * false answers both choices as the worker's completion of two does. */
static void test_choices(void)
{
    gw_stream *s = stream_new(true, false);
    check(feed_choice(s, 1, 0, 0, true, "A", SVC_FINISH_NONE, true) == GW_FEED_EVENTS, "c0 A");
    check(feed_choice(s, 1, 1, 1, true, "B", SVC_FINISH_NONE, true) == GW_FEED_EVENTS, "c1 B");
    check(feed_choice(s, 1, 2, 1, false, "b", SVC_FINISH_NONE, true) == GW_FEED_EVENTS, "c1 b");
    check(gw_stream_n_events(s) == 3, "three events before the crash");
    /* Attempt 2: choice 1's records first this time. */
    check(feed_choice(s, 2, 0, 1, true, "B", SVC_FINISH_NONE, true) == GW_FEED_CONTINUED,
          "a2 takes over with choice 1");
    check(feed_choice(s, 2, 1, 1, false, "b", SVC_FINISH_NONE, true) == GW_FEED_IGNORED,
          "a2 c1 b was sent");
    check(feed_choice(s, 2, 2, 1, false, "!", SVC_FINISH_STOP, true) == GW_FEED_EVENTS,
          "a2 c1 ends: new");
    check(feed_choice(s, 2, 3, 0, true, "A", SVC_FINISH_NONE, true) == GW_FEED_IGNORED,
          "a2 c0 A was sent");
    check(feed_choice(s, 2, 4, 0, false, "a", SVC_FINISH_LENGTH, true) == GW_FEED_EVENTS,
          "a2 c0 ends: new");
    check(feed_choice(s, 2, 5, -1, false, NULL, SVC_FINISH_NONE, true) == GW_FEED_DONE,
          "the final");
    /* 5 chunks, the usage chunk, [DONE]. */
    check(gw_stream_n_events(s) == 7, "events: %zu", gw_stream_n_events(s));
    svc_buf text[2];
    svc_buf_init(&text[0]);
    svc_buf_init(&text[1]);
    choice_texts(s, text, 2);
    check(!strcmp(text[0].data, "Aa") && !strcmp(text[1].data, "Bb!"), "texts '%s' and '%s'",
          text[0].data, text[1].data);
    cJSON *u = event_json(s, 5);
    check(cJSON_GetArraySize(get(u, "choices")) == 0 &&
              cJSON_IsNumber(get(get(u, "usage"), "completion_tokens")),
          "the usage chunk");
    cJSON_Delete(u);
    gw_stream_destroy(s);

    /* A new attempt that differs in one choice. */
    s = stream_new(false, false);
    feed_choice(s, 1, 0, 0, true, "A", SVC_FINISH_NONE, true);
    feed_choice(s, 1, 1, 1, true, "B", SVC_FINISH_NONE, true);
    check(feed_choice(s, 2, 0, 0, true, "A", SVC_FINISH_NONE, true) == GW_FEED_CONTINUED,
          "a2 takes over");
    check(feed_choice(s, 2, 1, 1, true, "C", SVC_FINISH_NONE, true) == GW_FEED_DIVERGED,
          "choice 1 differs: diverged");
    check_error_end(s, "stream_diverged", "server_error");
    gw_stream_destroy(s);

    /* A new attempt whose first record is of a choice that had sent
     * nothing: it takes over and its record is new. */
    s = stream_new(false, false);
    feed_choice(s, 1, 0, 0, true, "A", SVC_FINISH_NONE, true);
    check(feed_choice(s, 2, 0, 1, true, "B", SVC_FINISH_NONE, true) == GW_FEED_CONTINUED &&
              gw_stream_n_events(s) == 2,
          "a2 takes over with choice 1's first record, sent as new");
    check(feed_choice(s, 2, 1, 0, true, "A", SVC_FINISH_NONE, true) == GW_FEED_IGNORED,
          "a2 c0 A was sent");
    gw_stream_destroy(s);

    /* The final while a choice has not given again what it sent. */
    s = stream_new(false, false);
    feed_choice(s, 1, 0, 0, true, "A", SVC_FINISH_NONE, true);
    feed_choice(s, 1, 1, 1, true, "B", SVC_FINISH_NONE, true);
    check(feed_choice(s, 2, 0, 0, true, "A", SVC_FINISH_NONE, true) == GW_FEED_CONTINUED,
          "a2 takes over, choice 0 as sent");
    check(feed_choice(s, 2, 1, -1, false, NULL, SVC_FINISH_NONE, true) == GW_FEED_DIVERGED,
          "a final that leaves choice 1's text out: diverged");
    gw_stream_destroy(s);

    /* stream: false: the worker's completion of two choices. */
    s = stream_new(false, true);
    feed_choice(s, 1, 0, 1, true, "B", SVC_FINISH_NONE, false);
    feed_choice(s, 1, 1, 0, true, "A", SVC_FINISH_NONE, false);
    feed_choice(s, 1, 2, 1, false, "b", SVC_FINISH_LENGTH, false);
    feed_choice(s, 1, 3, 0, false, "a", SVC_FINISH_STOP, false);
    check(feed_choice(s, 1, 4, -1, false, NULL, SVC_FINISH_NONE, false) == GW_FEED_DONE,
          "the final");
    svc_buf gw, worker;
    svc_buf_init(&gw);
    svc_buf_init(&worker);
    int status = 0;
    check(gw_stream_completion(s, &gw, &status) == 0 && status == 200, "answer: 200");
    svc_reply_ctx ctx = {.id = ID, .model = MODEL, .created = CREATED, .attempt = 1};
    svc_reply r[2] = {
        {.content = "Aa", .content_len = 2, .finish = SVC_FINISH_STOP, .usage = &usage,
         .timings = &timings},
        {.content = "Bb", .content_len = 2, .finish = SVC_FINISH_LENGTH},
    };
    check(svc_reply_completion_n(&worker, &ctx, r, 2) == 0, "svc_reply_completion_n");
    check_same_completion(&gw, &worker);
    gw_stream_destroy(s);
    svc_buf_deinit(&gw);
    svc_buf_deinit(&worker);
    svc_buf_deinit(&text[0]);
    svc_buf_deinit(&text[1]);
}

/* Quotes, backslashes, control characters, a NUL, multi-byte characters
 * and an invalid byte (U+FFFD): what the worker escaped reaches the client
 * as it was escaped, in chunks and in the answer. (The worker holds back a
 * character split over tokens, so every record has whole characters.) */
static void test_escaping(void)
{
    static const char *tokens[] = {"\"q\" \\ ",   "tab\tnl\n",         "\x01",
                                   "caf\xc3\xa9", " \xf0\x9f\x98\x80", " bad\xff"};
    size_t n = sizeof tokens / sizeof tokens[0];
    gw_stream *s = stream_new(false, true);
    svc_buf all;
    svc_buf_init(&all);
    for (uint32_t i = 0; i < n; i++) {
        feed(s, (rec){.attempt = 1, .seq = i, .content = tokens[i]});
        svc_buf_printf(&all, "%s", tokens[i]);
    }
    /* A NUL byte cannot go through the C strings of rec: written by hand,
     * as the worker escapes it. */
    check(feed_raw(s, 1, (uint32_t)n, true,
                   "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"nul\\u0000end\"},"
                   "\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":{}}") == GW_FEED_DONE,
          "final with an escaped NUL");
    svc_buf text;
    svc_buf_init(&text);
    check_events(s, false, &text);
    svc_buf_deinit(&text);
    svc_buf gw;
    svc_buf_init(&gw);
    int status = 0;
    check(gw_stream_completion(s, &gw, &status) == 0 && status == 200, "answer");
    check(svc_utf8_valid(gw.data, gw.len, NULL), "answer valid UTF-8");
    cJSON *j = cJSON_Parse(gw.data);
    check(j != NULL, "answer parses: %s", gw.data);
    check(strstr(gw.data, "nul\\u0000end\"") != NULL, "the escaped NUL passes as written");
    check(strstr(gw.data, "\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":0}}") != NULL,
          "an empty usage gets the details: %s", gw.data);
    /* What the worker's writer makes of the same bytes, sans the NUL part. */
    svc_buf worker;
    svc_buf_init(&worker);
    svc_reply_ctx ctx = {.id = ID, .model = MODEL, .created = CREATED};
    svc_reply r = {.content = all.data, .content_len = all.len};
    check(svc_reply_completion(&worker, &ctx, &r) == 0, "worker's completion");
    const char *want = strstr(worker.data, "\"content\":");
    const char *want_end = strstr(worker.data, "\"},\"logprobs\"");
    const char *got = strstr(gw.data, "\"content\":");
    check(want && want_end && got && memcmp(got, want, (size_t)(want_end - want)) == 0,
          "content escaped as the worker does:\n%s\n%s", got, want);
    cJSON_Delete(j);
    svc_buf_deinit(&worker);
    svc_buf_deinit(&gw);
    svc_buf_deinit(&all);
    gw_stream_destroy(s);
}

/* Pretty-printed records (whitespace outside strings) stay on one line. */
static void test_whitespace(void)
{
    gw_stream *s = stream_new(false, false);
    check(
        feed_raw(s, 1, 0, false,
                 " {\n \"choices\" : [ {\n  \"index\": 0, \"delta\" : { \"content\" : \"a b\\n\" },"
                 "\n  \"logprobs\" : null , \"finish_reason\" : null } ] ,\n \"seq\": 0 }\n") ==
            GW_FEED_EVENTS,
        "pretty record");
    svc_buf text;
    svc_buf_init(&text);
    check_events(s, false, &text);
    check(strcmp(text.data, "a b\n") == 0, "content kept: %s", text.data);
    svc_buf_deinit(&text);
    gw_stream_destroy(s);
}

static void test_many_attempts(void)
{
    gw_stream *s = stream_new(false, false);
    gw_feed f = feed(s, (rec){.attempt = 1, .seq = 0, .content = "x"});
    uint32_t a = 2;
    while (f != GW_FEED_DONE && a < 1000)
        f = feed(s, (rec){.attempt = a++, .seq = 0, .content = "x", .reproducible = true});
    check(f == GW_FEED_DONE && a > 10, "too many attempts end the stream (after %u)", a);
    check_error_end(s, "internal", "server_error");
    gw_stream_destroy(s);
}

static void test_bytes_and_long_stream(void)
{
    enum { N = 5000 };
    gw_stream *s = stream_new(false, false);
    size_t empty = gw_stream_bytes(s);
    const char *first;
    size_t first_len;
    feed(s, (rec){.attempt = 1, .seq = 0, .content = "token"});
    gw_stream_event(s, 0, &first, &first_len);
    char keep[1024];
    check(first_len < sizeof keep, "a chunk event is small");
    memcpy(keep, first, first_len < sizeof keep ? first_len : sizeof keep);
    for (uint32_t i = 1; i < N; i++)
        feed(s, (rec){.attempt = 1, .seq = i, .content = "token"});
    size_t sum = 0;
    for (size_t i = 0; i < gw_stream_n_events(s); i++) {
        const char *d;
        size_t len;
        gw_stream_event(s, i, &d, &len);
        sum += len;
    }
    check(gw_stream_n_events(s) == N, "N events");
    check(gw_stream_bytes(s) >= empty + sum, "bytes %zu cover the events %zu", gw_stream_bytes(s),
          sum);
    check(gw_stream_bytes(s) < empty + 2 * sum + 32 * N, "and not much more: %zu for %zu",
          gw_stream_bytes(s), sum);
    const char *again;
    size_t again_len;
    gw_stream_event(s, 0, &again, &again_len);
    check(again == first && memcmp(again, keep, first_len) == 0, "event 0 never moved");
    gw_stream_destroy(s);
}

static void test_status_table(void)
{
    static const struct {
        const char *code;
        int status;
        const char *type;
    } cases[] = {
        {"invalid_json", 400, "invalid_request_error"},
        {"reply_too_large", 400, "invalid_request_error"},
        {"invalid_api_key", 401, "authentication_error"},
        {"model_not_found", 404, "invalid_request_error"},
        {"unknown_adapter", 404, "invalid_request_error"},
        {"cancelled", 409, "invalid_request_error"},
        {"adapter_too_large", 413, "invalid_request_error"},
        {"rate_limit_exceeded", 429, "rate_limit_error"},
        {"adapter_unavailable", 503, "server_error"},
        {"deadline_exceeded", 504, "server_error"},
        {"internal", 500, "server_error"},
        {"stream_diverged", 500, "server_error"},
        {"something_new", 500, "server_error"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int st = gw_http_status_of(cases[i].code);
        check(st == cases[i].status, "%s: %d", cases[i].code, st);
        check(strcmp(gw_error_type_of(st), cases[i].type) == 0, "%s: type", cases[i].code);
    }
    svc_buf b;
    svc_buf_init(&b);
    check(gw_error_body(&b, "invalid_json", "bad \"json\"\n") == 0, "gw_error_body");
    check(strcmp(b.data,
                 "{\"error\":{\"message\":\"bad \\\"json\\\"\\n\",\"type\":"
                 "\"invalid_request_error\",\"param\":null,\"code\":\"invalid_json\"}}") == 0,
          "error body: %s", b.data);
    /* What is not UTF-8 becomes U+FFFD: an answer is always valid UTF-8. */
    check(gw_error_body(&b, "internal", "bad \xff byte") == 0 &&
              svc_utf8_valid(b.data, b.len, NULL) && strstr(b.data, "bad \xef\xbf\xbd byte"),
          "invalid UTF-8 in a message: %s", b.data);
    svc_buf_deinit(&b);
    gw_stream_params p = {.id = ID, .model = "m\xc3", .created = CREATED};
    gw_stream *s = gw_stream_create(&p);
    feed(s, (rec){.attempt = 1, .seq = 0, .content = "x"});
    gw_stream_fail(s, "internal", "\xc3(");
    cJSON *j = event_json(s, 0);
    check(str_is(get(j, "model"), "m\xef\xbf\xbd"), "model made UTF-8");
    cJSON_Delete(j);
    j = event_json(s, 1);
    check(str_is(get(get(j, "error"), "message"), "\xef\xbf\xbd("), "fail message made UTF-8");
    cJSON_Delete(j);
    gw_stream_destroy(s);
}

int main(void)
{
    test_plain_stream();
    test_duplicates();
    test_interleaved_stale_attempt();
    test_crash_continuation();
    test_choices();
    test_divergence();
    test_not_reproducible();
    test_error_finals();
    test_include_usage();
    test_completion_with_logprobs();
    test_completion_with_call();
    test_completion_restart();
    test_escaping();
    test_whitespace();
    test_many_attempts();
    test_bytes_and_long_stream();
    test_status_table();
    return check_done();
}

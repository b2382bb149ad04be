/* Fuzz target: the gateway's reply-record state machine (gw_stream_feed)
 * on arbitrary record sequences. The input is one byte of stream options
 * (bit 0 include_usage, bit 1 completion_only), then records, each a
 * 4-byte header and a payload:
 *   attempt  bits 0-1: attempt 1..4; bit 2: plus 2^31 (an attempt Redis
 *            could not count)
 *   seq      bits 0-3: seq 0..15 (small, so duplicates and gaps are common)
 *   flags    bit 0 final, bit 1 reproducible, bit 2 the payload is the raw
 *            record value (else a chunk the worker's writer builds with the
 *            payload as its content), bit 3 with a logprobs entry, bit 4 an
 *            error final, bit 5 the gateway fails the stream instead
 *   len      payload bytes
 * Properties: events only ever grow and never change once written; every
 * event is
 * "id: <i>\ndata: <payload>\n\n" with a one-line payload that is valid
 * UTF-8 and a JSON object, or "[DONE]" exactly as the last event of a done
 * stream; the return value says what happened; gw_stream_bytes covers the
 * events; a done stream ignores records and its stream: false answer is a
 * JSON object. Aborts when a property breaks. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gateway/gw_stream.h"
#include "protocol/protocol.h"

#define HEADER_BYTES 4
#define ATTEMPTS_MASK 3
#define UNCOUNTED_BIT 4
#define UNCOUNTED_BASE (1u << 31)
#define SEQ_MASK 15
#define HTTP_STATUS_MIN 200
#define HTTP_STATUS_MAX 599

enum {
    FLAG_FINAL = 1,
    FLAG_REPRODUCIBLE = 2,
    FLAG_RAW = 4,
    FLAG_LOGPROBS = 8,
    FLAG_ERROR = 16,
    FLAG_FAIL = 32,
};

static void require_at(bool ok, int line)
{
    if (ok)
        return;
    fprintf(stderr, "fuzz_gw_stream.c:%d: property broken\n", line);
    abort();
}
#define require(ok) require_at((ok), __LINE__)

/* What an event looked like when it was first seen. */
typedef struct seen_event {
    const char *data;
    size_t len;
    uint64_t hash;
} seen_event;

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static void check_event(const gw_stream *s, size_t i)
{
    const char *data;
    size_t len;
    gw_stream_event(s, i, &data, &len);
    char prefix[64];
    int n = snprintf(prefix, sizeof prefix, "id: %zu\ndata: ", i);
    require(len >= (size_t)n + 2 && memcmp(data, prefix, (size_t)n) == 0);
    require(memcmp(data + len - 2, "\n\n", 2) == 0);
    const char *payload = data + n;
    size_t plen = len - (size_t)n - 2;
    require(memchr(payload, '\n', plen) == NULL);
    bool is_done = plen == 6 && memcmp(payload, "[DONE]", 6) == 0;
    require(is_done == (gw_stream_done(s) && i + 1 == gw_stream_n_events(s)));
    if (is_done)
        return;
    require(svc_utf8_valid(payload, plen, NULL));
    cJSON *j = cJSON_ParseWithLength(payload, plen);
    require(cJSON_IsObject(j));
    cJSON_Delete(j);
}

/* Feed one synthesized chunk: the worker's writer with `content` as text. */
static gw_feed feed_chunk(gw_stream *s, const gw_record *hdr, uint8_t flags,
                          const uint8_t *content, size_t n)
{
    static const svc_usage usage = {.prompt_tokens = 3, .completion_tokens = 2};
    svc_reply_ctx ctx = {.id = "req", .model = "m", .created = 1, .attempt = hdr->attempt};
    svc_token_logprob tok = {(const char *)content, n, -0.5f};
    svc_logprob_entry lp = {tok, &tok, 1};
    bool error = hdr->final && (flags & FLAG_ERROR);
    svc_reply r = {.seq = hdr->seq, .content = (const char *)content, .content_len = n,
                   .logprobs = (flags & FLAG_LOGPROBS) ? &lp : NULL,
                   .n_logprobs = (flags & FLAG_LOGPROBS) ? 1 : 0,
                   .finish = !hdr->final ? SVC_FINISH_NONE : error ? SVC_FINISH_ERROR
                                                                   : SVC_FINISH_STOP,
                   .usage = hdr->final ? &usage : NULL,
                   .error = error ? SVC_ERROR_INTERNAL : SVC_ERROR_NONE,
                   .error_message = error ? "boom" : NULL};
    svc_buf b;
    svc_buf_init(&b);
    require(svc_reply_chunk(&b, &ctx, &r) == 0);
    gw_record rec = *hdr;
    rec.value = b.data;
    rec.len = b.len;
    gw_feed f = gw_stream_feed(s, &rec);
    svc_buf_deinit(&b);
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    gw_stream_params p = {.id = "chatcmpl-fuzz", .model = "m\xc3\xa9\"", .created = 1,
                          .include_usage = data[0] & 1, .completion_only = data[0] & 2};
    gw_stream *s = gw_stream_create(&p);
    require(s != NULL);
    seen_event *seen = NULL;
    size_t n_seen = 0;
    size_t off = 1;
    while (off + HEADER_BYTES <= size) {
        const uint8_t *h = data + off;
        size_t len = h[3];
        off += HEADER_BYTES;
        if (len > size - off)
            len = size - off;
        uint8_t flags = h[2];
        gw_record hdr = {.attempt = 1 + (h[0] & ATTEMPTS_MASK) +
                                    ((h[0] & UNCOUNTED_BIT) ? UNCOUNTED_BASE : 0),
                         .seq = h[1] & SEQ_MASK, .final = flags & FLAG_FINAL,
                         .reproducible = flags & FLAG_REPRODUCIBLE};
        bool was_done = gw_stream_done(s);
        size_t before = gw_stream_n_events(s);
        gw_feed f = GW_FEED_IGNORED;
        if (flags & FLAG_FAIL) {
            char *message = malloc(len + 1);
            require(message != NULL);
            memcpy(message, data + off, len);
            message[len] = '\0';
            gw_stream_fail(s, "internal", message);
            free(message);
            require(gw_stream_done(s));
            if (!was_done)
                f = GW_FEED_DONE;
        } else if (flags & FLAG_RAW) {
            char *value = malloc(len ? len : 1); /* exactly len: ASan sees overreads */
            require(value != NULL);
            memcpy(value, data + off, len);
            hdr.value = value;
            hdr.len = len;
            f = gw_stream_feed(s, &hdr);
            free(value);
        } else {
            f = feed_chunk(s, &hdr, flags, data + off, len);
        }
        off += len;
        size_t after = gw_stream_n_events(s);
        if (was_done)
            require(f == GW_FEED_IGNORED && after == before);
        switch (f) {
        case GW_FEED_IGNORED: require(after == before && gw_stream_done(s) == was_done); break;
        case GW_FEED_EVENTS: require(after > before && !gw_stream_done(s)); break;
        case GW_FEED_DONE:
        case GW_FEED_DIVERGED: require(after > before && gw_stream_done(s)); break;
        case GW_FEED_CONTINUED:
            /* The first record is one event at most: always new with
             * completion_only; otherwise compared with what its choice sent,
             * or new when that choice sent nothing. */
            require(!gw_stream_done(s) &&
                    (p.completion_only ? after == before + 1 : after <= before + 1));
            break;
        }
        for (size_t i = 0; i < n_seen; i++) {
            const char *d;
            size_t l;
            gw_stream_event(s, i, &d, &l);
            require(d == seen[i].data && l == seen[i].len);
        }
        seen = realloc(seen, (after ? after : 1) * sizeof *seen);
        require(seen != NULL);
        for (size_t i = n_seen; i < after; i++) {
            check_event(s, i);
            gw_stream_event(s, i, &seen[i].data, &seen[i].len);
            seen[i].hash = fnv1a(seen[i].data, seen[i].len);
        }
        n_seen = after;
    }
    size_t sum = 0;
    for (size_t i = 0; i < n_seen; i++) {
        require(fnv1a(seen[i].data, seen[i].len) == seen[i].hash);
        sum += seen[i].len;
    }
    require(gw_stream_bytes(s) >= sum);
    if (!gw_stream_done(s))
        gw_stream_fail(s, "deadline_exceeded", "the fuzz input ended");
    check_event(s, gw_stream_n_events(s) - 1);
    svc_buf b;
    svc_buf_init(&b);
    int status = 0;
    require(gw_stream_completion(s, &b, &status) == 0);
    require(status >= HTTP_STATUS_MIN && status <= HTTP_STATUS_MAX);
    require(svc_utf8_valid(b.data, b.len, NULL));
    cJSON *j = cJSON_ParseWithLength(b.data, b.len);
    require(cJSON_IsObject(j));
    cJSON_Delete(j);
    svc_buf_deinit(&b);
    free(seen);
    gw_stream_destroy(s);
    return 0;
}

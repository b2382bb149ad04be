/* Reply records and record headers (protocol.h), with a small JSON writer:
 * records are built per token, so they are written straight into a reused
 * buffer instead of through a cJSON tree. */
#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/protocol.h"

/* OpenAI writes this for tokens whose probability underflows to zero. */
#define LOGPROB_FLOOR (-9999.0)
#define U64_DIGITS 20

/* ---- JSON writer ------------------------------------------------------- */

/* Appends latch the first allocation failure; the builder checks once. */
typedef struct jw {
    svc_buf *b;
    bool oom;
} jw;

static void jw_raw(jw *w, const char *s, size_t n)
{
    if (!w->oom && svc_buf_append(w->b, s, n) != 0)
        w->oom = true;
}

/* A string literal or constant: length known at compile time. */
#define JW_LIT(w, lit) jw_raw((w), (lit), sizeof(lit) - 1)

static void jw_u64(jw *w, uint64_t v)
{
    char tmp[U64_DIGITS];
    size_t n = 0;
    do {
        tmp[sizeof tmp - 1 - n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    jw_raw(w, tmp + sizeof tmp - n, n);
}

static void jw_i64(jw *w, int64_t v)
{
    if (v < 0) {
        JW_LIT(w, "-");
        jw_u64(w, (uint64_t)0 - (uint64_t)v);
    } else {
        jw_u64(w, (uint64_t)v);
    }
}

/* JSON has no inf/nan: non-finite values are written as `fallback`. */
static void jw_double(jw *w, double v, const char *fmt, double fallback)
{
    char tmp[64];
    if (!isfinite(v))
        v = fallback;
    int n = snprintf(tmp, sizeof tmp, fmt, v);
    assert(n > 0 && (size_t)n < sizeof tmp);
    jw_raw(w, tmp, (size_t)n);
}

/* A JSON string: quotes, escapes for '"', '\\' and control characters, and
 * U+FFFD for each byte that does not start a valid UTF-8 sequence; NULL is
 * written as null. Runs of plain bytes are copied in one piece. */
static void jw_str(jw *w, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    static const char replacement[] = "\xef\xbf\xbd"; /* U+FFFD */
    if (!s) {
        JW_LIT(w, "null");
        return;
    }
    const unsigned char *u = (const unsigned char *)s;
    JW_LIT(w, "\"");
    size_t run = 0; /* start of the pending run of bytes copied verbatim */
    size_t i = 0;
    while (i < n) {
        unsigned char c = u[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            i++;
            continue;
        }
        size_t k = c >= 0x80 ? svc_utf8_seq_len(u + i, n - i) : 0;
        if (k > 0) {
            i += k;
            continue;
        }
        jw_raw(w, s + run, i - run);
        switch (c) {
        case '"': JW_LIT(w, "\\\""); break;
        case '\\': JW_LIT(w, "\\\\"); break;
        case '\n': JW_LIT(w, "\\n"); break;
        case '\r': JW_LIT(w, "\\r"); break;
        case '\t': JW_LIT(w, "\\t"); break;
        case '\b': JW_LIT(w, "\\b"); break;
        case '\f': JW_LIT(w, "\\f"); break;
        default:
            if (c < 0x20) {
                char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                jw_raw(w, esc, sizeof esc);
            } else {
                JW_LIT(w, replacement);
            }
        }
        i++;
        run = i;
    }
    jw_raw(w, s + run, n - run);
    JW_LIT(w, "\"");
}

static void jw_cstr(jw *w, const char *s)
{
    jw_str(w, s, s ? strlen(s) : 0);
}

/* ---- Reply records ------------------------------------------------------ */

const char *svc_finish_name(svc_finish f)
{
    switch (f) {
    case SVC_FINISH_NONE: return NULL;
    case SVC_FINISH_STOP: return "stop";
    case SVC_FINISH_LENGTH: return "length";
    case SVC_FINISH_CANCELLED: return "cancelled";
    case SVC_FINISH_ERROR: return "error";
    case SVC_FINISH_TOOL_CALLS: return "tool_calls";
    }
    return NULL;
}

svc_finish svc_error_finish(svc_error e)
{
    return (e == SVC_ERROR_CANCELLED || e == SVC_ERROR_DEADLINE_EXCEEDED) ? SVC_FINISH_CANCELLED
                                                                          : SVC_FINISH_ERROR;
}

/* {"token":..,"logprob":..,"bytes":[..] */
static void write_token_logprob(jw *w, const svc_token_logprob *t)
{
    JW_LIT(w, "{\"token\":");
    jw_str(w, t->token ? t->token : "", t->token_len);
    JW_LIT(w, ",\"logprob\":");
    jw_double(w, t->logprob, "%.9g", LOGPROB_FLOOR);
    JW_LIT(w, ",\"bytes\":[");
    for (size_t i = 0; i < t->token_len; i++) {
        if (i)
            JW_LIT(w, ",");
        jw_u64(w, (unsigned char)t->token[i]);
    }
    JW_LIT(w, "]");
}

static void write_logprobs(jw *w, const svc_logprob_entry *lp, size_t n)
{
    if (!lp) {
        JW_LIT(w, "null");
        return;
    }
    JW_LIT(w, "{\"content\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            JW_LIT(w, ",");
        write_token_logprob(w, &lp[i].chosen);
        JW_LIT(w, ",\"top_logprobs\":[");
        for (size_t k = 0; k < lp[i].n_top; k++) {
            if (k)
                JW_LIT(w, ",");
            write_token_logprob(w, &lp[i].top[k]);
            JW_LIT(w, "}");
        }
        JW_LIT(w, "]}");
    }
    JW_LIT(w, "]}");
}

/* {"id":..,"object":..,"created":..,"model":.., */
static void write_head(jw *w, const svc_reply_ctx *ctx, const char *object, size_t object_len)
{
    JW_LIT(w, "{\"id\":");
    jw_cstr(w, ctx->id);
    JW_LIT(w, ",\"object\":\"");
    jw_raw(w, object, object_len);
    JW_LIT(w, "\",\"created\":");
    jw_i64(w, ctx->created);
    JW_LIT(w, ",\"model\":");
    jw_cstr(w, ctx->model);
    JW_LIT(w, ",");
}

/* "logprobs":..,"finish_reason":..} */
static void write_choice_tail(jw *w, const svc_reply *r)
{
    JW_LIT(w, ",\"logprobs\":");
    write_logprobs(w, r->logprobs, r->n_logprobs);
    JW_LIT(w, ",\"finish_reason\":");
    const char *finish = svc_finish_name(r->finish);
    if (finish)
        jw_cstr(w, finish);
    else
        JW_LIT(w, "null");
    JW_LIT(w, "}");
}

/* ,"usage":..,"timings":..,"error":..,"seq":..,"attempt":..} */
static void write_tail(jw *w, const svc_reply_ctx *ctx, const svc_reply *r)
{
    if (r->usage) {
        const svc_usage *u = r->usage;
        JW_LIT(w, ",\"usage\":{\"prompt_tokens\":");
        jw_u64(w, u->prompt_tokens);
        JW_LIT(w, ",\"prompt_tokens_cached\":");
        jw_u64(w, u->prompt_tokens_cached);
        JW_LIT(w, ",\"completion_tokens\":");
        jw_u64(w, u->completion_tokens);
        JW_LIT(w, ",\"total_tokens\":");
        jw_u64(w, (uint64_t)u->prompt_tokens + u->completion_tokens);
        JW_LIT(w, ",\"images\":");
        jw_u64(w, u->images);
        JW_LIT(w, ",\"images_cached\":");
        jw_u64(w, u->images_cached);
        JW_LIT(w, "}");
    }
    if (r->timings) {
        const svc_timings *t = r->timings;
        const struct {
            const char *key;
            double v;
        } fields[] = {{"\"queue_ms\":", t->queue_ms},     {"\"vision_ms\":", t->vision_ms},
                      {"\"prefill_ms\":", t->prefill_ms}, {"\"decode_ms\":", t->decode_ms},
                      {"\"ttft_ms\":", t->ttft_ms}};
        JW_LIT(w, ",\"timings\":{");
        for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
            if (i)
                JW_LIT(w, ",");
            jw_raw(w, fields[i].key, strlen(fields[i].key));
            jw_double(w, fields[i].v, "%.3f", 0.0);
        }
        JW_LIT(w, "}");
    }
    if (r->error != SVC_ERROR_NONE) {
        JW_LIT(w, ",\"error\":{\"code\":");
        jw_cstr(w, svc_error_code(r->error));
        JW_LIT(w, ",\"message\":");
        jw_cstr(w, r->error_message ? r->error_message : "");
        JW_LIT(w, "}");
    }
    JW_LIT(w, ",\"seq\":");
    jw_u64(w, r->seq);
    JW_LIT(w, ",\"attempt\":");
    jw_u64(w, ctx->attempt);
    JW_LIT(w, "}");
}

static int finish_record(jw *w)
{
    if (!w->oom)
        return 0;
    w->b->len = 0;
    if (w->b->data)
        w->b->data[0] = '\0';
    return -1;
}

/* "tool_calls":[{..}] as OpenAI writes them: in a chunk, "index" first
 * and the id, type and name only where the call begins; in a message, the
 * whole call. */
static void write_call(jw *w, const svc_reply_call *c, bool chunk)
{
    JW_LIT(w, "\"tool_calls\":[{");
    if (chunk)
        JW_LIT(w, "\"index\":0");
    if (c->name) {
        if (chunk)
            JW_LIT(w, ",");
        JW_LIT(w, "\"id\":");
        jw_cstr(w, c->id);
        JW_LIT(w, ",\"type\":\"function\"");
    }
    JW_LIT(w, ",\"function\":{");
    if (c->name) {
        JW_LIT(w, "\"name\":");
        jw_cstr(w, c->name);
        JW_LIT(w, ",");
    }
    JW_LIT(w, "\"arguments\":");
    jw_str(w, c->arguments ? c->arguments : "", c->arguments ? c->arguments_len : 0);
    JW_LIT(w, "}}]");
}

int svc_reply_chunk(svc_buf *out, const svc_reply_ctx *ctx, const svc_reply *r)
{
    static const char object[] = "chat.completion.chunk";
    jw w = {out, false};
    out->len = 0;
    write_head(&w, ctx, object, sizeof object - 1);
    if (r->no_choices) {
        JW_LIT(&w, "\"choices\":[]");
        write_tail(&w, ctx, r);
        return finish_record(&w);
    }
    JW_LIT(&w, "\"choices\":[{\"index\":");
    jw_u64(&w, r->index);
    JW_LIT(&w, ",\"delta\":{");
    bool role = r->seq == 0 || r->role;
    if (role)
        JW_LIT(&w, "\"role\":\"assistant\"");
    if (r->content && r->content_len > 0) {
        if (role)
            JW_LIT(&w, ",");
        JW_LIT(&w, "\"content\":");
        jw_str(&w, r->content, r->content_len);
    }
    if (r->call) {
        if (role || (r->content && r->content_len > 0))
            JW_LIT(&w, ",");
        write_call(&w, r->call, true);
    }
    JW_LIT(&w, "}");
    write_choice_tail(&w, r);
    JW_LIT(&w, "]");
    write_tail(&w, ctx, r);
    return finish_record(&w);
}

int svc_reply_completion_n(svc_buf *out, const svc_reply_ctx *ctx, const svc_reply *r,
                           size_t n)
{
    static const char object[] = "chat.completion";
    jw w = {out, false};
    out->len = 0;
    write_head(&w, ctx, object, sizeof object - 1);
    JW_LIT(&w, "\"choices\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            JW_LIT(&w, ",");
        JW_LIT(&w, "{\"index\":");
        jw_u64(&w, i);
        JW_LIT(&w, ",\"message\":{\"role\":\"assistant\",\"content\":");
        if (r[i].call) {
            JW_LIT(&w, "null,");
            write_call(&w, r[i].call, false);
        } else {
            jw_str(&w, r[i].content ? r[i].content : "", r[i].content ? r[i].content_len : 0);
        }
        JW_LIT(&w, "}");
        write_choice_tail(&w, &r[i]);
    }
    JW_LIT(&w, "]");
    write_tail(&w, ctx, r);
    return finish_record(&w);
}

int svc_reply_completion(svc_buf *out, const svc_reply_ctx *ctx, const svc_reply *r)
{
    return svc_reply_completion_n(out, ctx, r, 1);
}

int svc_reply_error(svc_buf *out, const svc_reply_ctx *ctx, bool stream, uint32_t seq,
                    svc_error e, const char *message)
{
    svc_reply r = {
        .seq = seq,
        .finish = svc_error_finish(e),
        .error = e,
        .error_message = message,
    };
    return stream ? svc_reply_chunk(out, ctx, &r) : svc_reply_completion(out, ctx, &r);
}

/* ---- Record headers ----------------------------------------------------- */

static void headers_add(svc_headers *hs, const char *name, const char *value, size_t len)
{
    assert(hs->n < SVC_HEADERS_MAX);
    hs->h[hs->n++] = (svc_header){name, value, len};
}

/* Copy up to len bytes of s into the store (fewer when it is nearly full,
 * never splitting a UTF-8 sequence) and add it as a header value. */
static void headers_add_copy(svc_headers *hs, const char *name, const char *s, size_t len)
{
    size_t room = SVC_HEADERS_STORE - hs->store_used;
    if (len > room) {
        len = room;
        while (len > 0 && ((unsigned char)s[len] & 0xc0) == 0x80)
            len--;
    }
    char *dst = hs->store + hs->store_used;
    memcpy(dst, s, len);
    hs->store_used += len;
    headers_add(hs, name, dst, len);
}

static void headers_add_i64(svc_headers *hs, const char *name, int64_t v)
{
    char tmp[U64_DIGITS + 2];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
    assert(n > 0 && (size_t)n < sizeof tmp);
    /* Numbers are added before any long value, so they always fit. */
    assert(hs->store_used + (size_t)n <= SVC_HEADERS_STORE);
    headers_add_copy(hs, name, tmp, (size_t)n);
}

static void headers_reset(svc_headers *hs)
{
    hs->n = 0;
    hs->store_used = 0;
}

void svc_headers_reply(svc_headers *hs, const char *request_id, uint32_t attempt,
                       uint32_t seq, bool final, bool reproducible)
{
    headers_reset(hs);
    headers_add(hs, "request_id", request_id, strlen(request_id));
    headers_add_i64(hs, "attempt", attempt);
    headers_add_i64(hs, "seq", seq);
    headers_add(hs, "final", final ? "true" : "false", final ? 4 : 5);
    headers_add(hs, "reproducible", reproducible ? "true" : "false", reproducible ? 4 : 5);
}

void svc_headers_dlt(svc_headers *hs, svc_error code, const char *message,
                     const char *topic, int32_t partition, int64_t offset,
                     const char *worker)
{
    headers_reset(hs);
    const char *c = svc_error_code(code);
    headers_add(hs, "x-error-code", c, strlen(c));
    headers_add(hs, "x-original-topic", topic, strlen(topic));
    headers_add_i64(hs, "x-original-partition", partition);
    headers_add_i64(hs, "x-original-offset", offset);
    if (worker)
        headers_add(hs, "x-worker", worker, strlen(worker));
    message = message ? message : "";
    headers_add_copy(hs, "x-error-msg", message, strlen(message));
}

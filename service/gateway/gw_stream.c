/* Reply records to SSE events and chat.completion answers (gw_stream.h).
 * Records are never turned into a tree and printed again: a strict JSON
 * scanner finds the spans the answer needs and they are copied as the
 * worker wrote them, so escapes (an escaped NUL included), numbers and
 * UTF-8 reach the client byte for byte, and a chunk costs no allocation
 * beyond its place in the event log. cJSON only writes and reads the small
 * error objects. */
#include "gateway/gw_stream.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "protocol/protocol.h"

/* The worker's records nest 6 deep (choices, logprobs, content, entry,
 * top_logprobs, bytes); the bound keeps hostile nesting off the stack. */
#define GW_JSON_DEPTH_MAX 32
/* cJSON reads at most 63 characters of a number: longer ones are refused
 * so that whatever the gateway passes on parses with cJSON too. The worker
 * writes at most 20. */
#define GW_JSON_NUMBER_MAX 63
/* Attempts one stream remembers; limits.max_attempts defaults to 3. Past
 * it the stream ends with an error rather than forget an attempt and
 * follow a late duplicate of its seq 0. */
#define GW_STREAM_ATTEMPTS_MAX 64
/* The event log grows in blocks that never move (event pointers stay
 * valid), doubling from the first so short answers stay small. */
#define LOG_BLOCK_MIN 1024
#define LOG_BLOCK_MAX (64 * 1024)
#define EVENTS_INITIAL 16
/* Error codes are short identifiers; messages are cut to the worker's own
 * capacity for them. */
#define ERR_CODE_MAX 64
#define ERR_MESSAGE_MAX SVC_ERRMSG_MAX
#define U64_DIGITS 20

enum {
    HTTP_OK = 200,
    HTTP_UNAUTHORIZED = 401,
    HTTP_TOO_MANY_REQUESTS = 429,
    HTTP_INTERNAL = 500,
};

/* ---- writing ---------------------------------------------------------------- */

/* Appends latch the first allocation failure; the builder checks once. */
typedef struct out {
    svc_buf *b; /* borrowed */
    bool oom;
} out;

static void put(out *o, const char *s, size_t n)
{
    if (o->oom || n == 0)
        return;
    if (svc_buf_reserve(o->b, n) != 0) {
        o->oom = true;
        return;
    }
    memcpy(o->b->data + o->b->len, s, n);
    o->b->len += n;
    o->b->data[o->b->len] = '\0';
}

#define PUT_LIT(o, lit) put((o), (lit), sizeof(lit) - 1)

static void put_i64(out *o, int64_t v)
{
    char tmp[U64_DIGITS + 2];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
    assert(n > 0 && (size_t)n < sizeof tmp);
    put(o, tmp, (size_t)n);
}

/* ---- the JSON scanner --------------------------------------------------------- */

/* A run of bytes inside a record or an event; p NULL = absent. */
typedef struct span {
    const char *p; /* borrowed */
    size_t n;
} span;

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && is_ws(*p))
        p++;
    return p;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The code unit of the \uXXXX escape at p, or -1. */
static long utf16_escape(const char *p, const char *end)
{
    if (end - p < 6 || p[0] != '\\' || p[1] != 'u')
        return -1;
    long v = 0;
    for (int i = 2; i < 6; i++) {
        int d = hex_digit(p[i]);
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

#define SURROGATE_HIGH_FIRST 0xd800
#define SURROGATE_LOW_FIRST 0xdc00
#define SURROGATE_LAST 0xdfff
#define UTF16_ESCAPE_LEN 6

/* Past the string at p (*p == '"'), or NULL: raw control characters,
 * invalid escapes, unpaired surrogates and invalid UTF-8 are refused. */
static const char *skip_string(const char *p, const char *end)
{
    p++;
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            return p + 1;
        if (c < 0x20)
            return NULL;
        if (c >= 0x80) {
            size_t k = svc_utf8_seq_len((const unsigned char *)p, (size_t)(end - p));
            if (k == 0)
                return NULL;
            p += k;
            continue;
        }
        if (c != '\\') {
            p++;
            continue;
        }
        if (end - p < 2)
            return NULL;
        if (p[1] != 'u') {
            if (!strchr("\"\\/bfnrt", p[1]) || p[1] == '\0')
                return NULL;
            p += 2;
            continue;
        }
        long u = utf16_escape(p, end);
        if (u < 0 || (u >= SURROGATE_LOW_FIRST && u <= SURROGATE_LAST))
            return NULL;
        p += UTF16_ESCAPE_LEN;
        if (u >= SURROGATE_HIGH_FIRST && u < SURROGATE_LOW_FIRST) {
            long lo = utf16_escape(p, end);
            if (lo < SURROGATE_LOW_FIRST || lo > SURROGATE_LAST)
                return NULL;
            p += UTF16_ESCAPE_LEN;
        }
    }
    return NULL;
}

/* Past one or more digits at p, or NULL when there is none. */
static const char *skip_digits(const char *p, const char *end)
{
    const char *q = p;
    while (q < end && *q >= '0' && *q <= '9')
        q++;
    return q > p ? q : NULL;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? */
static const char *skip_number(const char *p, const char *end)
{
    const char *start = p;
    if (p < end && *p == '-')
        p++;
    if (p < end && *p == '0')
        p++;
    else if (!(p = skip_digits(p, end)))
        return NULL;
    if (p < end && *p == '.' && !(p = skip_digits(p + 1, end)))
        return NULL;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (!(p = skip_digits(p, end)))
            return NULL;
    }
    return p - start <= GW_JSON_NUMBER_MAX ? p : NULL;
}

static const char *skip_literal(const char *p, const char *end, const char *lit)
{
    size_t n = strlen(lit);
    return (size_t)(end - p) >= n && memcmp(p, lit, n) == 0 ? p + n : NULL;
}

static const char *skip_value(const char *p, const char *end, int depth);

/* Past the object or array at p, or NULL. */
static const char *skip_container(const char *p, const char *end, int depth)
{
    bool object = *p == '{';
    char close = object ? '}' : ']';
    p = skip_ws(p + 1, end);
    if (p < end && *p == close)
        return p + 1;
    for (;;) {
        if (object) {
            p = skip_ws(p, end);
            if (p >= end || *p != '"' || !(p = skip_string(p, end)))
                return NULL;
            p = skip_ws(p, end);
            if (p >= end || *p != ':')
                return NULL;
            p++;
        }
        if (!(p = skip_value(p, end, depth)))
            return NULL;
        p = skip_ws(p, end);
        if (p >= end)
            return NULL;
        if (*p == close)
            return p + 1;
        if (*p != ',')
            return NULL;
        p++;
    }
}

/* Past the value at p (leading whitespace skipped), or NULL. */
static const char *skip_value(const char *p, const char *end, int depth)
{
    p = skip_ws(p, end);
    if (p >= end)
        return NULL;
    switch (*p) {
    case '"': return skip_string(p, end);
    case '{':
    case '[': return depth < GW_JSON_DEPTH_MAX ? skip_container(p, end, depth + 1) : NULL;
    case 't': return skip_literal(p, end, "true");
    case 'f': return skip_literal(p, end, "false");
    case 'n': return skip_literal(p, end, "null");
    default: return skip_number(p, end);
    }
}

/* The value of member `key` of the object span obj (already scanned, so
 * well formed), or an absent span. Keys compare as written: the worker
 * never escapes them. The first of duplicate keys counts, as in cJSON. */
static span member(span obj, const char *key)
{
    const char *p = obj.p + 1, *end = obj.p + obj.n;
    size_t klen = strlen(key);
    p = skip_ws(p, end);
    while (*p != '}') {
        const char *k = p;
        p = skip_string(p, end);
        assert(p);
        bool hit = (size_t)(p - k) == klen + 2 && memcmp(k + 1, key, klen) == 0;
        p = skip_ws(skip_ws(p, end) + 1, end); /* past ':' */
        const char *v = p;
        p = skip_value(p, end, 0);
        assert(p);
        if (hit)
            return (span){v, (size_t)(p - v)};
        p = skip_ws(p, end);
        if (*p == ',')
            p = skip_ws(p + 1, end);
    }
    return (span){NULL, 0};
}

/* The first element of the array span arr (scanned), or an absent span. */
static span first_element(span arr)
{
    const char *end = arr.p + arr.n;
    const char *p = skip_ws(arr.p + 1, end);
    if (*p == ']')
        return (span){NULL, 0};
    const char *q = skip_value(p, end, 0);
    assert(q);
    return (span){p, (size_t)(q - p)};
}

static bool is_kind(span v, char first)
{
    return v.p && v.n > 0 && v.p[0] == first;
}

static bool is_null(span v)
{
    return !v.p || is_kind(v, 'n');
}

/* What is between the brackets or quotes of a scanned array or string. */
static span inner(span v)
{
    return (span){v.p + 1, v.n - 2};
}

/* Copy a scanned span without the whitespace outside its strings: SSE data
 * must stay on one line. */
static void put_compact(out *o, span v)
{
    bool in_string = false;
    size_t run = 0;
    for (size_t i = 0; i < v.n; i++) {
        char c = v.p[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (is_ws(c)) {
            put(o, v.p + run, i - run);
            run = i + 1;
        }
    }
    put(o, v.p + run, v.n - run);
}

/* ---- chunks ------------------------------------------------------------------- */

/* The parts of a chat.completion.chunk (a worker's record or an event's
 * data) the stream uses. */
typedef struct chunk {
    span choices;  /* the array */
    span content;  /* choices[0].delta.content between its quotes; absent when none */
    span logprobs; /* choices[0].logprobs.content, the array; absent when logprobs is null */
    span finish;   /* choices[0].finish_reason; absent when missing */
    span usage;    /* an object; absent when missing or null */
    span error;    /* an object; absent when missing or null */
} chunk;

/* Scan v as one JSON object with the shape of a chunk: choices a non-empty
 * array whose first element is an object with an object delta; content a
 * string or null; logprobs null or an object with a content array; usage
 * and error objects or null. Returns false otherwise. */
static bool chunk_parse(const char *v, size_t n, chunk *c)
{
    const char *end = v + n;
    const char *p = skip_ws(v, end);
    const char *q = skip_value(p, end, 0);
    if (!q || skip_ws(q, end) != end || *p != '{')
        return false;
    span root = {p, (size_t)(q - p)};
    *c = (chunk){.choices = member(root, "choices")};
    if (!is_kind(c->choices, '['))
        return false;
    span choice = first_element(c->choices);
    if (!is_kind(choice, '{'))
        return false;
    span delta = member(choice, "delta");
    if (!is_kind(delta, '{'))
        return false;
    span content = member(delta, "content");
    if (is_kind(content, '"'))
        c->content = inner(content);
    else if (!is_null(content))
        return false;
    span lp = member(choice, "logprobs");
    if (!is_null(lp)) {
        if (!is_kind(lp, '{'))
            return false;
        c->logprobs = member(lp, "content");
        if (!is_kind(c->logprobs, '['))
            return false;
    }
    c->finish = member(choice, "finish_reason");
    span usage = member(root, "usage"), error = member(root, "error");
    if ((!is_null(usage) && !is_kind(usage, '{')) || (!is_null(error) && !is_kind(error, '{')))
        return false;
    c->usage = is_null(usage) ? (span){NULL, 0} : usage;
    c->error = is_null(error) ? (span){NULL, 0} : error;
    return true;
}

/* ---- the stream ---------------------------------------------------------------- */

typedef struct log_block {
    struct log_block *next; /* owned: the block filled before this one */
    size_t cap, used;
    char data[];
} log_block;

typedef struct gw_event {
    const char *data; /* borrowed from a log block */
    size_t len;
    size_t payload;   /* offset of the JSON (or [DONE]) after "data: " */
} gw_event;

struct gw_stream {
    char *id_json;    /* owned (cJSON's allocator): the id as a JSON string */
    char *model_json; /* owned (cJSON's allocator) */
    int64_t created;
    bool include_usage, completion_only;

    log_block *blocks; /* owned: newest first; events point into them */
    size_t block_bytes;
    gw_event *events;  /* owned */
    size_t n_events, cap_events;
    /* Events 0 .. n_records - 1 are the records seq 0, 1, ... of the attempts
     * followed (a continuation's records below n_records were compared). */
    size_t n_records;
    svc_buf scratch;   /* the event being built */
    svc_buf usage;     /* the final's usage, rewritten; empty when none */

    uint32_t seen[GW_STREAM_ATTEMPTS_MAX]; /* attempts whose seq 0 was followed */
    size_t n_seen;
    bool following;    /* an attempt is followed */
    bool broken;       /* it skipped a seq: ignore it */
    uint32_t attempt, next_seq;

    bool done;
    bool failed;       /* it ended with an error: */
    char err_code[ERR_CODE_MAX];
    char err_message[ERR_MESSAGE_MAX];
};

/* A JSON string of s, allocated by cJSON; NULL when out of memory. */
static char *json_string(const char *s)
{
    cJSON *str = cJSON_CreateString(s);
    char *text = str ? cJSON_PrintUnformatted(str) : NULL;
    cJSON_Delete(str);
    return text;
}

gw_stream *gw_stream_create(const gw_stream_params *p)
{
    gw_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->id_json = json_string(p->id);
    s->model_json = json_string(p->model);
    s->created = p->created;
    s->include_usage = p->include_usage;
    s->completion_only = p->completion_only;
    svc_buf_init(&s->scratch);
    svc_buf_init(&s->usage);
    if (!s->id_json || !s->model_json) {
        gw_stream_destroy(s);
        return NULL;
    }
    return s;
}

static void drop_events(gw_stream *s)
{
    while (s->blocks) {
        log_block *b = s->blocks;
        s->blocks = b->next;
        free(b);
    }
    s->block_bytes = 0;
    s->n_events = 0;
    s->n_records = 0;
}

void gw_stream_destroy(gw_stream *s)
{
    if (!s)
        return;
    drop_events(s);
    free(s->events);
    svc_buf_deinit(&s->scratch);
    svc_buf_deinit(&s->usage);
    cJSON_free(s->id_json);
    cJSON_free(s->model_json);
    free(s);
}

size_t gw_stream_n_events(const gw_stream *s)
{
    return s->n_events;
}

void gw_stream_event(const gw_stream *s, size_t i, const char **data, size_t *len)
{
    assert(i < s->n_events);
    *data = s->events[i].data;
    *len = s->events[i].len;
}

bool gw_stream_done(const gw_stream *s)
{
    return s->done;
}

size_t gw_stream_bytes(const gw_stream *s)
{
    return sizeof *s + s->block_bytes + s->cap_events * sizeof *s->events + s->scratch.cap +
           s->usage.cap + strlen(s->id_json) + strlen(s->model_json) + 2;
}

/* ---- building events ---------------------------------------------------------- */

/* "id: <n>\ndata: " into the scratch buffer (emptied); returns the payload offset. */
static size_t begin_event(gw_stream *s, out *o, size_t n)
{
    s->scratch.len = 0;
    PUT_LIT(o, "id: ");
    put_i64(o, (int64_t)n);
    PUT_LIT(o, "\ndata: ");
    return s->scratch.len;
}

static void end_event(out *o)
{
    PUT_LIT(o, "\n\n");
}

/* {"id":..,"object":..,"created":..,"model":.. */
static void put_head(const gw_stream *s, out *o, const char *object)
{
    PUT_LIT(o, "{\"id\":");
    put(o, s->id_json, strlen(s->id_json));
    PUT_LIT(o, ",\"object\":\"");
    put(o, object, strlen(object));
    PUT_LIT(o, "\",\"created\":");
    put_i64(o, s->created);
    PUT_LIT(o, ",\"model\":");
    put(o, s->model_json, strlen(s->model_json));
}

static const char chunk_object[] = "chat.completion.chunk";

/* The event of record seq n, from its chunk. */
static size_t build_chunk(gw_stream *s, out *o, size_t n, const chunk *c)
{
    size_t payload = begin_event(s, o, n);
    put_head(s, o, chunk_object);
    PUT_LIT(o, ",\"choices\":");
    put_compact(o, c->choices);
    if (s->include_usage)
        PUT_LIT(o, ",\"usage\":null");
    PUT_LIT(o, "}");
    end_event(o);
    return payload;
}

/* Copy the scratch buffer into the log as the next event. Returns 0 or -1. */
static int log_append(gw_stream *s, size_t payload)
{
    const char *data = s->scratch.data;
    size_t len = s->scratch.len;
    if (s->n_events == s->cap_events) {
        size_t cap = s->cap_events ? 2 * s->cap_events : EVENTS_INITIAL;
        gw_event *e = realloc(s->events, cap * sizeof *e);
        if (!e)
            return -1;
        s->events = e;
        s->cap_events = cap;
    }
    log_block *b = s->blocks;
    if (!b || b->cap - b->used < len) {
        size_t cap = b ? 2 * b->cap : LOG_BLOCK_MIN;
        if (cap > LOG_BLOCK_MAX)
            cap = LOG_BLOCK_MAX;
        if (cap < len)
            cap = len;
        log_block *nb = malloc(sizeof *nb + cap);
        if (!nb)
            return -1;
        *nb = (log_block){.next = b, .cap = cap};
        s->blocks = b = nb;
        s->block_bytes += sizeof *nb + cap;
    }
    char *dst = b->data + b->used;
    memcpy(dst, data, len);
    b->used += len;
    s->events[s->n_events++] = (gw_event){dst, len, payload};
    return 0;
}

/* Build with `o` finished: append it, or report a failure. */
static int emit(gw_stream *s, const out *o, size_t payload)
{
    return o->oom ? -1 : log_append(s, payload);
}

/* The error object into o: cJSON writes it (messages are arbitrary text). */
static void put_error_object(out *o, const char *code, const char *message)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    bool built = e && cJSON_AddStringToObject(e, "message", message) &&
                 cJSON_AddStringToObject(e, "type",
                                         gw_error_type_of(gw_http_status_of(code))) &&
                 cJSON_AddNullToObject(e, "param") && cJSON_AddStringToObject(e, "code", code);
    char *text = built ? cJSON_PrintUnformatted(root) : NULL;
    if (text)
        put(o, text, strlen(text));
    else
        o->oom = true;
    cJSON_free(text);
    cJSON_Delete(root);
}

/* Copy at most cap - 1 bytes of src, never splitting a UTF-8 sequence. */
static void copy_cut(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xc0) == 0x80)
            n--;
    }
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* End the stream: the error event (when code is not NULL), then [DONE].
 * When memory runs out the stream still ends, without the events that did
 * not fit: a reader then sees the stream cut, which is what it is. */
static void finish(gw_stream *s, const char *code, const char *message)
{
    out o = {&s->scratch, false};
    if (code) {
        s->failed = true;
        copy_cut(s->err_code, sizeof s->err_code, code);
        copy_cut(s->err_message, sizeof s->err_message, message);
        size_t payload = begin_event(s, &o, s->n_events);
        put_error_object(&o, s->err_code, s->err_message);
        end_event(&o);
        emit(s, &o, payload);
    }
    o.oom = false;
    size_t payload = begin_event(s, &o, s->n_events);
    PUT_LIT(&o, "[DONE]");
    end_event(&o);
    emit(s, &o, payload);
    s->done = true;
}

static gw_feed fail_internal(gw_stream *s, const char *message)
{
    finish(s, "internal", message);
    return GW_FEED_DONE;
}

void gw_stream_fail(gw_stream *s, const char *code, const char *message)
{
    assert(code);
    if (!s->done)
        finish(s, code, message ? message : "");
}

static gw_feed diverge(gw_stream *s)
{
    finish(s, "stream_diverged",
           "the request ran again after a failure and its new answer differs from the "
           "text already sent");
    return GW_FEED_DIVERGED;
}

/* The worker's error object (scanned) ends the stream with its code and
 * message. */
static gw_feed end_with_worker_error(gw_stream *s, span error)
{
    cJSON *e = cJSON_ParseWithLength(error.p, error.n);
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    finish(s, cJSON_IsString(code) ? code->valuestring : "internal",
           cJSON_IsString(msg) ? msg->valuestring : "");
    cJSON_Delete(e);
    return GW_FEED_DONE;
}

static bool is_number(span v)
{
    return v.p && v.n > 0 && (v.p[0] == '-' || (v.p[0] >= '0' && v.p[0] <= '9'));
}

/* The final's usage into s->usage, with the member OpenAI clients read for
 * cached prompt tokens added: "prompt_tokens_details":{"cached_tokens":N}.
 * Returns 0, or -1 when out of memory. */
static int keep_usage(gw_stream *s, span usage)
{
    s->usage.len = 0;
    if (!usage.p)
        return 0;
    out o = {&s->usage, false};
    put_compact(&o, (span){usage.p, usage.n - 1}); /* without its closing brace */
    if (skip_ws(usage.p + 1, usage.p + usage.n)[0] != '}')
        PUT_LIT(&o, ",");
    PUT_LIT(&o, "\"prompt_tokens_details\":{\"cached_tokens\":");
    span cached = member(usage, "prompt_tokens_cached");
    if (is_number(cached))
        put(&o, cached.p, cached.n);
    else
        PUT_LIT(&o, "0");
    PUT_LIT(&o, "}}");
    return o.oom ? -1 : 0;
}

/* The final record's chunk was sent: the usage chunk, when asked for, and
 * [DONE]. */
static gw_feed end_with_answer(gw_stream *s, const chunk *c)
{
    if (keep_usage(s, c->usage) != 0)
        return fail_internal(s, "out of memory");
    if (s->include_usage && s->usage.len > 0) {
        out o = {&s->scratch, false};
        size_t payload = begin_event(s, &o, s->n_events);
        put_head(s, &o, chunk_object);
        PUT_LIT(&o, ",\"choices\":[],\"usage\":");
        put(&o, s->usage.data, s->usage.len);
        PUT_LIT(&o, "}");
        end_event(&o);
        if (emit(s, &o, payload) != 0)
            return fail_internal(s, "out of memory");
    }
    finish(s, NULL, NULL);
    return GW_FEED_DONE;
}

/* Record r, the next seq of the followed attempt: compared with what was
 * sent (below n_records) or appended. */
static gw_feed take(gw_stream *s, const gw_record *r)
{
    chunk c;
    if (!chunk_parse(r->value, r->len, &c))
        return fail_internal(s, "the worker sent a reply record that is not a chunk");
    if (c.error.p)
        return end_with_worker_error(s, c.error);
    size_t k = r->seq;
    assert(k <= s->n_records);
    out o = {&s->scratch, false};
    size_t payload = build_chunk(s, &o, k, &c);
    if (o.oom)
        return fail_internal(s, "out of memory");
    if (k < s->n_records) {
        const gw_event *sent = &s->events[k];
        bool same = sent->len == s->scratch.len &&
                    memcmp(sent->data, s->scratch.data, sent->len) == 0;
        /* A final below the last record sent would leave the reader with
         * text this answer does not have. */
        if (!same || (r->final && k + 1 < s->n_records))
            return diverge(s);
        return r->final ? end_with_answer(s, &c) : GW_FEED_IGNORED;
    }
    if (log_append(s, payload) != 0)
        return fail_internal(s, "out of memory");
    s->n_records++;
    return r->final ? end_with_answer(s, &c) : GW_FEED_EVENTS;
}

static bool attempt_seen(const gw_stream *s, uint32_t attempt)
{
    for (size_t i = 0; i < s->n_seen; i++)
        if (s->seen[i] == attempt)
            return true;
    return false;
}

gw_feed gw_stream_feed(gw_stream *s, const gw_record *r)
{
    if (s->done)
        return GW_FEED_IGNORED;
    bool takeover = false;
    if (s->following && r->attempt == s->attempt) {
        if (s->broken || r->seq < s->next_seq)
            return GW_FEED_IGNORED;
        if (r->seq > s->next_seq) {
            s->broken = true;
            return GW_FEED_IGNORED;
        }
    } else {
        if (r->seq != 0 || attempt_seen(s, r->attempt))
            return GW_FEED_IGNORED;
        if (s->n_seen == GW_STREAM_ATTEMPTS_MAX)
            return fail_internal(s, "the request ran too many times");
        s->seen[s->n_seen++] = r->attempt;
        takeover = s->n_records > 0;
        if (takeover && s->completion_only)
            drop_events(s);
        else if (takeover && !r->reproducible)
            return diverge(s);
        s->following = true;
        s->broken = false;
        s->attempt = r->attempt;
        s->next_seq = 0;
    }
    gw_feed f = take(s, r);
    s->next_seq++;
    return takeover && (f == GW_FEED_IGNORED || f == GW_FEED_EVENTS) ? GW_FEED_CONTINUED : f;
}

/* ---- stream: false ---------------------------------------------------------------- */

static void event_chunk(const gw_stream *s, size_t i, chunk *c)
{
    const gw_event *e = &s->events[i];
    bool ok = chunk_parse(e->data + e->payload, e->len - e->payload - (sizeof "\n\n" - 1), c);
    assert(ok); /* the stream wrote it */
    (void)ok;
}

int gw_stream_completion(const gw_stream *s, svc_buf *b, int *http_status)
{
    assert(s->done);
    if (s->failed) {
        *http_status = gw_http_status_of(s->err_code);
        return gw_error_body(b, s->err_code, s->err_message);
    }
    *http_status = HTTP_OK;
    out o = {b, false};
    b->len = 0;
    put_head(s, &o, "chat.completion");
    PUT_LIT(&o, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"");
    chunk c;
    bool any_logprobs = false;
    for (size_t i = 0; i < s->n_records; i++) {
        event_chunk(s, i, &c);
        if (c.content.p)
            put(&o, c.content.p, c.content.n);
        any_logprobs |= c.logprobs.p != NULL;
    }
    PUT_LIT(&o, "\"},\"logprobs\":");
    if (any_logprobs) {
        PUT_LIT(&o, "{\"content\":[");
        bool first = true;
        for (size_t i = 0; i < s->n_records; i++) {
            event_chunk(s, i, &c);
            if (!c.logprobs.p || skip_ws(c.logprobs.p + 1, c.logprobs.p + c.logprobs.n)[0] == ']')
                continue;
            if (!first)
                PUT_LIT(&o, ",");
            first = false;
            put_compact(&o, inner(c.logprobs));
        }
        PUT_LIT(&o, "]}");
    } else {
        PUT_LIT(&o, "null");
    }
    PUT_LIT(&o, ",\"finish_reason\":");
    /* n_records > 0: an answer ends with its final record. */
    event_chunk(s, s->n_records - 1, &c);
    if (c.finish.p)
        put_compact(&o, c.finish);
    else
        PUT_LIT(&o, "null");
    PUT_LIT(&o, "}]");
    if (s->usage.len > 0) {
        PUT_LIT(&o, ",\"usage\":");
        put(&o, s->usage.data, s->usage.len);
    }
    PUT_LIT(&o, "}");
    if (!o.oom)
        return 0;
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
    return -1;
}

/* ---- errors --------------------------------------------------------------------- */

int gw_http_status_of(const char *code)
{
    static const struct {
        const char *code;
        int status;
    } table[] = {
        {"invalid_json", 400},
        {"invalid_request", 400},
        {"invalid_image", 400},
        {"image_too_large", 400},
        {"context_length_exceeded", 400},
        {"reply_too_large", 400},
        {"invalid_api_key", 401},
        {"not_found", 404},
        {"model_not_found", 404},
        {"unknown_adapter", 404},
        {"method_not_allowed", 405},
        {"request_timeout", 408},
        {"cancelled", 409},
        {"request_too_large", 413},
        {"adapter_too_large", 413},
        {"rate_limit_exceeded", 429},
        {"too_many_streams", 429},
        {"adapter_unavailable", 503},
        {"not_ready", 503},
        {"kafka_unavailable", 503},
        {"overloaded", 503},
        {"deadline_exceeded", 504},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(code, table[i].code) == 0)
            return table[i].status;
    return HTTP_INTERNAL;
}

const char *gw_error_type_of(int http_status)
{
    if (http_status == HTTP_UNAUTHORIZED)
        return "authentication_error";
    if (http_status == HTTP_TOO_MANY_REQUESTS)
        return "rate_limit_error";
    if (http_status >= HTTP_INTERNAL)
        return "server_error";
    return "invalid_request_error";
}

int gw_error_body(svc_buf *b, const char *code, const char *message)
{
    out o = {b, false};
    b->len = 0;
    put_error_object(&o, code, message);
    if (!o.oom)
        return 0;
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
    return -1;
}

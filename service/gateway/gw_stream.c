/* Reply records to SSE events and chat.completion answers (gw_stream.h).
 * Records are never turned into a tree and printed again: svc_json (protocol/json_span.h) finds
 * the spans an answer needs and they are copied as the worker wrote them.
 * cJSON only writes and reads the small error objects. */
#include "gateway/gw_stream.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "protocol/json_span.h"
#include "protocol/protocol.h"

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
/* Choices one stream follows: the most a worker may be configured to give
 * (limits.max_n). */
#define GW_STREAM_CHOICES_MAX SVC_MAX_N_LIMIT
#define CHOICE_EVENTS_INITIAL 16

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
    if (!o->oom && svc_buf_append(o->b, s, n) != 0)
        o->oom = true;
}

/* A builder's result: 0, or -1 with the buffer emptied after a failed
 * append (no half-written document is ever read). */
static int out_end(out *o)
{
    if (!o->oom)
        return 0;
    o->b->len = 0;
    if (o->b->data)
        o->b->data[0] = '\0';
    return -1;
}

#define PUT_LIT(o, lit) put((o), (lit), sizeof(lit) - 1)

static void put_compact(out *o, svc_span v)
{
    if (!o->oom && svc_json_put_compact(o->b, v) != 0)
        o->oom = true;
}

static void put_i64(out *o, int64_t v)
{
    char tmp[U64_DIGITS + 2];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
    assert(n > 0 && (size_t)n < sizeof tmp);
    put(o, tmp, (size_t)n);
}

/* ---- chunks ------------------------------------------------------------------- */

/* The parts of a chat.completion.chunk (a worker's record or an event's
 * data) the stream uses. */
typedef struct chunk {
    svc_span choices;  /* the array */
    bool has_choice;  /* choices is not empty (the final of n > 1 choices is) */
    uint32_t index;   /* choices[0].index: its choice (0 when absent) */
    svc_span content;  /* choices[0].delta.content between its quotes; absent when none */
    svc_span logprobs; /* choices[0].logprobs.content, the array; absent when logprobs is null */
    svc_span finish;   /* choices[0].finish_reason; absent when missing */
    svc_span usage;    /* an object; absent when missing or null */
    svc_span error;    /* an object; absent when missing or null */
    /* choices[0].delta.tool_calls[0] (tool_stream.h): where a call begins
     * its id and name (the JSON strings), and in every chunk of it the
     * arguments' bytes between their quotes; absent when none. */
    svc_span call_id, call_name, call_args;
} chunk;

/* A choice's index: decimal digits below GW_STREAM_CHOICES_MAX; an absent
 * index is choice 0. Returns false otherwise. */
static bool index_parse(svc_span v, uint32_t *index)
{
    *index = 0;
    if (!v.p)
        return true;
    if (!svc_json_is_number(v) || v.n > U64_DIGITS)
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < v.n; i++) {
        if (v.p[i] < '0' || v.p[i] > '9')
            return false;
        x = x * 10 + (uint64_t)(v.p[i] - '0');
        if (x >= GW_STREAM_CHOICES_MAX)
            return false;
    }
    *index = (uint32_t)x;
    return true;
}

/* delta.tool_calls (absent or null: no call): an array whose first element
 * is an object with a function object; id and name strings where present,
 * arguments a string. Returns false otherwise. */
static bool call_parse(svc_span calls, chunk *c)
{
    if (svc_json_is_null(calls))
        return true;
    svc_span call = svc_json_is(calls, '[') ? svc_json_first(calls) : (svc_span){NULL, 0};
    svc_span fn = svc_json_is(call, '{') ? svc_json_member(call, "function") : call;
    if (!svc_json_is(fn, '{'))
        return false;
    svc_span id = svc_json_member(call, "id"), name = svc_json_member(fn, "name");
    svc_span args = svc_json_member(fn, "arguments");
    if ((id.p && !svc_json_is(id, '"')) || (name.p && !svc_json_is(name, '"')) ||
        !svc_json_is(args, '"'))
        return false;
    c->call_id = id;
    c->call_name = name;
    c->call_args = svc_json_inner(args);
    return true;
}

/* Scan v as one JSON object with the shape of a chunk: choices an array,
 * empty or whose first element is an object with an index below
 * GW_STREAM_CHOICES_MAX and an object delta; content a string or null;
 * logprobs null or an object with a content array; usage and error objects
 * or null. Returns false otherwise. */
static bool chunk_parse(const char *v, size_t n, chunk *c)
{
    svc_span root = svc_json_value(v, n);
    if (!svc_json_is(root, '{'))
        return false;
    *c = (chunk){.choices = svc_json_member(root, "choices")};
    if (!svc_json_is(c->choices, '['))
        return false;
    svc_span usage = svc_json_member(root, "usage"), error = svc_json_member(root, "error");
    if ((!svc_json_is_null(usage) && !svc_json_is(usage, '{')) ||
        (!svc_json_is_null(error) && !svc_json_is(error, '{')))
        return false;
    c->usage = svc_json_is_null(usage) ? (svc_span){NULL, 0} : usage;
    c->error = svc_json_is_null(error) ? (svc_span){NULL, 0} : error;
    c->has_choice = !svc_json_is_empty(c->choices);
    if (!c->has_choice)
        return true;
    svc_span choice = svc_json_first(c->choices);
    if (!svc_json_is(choice, '{') || !index_parse(svc_json_member(choice, "index"), &c->index))
        return false;
    svc_span delta = svc_json_member(choice, "delta");
    if (!svc_json_is(delta, '{'))
        return false;
    svc_span content = svc_json_member(delta, "content");
    if (svc_json_is(content, '"'))
        c->content = svc_json_inner(content);
    else if (!svc_json_is_null(content))
        return false;
    if (!call_parse(svc_json_member(delta, "tool_calls"), c))
        return false;
    svc_span lp = svc_json_member(choice, "logprobs");
    if (!svc_json_is_null(lp)) {
        if (!svc_json_is(lp, '{'))
            return false;
        c->logprobs = svc_json_member(lp, "content");
        if (!svc_json_is(c->logprobs, '['))
            return false;
    }
    c->finish = svc_json_member(choice, "finish_reason");
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

/* One choice of the answer (n > 1 choices: service/protocol/README.md):
 * the events of its records, in order, and how far a new attempt has
 * matched them. Records of several choices interleave as the worker
 * samples them, which a new attempt need not repeat; each choice's own
 * records it does repeat, so a takeover is compared choice by choice. */
typedef struct gw_choice {
    size_t *events;   /* owned: indices into gw_stream.events */
    size_t n_events, cap_events;
    size_t matched;   /* of them, those the followed attempt has given again */
} gw_choice;

struct gw_stream {
    char *id_json;    /* owned (cJSON's allocator): the id as a JSON string */
    char *model_json; /* owned (cJSON's allocator) */
    int64_t created;
    bool include_usage, completion_only;

    log_block *blocks; /* owned: newest first; events point into them */
    size_t block_bytes;
    gw_event *events;  /* owned */
    size_t n_events, cap_events;
    /* The answer's records, from event `answer` on (0 but where
     * completion_only restarted), each an event of one choice: choices[i]
     * the events of choice i (n_choices, one past the highest index seen);
     * n_records of them in all. */
    size_t answer, n_records;
    gw_choice *choices; /* owned */
    size_t n_choices;
    svc_buf scratch;   /* the event being built */
    svc_buf usage;     /* the final's usage, rewritten; empty when none */

    uint32_t seen[GW_STREAM_ATTEMPTS_MAX]; /* attempts whose seq 0 was followed */
    size_t n_seen;
    bool following;    /* an attempt is followed */
    bool broken;       /* it skipped a seq: ignore it */
    uint32_t attempt, next_seq;

    bool done;
    bool failed;       /* it ended with this error: */
    char err_code[ERR_CODE_MAX];
    char err_message[ERR_MESSAGE_MAX];
};

/* s as valid UTF-8: s itself, or a copy in tmp with U+FFFD for each byte
 * that starts no valid sequence; NULL when out of memory. */
static const char *utf8_text(const char *s, svc_buf *tmp)
{
    static const char replacement[] = "\xef\xbf\xbd";
    size_t n = strlen(s);
    if (svc_utf8_valid(s, n, NULL))
        return s;
    out o = {tmp, false};
    for (size_t i = 0; i < n;) {
        size_t k = svc_utf8_seq_len((const unsigned char *)s + i, n - i);
        if (k > 0) {
            put(&o, s + i, k);
            i += k;
        } else {
            PUT_LIT(&o, replacement);
            i++;
        }
    }
    return o.oom ? NULL : tmp->data;
}

/* A JSON string of s (made valid UTF-8), allocated by cJSON; NULL when out
 * of memory. */
static char *json_string(const char *s)
{
    svc_buf tmp;
    svc_buf_init(&tmp);
    const char *text = utf8_text(s, &tmp);
    cJSON *str = text ? cJSON_CreateString(text) : NULL;
    char *json = str ? cJSON_PrintUnformatted(str) : NULL;
    cJSON_Delete(str);
    svc_buf_deinit(&tmp);
    return json;
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

void gw_stream_destroy(gw_stream *s)
{
    if (!s)
        return;
    while (s->blocks) {
        log_block *b = s->blocks;
        s->blocks = b->next;
        free(b);
    }
    free(s->events);
    for (size_t i = 0; i < s->n_choices; i++)
        free(s->choices[i].events);
    free(s->choices);
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
    size_t choices = s->n_choices * sizeof *s->choices;
    for (size_t i = 0; i < s->n_choices; i++)
        choices += s->choices[i].cap_events * sizeof *s->choices[i].events;
    return sizeof *s + s->block_bytes + s->cap_events * sizeof *s->events + s->scratch.cap +
           s->usage.cap + choices + strlen(s->id_json) + 1 + strlen(s->model_json) + 1;
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

/* The error object into o: cJSON writes it (messages are arbitrary text,
 * made valid UTF-8 first: an answer is always valid UTF-8). */
static void put_error_object(out *o, const char *code, const char *message)
{
    svc_buf code_tmp, message_tmp;
    svc_buf_init(&code_tmp);
    svc_buf_init(&message_tmp);
    const char *code_text = utf8_text(code, &code_tmp);
    const char *message_text = utf8_text(message, &message_tmp);
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    bool built = code_text && message_text && e &&
                 cJSON_AddStringToObject(e, "message", message_text) &&
                 cJSON_AddStringToObject(e, "type",
                                         gw_error_type_of(gw_http_status_of(code))) &&
                 cJSON_AddNullToObject(e, "param") &&
                 cJSON_AddStringToObject(e, "code", code_text);
    char *text = built ? cJSON_PrintUnformatted(root) : NULL;
    if (text)
        put(o, text, strlen(text));
    else
        o->oom = true;
    cJSON_free(text);
    cJSON_Delete(root);
    svc_buf_deinit(&code_tmp);
    svc_buf_deinit(&message_tmp);
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
static gw_feed end_with_worker_error(gw_stream *s, svc_span error)
{
    cJSON *e = cJSON_ParseWithLength(error.p, error.n);
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    finish(s, cJSON_IsString(code) ? code->valuestring : "internal",
           cJSON_IsString(msg) ? msg->valuestring : "");
    cJSON_Delete(e);
    return GW_FEED_DONE;
}

/* The final's usage into s->usage, with the member OpenAI clients read for
 * cached prompt tokens added: "prompt_tokens_details":{"cached_tokens":N}.
 * Returns 0, or -1 when out of memory. */
static int keep_usage(gw_stream *s, svc_span usage)
{
    s->usage.len = 0;
    if (!usage.p)
        return 0;
    out o = {&s->usage, false};
    put_compact(&o, (svc_span){usage.p, usage.n - 1}); /* without its closing brace */
    if (!svc_json_is_empty(usage))
        PUT_LIT(&o, ",");
    PUT_LIT(&o, "\"prompt_tokens_details\":{\"cached_tokens\":");
    svc_span cached = svc_json_member(usage, "prompt_tokens_cached");
    if (svc_json_is_number(cached))
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

/* Choice i, made (with those below it) when first seen; NULL when out of
 * memory. */
static gw_choice *choice_at(gw_stream *s, uint32_t i)
{
    if (i >= s->n_choices) {
        gw_choice *c = realloc(s->choices, ((size_t)i + 1) * sizeof *c);
        if (!c)
            return NULL;
        memset(c + s->n_choices, 0, ((size_t)i + 1 - s->n_choices) * sizeof *c);
        s->choices = c;
        s->n_choices = (size_t)i + 1;
    }
    return &s->choices[i];
}

/* Event e of the log is choice ch's next. Returns 0 or -1. */
static int choice_append(gw_choice *ch, size_t e)
{
    if (ch->n_events == ch->cap_events) {
        size_t cap = ch->cap_events ? 2 * ch->cap_events : CHOICE_EVENTS_INITIAL;
        size_t *ev = realloc(ch->events, cap * sizeof *ev);
        if (!ev)
            return -1;
        ch->events = ev;
        ch->cap_events = cap;
    }
    ch->events[ch->n_events++] = e;
    ch->matched = ch->n_events;
    return 0;
}

/* Whether every choice's sent records were given again. */
static bool all_matched(const gw_stream *s)
{
    for (size_t i = 0; i < s->n_choices; i++)
        if (s->choices[i].matched < s->choices[i].n_events)
            return false;
    return true;
}

/* Record r, the next seq of the followed attempt: compared with what was
 * sent of its choice (a record below those the choice sent) or appended.
 * The final record of n > 1 choices carries none: it ends the answer. */
static gw_feed take(gw_stream *s, const gw_record *r)
{
    chunk c;
    if (!chunk_parse(r->value, r->len, &c) || (!c.has_choice && !r->final))
        return fail_internal(s, "the worker sent a reply record that is not a chunk");
    if (c.error.p)
        return end_with_worker_error(s, c.error);
    if (!c.has_choice) /* a final below a choice's last record sent: text the answer lacks */
        return all_matched(s) ? end_with_answer(s, &c) : diverge(s);
    gw_choice *ch = choice_at(s, c.index);
    if (!ch)
        return fail_internal(s, "out of memory");
    out o = {&s->scratch, false};
    size_t payload = build_chunk(s, &o, s->n_events, &c);
    if (o.oom)
        return fail_internal(s, "out of memory");
    if (ch->matched < ch->n_events) {
        /* Its data, not its SSE id: the choices may interleave otherwise. */
        const gw_event *sent = &s->events[ch->events[ch->matched]];
        size_t sent_len = sent->len - sent->payload, len = s->scratch.len - payload;
        bool same = sent_len == len &&
                    memcmp(sent->data + sent->payload, s->scratch.data + payload, len) == 0;
        ch->matched++;
        if (!same || (r->final && !all_matched(s)))
            return diverge(s);
        return r->final ? end_with_answer(s, &c) : GW_FEED_IGNORED;
    }
    if (log_append(s, payload) != 0 || choice_append(ch, s->n_events - 1) != 0)
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
        if (takeover && s->completion_only) {
            s->answer = s->n_events;
            s->n_records = 0;
            for (size_t i = 0; i < s->n_choices; i++)
                s->choices[i].n_events = s->choices[i].matched = 0;
        } else if (takeover && !r->reproducible) {
            return diverge(s);
        }
        for (size_t i = 0; i < s->n_choices; i++)
            s->choices[i].matched = 0;
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

/* Choice i of the completion: the contents and the logprobs "content"
 * entries of its events in order, and its last event's finish_reason. */
/* Choice i's message: its call, when its chunks carry one (its id and
 * name from where it began, its arguments put together), else its text. */
static void put_message(const gw_stream *s, out *o, const gw_choice *ch)
{
    chunk c, head = {0};
    for (size_t k = 0; k < ch->n_events && !head.call_name.p; k++) {
        event_chunk(s, ch->events[k], &c);
        if (c.call_name.p)
            head = c;
    }
    PUT_LIT(o, "{\"role\":\"assistant\",\"content\":");
    if (head.call_name.p) {
        PUT_LIT(o, "null,\"tool_calls\":[{\"id\":");
        if (head.call_id.p)
            put(o, head.call_id.p, head.call_id.n);
        else
            PUT_LIT(o, "null");
        PUT_LIT(o, ",\"type\":\"function\",\"function\":{\"name\":");
        put(o, head.call_name.p, head.call_name.n);
        PUT_LIT(o, ",\"arguments\":\"");
    } else {
        PUT_LIT(o, "\"");
    }
    for (size_t k = 0; k < ch->n_events; k++) {
        event_chunk(s, ch->events[k], &c);
        svc_span part = head.call_name.p ? c.call_args : c.content;
        if (part.p)
            put(o, part.p, part.n);
    }
    if (head.call_name.p)
        PUT_LIT(o, "\"}}]}");
    else
        PUT_LIT(o, "\"}");
}

static void put_choice(const gw_stream *s, out *o, size_t i)
{
    const gw_choice *ch = &s->choices[i];
    PUT_LIT(o, "{\"index\":");
    put_i64(o, (int64_t)i);
    PUT_LIT(o, ",\"message\":");
    put_message(s, o, ch);
    chunk c;
    bool any_logprobs = false;
    for (size_t k = 0; k < ch->n_events; k++) {
        event_chunk(s, ch->events[k], &c);
        any_logprobs |= c.logprobs.p != NULL;
    }
    PUT_LIT(o, ",\"logprobs\":");
    if (any_logprobs) {
        PUT_LIT(o, "{\"content\":[");
        bool first = true;
        for (size_t k = 0; k < ch->n_events; k++) {
            event_chunk(s, ch->events[k], &c);
            if (!c.logprobs.p || svc_json_is_empty(c.logprobs))
                continue;
            if (!first)
                PUT_LIT(o, ",");
            first = false;
            put_compact(o, svc_json_inner(c.logprobs));
        }
        PUT_LIT(o, "]}");
    } else {
        PUT_LIT(o, "null");
    }
    PUT_LIT(o, ",\"finish_reason\":");
    c.finish = (svc_span){NULL, 0};
    if (ch->n_events > 0)
        event_chunk(s, ch->events[ch->n_events - 1], &c);
    if (c.finish.p)
        put_compact(o, c.finish);
    else
        PUT_LIT(o, "null");
    PUT_LIT(o, "}");
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
    PUT_LIT(&o, ",\"choices\":[");
    for (size_t i = 0; i < s->n_choices; i++) {
        if (i)
            PUT_LIT(&o, ",");
        put_choice(s, &o, i);
    }
    PUT_LIT(&o, "]");
    if (s->usage.len > 0) {
        PUT_LIT(&o, ",\"usage\":");
        put(&o, s->usage.data, s->usage.len);
    }
    PUT_LIT(&o, "}");
    return out_end(&o);
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
        {"invalid_image_url", 400},
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
    return out_end(&o);
}

/* Parsing and validation of request records (protocol.h has the contract).
 *
 * The record is hostile input: its size and its number of JSON values are
 * bounded before cJSON builds a tree, every field is type- and range-checked
 * with an error naming it, and image sizes are checked from the base64
 * length before anything is decoded. What the request keeps is copied into
 * one arena owned by the request, so the record and the cJSON tree are freed
 * when parsing returns. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "protocol/arena.h"
#include "protocol/base64.h"
#include "protocol/protocol.h"

/* ---- The request -------------------------------------------------------- */

/* The request as allocated: the public part first, so a svc_request pointer
 * is also a request_impl pointer. */
typedef struct request_impl {
    svc_request pub;
    svc_arena arena; /* what pub points into */
} request_impl;

void svc_request_destroy(svc_request *req)
{
    if (!req)
        return;
    request_impl *r = (request_impl *)req;
    svc_arena_deinit(&r->arena);
    free(r);
}

bool svc_request_answerable(const svc_request *req)
{
    return req && req->id && req->reply_topic;
}

/* ---- JSON pre-scan ------------------------------------------------------ */

/* An upper bound on the number of values in the JSON text s[0..n): one plus
 * the commas and opening brackets outside strings. cJSON spends about 64
 * bytes per value, so "[0,0,0,...]" would cost 32x its size without this
 * bound. Stops counting past `max`. Malformed text is left to cJSON. */
static size_t json_value_bound(const char *s, size_t n, size_t max)
{
    size_t count = 1;
    size_t i = 0;
    while (i < n && count <= max) {
        char c = s[i++];
        if (c == ',' || c == '[' || c == '{') {
            count++;
        } else if (c == '"') {
            /* Skip the string: find a quote preceded by an even number of
             * backslashes. memchr keeps multi-megabyte base64 strings cheap. */
            for (;;) {
                const char *q = memchr(s + i, '"', n - i);
                if (!q)
                    return count;
                size_t at = (size_t)(q - s), bs = 0;
                while (at - bs > i && s[at - bs - 1] == '\\')
                    bs++;
                i = at + 1;
                if (bs % 2 == 0)
                    break;
            }
        }
    }
    return count;
}

/* ---- Parser state and field helpers ------------------------------------- */

typedef struct parser {
    request_impl *r;
    const svc_limits *lim;
    char *err;
    size_t errlen;
    svc_error first; /* the first error; later ones are not reported */
    svc_image *images; /* capacity lim->max_images, allocated at the first image */
    size_t n_parts;
} parser;

static svc_error fail(parser *p, svc_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Record an error (only the first one is kept) and return it. */
static svc_error fail(parser *p, svc_error e, const char *fmt, ...)
{
    if (p->first != SVC_ERROR_NONE)
        return e;
    p->first = e;
    va_list ap;
    va_start(ap, fmt);
    svc_verrf(p->err, p->errlen, fmt, ap);
    va_end(ap);
    return e;
}

static svc_error out_of_memory(parser *p)
{
    return fail(p, SVC_ERROR_INTERNAL, "out of memory while parsing the request");
}

/* Member `name` of obj; NULL when absent or JSON null (the same thing here). */
static const cJSON *member(const cJSON *obj, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

/* Largest integer a JSON number (an IEEE double) holds exactly. */
#define JSON_INT_MAX 9007199254740991.0 /* 2^53 - 1 */

/* Optional integer in [lo, hi]; *out unchanged when absent. */
static svc_error opt_int(parser *p, const cJSON *obj, const char *name, int64_t lo, int64_t hi,
                         int64_t *out, bool *present)
{
    const cJSON *it = member(obj, name);
    if (present)
        *present = it != NULL;
    if (!it)
        return SVC_ERROR_NONE;
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v) || fabs(v) > JSON_INT_MAX)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: expected an integer", name);
    if (v < (double)lo || v > (double)hi)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: %.0f is out of range [%lld, %lld]", name,
                    v, (long long)lo, (long long)hi);
    *out = (int64_t)v;
    return SVC_ERROR_NONE;
}

/* A closed or open bound of a number range. */
typedef struct bound {
    double v;
    bool open;
} bound;

/* Optional number in the range (lo, hi) with the given openness; *out
 * unchanged when absent. */
static svc_error opt_number(parser *p, const cJSON *obj, const char *name, bound lo, bound hi,
                            float *out)
{
    const cJSON *it = member(obj, name);
    if (!it)
        return SVC_ERROR_NONE;
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: expected a number", name);
    bool ok = (lo.open ? v > lo.v : v >= lo.v) && (hi.open ? v < hi.v : v <= hi.v);
    if (!ok)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: %g is out of range %c%g, %g%c", name, v,
                    lo.open ? '(' : '[', lo.v, hi.v, hi.open ? ')' : ']');
    *out = (float)v;
    return SVC_ERROR_NONE;
}

static svc_error opt_bool(parser *p, const cJSON *obj, const char *name, bool *out)
{
    const cJSON *it = member(obj, name);
    if (!it)
        return SVC_ERROR_NONE;
    if (!cJSON_IsBool(it))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: expected true or false", name);
    *out = cJSON_IsTrue(it);
    return SVC_ERROR_NONE;
}

/* Checks shared by ids from headers, keys and JSON: 1..max bytes, UTF-8,
 * no control characters (ids travel in headers and logs). */
static bool valid_id(const char *s, size_t len, size_t max)
{
    if (len == 0 || len > max || !svc_utf8_valid(s, len, NULL))
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

/* ---- Addressing --------------------------------------------------------- */

static svc_error set_id(parser *p, const char *s, size_t len, const char *source)
{
    if (!valid_id(s, len, p->lim->max_id_bytes))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "%s: request id must be 1..%zu bytes of UTF-8 without control characters",
                    source, p->lim->max_id_bytes);
    p->r->pub.id = svc_arena_strndup(&p->r->arena, s, len);
    return p->r->pub.id ? SVC_ERROR_NONE : out_of_memory(p);
}

static svc_error set_reply_topic(parser *p, const char *s, size_t len, const char *source)
{
    if (!svc_valid_topic(s, len))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "%s: not a Kafka topic name ([A-Za-z0-9._-], 1..%d characters)", source,
                    SVC_TOPIC_NAME_MAX);
    p->r->pub.reply_topic = svc_arena_strndup(&p->r->arena, s, len);
    return p->r->pub.reply_topic ? SVC_ERROR_NONE : out_of_memory(p);
}

/* The header-borne addressing, usable even when the body is not. */
static void address_from_headers(parser *p, const svc_request_input *in)
{
    if (in->request_id.ptr)
        set_id(p, in->request_id.ptr, in->request_id.len, "header request_id");
    if (in->reply_topic.ptr)
        set_reply_topic(p, in->reply_topic.ptr, in->reply_topic.len, "header reply_topic");
    const char *tp = in->traceparent.ptr;
    if (tp && svc_valid_traceparent(tp, in->traceparent.len))
        p->r->pub.traceparent = svc_arena_strndup(&p->r->arena, tp, in->traceparent.len);
}

static void id_from_key(parser *p, const svc_request_input *in)
{
    if (!p->r->pub.id && !in->request_id.ptr && in->key)
        set_id(p, in->key, in->key_len, "record key");
}

/* Body addressing: id, reply_topic and stream, before anything else can
 * fail, so that an error reply can reach the client. */
static void address_from_body(parser *p, const svc_request_input *in, const cJSON *root)
{
    const cJSON *it;
    if (!in->request_id.ptr) {
        if ((it = member(root, "id"))) {
            if (cJSON_IsString(it))
                set_id(p, it->valuestring, strlen(it->valuestring), "id");
            else
                fail(p, SVC_ERROR_INVALID_REQUEST, "id: expected a string");
        } else {
            id_from_key(p, in);
        }
    }
    if (!in->reply_topic.ptr && (it = member(root, "reply_topic"))) {
        if (cJSON_IsString(it))
            set_reply_topic(p, it->valuestring, strlen(it->valuestring), "reply_topic");
        else
            fail(p, SVC_ERROR_INVALID_REQUEST, "reply_topic: expected a string");
    }
    opt_bool(p, root, "stream", &p->r->pub.stream);
}

static svc_error check_addressing(parser *p)
{
    if (p->first != SVC_ERROR_NONE)
        return p->first;
    if (!p->r->pub.id)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "id: missing (no request_id header, id field or record key)");
    if (!p->r->pub.reply_topic)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "reply_topic: missing (no reply_topic header or field)");
    return SVC_ERROR_NONE;
}

/* Decimal digits of a positive int64, as sent in a header. */
static bool parse_header_i64(const char *s, size_t len, int64_t *out)
{
    enum { I64_MAX_DIGITS = 19 };
    if (len == 0 || len > I64_MAX_DIGITS)
        return false;
    int64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        int d = s[i] - '0';
        if (v > (INT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static svc_error parse_deadline(parser *p, const svc_request_input *in, const cJSON *root)
{
    svc_request *req = &p->r->pub;
    if (in->deadline_ms.ptr) {
        if (!parse_header_i64(in->deadline_ms.ptr, in->deadline_ms.len, &req->deadline_ms) ||
            req->deadline_ms == 0)
            return fail(p, SVC_ERROR_INVALID_REQUEST,
                        "header deadline_ms: expected a positive decimal integer (unix ms)");
    } else {
        svc_error e = opt_int(p, root, "deadline_ms", 1, (int64_t)JSON_INT_MAX,
                              &req->deadline_ms, NULL);
        if (e)
            return e;
    }
    if (req->deadline_ms && in->now_ms && req->deadline_ms <= in->now_ms)
        return fail(p, SVC_ERROR_DEADLINE_EXCEEDED,
                    "deadline_ms: %lld is %lld ms in the past", (long long)req->deadline_ms,
                    (long long)(in->now_ms - req->deadline_ms));
    return SVC_ERROR_NONE;
}

/* ---- Messages ----------------------------------------------------------- */

/* Where a part sits, for error messages: "messages[1].content[2]". */
typedef struct part_loc {
    size_t msg;
    size_t part;
} part_loc;

static svc_error add_text(parser *p, svc_part *part, const char *s, part_loc at,
                          bool whole_content)
{
    size_t len = strlen(s);
    size_t bad;
    char where[64];
    if (whole_content)
        snprintf(where, sizeof where, "messages[%zu].content", at.msg);
    else
        snprintf(where, sizeof where, "messages[%zu].content[%zu].text", at.msg, at.part);
    if (!svc_utf8_valid(s, len, &bad))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "%s: invalid UTF-8 at byte %zu", where, bad);
    if (len > p->lim->max_text_bytes - p->r->pub.n_text_bytes)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "%s: the request's text exceeds the limit of %zu bytes", where,
                    p->lim->max_text_bytes);
    p->r->pub.n_text_bytes += len;
    part->kind = SVC_PART_TEXT;
    part->text = svc_arena_strndup(&p->r->arena, s, len);
    part->text_len = len;
    return part->text ? SVC_ERROR_NONE : out_of_memory(p);
}

/* A new image slot, or NULL after reporting too many images. */
static svc_image *new_image(parser *p, part_loc at)
{
    svc_request *req = &p->r->pub;
    if (req->n_images >= p->lim->max_images) {
        fail(p, SVC_ERROR_INVALID_REQUEST, "messages[%zu].content[%zu]: more than %zu images",
             at.msg, at.part, p->lim->max_images);
        return NULL;
    }
    if (!p->images) {
        p->images = svc_arena_alloc(&p->r->arena, p->lim->max_images * sizeof *p->images);
        if (!p->images) {
            out_of_memory(p);
            return NULL;
        }
        req->images = p->images;
    }
    svc_image *img = &p->images[req->n_images++];
    memset(img, 0, sizeof *img);
    return img;
}

/* Whether a data: URL's media type is one the engine decodes. The type only
 * turns away other formats early: the decoder tells JPEG from PNG by the
 * bytes' signature, so a PNG declared as image/jpeg still decodes. */
static bool image_media_type_ok(const char *mime, size_t len)
{
    static const char *const types[] = {"image/jpeg", "image/png"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (len == strlen(types[i]) && strncasecmp(mime, types[i], len) == 0)
            return true;
    return false;
}

static svc_error add_image_url(parser *p, svc_part *part, const cJSON *item, part_loc at)
{
    const cJSON *url = item;
    const char *field = "image_url";
    if (cJSON_IsObject(item)) {
        url = member(item, "url");
        field = "image_url.url";
    }
    if (!cJSON_IsString(url))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content[%zu].%s: expected a string", at.msg, at.part, field);

    char why[SVC_ERRMSG_MAX];
    const char *s = url->valuestring;
    svc_data_url du;
    if (svc_data_url_parse(s, strlen(s), &du, why, sizeof why) != SVC_BASE64_OK)
        return fail(p, SVC_ERROR_INVALID_IMAGE, "messages[%zu].content[%zu].%s: %s", at.msg,
                    at.part, field, why);
    if (!image_media_type_ok(du.mime, du.mime_len))
        return fail(p, SVC_ERROR_INVALID_IMAGE,
                    "messages[%zu].content[%zu].%s: media type %.*s is not supported "
                    "(image/jpeg or image/png)",
                    at.msg, at.part, field, (int)du.mime_len, du.mime);

    size_t n;
    svc_base64_status st = svc_base64_decoded_len(du.data, du.data_len, p->lim->max_image_bytes,
                                                  &n, why, sizeof why);
    if (st == SVC_BASE64_TOO_LARGE)
        return fail(p, SVC_ERROR_IMAGE_TOO_LARGE, "messages[%zu].content[%zu].%s: %s", at.msg,
                    at.part, field, why);
    if (st == SVC_BASE64_OK && n == 0)
        return fail(p, SVC_ERROR_INVALID_IMAGE, "messages[%zu].content[%zu].%s: empty image",
                    at.msg, at.part, field);
    svc_image *img = new_image(p, at);
    if (!img)
        return p->first;
    uint8_t *bytes = NULL;
    if (st == SVC_BASE64_OK) {
        bytes = svc_arena_alloc(&p->r->arena, n);
        if (!bytes)
            return out_of_memory(p);
        st = svc_base64_decode(du.data, du.data_len, bytes, n, &n, why, sizeof why);
    }
    if (st != SVC_BASE64_OK)
        return fail(p, SVC_ERROR_INVALID_IMAGE, "messages[%zu].content[%zu].%s: %s", at.msg,
                    at.part, field, why);
    img->kind = SVC_IMAGE_INLINE;
    img->bytes = bytes;
    img->n_bytes = n;
    part->kind = SVC_PART_IMAGE;
    part->image = (uint32_t)(p->r->pub.n_images - 1);
    return SVC_ERROR_NONE;
}

static svc_error add_image_ref(parser *p, svc_part *part, const cJSON *obj, part_loc at)
{
    const cJSON *h = member(obj, "sha256");
    if (!cJSON_IsString(h))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content[%zu].sha256: expected a string", at.msg, at.part);
    char hex[SVC_SHA256_HEX_LEN + 1];
    size_t len = strlen(h->valuestring);
    for (size_t i = 0; i < len && i < SVC_SHA256_HEX_LEN; i++)
        hex[i] = (char)tolower((unsigned char)h->valuestring[i]);
    if (!svc_valid_sha256(hex, len))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content[%zu].sha256: expected 64 hex digits", at.msg, at.part);
    svc_image *img = new_image(p, at);
    if (!img)
        return p->first;
    img->kind = SVC_IMAGE_REF;
    memcpy(img->sha256, hex, SVC_SHA256_HEX_LEN);
    img->sha256[SVC_SHA256_HEX_LEN] = '\0';
    part->kind = SVC_PART_IMAGE;
    part->image = (uint32_t)(p->r->pub.n_images - 1);
    return SVC_ERROR_NONE;
}

static svc_error parse_part(parser *p, svc_part *part, const cJSON *obj, svc_role role,
                            part_loc at)
{
    if (!cJSON_IsObject(obj))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "messages[%zu].content[%zu]: expected an object",
                    at.msg, at.part);
    const cJSON *type = member(obj, "type");
    if (!cJSON_IsString(type))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content[%zu].type: expected a string", at.msg, at.part);
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) {
        const cJSON *text = member(obj, "text");
        if (!cJSON_IsString(text))
            return fail(p, SVC_ERROR_INVALID_REQUEST,
                        "messages[%zu].content[%zu].text: expected a string", at.msg, at.part);
        return add_text(p, part, text->valuestring, at, false);
    }
    bool url = !strcmp(t, "image_url");
    if (!url && strcmp(t, "image") != 0)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content[%zu].type: unknown part type (expected text, "
                    "image_url or image)", at.msg, at.part);
    if (role != SVC_ROLE_USER)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content[%zu]: images are allowed in user messages only",
                    at.msg, at.part);
    if (!url)
        return add_image_ref(p, part, obj, at);
    const cJSON *iu = member(obj, "image_url");
    if (!iu)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content[%zu].image_url: missing", at.msg, at.part);
    return add_image_url(p, part, iu, at);
}

static svc_error parse_role(parser *p, const cJSON *msg, size_t i, svc_role *role)
{
    static const svc_role roles[] = {SVC_ROLE_SYSTEM, SVC_ROLE_USER, SVC_ROLE_ASSISTANT};
    const cJSON *r = member(msg, "role");
    if (!cJSON_IsString(r))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "messages[%zu].role: expected a string", i);
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) {
        if (!strcmp(r->valuestring, svc_role_name(roles[k]))) {
            *role = roles[k];
            return SVC_ERROR_NONE;
        }
    }
    return fail(p, SVC_ERROR_INVALID_REQUEST,
                "messages[%zu].role: expected system, user or assistant", i);
}

static svc_error parse_message(parser *p, svc_message *m, const cJSON *msg, size_t i)
{
    if (!cJSON_IsObject(msg))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "messages[%zu]: expected an object", i);
    svc_error e = parse_role(p, msg, i, &m->role);
    if (e)
        return e;
    const cJSON *content = member(msg, "content");
    size_t n = 0;
    if (cJSON_IsString(content))
        n = 1;
    else if (cJSON_IsArray(content))
        n = (size_t)cJSON_GetArraySize(content);
    if (n == 0)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content: expected a string or a non-empty array of parts", i);
    if (n > p->lim->max_parts - p->n_parts)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].content: more than %zu content parts in the request", i,
                    p->lim->max_parts);
    p->n_parts += n;
    svc_part *parts = svc_arena_alloc(&p->r->arena, n * sizeof *parts);
    if (!parts)
        return out_of_memory(p);
    memset(parts, 0, n * sizeof *parts);
    m->parts = parts;
    m->n_parts = n;
    if (cJSON_IsString(content))
        return add_text(p, &parts[0], content->valuestring, (part_loc){i, 0}, true);
    size_t k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content)
    {
        if ((e = parse_part(p, &parts[k], part, m->role, (part_loc){i, k})))
            return e;
        k++;
    }
    return SVC_ERROR_NONE;
}

static svc_error parse_messages(parser *p, const cJSON *root)
{
    const cJSON *msgs = member(root, "messages");
    if (!msgs)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "messages: missing");
    if (!cJSON_IsArray(msgs))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "messages: expected an array");
    size_t n = (size_t)cJSON_GetArraySize(msgs);
    if (n == 0 || n > p->lim->max_messages)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "messages: expected 1..%zu messages, got %zu",
                    p->lim->max_messages, n);
    svc_message *m = svc_arena_alloc(&p->r->arena, n * sizeof *m);
    if (!m)
        return out_of_memory(p);
    memset(m, 0, n * sizeof *m);
    p->r->pub.messages = m;
    p->r->pub.n_messages = n;
    size_t i = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs)
    {
        svc_error e = parse_message(p, &m[i], msg, i);
        if (e)
            return e;
        i++;
    }
    return SVC_ERROR_NONE;
}

/* ---- Generation options ------------------------------------------------- */

static svc_error add_stop(parser *p, const cJSON *s, size_t i, const char **slot)
{
    if (!cJSON_IsString(s))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "stop[%zu]: expected a string", i);
    size_t len = strlen(s->valuestring);
    if (len == 0 || len > p->lim->max_stop_bytes || !svc_utf8_valid(s->valuestring, len, NULL))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "stop[%zu]: expected 1..%zu bytes of UTF-8", i,
                    p->lim->max_stop_bytes);
    *slot = svc_arena_strndup(&p->r->arena, s->valuestring, len);
    return *slot ? SVC_ERROR_NONE : out_of_memory(p);
}

static svc_error parse_stop(parser *p, const cJSON *root)
{
    const cJSON *stop = member(root, "stop");
    if (!stop)
        return SVC_ERROR_NONE;
    size_t n;
    if (cJSON_IsString(stop))
        n = 1;
    else if (cJSON_IsArray(stop))
        n = (size_t)cJSON_GetArraySize(stop);
    else
        return fail(p, SVC_ERROR_INVALID_REQUEST, "stop: expected a string or an array of strings");
    if (n > p->lim->max_stop)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "stop: at most %zu stop strings",
                    p->lim->max_stop);
    if (n == 0)
        return SVC_ERROR_NONE;
    const char **list = svc_arena_alloc(&p->r->arena, n * sizeof *list);
    if (!list)
        return out_of_memory(p);
    p->r->pub.stop = list;
    p->r->pub.n_stop = n;
    if (cJSON_IsString(stop))
        return add_stop(p, stop, 0, &list[0]);
    size_t i = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, stop)
    {
        svc_error e = add_stop(p, s, i, &list[i]);
        if (e)
            return e;
        i++;
    }
    return SVC_ERROR_NONE;
}

static svc_error parse_adapter(parser *p, const cJSON *root)
{
    const cJSON *a = member(root, "adapter");
    if (!a)
        return SVC_ERROR_NONE;
    if (!cJSON_IsString(a) || !svc_valid_adapter_name(a->valuestring, strlen(a->valuestring)))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "adapter: expected a name of 1..%d characters [A-Za-z0-9._-], not starting "
                    "with '.'", SVC_ADAPTER_NAME_MAX);
    p->r->pub.adapter = svc_arena_strndup(&p->r->arena, a->valuestring, strlen(a->valuestring));
    return p->r->pub.adapter ? SVC_ERROR_NONE : out_of_memory(p);
}

/* Sampling ranges (OpenAI's where it has one). */
#define TEMPERATURE_MAX 2.0
#define PENALTY_ABS_MAX 2.0
#define REPETITION_PENALTY_MAX 10.0

/* response_format: text (the default) or json_object (JSON mode). */
static svc_error parse_response_format(parser *p, const cJSON *root)
{
    const cJSON *format = member(root, "response_format");
    const cJSON *type = cJSON_IsObject(format) ? member(format, "type") : NULL;
    if (!format || (cJSON_IsString(type) && !strcmp(type->valuestring, "text")))
        return SVC_ERROR_NONE;
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "json_object")) {
        p->r->pub.json_object = true;
        return SVC_ERROR_NONE;
    }
    return fail(p, SVC_ERROR_INVALID_REQUEST,
                "response_format: expected {\"type\": \"text\"} or {\"type\": "
                "\"json_object\"} (JSON schemas are not supported)");
}

/* Fields a client sends to change what the answer is (tool calls, token
 * biases): ignoring them like unknown fields would return a plain text
 * answer the client did not ask for, so they are refused by name. Their
 * neutral values (null, [], {}) pass. */
static svc_error refuse_unsupported(parser *p, const cJSON *root)
{
    const cJSON *tools = member(root, "tools");
    if (tools && !(cJSON_IsArray(tools) && cJSON_GetArraySize(tools) == 0))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "tools: tool calling is not supported");
    const cJSON *bias = member(root, "logit_bias");
    if (bias && !(cJSON_IsObject(bias) && !bias->child))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "logit_bias: not supported");
    return SVC_ERROR_NONE;
}

static svc_error parse_options(parser *p, const cJSON *root)
{
    svc_request *req = &p->r->pub;
    svc_sampling *s = &req->sampling;
    const svc_limits *lim = p->lim;
    svc_error e;

    int64_t v = lim->max_tokens_default;
    bool has_max_tokens, has_alias;
    int64_t alias = 0;
    if ((e = opt_int(p, root, "max_tokens", 1, lim->max_tokens_limit, &v, &has_max_tokens)) ||
        (e = opt_int(p, root, "max_completion_tokens", 1, lim->max_tokens_limit, &alias,
                     &has_alias)))
        return e;
    if (has_max_tokens && has_alias)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "max_tokens: give either max_tokens or max_completion_tokens, not both");
    req->max_tokens = (uint32_t)(has_alias ? alias : v);

    int64_t n = 1;
    if ((e = opt_int(p, root, "n", 1, 1, &n, NULL)))
        return e;

    if ((e = opt_number(p, root, "temperature", (bound){0, false},
                        (bound){TEMPERATURE_MAX, false}, &s->temperature)) ||
        (e = opt_number(p, root, "top_p", (bound){0, true}, (bound){1, false}, &s->top_p)) ||
        (e = opt_number(p, root, "min_p", (bound){0, false}, (bound){1, true}, &s->min_p)) ||
        (e = opt_number(p, root, "repetition_penalty", (bound){0, true},
                        (bound){REPETITION_PENALTY_MAX, false}, &s->repetition_penalty)) ||
        (e = opt_number(p, root, "presence_penalty", (bound){-PENALTY_ABS_MAX, false},
                        (bound){PENALTY_ABS_MAX, false}, &s->presence_penalty)) ||
        (e = opt_number(p, root, "frequency_penalty", (bound){-PENALTY_ABS_MAX, false},
                        (bound){PENALTY_ABS_MAX, false}, &s->frequency_penalty)))
        return e;

    int64_t top_k = 0;
    if ((e = opt_int(p, root, "top_k", 0, INT32_MAX, &top_k, NULL)))
        return e;
    s->top_k = (int32_t)top_k;
    if ((e = opt_int(p, root, "seed", -(int64_t)JSON_INT_MAX, (int64_t)JSON_INT_MAX, &s->seed,
                     &s->has_seed)))
        return e;

    int64_t top_logprobs = 0;
    bool has_top_logprobs;
    if ((e = opt_bool(p, root, "logprobs", &req->logprobs)) ||
        (e = opt_int(p, root, "top_logprobs", 0, SVC_TOP_LOGPROBS_MAX, &top_logprobs,
                     &has_top_logprobs)))
        return e;
    if (top_logprobs > 0 && !req->logprobs)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "top_logprobs: needs \"logprobs\": true");
    req->top_logprobs = (uint32_t)top_logprobs;
    /* A stream: false answer is one record: refuse what may not fit before
     * any work is done (streamed chunks hold one token each). */
    size_t reply_bytes = svc_reply_bound(req->max_tokens, req->logprobs, req->top_logprobs);
    if (!req->stream && lim->max_reply_bytes && reply_bytes > lim->max_reply_bytes)
        return fail(p, SVC_ERROR_REPLY_TOO_LARGE,
                    "max_tokens: a stream:false reply of %u tokens%s may need %zu bytes, over "
                    "the limit of %zu; lower max_tokens or top_logprobs, or stream",
                    req->max_tokens, req->logprobs ? " with logprobs" : "", reply_bytes,
                    lim->max_reply_bytes);

    if ((e = parse_stop(p, root)) || (e = parse_response_format(p, root)) ||
        (e = refuse_unsupported(p, root)))
        return e;
    return parse_adapter(p, root);
}

/* ---- Entry point -------------------------------------------------------- */

static const svc_sampling sampling_default = {
    .temperature = 1.0f,
    .top_p = 1.0f,
    .top_k = 0,
    .min_p = 0.0f,
    .repetition_penalty = 1.0f,
    .presence_penalty = 0.0f,
    .frequency_penalty = 0.0f,
    .has_seed = false,
    .seed = 0,
};

static bool only_whitespace(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
            return false;
    return true;
}

/* Parse the body into a cJSON tree (NULL after reporting invalid_json or a
 * limit). */
static cJSON *parse_body(parser *p, const svc_request_input *in)
{
    const char *text = in->value;
    size_t n = in->value_len;
    if (n > p->lim->max_request_bytes) {
        fail(p, SVC_ERROR_INVALID_REQUEST, "request: %zu bytes exceeds the limit of %zu", n,
             p->lim->max_request_bytes);
        return NULL;
    }
    if (json_value_bound(text, n, p->lim->max_json_values) > p->lim->max_json_values) {
        fail(p, SVC_ERROR_INVALID_REQUEST, "request: more than %zu JSON values",
             p->lim->max_json_values);
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = n ? cJSON_ParseWithLengthOpts(text, n, &end, false) : NULL;
    if (!root) {
        size_t at = end ? (size_t)(end - text) : 0;
        fail(p, SVC_ERROR_INVALID_JSON, "request: invalid JSON near byte %zu", at);
        return NULL;
    }
    if (!only_whitespace(end, n - (size_t)(end - text))) {
        fail(p, SVC_ERROR_INVALID_JSON, "request: unexpected data after the JSON value at byte %zu",
             (size_t)(end - text));
        cJSON_Delete(root);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        fail(p, SVC_ERROR_INVALID_REQUEST, "request: expected a JSON object");
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* Forget everything but the addressing after a failure, so that users who
 * ignore the error cannot read a half-filled request. */
static void keep_addressing_only(svc_request *req)
{
    *req = (svc_request){
        .id = req->id,
        .reply_topic = req->reply_topic,
        .traceparent = req->traceparent,
        .stream = req->stream,
    };
}

svc_error svc_request_parse(const svc_request_input *in, const svc_limits *lim,
                            svc_request **out, char *err, size_t errlen)
{
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    request_impl *r = calloc(1, sizeof *r);
    if (!r) {
        svc_errf(err, errlen, "out of memory while parsing the request");
        return SVC_ERROR_INTERNAL;
    }
    svc_request *req = &r->pub;
    req->stream = true;
    req->sampling = sampling_default;
    parser p = {.r = r, .lim = lim, .err = err, .errlen = errlen};

    address_from_headers(&p, in);
    cJSON *root = parse_body(&p, in);
    if (root)
        address_from_body(&p, in, root);
    else
        id_from_key(&p, in); /* the body cannot name the id */

    svc_error e = check_addressing(&p);
    if (!e)
        e = parse_deadline(&p, in, root);
    if (!e)
        e = parse_options(&p, root);
    if (!e)
        e = parse_messages(&p, root);
    cJSON_Delete(root);

    if (e)
        keep_addressing_only(req);
    *out = req;
    return e;
}

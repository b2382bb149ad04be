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

#include "protocol/request_internal.h"

/* ---- The request -------------------------------------------------------- */

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

/* ---- Field helpers ------------------------------------------------------ */

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
 * turns away other formats early: the decoder tells the formats apart by the
 * bytes' signature, so a PNG declared as image/jpeg still decodes. */
static bool image_media_type_ok(const char *mime, size_t len)
{
    static const char *const types[] = {"image/jpeg", "image/png", "image/webp", "image/gif",
                                        "image/tiff"};
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
                    "(image/jpeg, image/png, image/webp, image/gif or image/tiff)",
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
    static const svc_role roles[] = {SVC_ROLE_SYSTEM, SVC_ROLE_USER, SVC_ROLE_ASSISTANT,
                                     SVC_ROLE_TOOL};
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
                "messages[%zu].role: expected system, user, assistant or tool", i);
}

static svc_error parse_message(parser *p, svc_message *m, const cJSON *msg, size_t i)
{
    if (!cJSON_IsObject(msg))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "messages[%zu]: expected an object", i);
    svc_error e = parse_role(p, msg, i, &m->role);
    if (e)
        return e;
    /* A call's content is not rendered (the template's), so not read. */
    const cJSON *calls = member(msg, "tool_calls");
    if (m->role == SVC_ROLE_ASSISTANT && calls &&
        !(cJSON_IsArray(calls) && cJSON_GetArraySize(calls) == 0))
        return svc_request_parse_tool_call(p, m, calls, i);
    if (m->role == SVC_ROLE_TOOL)
        return svc_request_parse_tool_content(p, m, i);
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
    parser p = {.r = r, .lim = lim, .err = err, .errlen = errlen, .body = in->value,
                .body_len = in->value_len};

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
        e = svc_request_parse_options(&p, root);
    if (!e)
        e = parse_messages(&p, root);
    if (!e)
        e = svc_request_check_tools(&p);
    cJSON_Delete(root);

    if (e)
        keep_addressing_only(req);
    *out = req;
    return e;
}

/* Fuzz target: request parsing with small limits, then the records a worker
 * would produce from whatever was parsed (an error reply, or a final chunk
 * echoing every text part through the JSON escaper, and dead-letter
 * headers). Aborts when an invariant of the parsed request or of the output
 * JSON breaks.
 *
 * Input: one selector character, then the record value. The selector's low
 * three bits choose which of the request_id header, reply_topic header and
 * record key are present, so headers and key precedence are fuzzed too. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "protocol/protocol.h"

enum { SEL_HDR_ID = 1, SEL_HDR_TOPIC = 2, SEL_KEY = 4 };

static void require(bool ok)
{
    if (!ok)
        abort();
}

/* The record must be one JSON object in valid UTF-8. */
static void check_record(const svc_buf *b)
{
    require(b->len > 0 && svc_utf8_valid(b->data, b->len, NULL));
    cJSON *root = cJSON_ParseWithLength(b->data, b->len);
    require(cJSON_IsObject(root));
    cJSON_Delete(root);
}

/* True when text is one JSON value of cJSON type `type`. */
static bool json_is(const char *text, int type)
{
    cJSON *v = text ? cJSON_Parse(text) : NULL;
    bool ok = v && (v->type & 0xff) == type;
    cJSON_Delete(v);
    return ok;
}

static void check_request(const svc_request *req, const svc_limits *lim)
{
    require(req->id && req->reply_topic);
    require(req->n_messages >= 1 && req->n_messages <= lim->max_messages);
    require(req->n_images <= lim->max_images && req->n_text_bytes <= lim->max_text_bytes);
    require(req->max_tokens >= 1 && req->max_tokens <= lim->max_tokens_limit);
    size_t text = 0;
    for (size_t i = 0; i < req->n_messages; i++) {
        const svc_message *m = &req->messages[i];
        /* A tool result is its content's JSON text, a call its name and
         * arguments; every other message has parts. */
        if (m->content_json) {
            require(m->role == SVC_ROLE_TOOL && m->n_parts == 0);
            require(json_is(m->content_json, cJSON_String) || json_is(m->content_json, cJSON_Array));
            text += strlen(m->content_json);
        } else if (m->tool_call_name) {
            require(m->role == SVC_ROLE_ASSISTANT && m->n_parts == 0);
            require(svc_valid_openai_name(m->tool_call_name, strlen(m->tool_call_name)));
            require(json_is(m->tool_call_arguments, cJSON_Object));
            text += strlen(m->tool_call_arguments);
        } else {
            require(m->n_parts >= 1 && m->role != SVC_ROLE_TOOL);
        }
        for (size_t k = 0; k < m->n_parts; k++) {
            const svc_part *p = &m->parts[k];
            if (p->kind == SVC_PART_TEXT) {
                require(strlen(p->text) == p->text_len);
                require(svc_utf8_valid(p->text, p->text_len, NULL));
                text += p->text_len;
            } else {
                require(p->image < req->n_images && m->role == SVC_ROLE_USER);
            }
        }
    }
    /* Tools: their text as written (the prompt prints it), counted as text;
     * a call schema exactly when a tool choice other than none. */
    require(req->n_tools <= SVC_TOOLS_MAX && (req->n_tools == 0) == !req->tools);
    for (size_t i = 0; i < req->n_tools; i++) {
        require(svc_valid_openai_name(req->tools[i].name, strlen(req->tools[i].name)));
        require(strlen(req->tools[i].json) == req->tools[i].json_len &&
                json_is(req->tools[i].json, cJSON_Object));
        text += req->tools[i].json_len;
    }
    require(text == req->n_text_bytes);
    require((req->tool_choice == SVC_TOOL_CHOICE_NONE) == !req->tool_call_schema);
    require(req->tool_choice == SVC_TOOL_CHOICE_NONE || req->n_tools > 0);
    require(req->tool_choice != SVC_TOOL_CHOICE_FUNCTION || req->tool_named < req->n_tools);
    if (req->tool_call_schema) {
        require(strlen(req->tool_call_schema) == req->tool_call_schema_len &&
                req->tool_call_schema_len <= lim->max_schema_bytes &&
                json_is(req->tool_call_schema, cJSON_Object));
        require(req->n_images == 0 && req->n_stop == 0 && !req->json_object && !req->json_schema);
    }
    require(!req->date_string ||
            svc_valid_date_string(req->date_string, strlen(req->date_string)));
    /* A json_schema is kept as JSON text within the bound, with a name. */
    if (req->json_schema) {
        require(!req->json_object && req->json_schema_name && req->json_schema_name[0]);
        require(strlen(req->json_schema) == req->json_schema_len &&
                req->json_schema_len <= lim->max_schema_bytes);
        cJSON *schema = cJSON_ParseWithLength(req->json_schema, req->json_schema_len);
        require(cJSON_IsObject(schema) || cJSON_IsBool(schema));
        cJSON_Delete(schema);
    }
    /* logit_bias: within OpenAI's bounds and the vocabulary, each id once. */
    const svc_sampling *s = &req->sampling;
    require(s->n_logit_bias <= SVC_LOGIT_BIAS_MAX && (s->n_logit_bias == 0) == !s->logit_bias);
    for (size_t i = 0; i < s->n_logit_bias; i++) {
        const svc_logit_bias *b = &s->logit_bias[i];
        require(b->id >= 0 && (size_t)b->id < lim->logit_vocab);
        require(b->bias >= -SVC_LOGIT_BIAS_ABS_MAX && b->bias <= SVC_LOGIT_BIAS_ABS_MAX);
        for (size_t j = 0; j < i; j++)
            require(s->logit_bias[j].id != b->id);
    }
    for (size_t i = 0; i < req->n_images; i++) {
        const svc_image *im = &req->images[i];
        if (im->kind == SVC_IMAGE_INLINE)
            require(im->n_bytes > 0 && im->n_bytes <= lim->max_image_bytes);
        else
            require(svc_valid_sha256(im->sha256, strlen(im->sha256)));
    }
}

/* Echo every text part as chunk content: the escaper sees fuzzed text. */
static void echo_texts(svc_buf *b, const svc_reply_ctx *ctx, const svc_request *req)
{
    uint32_t seq = 0;
    for (size_t i = 0; i < req->n_messages; i++) {
        for (size_t k = 0; k < req->messages[i].n_parts; k++) {
            const svc_part *p = &req->messages[i].parts[k];
            if (p->kind != SVC_PART_TEXT)
                continue;
            svc_reply r = {.seq = seq++, .content = p->text, .content_len = p->text_len};
            require(svc_reply_chunk(b, ctx, &r) == 0);
            check_record(b);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned sel = data[0];
    svc_limits lim;
    svc_limits_default(&lim);
    lim.max_request_bytes = 64 * 1024;
    lim.max_json_values = 512;
    lim.max_messages = 8;
    lim.max_parts = 16;
    lim.max_text_bytes = 4096;
    lim.max_images = 3;
    lim.max_image_bytes = 4096;
    lim.max_id_bytes = 64;
    lim.max_schema_bytes = 1024;
    lim.logit_vocab = 1000;

    svc_request_input in = {
        .value = data + 1,
        .value_len = size - 1,
        .now_ms = 1700000000000,
    };
    if (sel & SEL_HDR_ID)
        in.request_id = (svc_bytes){"hdr-id", 6};
    if (sel & SEL_HDR_TOPIC)
        in.reply_topic = (svc_bytes){"hdr.topic", 9};
    if (sel & SEL_KEY) {
        in.key = "key-id";
        in.key_len = 6;
    }

    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX];
    svc_error e = svc_request_parse(&in, &lim, &req, err, sizeof err);
    require(req != NULL);
    require((e == SVC_ERROR_NONE) == (err[0] == '\0'));

    svc_buf b;
    svc_buf_init(&b);
    svc_reply_ctx ctx = {.id = req->id, .model = "fuzz", .created = 1, .attempt = 1};
    if (e == SVC_ERROR_NONE) {
        check_request(req, &lim);
        echo_texts(&b, &ctx, req);
        svc_usage u = {.images = (uint32_t)req->n_images};
        svc_reply r = {.finish = SVC_FINISH_STOP, .usage = &u};
        require((req->stream ? svc_reply_chunk(&b, &ctx, &r)
                             : svc_reply_completion(&b, &ctx, &r)) == 0);
        check_record(&b);
    } else if (svc_request_answerable(req)) {
        require(svc_reply_error(&b, &ctx, req->stream, 0, e, err) == 0);
        check_record(&b);
    } else {
        svc_headers hs;
        svc_headers_dlt(&hs, e, err, "llm.requests", 0, 42, "fuzz");
        for (size_t i = 0; i < hs.n; i++)
            require(hs.h[i].value != NULL || hs.h[i].len == 0);
    }
    svc_buf_deinit(&b);
    svc_request_destroy(req);
    return 0;
}

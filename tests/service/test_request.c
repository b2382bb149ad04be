/* Request parsing and validation (service/protocol/request.c): defaults, every
 * field, image decoding, the precedence of headers over body over key, and
 * one case per rejection with its error code, the field named in the
 * message, and whether the request can still be answered. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "protocol/base64.h"
#include "protocol/protocol.h"
#include "test_request.h"

svc_limits limits;

/* Parse `json` from an exact-size heap copy without a NUL, so ASan catches a
 * read past the record. */
static svc_error parse_in(svc_request_input *in, const char *json, svc_request **req, char *err,
                          size_t errlen)
{
    size_t n = strlen(json);
    char *copy = malloc(n ? n : 1);
    if (!copy) {
        *req = NULL;
        return SVC_ERROR_INTERNAL;
    }
    memcpy(copy, json, n);
    in->value = copy;
    in->value_len = n;
    svc_error e = svc_request_parse(in, &limits, req, err, errlen);
    free(copy);
    return e;
}

svc_error parse(const char *json, svc_request **req, char *err, size_t errlen)
{
    svc_request_input in = {0};
    return parse_in(&in, json, req, err, errlen);
}

static svc_bytes hdr(const char *s)
{
    return (svc_bytes){s, strlen(s)};
}

void expect_error(const char *json, svc_error code, const char *msg_part, bool answerable)
{
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    svc_error e = parse(json, &req, err, sizeof err);
    check(e == code, "%.60s: got %s, want %s (%s)", json, svc_error_code(e), svc_error_code(code),
          err);
    check(strstr(err, msg_part) != NULL, "%.60s: message '%s' lacks '%s'", json, err, msg_part);
    check(req != NULL, "%.60s: a request comes back on error", json);
    if (req) {
        check(svc_request_answerable(req) == answerable, "%.60s: answerable %d (%s)", json,
              answerable, err);
        check(req->n_messages == 0 && req->messages == NULL && req->n_images == 0,
              "%.60s: only addressing is kept on error", json);
    }
    svc_request_destroy(req);
}

char *wrap(const char *content, const char *extra)
{
    static const char fmt[] = "{\"id\":\"r1\",\"reply_topic\":\"" TOPIC "\","
                              "\"messages\":[{\"role\":\"user\",\"content\":%s}]%s}";
    size_t n = strlen(fmt) + strlen(content) + strlen(extra) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, fmt, content, extra);
    return s;
}

static void expect_error_wrapped(const char *content, const char *extra, svc_error code,
                                 const char *msg_part)
{
    char *json = wrap(content, extra);
    check(json != NULL, "malloc");
    if (json)
        expect_error(json, code, msg_part, true);
    free(json);
}

static void test_minimal_and_defaults(void)
{
    svc_request *req;
    char err[SVC_ERRMSG_MAX];
    svc_error e = parse("{\"id\":\"abc\",\"reply_topic\":\"" TOPIC "\","
                        "\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}",
                        &req, err, sizeof err);
    check(e == SVC_ERROR_NONE, "minimal request: %s", err);
    if (e)
        return;
    check(!strcmp(req->id, "abc") && !strcmp(req->reply_topic, TOPIC), "addressing");
    check(req->stream && req->deadline_ms == 0 && !req->adapter && !req->traceparent, "defaults");
    check(req->max_tokens == limits.max_tokens_default, "max_tokens default");
    check(req->sampling.temperature == 1.0f && req->sampling.top_p == 1.0f &&
              req->sampling.top_k == 0 && req->sampling.min_p == 0.0f &&
              req->sampling.repetition_penalty == 1.0f && !req->sampling.has_seed,
          "sampling defaults");
    check(req->n_stop == 0 && !req->logprobs && req->top_logprobs == 0 && !req->date_string,
          "other defaults");
    check(req->n_messages == 1 && req->messages[0].role == SVC_ROLE_USER &&
              req->messages[0].n_parts == 1,
          "one message, one part");
    const svc_part *p = &req->messages[0].parts[0];
    check(p->kind == SVC_PART_TEXT && p->text_len == 5 && !strcmp(p->text, "Hello"), "text part");
    check(req->n_text_bytes == 5 && req->n_images == 0, "counts");
    check(svc_request_answerable(req), "answerable");
    svc_request_destroy(req);
}

static void test_all_fields(void)
{
    const char *json =
        "{\"id\":\"req-\\u00e9\",\"reply_topic\":\"replies_1\",\"adapter\":\"lora-7b.v2\","
        "\"max_tokens\":100,\"temperature\":0,\"top_p\":0.5,\"top_k\":40,\"min_p\":0.05,"
        "\"repetition_penalty\":1.1,\"presence_penalty\":-2,\"frequency_penalty\":2,"
        "\"seed\":-9007199254740991,\"stop\":[\"\\n\\n\",\"END\"],\"logprobs\":true,"
        "\"top_logprobs\":20,\"n\":1,\"deadline_ms\":4102444800000,\"stream\":false,"
        "\"response_format\":{\"type\":\"json_object\"},"
        "\"model\":\"ignored\",\"future_field\":{\"x\":[1,2]},\"user\":null,"
        "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"name\":\"bob\",\"content\":[{\"type\":\"text\",\"text\":\"A\"},"
        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/jpeg;base64,/9j/4A==\","
        "\"detail\":\"high\"}},{\"type\":\"image\",\"sha256\":"
        "\"ABCDEF0123456789abcdef0123456789ABCDEF0123456789abcdef0123456789\"},"
        "{\"type\":\"image_url\",\"image_url\":\"data:image/PNG;base64,AQID\"},"
        "{\"type\":\"text\",\"text\":\"B\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}]}";
    svc_request *req;
    char err[SVC_ERRMSG_MAX];
    svc_request_input in = {.now_ms = 1700000000000};
    svc_error e = parse_in(&in, json, &req, err, sizeof err);
    check(e == SVC_ERROR_NONE, "full request: %s", err);
    if (e) {
        svc_request_destroy(req);
        return;
    }
    check(!strcmp(req->id, "req-\xc3\xa9"), "id with \\u escape");
    check(!strcmp(req->reply_topic, "replies_1") && !strcmp(req->adapter, "lora-7b.v2"),
          "topic, adapter");
    check(req->max_tokens == 100 && !req->stream && req->deadline_ms == 4102444800000LL,
          "max_tokens, stream, deadline");
    const svc_sampling *s = &req->sampling;
    check(s->temperature == 0.0f && s->top_p == 0.5f && s->top_k == 40 && s->min_p == 0.05f &&
              s->repetition_penalty == 1.1f && s->presence_penalty == -2.0f &&
              s->frequency_penalty == 2.0f,
          "sampling");
    check(s->has_seed && s->seed == -9007199254740991LL, "seed");
    check(req->n_stop == 2 && !strcmp(req->stop[0], "\n\n") && !strcmp(req->stop[1], "END"),
          "stop list");
    check(req->logprobs && req->top_logprobs == 20, "logprobs");
    check(req->json_object, "response_format json_object");

    check(req->n_messages == 3, "3 messages");
    check(req->messages[0].role == SVC_ROLE_SYSTEM && req->messages[2].role == SVC_ROLE_ASSISTANT,
          "roles");
    const svc_message *m = &req->messages[1];
    check(m->n_parts == 5, "5 parts");
    check(m->parts[0].kind == SVC_PART_TEXT && !strcmp(m->parts[0].text, "A"), "part 0 text");
    check(m->parts[1].kind == SVC_PART_IMAGE && m->parts[1].image == 0, "part 1 image 0");
    check(m->parts[2].kind == SVC_PART_IMAGE && m->parts[2].image == 1, "part 2 image 1");
    check(m->parts[3].kind == SVC_PART_IMAGE && m->parts[3].image == 2, "part 3 image 2");
    check(m->parts[4].kind == SVC_PART_TEXT && !strcmp(m->parts[4].text, "B"), "part 4 text");
    check(req->n_images == 3, "3 images");
    static const uint8_t jpeg_soi[] = {0xff, 0xd8, 0xff, 0xe0};
    const svc_image *im = req->images;
    check(im[0].kind == SVC_IMAGE_INLINE && im[0].n_bytes == 4 &&
              !memcmp(im[0].bytes, jpeg_soi, 4) && im[0].sha256[0] == '\0',
          "inline image bytes");
    check(im[1].kind == SVC_IMAGE_REF && im[1].bytes == NULL &&
              !strcmp(im[1].sha256,
                      "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"),
          "image ref lower-cased");
    check(im[2].kind == SVC_IMAGE_INLINE && im[2].n_bytes == 3 && im[2].bytes[2] == 3,
          "image_url as a plain string");
    check(req->n_text_bytes == strlen("Be brief.") + 2 + 2, "text bytes");
    svc_request_destroy(req);
}

static void test_nulls_and_neutral_values(void)
{
    /* The refused fields' neutral values pass too, and an empty logit_bias. */
    char *json = wrap("\"x\"", ",\"temperature\":null,\"stop\":null,\"adapter\":null,"
                               "\"seed\":null,\"max_tokens\":null,\"stream\":null,"
                               "\"tools\":[],\"response_format\":{\"type\":\"text\"},"
                               "\"logit_bias\":{},\"tool_choice\":null,\"date_string\":null");
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX];
    svc_error e = json ? parse(json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    check(e == SVC_ERROR_NONE, "nulls: %s", err);
    if (!e)
        check(req->sampling.temperature == 1.0f && req->n_stop == 0 && !req->adapter &&
                  !req->sampling.has_seed && req->stream && !req->date_string &&
                  req->max_tokens == limits.max_tokens_default,
              "nulls keep defaults");
    svc_request_destroy(req);
    free(json);
}

static void test_alias_and_single_stop(void)
{
    char *json = wrap("\"x\"", ",\"max_completion_tokens\":7,\"stop\":\"###\"");
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX];
    svc_error e = json ? parse(json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    check(e == SVC_ERROR_NONE, "alias: %s", err);
    if (!e)
        check(req->max_tokens == 7 && req->n_stop == 1 && !strcmp(req->stop[0], "###"),
              "max_completion_tokens and a single stop string");
    svc_request_destroy(req);
    free(json);
}

static void test_precedence(void)
{
    static const char body[] = "{\"id\":\"body-id\",\"reply_topic\":\"body.topic\","
                               "\"deadline_ms\":1000,\"messages\":[{\"role\":\"user\","
                               "\"content\":\"x\"}]}";
    static const char body_no_id[] = "{\"reply_topic\":\"t\",\"messages\":[{\"role\":\"user\","
                                     "\"content\":\"x\"}]}";
    svc_request *req;
    char err[SVC_ERRMSG_MAX];

    /* Headers beat the body; the body beats the key. */
    svc_request_input in = {.key = "key-id", .key_len = 6,
                            .request_id = hdr("hdr-id"), .reply_topic = hdr("hdr.topic"),
                            .deadline_ms = hdr("5000"),
                            .traceparent = hdr("00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                               "00f067aa0ba902b7-01")};
    svc_error e = parse_in(&in, body, &req, err, sizeof err);
    check(e == SVC_ERROR_NONE, "headers: %s", err);
    if (!e) {
        check(!strcmp(req->id, "hdr-id") && !strcmp(req->reply_topic, "hdr.topic"),
              "header addressing wins");
        check(req->deadline_ms == 5000, "header deadline wins");
        check(req->traceparent && !strncmp(req->traceparent, "00-4bf9", 7), "traceparent kept");
    }
    svc_request_destroy(req);

    in = (svc_request_input){.key = "key-id", .key_len = 6};
    e = parse_in(&in, body, &req, err, sizeof err);
    check(e == SVC_ERROR_NONE && !strcmp(req->id, "body-id") && req->deadline_ms == 1000,
          "body id beats the key");
    svc_request_destroy(req);

    e = parse_in(&in, body_no_id, &req, err, sizeof err);
    check(e == SVC_ERROR_NONE && !strcmp(req->id, "key-id"), "key as the last resort");
    svc_request_destroy(req);

    /* A malformed traceparent is dropped, not an error. */
    in = (svc_request_input){.traceparent = hdr("00-00000000000000000000000000000000-"
                                                "00f067aa0ba902b7-01")};
    e = parse_in(&in, body, &req, err, sizeof err);
    check(e == SVC_ERROR_NONE && req->traceparent == NULL, "zero trace id dropped");
    svc_request_destroy(req);

    /* An invalid header does not fall through to the body. */
    in = (svc_request_input){.request_id = hdr("bad\nid")};
    e = parse_in(&in, body, &req, err, sizeof err);
    check(e == SVC_ERROR_INVALID_REQUEST && strstr(err, "header request_id") &&
              req && !req->id && !svc_request_answerable(req),
          "invalid header id: unanswerable (%s)", err);
    svc_request_destroy(req);

    in = (svc_request_input){.deadline_ms = hdr("12x")};
    e = parse_in(&in, body, &req, err, sizeof err);
    check(e == SVC_ERROR_INVALID_REQUEST && strstr(err, "header deadline_ms") &&
              svc_request_answerable(req),
          "bad deadline header (%s)", err);
    svc_request_destroy(req);

    /* Unreadable body: header addressing still answers; the key stands in. */
    in = (svc_request_input){.reply_topic = hdr("t"), .key = "k1", .key_len = 2};
    e = parse_in(&in, "{\"id\":", &req, err, sizeof err);
    check(e == SVC_ERROR_INVALID_JSON && req && !strcmp(req->id, "k1") &&
              svc_request_answerable(req),
          "invalid JSON with header/key addressing (%s)", err);
    svc_request_destroy(req);
}

static void test_deadline(void)
{
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX];
    char *json = wrap("\"x\"", ",\"deadline_ms\":1000,\"stream\":false,"
                               "\"messages_after\":[]");
    svc_request_input in = {.now_ms = 1500};
    svc_error e = json ? parse_in(&in, json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    check(e == SVC_ERROR_DEADLINE_EXCEEDED && strstr(err, "500 ms in the past"),
          "deadline passed (%s)", err);
    if (req)
        check(svc_request_answerable(req) && !req->stream, "answerable, stream flag kept");
    svc_request_destroy(req);

    in.now_ms = 999;
    e = json ? parse_in(&in, json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    check(e == SVC_ERROR_NONE, "deadline ahead (%s)", err);
    svc_request_destroy(req);
    free(json);

    /* The deadline is checked before images are decoded. */
    json = wrap("[{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,!!!!\"}]",
                ",\"deadline_ms\":1");
    in.now_ms = 2;
    e = json ? parse_in(&in, json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    check(e == SVC_ERROR_DEADLINE_EXCEEDED, "deadline before images (%s)", err);
    svc_request_destroy(req);
    free(json);
}

static void test_body_errors(void)
{
    expect_error("", SVC_ERROR_INVALID_JSON, "invalid JSON", false);
    expect_error("{\"id\":\"a\",", SVC_ERROR_INVALID_JSON, "invalid JSON", false);
    expect_error("{\"id\":\"a\"} x", SVC_ERROR_INVALID_JSON, "after the JSON value", false);
    expect_error("[1,2]", SVC_ERROR_INVALID_REQUEST, "expected a JSON object", false);
    expect_error("{\"id\":\"a\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                 SVC_ERROR_INVALID_REQUEST, "reply_topic: missing", false);
    expect_error("{\"reply_topic\":\"t\",\"messages\":[]}", SVC_ERROR_INVALID_REQUEST,
                 "id: missing", false);
    expect_error("{\"id\":7,\"reply_topic\":\"t\"}", SVC_ERROR_INVALID_REQUEST,
                 "id: expected a string", false);
    expect_error("{\"id\":\"a\",\"reply_topic\":\"no/slash\"}", SVC_ERROR_INVALID_REQUEST,
                 "reply_topic: not a Kafka topic", false);
    expect_error("{\"id\":\"a\",\"reply_topic\":\"..\"}", SVC_ERROR_INVALID_REQUEST,
                 "reply_topic: not a Kafka topic", false);
    expect_error("{\"id\":\"\",\"reply_topic\":\"t\"}", SVC_ERROR_INVALID_REQUEST,
                 "id: request id must be", false);
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\"}", SVC_ERROR_INVALID_REQUEST,
                 "messages: missing", true);
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\",\"messages\":{}}",
                 SVC_ERROR_INVALID_REQUEST, "messages: expected an array", true);
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\",\"messages\":[]}",
                 SVC_ERROR_INVALID_REQUEST, "messages: expected 1..", true);
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\",\"stream\":1,\"messages\":[]}",
                 SVC_ERROR_INVALID_REQUEST, "stream: expected true or false", true);
}

static void test_message_errors(void)
{
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\",\"messages\":[3]}",
                 SVC_ERROR_INVALID_REQUEST, "messages[0]: expected an object", true);
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\",\"messages\":[{\"role\":\"ipython\","
                 "\"content\":\"x\"}]}",
                 SVC_ERROR_INVALID_REQUEST, "messages[0].role: expected system, user, assistant or tool",
                 true);
    expect_error_wrapped("[]", "", SVC_ERROR_INVALID_REQUEST, "messages[0].content: expected");
    expect_error_wrapped("null", "", SVC_ERROR_INVALID_REQUEST, "messages[0].content: expected");
    expect_error_wrapped("[\"x\"]", "", SVC_ERROR_INVALID_REQUEST,
                         "messages[0].content[0]: expected an object");
    expect_error_wrapped("[{\"type\":\"audio\"}]", "", SVC_ERROR_INVALID_REQUEST,
                         "messages[0].content[0].type: unknown part type");
    expect_error_wrapped("[{\"text\":\"x\"}]", "", SVC_ERROR_INVALID_REQUEST,
                         "messages[0].content[0].type: expected a string");
    expect_error_wrapped("[{\"type\":\"text\",\"text\":1}]", "", SVC_ERROR_INVALID_REQUEST,
                         "messages[0].content[0].text: expected a string");
    expect_error_wrapped("\"bad \xff utf8\"", "", SVC_ERROR_INVALID_REQUEST,
                         "messages[0].content: invalid UTF-8 at byte 4");
    expect_error_wrapped("[{\"type\":\"text\",\"text\":\"\xed\xa0\x80\"}]", "",
                         SVC_ERROR_INVALID_REQUEST, "content[0].text: invalid UTF-8 at byte 0");
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\",\"messages\":[{\"role\":\"system\","
                 "\"content\":[{\"type\":\"image\",\"sha256\":\"00\"}]}]}",
                 SVC_ERROR_INVALID_REQUEST, "images are allowed in user messages only", true);
}

static void test_image_errors(void)
{
    expect_error_wrapped("[{\"type\":\"image_url\"}]", "", SVC_ERROR_INVALID_REQUEST,
                         "messages[0].content[0].image_url: missing");
    expect_error_wrapped("[{\"type\":\"image_url\",\"image_url\":{}}]", "",
                         SVC_ERROR_INVALID_REQUEST, "content[0].image_url.url: expected a string");
    expect_error_wrapped("[{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://x/a.jpg\"}}]",
                         "", SVC_ERROR_INVALID_IMAGE,
                         "messages[0].content[0].image_url.url: not a data: URL");
    expect_error_wrapped("[{\"type\":\"image_url\",\"image_url\":\"data:image/bmp;base64,AAAA\"}]",
                         "", SVC_ERROR_INVALID_IMAGE,
                         "media type image/bmp is not supported "
                         "(image/jpeg, image/png, image/webp, image/gif or image/tiff)");
    expect_error_wrapped("[{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,AA=A\"}]",
                         "", SVC_ERROR_INVALID_IMAGE, "content[0].image_url: misplaced '='");
    expect_error_wrapped("[{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,AAA\"}]",
                         "", SVC_ERROR_INVALID_IMAGE, "not a multiple of 4");
    expect_error_wrapped("[{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,\"}]",
                         "", SVC_ERROR_INVALID_IMAGE, "empty image");
    expect_error_wrapped("[{\"type\":\"image\",\"sha256\":\"abc\"}]", "",
                         SVC_ERROR_INVALID_REQUEST, "content[0].sha256: expected 64 hex digits");
    expect_error_wrapped("[{\"type\":\"image\",\"sha256\":"
                         "\"g000000000000000000000000000000000000000000000000000000000000000\"}]",
                         "", SVC_ERROR_INVALID_REQUEST, "sha256: expected 64 hex digits");
    expect_error_wrapped("[{\"type\":\"image\"}]", "", SVC_ERROR_INVALID_REQUEST,
                         "content[0].sha256: expected a string");

    /* Over the image cap: rejected from the length, before decoding (the
     * characters are not even base64). */
    svc_limits saved = limits;
    limits.max_image_bytes = 6;
    expect_error_wrapped("[{\"type\":\"image_url\",\"image_url\":"
                         "\"data:image/jpeg;base64,!!!!!!!!!!!!\"}]",
                         "", SVC_ERROR_IMAGE_TOO_LARGE, "9 bytes exceeds the limit of 6");
    limits = saved;

    /* Too many images. */
    limits.max_images = 2;
    expect_error_wrapped("[{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,AQID\"},"
                         "{\"type\":\"image_url\",\"image_url\":\"data:image/jpeg;base64,AQID\"},"
                         "{\"type\":\"image\",\"sha256\":"
                         "\"0000000000000000000000000000000000000000000000000000000000000000\"}]",
                         "", SVC_ERROR_INVALID_REQUEST,
                         "messages[0].content[2]: more than 2 images");
    limits = saved;
}

static void test_option_errors(void)
{
    static const struct {
        const char *extra;
        const char *msg;
    } cases[] = {
        {",\"max_tokens\":0", "max_tokens: 0 is out of range [1, 4096]"},
        {",\"max_tokens\":4097", "max_tokens: 4097 is out of range"},
        {",\"max_tokens\":1.5", "max_tokens: expected an integer"},
        {",\"max_tokens\":\"10\"", "max_tokens: expected an integer"},
        {",\"max_tokens\":1e400", "max_tokens: expected an integer"},
        {",\"max_tokens\":5,\"max_completion_tokens\":5", "not both"},
        {",\"n\":0", "n: 0 is out of range [1, 8]"},
        {",\"n\":9", "n: 9 is out of range [1, 8]"},
        {",\"n\":1.5", "n: expected an integer"},
        {",\"n\":\"2\"", "n: expected an integer"},
        {",\"n\":3,\"seed\":9007199254740990",
         "seed: with n 3 choices sample with seeds 9007199254740990 .. 9007199254740992"},
        {",\"temperature\":-0.1", "temperature: -0.1 is out of range [0, 2]"},
        {",\"temperature\":2.5", "temperature: 2.5 is out of range"},
        {",\"temperature\":true", "temperature: expected a number"},
        {",\"top_p\":0", "top_p: 0 is out of range (0, 1]"},
        {",\"top_p\":1.01", "top_p: 1.01 is out of range"},
        {",\"min_p\":1", "min_p: 1 is out of range [0, 1)"},
        {",\"top_k\":-1", "top_k: -1 is out of range"},
        {",\"repetition_penalty\":0", "repetition_penalty: 0 is out of range (0, 10]"},
        {",\"presence_penalty\":-2.5", "presence_penalty: -2.5 is out of range [-2, 2]"},
        {",\"frequency_penalty\":3", "frequency_penalty: 3 is out of range"},
        {",\"seed\":1.5", "seed: expected an integer"},
        {",\"seed\":9007199254740993", "seed: expected an integer"},
        {",\"stop\":5", "stop: expected a string or an array"},
        {",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop: at most 4"},
        {",\"stop\":[\"\"]", "stop[0]: expected 1..256 bytes"},
        {",\"stop\":[\"a\",7]", "stop[1]: expected a string"},
        {",\"logprobs\":\"yes\"", "logprobs: expected true or false"},
        {",\"top_logprobs\":3", "top_logprobs: needs \"logprobs\": true"},
        {",\"logprobs\":true,\"top_logprobs\":21", "top_logprobs: 21 is out of range [0, 20]"},
        {",\"adapter\":\"../etc\"", "adapter: expected a name"},
        {",\"adapter\":\"a b\"", "adapter: expected a name"},
        {",\"adapter\":7", "adapter: expected a name"},
        {",\"deadline_ms\":0", "deadline_ms: 0 is out of range"},
        {",\"response_format\":{\"type\":\"json_schema\"}",
         "response_format.json_schema: expected an object"},
        {",\"response_format\":{\"type\":\"grammar\"}", "response_format: expected"},
        {",\"response_format\":\"text\"", "response_format: expected"},
        {",\"date_string\":\"\"", "date_string: expected 1..64 bytes"},
        {",\"date_string\":7", "date_string: expected 1..64 bytes"},
        {",\"date_string\":[\"26 Jul 2024\"]", "date_string: expected"},
        {",\"date_string\":\"26 Jul\\n2024\"", "date_string: expected"},
        {",\"date_string\":\"\\u007f\"", "date_string: expected"},
        {",\"date_string\":\"\\u0085\"", "date_string: expected"},
        {",\"date_string\":\"0123456789012345678901234567890123456789012345678901234567890123"
         "4\"", "date_string: expected"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error_wrapped("\"x\"", cases[i].extra, SVC_ERROR_INVALID_REQUEST, cases[i].msg);
}

static void test_limits(void)
{
    svc_limits saved = limits;
    limits.max_request_bytes = 40;
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\",\"messages\":[{\"role\":\"user\"}]}",
                 SVC_ERROR_INVALID_REQUEST, "exceeds the limit of 40", false);
    limits = saved;

    /* The body is not parsed at all, so only header addressing could answer. */
    limits.max_json_values = 10;
    char *many = wrap("\"x\"", ",\"junk\":[1,2,3,4,5,6,7,8,9]");
    if (many)
        expect_error(many, SVC_ERROR_INVALID_REQUEST, "more than 10 JSON values", false);
    free(many);
    /* Commas and brackets inside strings do not count. */
    char *json = wrap("\"[[[,,,{{{\\\"\\\\,,,\"", "");
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX];
    svc_error e = json ? parse(json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    check(e == SVC_ERROR_NONE, "brackets in strings are not values (%s)", err);
    if (!e)
        check(!strcmp(req->messages[0].parts[0].text, "[[[,,,{{{\"\\,,,"), "escapes decoded");
    svc_request_destroy(req);
    free(json);
    limits = saved;

    limits.max_messages = 2;
    expect_error("{\"id\":\"a\",\"reply_topic\":\"t\",\"messages\":[{},{},{}]}",
                 SVC_ERROR_INVALID_REQUEST, "expected 1..2 messages, got 3", true);
    limits = saved;

    limits.max_parts = 3;
    expect_error_wrapped("[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"a\"},"
                         "{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"a\"}]",
                         "", SVC_ERROR_INVALID_REQUEST, "more than 3 content parts");
    limits = saved;

    limits.max_text_bytes = 5;
    expect_error_wrapped("[{\"type\":\"text\",\"text\":\"abc\"},{\"type\":\"text\",\"text\":\"abc\"}]",
                         "", SVC_ERROR_INVALID_REQUEST,
                         "messages[0].content[1].text: the request's text exceeds the limit of 5");
    limits = saved;

    limits.max_id_bytes = 3;
    expect_error("{\"id\":\"abcd\",\"reply_topic\":\"t\"}", SVC_ERROR_INVALID_REQUEST,
                 "1..3 bytes", false);
    limits = saved;
}

/* A stream: false answer is one record: max_tokens x (1 + logprobs + top)
 * entries of SVC_REPLY_ENTRY_BYTES must fit limits.max_reply_bytes. */
static void test_reply_size(void)
{
    svc_limits saved = limits;
    limits.max_reply_bytes = 1 << 20;
    /* The issue's case: 4096 x 22 x 128 bytes is 11.5 MB. */
    expect_error_wrapped("\"hi\"",
                         ",\"stream\":false,\"logprobs\":true,\"top_logprobs\":20,"
                         "\"max_tokens\":4096",
                         SVC_ERROR_REPLY_TOO_LARGE, "over the limit of 1048576");
    check(svc_reply_bound(1, 4096, true, 20) == 4096u * 22 * SVC_REPLY_ENTRY_BYTES +
                                                 SVC_REPLY_FIXED_BYTES,
          "reply bound");
    const char *fit[] = {
        ",\"stream\":false,\"max_tokens\":4096",                 /* 4096 x 1 entries */
        ",\"stream\":false,\"logprobs\":true,\"top_logprobs\":20,\"max_tokens\":256",
        ",\"logprobs\":true,\"top_logprobs\":20,\"max_tokens\":4096", /* streamed */
    };
    for (size_t i = 0; i < sizeof fit / sizeof fit[0]; i++) {
        char *json = wrap("\"hi\"", fit[i]);
        svc_request *req = NULL;
        char err[SVC_ERRMSG_MAX] = "";
        svc_error e = json ? parse(json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
        check(e == SVC_ERROR_NONE, "%s: fits, got %s (%s)", fit[i], svc_error_code(e), err);
        svc_request_destroy(req);
        free(json);
    }
    limits = saved;
}

/* Parses the request made of `extra` and checks its n; returns whether it
 * parsed. */
static bool parses_with_n(const char *extra, uint32_t want_n)
{
    char *json = wrap("\"hi\"", extra);
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    svc_error e = json ? parse(json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
    bool ok = e == SVC_ERROR_NONE && req->n == want_n;
    check(ok, "%s: parses with n %u, got %s (%s), n %u", extra, want_n, svc_error_code(e), err,
          req ? req->n : 0);
    svc_request_destroy(req);
    free(json);
    return ok;
}

/* n choices: 1 by default, up to limits.max_n; with a seed, every choice's
 * seed s + i exact; the stream: false bound counts n answers. */
static void test_choices(void)
{
    parses_with_n("", 1);
    parses_with_n(",\"n\":null", 1);
    parses_with_n(",\"n\":3", 3);
    parses_with_n(",\"n\":8", 8);
    parses_with_n(",\"n\":3,\"seed\":9007199254740989", 3); /* s + 2 = 2^53 - 1 */
    parses_with_n(",\"n\":8,\"seed\":-9007199254740991", 8);  /* s + i nears zero */
    svc_limits saved = limits;
    limits.max_n = 2;
    expect_error_wrapped("\"hi\"", ",\"n\":3", SVC_ERROR_INVALID_REQUEST,
                         "n: 3 is out of range [1, 2]");
    limits = saved;

    limits.max_reply_bytes = 1 << 20;
    check(svc_reply_bound(4, 2048, false, 0) == 4u * 2048 * SVC_REPLY_ENTRY_BYTES +
                                                 SVC_REPLY_FIXED_BYTES,
          "reply bound of 4 choices");
    /* One answer of 2048 tokens fits 1 MiB, four do not. */
    parses_with_n(",\"stream\":false,\"max_tokens\":2048", 1);
    expect_error_wrapped("\"hi\"", ",\"stream\":false,\"n\":4,\"max_tokens\":2048",
                         SVC_ERROR_REPLY_TOO_LARGE,
                         "a stream:false reply of n 4 choices of 2048 tokens may need 1052672 "
                         "bytes, over the limit of 1048576; lower n, max_tokens");
    parses_with_n(",\"n\":4,\"max_tokens\":2048", 4); /* streamed */
    limits = saved;
}

/* Two tenants' reply-topic policies overlap when one topic name could be
 * allowed by both (config.c refuses such tenants). */
static void test_reply_policy_overlap(void)
{
    static const struct {
        const char *a, *b;
        bool overlap;
    } cases[] = {
        {"mllama.replies.acme,mllama.replies.acme.*", "mllama.replies.beta,mllama.replies.beta.*",
         false},
        {"mllama.replies.acme,mllama.replies.acme.*", "mllama.replies.acme2", false},
        {"mllama.replies.acme.*", "mllama.replies.acme.ui", true},
        {"mllama.replies.acme", "mllama.replies.*", true},
        {"x", "y,x", true},
        {"x", "xy", false},
        {"x*", "xy", true},
        {"ab*", "a*", true},
        {"ab*", "ac*", false},
        {"", "x", false},
    };
    char why[SVC_ERRMSG_MAX];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        svc_topic_policy a = {cases[i].a, NULL, 0}, b = {cases[i].b, NULL, 0};
        check(svc_topic_policy_overlap(&a, &b, why, sizeof why) == cases[i].overlap &&
                  svc_topic_policy_overlap(&b, &a, why, sizeof why) == cases[i].overlap,
              "'%s' and '%s': overlap should be %d", cases[i].a, cases[i].b, cases[i].overlap);
    }
    svc_topic_policy a = {"p.x", NULL, 0}, b = {"q,p.*", NULL, 0};
    check(svc_topic_policy_overlap(&a, &b, why, sizeof why) && strstr(why, "'p.x' and 'p.*'"),
          "the overlapping entries named: %s", why);
    check(svc_valid_tenant_name("acme_2-b", 8) && !svc_valid_tenant_name("Acme", 4) &&
              !svc_valid_tenant_name("a.b", 3) && !svc_valid_tenant_name("", 0) &&
              svc_valid_tenant_name("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 48) &&
              !svc_valid_tenant_name("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 49),
          "tenant names: [a-z0-9_-]{1,48}");
}

/* The reply-topic policy: exact names and prefixes; never the reserved
 * topics or Kafka's own, whatever the list says. */
static void test_reply_topic_policy(void)
{
    const char *reserved[] = {"mllama.requests", "mllama.cancel", "mllama.dlt"};
    svc_topic_policy p = {"mllama.replies,mllama.replies.*,team-a.*,mllama.*", reserved, 3};
    char err[SVC_ERRMSG_MAX];
    check(svc_topic_policy_check(&p, err, sizeof err), "policy accepted (%s)", err);
    static const struct {
        const char *topic;
        bool allowed;
    } cases[] = {
        {"mllama.replies", true},      {"mllama.replies.eu-1", true},
        {"team-a.x", true},            {"mllama.other", true},
        {"mllama.requests", false},    {"mllama.cancel", false},
        {"mllama.dlt", false},         {"__consumer_offsets", false},
        {"__transaction_state", false}, {"team-b.x", false},
        {"team-a", false},             {"mllama replies", false},
        {"", false},                   {"..", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check(svc_reply_topic_allowed(&p, cases[i].topic, strlen(cases[i].topic)) ==
                  cases[i].allowed,
              "'%s': allowed should be %d", cases[i].topic, cases[i].allowed);
    /* Not NUL-terminated: only len bytes count. */
    check(svc_reply_topic_allowed(&p, "mllama.repliesXYZ", 14), "length-bounded topic");
    svc_topic_policy exact = {"mllama.replies", reserved, 3};
    check(!svc_reply_topic_allowed(&exact, "mllama.replies", 13) &&
              !svc_reply_topic_allowed(&exact, "mllama.replies.x", 16),
          "an exact entry matches only its own name");
    char long_topic[SVC_TOPIC_NAME_MAX + 2];
    memset(long_topic, 'a', sizeof long_topic);
    svc_topic_policy any_a = {"a*", reserved, 3};
    check(svc_reply_topic_allowed(&any_a, long_topic, SVC_TOPIC_NAME_MAX) &&
              !svc_reply_topic_allowed(&any_a, long_topic, SVC_TOPIC_NAME_MAX + 1),
          "Kafka's length limit holds under a prefix");
    svc_topic_policy none = {"", reserved, 3};
    check(!svc_reply_topic_allowed(&none, "mllama.replies", 14), "an empty list allows nothing");

    static const struct {
        const char *list;
        const char *why;
    } bad[] = {
        {"mllama.dlt", "never receive replies"},
        {"ok,__consumer_offsets", "entry 1"},
        {"__*", "Kafka's own"},
        {"*", "expected a topic name"},
        {"a,,b", "entry 1"},
        {"a b", "expected a topic name"},
        {"a*b", "expected a topic name"},
        {"..", "expected a topic name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        svc_topic_policy q = {bad[i].list, reserved, 3};
        err[0] = '\0';
        check(!svc_topic_policy_check(&q, err, sizeof err) && strstr(err, bad[i].why),
              "'%s' refused with '%s': got '%s'", bad[i].list, bad[i].why, err);
    }
    check(!strcmp(svc_error_code(SVC_ERROR_REPLY_TOPIC_NOT_ALLOWED), "reply_topic_not_allowed") &&
              !strcmp(svc_error_code(SVC_ERROR_REPLY_TOO_LARGE), "reply_too_large") &&
              !strcmp(svc_error_code(SVC_ERROR_REPLY_UNDELIVERABLE), "reply_undeliverable"),
          "reply error codes");
}

/* date_string: kept as given when it is 1..64 bytes of UTF-8 without control
 * characters (the refusals are in test_option_errors). */
static void test_date_string(void)
{
    static const char *const good[] = {
        "26 Jul 2024", "01 Dec 2026", "2024-07-26", "26 juil. 2024",
        "\xe4\xbb\x8a\xe6\x97\xa5", /* U+4ECA U+65E5, two CJK characters */
        "0123456789012345678901234567890123456789012345678901234567890123", /* 64 bytes */
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char extra[128];
        snprintf(extra, sizeof extra, ",\"date_string\":\"%s\"", good[i]);
        char *json = wrap("\"x\"", extra);
        svc_request *req = NULL;
        char err[SVC_ERRMSG_MAX] = "";
        svc_error e = json ? parse(json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
        check(e == SVC_ERROR_NONE && req->date_string && !strcmp(req->date_string, good[i]),
              "date_string '%s': %s", good[i], e ? err : "");
        svc_request_destroy(req);
        free(json);
    }
    check(svc_valid_date_string("26 Jul 2024", 11) && !svc_valid_date_string("", 0) &&
              !svc_valid_date_string("26\tJul", 6) && !svc_valid_date_string("\xc2\x9f", 2) &&
              svc_valid_date_string("\xc2\xa0", 2) && !svc_valid_date_string("\xc2", 1) &&
              !svc_valid_date_string("\xff", 1),
          "svc_valid_date_string: C0, C1 and invalid UTF-8 refused, U+00A0 kept");
}

static void test_validators(void)
{
    check(svc_valid_topic("a.b_c-D9", 8) && !svc_valid_topic("", 0) &&
              !svc_valid_topic(".", 1) && !svc_valid_topic("a b", 3),
          "topic names");
    char long_topic[SVC_TOPIC_NAME_MAX + 1];
    memset(long_topic, 'a', sizeof long_topic);
    check(svc_valid_topic(long_topic, SVC_TOPIC_NAME_MAX) &&
              !svc_valid_topic(long_topic, SVC_TOPIC_NAME_MAX + 1),
          "topic length");
    check(svc_valid_adapter_name("x", 1) && !svc_valid_adapter_name(".x", 2) &&
              !svc_valid_adapter_name("a/b", 3),
          "adapter names");
    check(svc_valid_sha256("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64) &&
              !svc_valid_sha256("0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
                                64),
          "sha256 spelling");
    check(!strcmp(svc_error_code(SVC_ERROR_CONTEXT_LENGTH_EXCEEDED), "context_length_exceeded") &&
              !strcmp(svc_error_code(SVC_ERROR_IMAGE_TOO_LARGE), "image_too_large"),
          "error codes");
}

int main(void)
{
    svc_limits_default(&limits);
    test_minimal_and_defaults();
    test_all_fields();
    test_nulls_and_neutral_values();
    test_alias_and_single_stop();
    test_precedence();
    test_deadline();
    test_body_errors();
    test_message_errors();
    test_image_errors();
    test_option_errors();
    test_limits();
    test_reply_size();
    test_choices();
    test_reply_topic_policy();
    test_reply_policy_overlap();
    test_date_string();
    test_validators();
    test_json_schema();
    test_json_schema_bound();
    test_logit_bias();
    test_tools();
    return check_done();
}

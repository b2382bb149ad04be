/* Part 2 of test_request (one executable, test_request.h): response_format
 * json_schema as the parser takes it: OpenAI's shape, the name's spelling,
 * the schema kept as compact text, and limits.max_schema_bytes. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "test_request.h"

/* A request whose response_format is {"type":"json_schema","json_schema":JS}. */
static char *wrap_schema(const char *js)
{
    static const char fmt[] = ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":%s}";
    size_t n = sizeof fmt + strlen(js);
    char *extra = malloc(n);
    if (!extra)
        return NULL;
    snprintf(extra, n, fmt, js);
    char *json = wrap("\"x\"", extra);
    free(extra);
    return json;
}

void test_json_schema(void)
{
    /* Accepted shapes: the schema is kept as compact text, whatever its
     * spacing; strict and description are optional; a boolean schema. */
    static const struct {
        const char *js, *text, *name;
        bool strict;
    } good[] = {
        {"{\"name\":\"invoice\",\"schema\":{\"type\": \"object\",\n \"properties\": {\"n\": "
         "{\"type\":\"integer\"}}},\"strict\":true}",
         "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}}}", "invoice", true},
        {"{\"name\":\"A-b_9\",\"description\":\"d\",\"schema\":{\"type\":\"string\"}}",
         "{\"type\":\"string\"}", "A-b_9", false},
        {"{\"name\":\"t\",\"schema\":true,\"strict\":false,\"extra\":1}", "true", "t", false},
        {"{\"name\":\"t\",\"schema\":{},\"strict\":null,\"description\":null}", "{}", "t", false},
        {"{\"name\":\"0123456789012345678901234567890123456789012345678901234567890123\","
         "\"schema\":{\"enum\":[\"\\u00e9\",1.5]}}",
         "{\"enum\":[\"\xc3\xa9\",1.5]}", "0123456789012345678901234567890123456789012345678901234567890123",
         false},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char *json = wrap_schema(good[i].js);
        svc_request *req = NULL;
        char err[SVC_ERRMSG_MAX] = "";
        svc_error e = json ? parse(json, &req, err, sizeof err) : SVC_ERROR_INTERNAL;
        check(e == SVC_ERROR_NONE, "json_schema %zu accepted: %s", i, err);
        if (e == SVC_ERROR_NONE) {
            check(req->json_schema && !strcmp(req->json_schema, good[i].text) &&
                      req->json_schema_len == strlen(good[i].text),
                  "json_schema %zu: text '%s', want '%s'", i,
                  req->json_schema ? req->json_schema : "(null)", good[i].text);
            check(!strcmp(req->json_schema_name, good[i].name) &&
                      req->json_schema_strict == good[i].strict && !req->json_object,
                  "json_schema %zu: name and strict", i);
        }
        svc_request_destroy(req);
        free(json);
    }

    /* Without response_format, or with text or json_object: no schema. */
    char *plain = wrap("\"x\"", ",\"response_format\":{\"type\":\"json_object\"}");
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    check(plain && parse(plain, &req, err, sizeof err) == SVC_ERROR_NONE && req->json_object &&
              !req->json_schema && !req->json_schema_name,
          "json_object carries no schema");
    svc_request_destroy(req);
    free(plain);

    /* Each refused shape names its field. */
    static const struct {
        const char *js, *msg;
    } bad[] = {
        {"\"invoice\"", "response_format.json_schema: expected an object"},
        {"null", "response_format.json_schema: expected an object"},
        {"{\"schema\":{}}", "response_format.json_schema.name: expected 1..64 characters"},
        {"{\"name\":\"\",\"schema\":{}}", "json_schema.name: expected 1..64"},
        {"{\"name\":\"a b\",\"schema\":{}}", "json_schema.name: expected"},
        {"{\"name\":\"a.b\",\"schema\":{}}", "json_schema.name: expected"},
        {"{\"name\":7,\"schema\":{}}", "json_schema.name: expected"},
        {"{\"name\":\"01234567890123456789012345678901234567890123456789012345678901234\","
         "\"schema\":{}}", "json_schema.name: expected 1..64"},
        {"{\"name\":\"t\"}", "response_format.json_schema.schema: expected a JSON Schema"},
        {"{\"name\":\"t\",\"schema\":null}", "json_schema.schema: expected a JSON Schema"},
        {"{\"name\":\"t\",\"schema\":\"{}\"}", "json_schema.schema: expected a JSON Schema"},
        {"{\"name\":\"t\",\"schema\":[]}", "json_schema.schema: expected a JSON Schema"},
        {"{\"name\":\"t\",\"schema\":1}", "json_schema.schema: expected a JSON Schema"},
        {"{\"name\":\"t\",\"schema\":{},\"strict\":\"true\"}",
         "response_format.json_schema.strict: expected true or false"},
        {"{\"name\":\"t\",\"schema\":{},\"description\":5}",
         "response_format.json_schema.description: expected a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *json = wrap_schema(bad[i].js);
        check(json != NULL, "malloc");
        if (json)
            expect_error(json, SVC_ERROR_INVALID_REQUEST, bad[i].msg, true);
        free(json);
    }
}

/* limits.max_schema_bytes bounds the compact text: a schema of exactly the
 * bound passes, one byte more is refused with the bound in the message,
 * and pretty-printing does not count. */
void test_json_schema_bound(void)
{
    svc_limits saved = limits;
    static const char head[] = "{\"name\":\"t\",\"schema\":{\"description\":\"";
    static const char tail[] = "\"}}";
    const size_t fixed = strlen("{\"description\":\"\"}"); /* the compact text around the filler */
    limits.max_schema_bytes = 100;
    for (size_t extra = 0; extra < 2; extra++) {
        size_t filler = limits.max_schema_bytes - fixed + extra;
        char js[256];
        size_t n = (size_t)snprintf(js, sizeof js, "%s", head);
        memset(js + n, 'a', filler);
        snprintf(js + n + filler, sizeof js - n - filler, "%s", tail);
        char *json = wrap_schema(js);
        check(json != NULL, "malloc");
        if (!json)
            continue;
        if (extra) {
            expect_error(json, SVC_ERROR_INVALID_REQUEST,
                         "over the limit of 100 bytes (limits.max_schema_bytes)", true);
        } else {
            svc_request *req = NULL;
            char err[SVC_ERRMSG_MAX] = "";
            svc_error e = parse(json, &req, err, sizeof err);
            check(e == SVC_ERROR_NONE && req->json_schema_len == limits.max_schema_bytes,
                  "a schema of exactly max_schema_bytes passes: %s", err);
            svc_request_destroy(req);
        }
        free(json);
    }
    /* Escapes count as printed: 20 control characters print as 120 bytes. */
    char *json = wrap_schema("{\"name\":\"t\",\"schema\":{\"const\":\"\\u0001\\u0001\\u0001"
                             "\\u0001\\u0001\\u0001\\u0001\\u0001\\u0001\\u0001\\u0001\\u0001"
                             "\\u0001\\u0001\\u0001\\u0001\\u0001\\u0001\\u0001\\u0001\"}}");
    if (json)
        expect_error(json, SVC_ERROR_INVALID_REQUEST, "limits.max_schema_bytes", true);
    free(json);
    /* Whitespace outside strings is not counted. */
    char *spaced = wrap_schema("{\"name\":\"t\",\"schema\":{                                       "
                               "                                                            "
                               "                  \"type\"   :    \"string\"   }}");
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    check(spaced && parse(spaced, &req, err, sizeof err) == SVC_ERROR_NONE &&
              !strcmp(req->json_schema, "{\"type\":\"string\"}"),
          "whitespace of the record does not count against the bound: %s", err);
    svc_request_destroy(req);
    free(spaced);
    limits = saved;
}

/* Part 4 of test_request (one executable, test_request.h): tools as the
 * parser takes them: OpenAI's shapes (tools, tool_choice,
 * parallel_tool_calls, an assistant's tool_calls, a tool's result), each
 * tool's text kept exactly as written (the chat template prints it the way
 * Python's json.dumps does), the JSON Schema of a call (its references
 * moved with the parameters, and compiling), what tools exclude (images,
 * stop strings, another response_format) and a clear error for each
 * refusal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar/grammar.h"
#include "harness.h"
#include "test_request.h"

/* Two tools as a client writes them: numbers Python prints its own way
 * (1.0, 1e2), a reference into the parameters' own $defs, and a function
 * without parameters. */
#define WEATHER                                                                                  \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "     \
    "\"Weather at a place\", \"parameters\": {\"type\": \"object\", \"properties\": "         \
    "{\"place\": {\"$ref\": \"#/$defs/place\"}, \"days\": {\"type\": \"integer\", "           \
    "\"minimum\": 1.0, \"maximum\": 1e2}}, \"required\": [\"place\"], \"$defs\": {\"place\": " \
    "{\"type\": \"string\", \"enum\": [\"Paris\", \"Oslo\"]}}}}}"
#define CLOCK "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}"
#define TOOLS ",\"tools\":[" WEATHER " , " CLOCK "]"

static svc_error parse_extra(const char *content, const char *extra, svc_request **req, char *err,
                             size_t errlen)
{
    char *json = wrap(content, extra);
    svc_error e = json ? parse(json, req, err, errlen) : SVC_ERROR_INTERNAL;
    free(json);
    return e;
}

/* The call schema compiles (its moved references resolve) and names the
 * tools it allows, in order. */
static void check_call_schema(const svc_request *req, const char *const *names, size_t n,
                              const char *what)
{
    cJSON *schema = cJSON_ParseWithLength(req->tool_call_schema, req->tool_call_schema_len);
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(schema, "anyOf");
    check(schema && (n == 1) == (any == NULL), "%s: %s", what,
          n == 1 ? "one call, no anyOf" : "an anyOf of calls");
    for (size_t i = 0; i < n; i++) {
        const cJSON *call = any ? cJSON_GetArrayItem(any, (int)i) : schema;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(call, "properties");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(props, "name"), "const");
        check(cJSON_IsString(name) && !strcmp(name->valuestring, names[i]) &&
                  cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(call, "additionalProperties")),
              "%s: call %zu is %s's", what, i, names[i]);
    }
    cJSON_Delete(schema);
    ml_schema_limits lim;
    ml_schema_limits_default(&lim);
    ml_grammar *g = NULL;
    char err[256] = "";
    check(ml_grammar_compile_schema(req->tool_call_schema, req->tool_call_schema_len, &lim, &g,
                                    err, sizeof err) == ML_OK,
          "%s: the call schema compiles: %s", what, err);
    ml_grammar_unref(g);
}

static void test_tools_accepted(void)
{
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    svc_error e = parse_extra("\"Weather in Oslo?\"", TOOLS, &req, err, sizeof err);
    check(e == SVC_ERROR_NONE, "two tools: %s", err);
    if (!e) {
        check(req->n_tools == 2 && !strcmp(req->tools[0].name, "get_weather") &&
                  !strcmp(req->tools[1].name, "now"),
              "two tools, in order");
        check(req->tools[0].json_len == strlen(WEATHER) &&
                  !memcmp(req->tools[0].json, WEATHER, strlen(WEATHER)) &&
                  req->tools[1].json_len == strlen(CLOCK) &&
                  !memcmp(req->tools[1].json, CLOCK, strlen(CLOCK)),
              "each tool's text as written");
        check(req->tool_choice == SVC_TOOL_CHOICE_AUTO && req->parallel_tool_calls,
              "tool_choice auto and parallel_tool_calls true by default");
        static const char *const both[] = {"get_weather", "now"};
        check_call_schema(req, both, 2, "auto");
        check(strstr(req->tool_call_schema, "\"#/anyOf/0/properties/parameters/$defs/place\"") &&
                  strstr(req->tool_call_schema, "\"enum\":[\"Paris\",\"Oslo\"]"),
              "the reference moved with the parameters: %s", req->tool_call_schema);
    }
    svc_request_destroy(req);

    e = parse_extra("\"x\"", TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":"
                                   "{\"name\":\"get_weather\"}},\"parallel_tool_calls\":false",
                    &req, err, sizeof err);
    check(e == SVC_ERROR_NONE && req->tool_choice == SVC_TOOL_CHOICE_FUNCTION &&
              req->tool_named == 0 && !req->parallel_tool_calls,
          "a named function: %s", err);
    if (!e) {
        static const char *const one[] = {"get_weather"};
        check_call_schema(req, one, 1, "named");
        check(strstr(req->tool_call_schema, "\"#/properties/parameters/$defs/place\"") != NULL,
              "the named call's reference: %s", req->tool_call_schema);
    }
    svc_request_destroy(req);

    e = parse_extra("\"x\"", ",\"tools\":[" CLOCK "],\"tool_choice\":\"required\"", &req, err,
                    sizeof err);
    check(e == SVC_ERROR_NONE && req->tool_choice == SVC_TOOL_CHOICE_REQUIRED, "required: %s",
          err);
    if (!e) {
        static const char *const clock[] = {"now"};
        check_call_schema(req, clock, 1, "required, one tool");
    }
    svc_request_destroy(req);

    /* "none": tools parsed, nothing rendered or enforced, so an image and
     * stop strings are fine. */
    e = parse_extra("\"x\"", TOOLS ",\"tool_choice\":\"none\",\"stop\":[\"\\n\"]", &req, err,
                    sizeof err);
    check(e == SVC_ERROR_NONE && req->tool_choice == SVC_TOOL_CHOICE_NONE &&
              !req->tool_call_schema && req->n_tools == 2,
          "tool_choice none: %s", err);
    svc_request_destroy(req);
    /* Neutral values. */
    e = parse_extra("\"x\"", ",\"tools\":[],\"tool_choice\":\"none\",\"parallel_tool_calls\":null",
                    &req, err, sizeof err);
    check(e == SVC_ERROR_NONE && req->n_tools == 0 && req->tool_choice == SVC_TOOL_CHOICE_NONE,
          "no tools: %s", err);
    svc_request_destroy(req);
}

static void test_tool_history(void)
{
    static const char json[] =
        "{\"id\":\"r1\",\"reply_topic\":\"" TOPIC "\",\"messages\":["
        "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"place\\\": \\\"Oslo\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"{\\\"c\\\": 1.0}\"},"
        "{\"role\":\"tool\",\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]},"
        "{\"role\":\"assistant\",\"content\":\"Cold.\",\"tool_calls\":[]}]" TOOLS "}";
    svc_request *req = NULL;
    char err[SVC_ERRMSG_MAX] = "";
    svc_error e = parse(json, &req, err, sizeof err);
    check(e == SVC_ERROR_NONE, "a history with a call and results: %s", err);
    if (!e) {
        const svc_message *m = req->messages;
        check(req->n_messages == 5 && m[1].role == SVC_ROLE_ASSISTANT &&
                  !strcmp(m[1].tool_call_name, "get_weather") &&
                  !strcmp(m[1].tool_call_arguments, "{\"place\": \"Oslo\"}") && m[1].n_parts == 0,
              "the call: its name and arguments");
        check(m[2].role == SVC_ROLE_TOOL && !strcmp(m[2].content_json, "\"{\\\"c\\\": 1.0}\"") &&
                  !strcmp(m[3].content_json, "[{\"type\":\"text\",\"text\":\"ok\"}]"),
              "results: their content's JSON text as written ('%s', '%s')", m[2].content_json,
              m[3].content_json);
        check(!m[4].tool_call_name && m[4].n_parts == 1, "empty tool_calls: a plain answer");
    }
    svc_request_destroy(req);
}

static void test_tool_errors(void)
{
    static const struct {
        const char *content, *extra, *msg;
    } cases[] = {
        {"\"x\"", ",\"tools\":{}", "tools: expected an array"},
        {"\"x\"", ",\"tools\":[{\"type\":\"function\"}]", "tools[0].function.name: expected"},
        {"\"x\"", ",\"tools\":[{\"type\":\"retrieval\"}]", "tools[0]: expected {\"type\""},
        {"\"x\"", ",\"tools\":[7]", "tools[0]: expected"},
        {"\"x\"", ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a.b\"}}]",
         "tools[0].function.name: expected 1..64 characters"},
        {"\"x\"", ",\"tools\":[" CLOCK "," CLOCK "]", "tools[1].function.name: \"now\" is also"},
        {"\"x\"", ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                  "\"parameters\":[]}}]",
         "tools[0].function.parameters: expected a JSON Schema object"},
        {"\"x\"", ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                  "\"description\":7}}]",
         "tools[0].function.description: expected a string"},
        {"\"x\"", TOOLS ",\"tool_choice\":\"any\"", "tool_choice: expected"},
        {"\"x\"", TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}",
         "tool_choice.function.name: \"f\" is not one of the tools"},
        {"\"x\"", ",\"tool_choice\":\"required\"", "tool_choice: a choice other than"},
        {"\"x\"", TOOLS ",\"parallel_tool_calls\":1", "parallel_tool_calls: expected true"},
        {"\"x\"", TOOLS ",\"response_format\":{\"type\":\"json_object\"}",
         "response_format: only \"text\" goes with tools"},
        {"\"x\"", TOOLS ",\"stop\":\"\\n\"", "stop: stop strings do not go with tools"},
        {"[{\"type\":\"image\",\"sha256\":"
         "\"0000000000000000000000000000000000000000000000000000000000000000\"},"
         "{\"type\":\"text\",\"text\":\"x\"}]",
         TOOLS, "tools: tool calling does not work with images"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *json = wrap(cases[i].content, cases[i].extra);
        if (json)
            expect_error(json, SVC_ERROR_INVALID_REQUEST, cases[i].msg, true);
        free(json);
    }

    /* The tools and a result are read as written: a key spelled with
     * escapes (cJSON reads it, the prompt could not print it as written) is
     * refused, and so is a request the strict scanner cannot read. */
    char *escaped = wrap("\"x\"", ",\"t\\u006fols\":[" CLOCK "]");
    if (escaped)
        expect_error(escaped, SVC_ERROR_INVALID_REQUEST,
                     "tools: write the key \"tools\" without escapes", true);
    free(escaped);
    expect_error("{\"id\":\"r1\",\"reply_topic\":\"" TOPIC "\",\"messages\":[{\"role\":"
                 "\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"c\\u006fntent\":\"r\"}]}",
                 SVC_ERROR_INVALID_REQUEST,
                 "messages[1].content: write the key \"content\" without escapes", true);
    expect_error("{\"id\":\"r1\",\"reply_topic\":\"" TOPIC "\",\"messages\":[{\"role\":"
                 "\"user\",\"content\":\"x\"}],\"tools\":[" CLOCK "],\"date_string\":\"\x01\"}",
                 SVC_ERROR_INVALID_REQUEST, "tools: the request cannot be read as written", true);

    /* More tools than OpenAI allows. */
    size_t cap = 64 * (SVC_TOOLS_MAX + 2) + 16, at = 0;
    char *many = malloc(cap);
    if (many) {
        at += (size_t)snprintf(many, cap, ",\"tools\":[");
        for (int i = 0; i <= SVC_TOOLS_MAX; i++)
            at += (size_t)snprintf(many + at, cap - at,
                                   "%s{\"type\":\"function\",\"function\":{\"name\":\"f%d\"}}",
                                   i ? "," : "", i);
        snprintf(many + at, cap - at, "]");
        char *json = wrap("\"x\"", many);
        if (json)
            expect_error(json, SVC_ERROR_INVALID_REQUEST, "tools: 129 tools, at most 128", true);
        free(json);
        free(many);
    }

    static const struct {
        const char *message, *msg;
    } history[] = {
        {"{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"f\",\"arguments\":\"{}\"}},{\"type\":\"function\",\"function\":{\"name\":\"g\","
         "\"arguments\":\"{}\"}}]}",
         "messages[1].tool_calls: expected one call"},
        {"{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"f\",\"arguments\":\"[1]\"}}]}",
         "messages[1].tool_calls[0].function.arguments: expected a string holding a JSON "
         "object"},
        {"{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"f\",\"arguments\":{}}}]}",
         "messages[1].tool_calls[0].function.arguments: expected a string"},
        {"{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":"
         "\"f\\\"\",\"arguments\":\"{}\"}}]}",
         "messages[1].tool_calls[0].function.name: expected"},
        {"{\"role\":\"tool\",\"content\":7}", "messages[1].content: a tool result is a string"},
        {"{\"role\":\"tool\",\"content\":[{\"type\":\"image\",\"sha256\":\"00\"}]}",
         "messages[1].content: a tool result is a string"},
        {"{\"role\":\"tool\",\"content\":[]}", "messages[1].content: a tool result is a string"},
    };
    for (size_t i = 0; i < sizeof history / sizeof history[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"id\":\"r1\",\"reply_topic\":\"" TOPIC "\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"x\"},%s]}",
                 history[i].message);
        expect_error(json, SVC_ERROR_INVALID_REQUEST, history[i].msg, true);
    }
}

void test_tools(void)
{
    test_tools_accepted();
    test_tool_history();
    test_tool_errors();
}

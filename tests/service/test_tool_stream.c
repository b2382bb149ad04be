/* The tool-call scanner (service/protocol/tool_stream.c): a call fed in
 * every split (one byte at a time, whole, in uneven pieces) gives its name
 * once and its arguments' exact text; brackets and quotes inside strings,
 * scalar parameters, prose answers (held whitespace given back), a
 * whitespace-only answer, calls cut short, and the call ids. */
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "protocol/tool_stream.h"
#include "util.h"

typedef struct outcome {
    svc_buf content, args;
    int begins;
    char name[SVC_OPENAI_NAME_MAX + 1];
    bool called;
} outcome;

static void take(outcome *o, const svc_tool_stream *ts, svc_tool_delta d)
{
    if (d.content_len)
        svc_buf_printf(&o->content, "%.*s", (int)d.content_len, d.content);
    if (d.arguments_len)
        svc_buf_printf(&o->args, "%.*s", (int)d.arguments_len, d.arguments);
    if (d.call_begins) {
        o->begins++;
        snprintf(o->name, sizeof o->name, "%s", svc_tool_stream_name(ts));
    }
}

/* Feed text in pieces of `step` bytes (0: whole). */
static void run(const char *text, bool call, size_t step, outcome *o)
{
    memset(o, 0, sizeof *o);
    svc_buf_init(&o->content);
    svc_buf_init(&o->args);
    svc_tool_stream ts = {0};
    svc_tool_stream_init(&ts, call);
    size_t n = strlen(text);
    for (size_t at = 0; at < n;) {
        size_t k = step && step < n - at ? step : n - at;
        take(o, &ts, svc_tool_stream_feed(&ts, text + at, k));
        at += k;
    }
    take(o, &ts, svc_tool_stream_end(&ts));
    o->called = svc_tool_stream_called(&ts);
    svc_tool_stream_deinit(&ts);
}

static void done(outcome *o)
{
    svc_buf_deinit(&o->content);
    svc_buf_deinit(&o->args);
}

static const char *str(const svc_buf *b)
{
    return b->data ? b->data : "";
}

/* Every split of `text` gives name, arguments and content as wanted. */
static void expect(const char *text, bool call, const char *name, const char *args,
                   const char *content, bool called)
{
    static const size_t steps[] = {0, 1, 2, 3, 7};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        outcome o;
        run(text, call, steps[i], &o);
        check(o.begins == (name ? 1 : 0) && (!name || !strcmp(o.name, name)),
              "%s (pieces of %zu): the call begins %d times, name '%s'", text, steps[i], o.begins,
              o.name);
        check(!strcmp(str(&o.args), args), "%s (pieces of %zu): arguments '%s', want '%s'", text,
              steps[i], str(&o.args), args);
        check(!strcmp(str(&o.content), content), "%s (pieces of %zu): content '%s', want '%s'",
              text, steps[i], str(&o.content), content);
        check(o.called == called, "%s (pieces of %zu): called %d", text, steps[i], o.called);
        done(&o);
    }
}

static void test_calls(void)
{
    expect("{\"name\": \"get_weather\", \"parameters\": {\"place\": \"Oslo\", \"days\": 3}}",
           true, "get_weather", "{\"place\": \"Oslo\", \"days\": 3}", "", true);
    expect("{\"name\":\"f\",\"parameters\":{\"q\":\"a}b{\\\"]\",\"n\":[1,{\"x\":\"]\"}]}}", true,
           "f", "{\"q\":\"a}b{\\\"]\",\"n\":[1,{\"x\":\"]\"}]}", "", true);
    expect("{ \"name\" : \"n\" ,\n \"parameters\" : 42 }", true, "n", "42", "", true);
    expect("{\"name\":\"n\",\"parameters\":true}", true, "n", "true", "", true);
    expect("{\"name\":\"n\",\"parameters\":\"s\\\"}\"}", true, "n", "\"s\\\"}\"", "", true);
    expect("{\"name\": \"now\", \"parameters\": {}}", true, "now", "{}", "", true);
}

static void test_auto(void)
{
    expect("\n {\"name\": \"f\", \"parameters\": {\"a\": 1}}", false, "f", "{\"a\": 1}", "",
           true);
    expect("  Hello {x}", false, NULL, "", "  Hello {x}", false);
    expect("Plain.", false, NULL, "", "Plain.", false);
    expect(" \n", false, NULL, "", " \n", false);
    /* More whitespace than is held: prose from there. */
    char lead[SVC_TOOL_LEAD_MAX + 3];
    memset(lead, ' ', sizeof lead - 1);
    lead[sizeof lead - 2] = '{';
    lead[sizeof lead - 1] = '\0';
    expect(lead, false, NULL, "", lead, false);
}

static void test_cut_short(void)
{
    expect("{\"name\": \"get_wea", true, NULL, "", "", false);
    expect("{\"name\": \"f\", \"parameters\": {\"a\": 1", true, "f", "{\"a\": 1", "", false);
    expect("{\"name\": \"f\", \"parameters\": {\"a\": 1}", true, "f", "{\"a\": 1}", "", false);
    /* Not a call of this format: the parameters before the name are not
     * passed on, and nothing breaks. */
    expect("{\"parameters\": {\"a\": 1}, \"name\": \"f\"}", true, "f", "", "", true);
    expect("[1, 2]", true, NULL, "", "", false);
}

static void test_ids(void)
{
    char a[SVC_TOOL_CALL_ID_LEN + 1], b[SVC_TOOL_CALL_ID_LEN + 1], c[SVC_TOOL_CALL_ID_LEN + 1];
    svc_tool_call_id("req-1", 0, a);
    svc_tool_call_id("req-1", 0, b);
    svc_tool_call_id("req-1", 1, c);
    check(strlen(a) == SVC_TOOL_CALL_ID_LEN && !strncmp(a, "call_", 5) && !strcmp(a, b) &&
              strcmp(a, c) != 0,
          "ids: '%s' again for the same request and index, '%s' for another index", a, c);
    svc_tool_call_id("req-10", 0, b);
    svc_tool_call_id("req-1", 10, c);
    check(strcmp(b, c) != 0, "the id and the index are kept apart ('%s', '%s')", b, c);
}

int main(void)
{
    test_calls();
    test_auto();
    test_cut_short();
    test_ids();
    return check_done();
}

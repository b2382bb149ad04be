/* Tool calling in a request record: `tools`, `tool_choice`,
 * `parallel_tool_calls`, the history's calls and results, and the JSON
 * Schema of a call the worker compiles (protocol.h, svc_request.tools).
 *
 * Llama 3.2 Vision calls a function the Llama 3.1 way: the whole answer is
 * {"name": <function>, "parameters": <its arguments>}, one call per turn
 * (the published template renders one call per assistant message and
 * refuses more). A call is enforced by the grammar of that document: for
 * tool_choice "required" any tool's, for a named function that one's,
 * for "auto" the same grammar but bound only to an answer that starts
 * with '{' (the runtime's constraint, ml_sampling_params.tool_auto). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/json_span.h"
#include "protocol/request_internal.h"

/* Keywords whose values are data, not schemas: a "$ref" inside them is a
 * value like any other and keeps its text. */
static bool data_keyword(const char *k)
{
    static const char *const data[] = {"enum", "const", "default", "examples"};
    for (size_t i = 0; i < sizeof data / sizeof data[0]; i++)
        if (k && !strcmp(k, data[i]))
            return true;
    return false;
}

/* The parameters schema moves from the root of its own document to
 * `prefix` inside the call's: every "#/..." reference it holds is rewritten
 * to point where its target now is. Returns false out of memory. */
static bool move_refs(cJSON *node, const char *prefix)
{
    for (cJSON *m = node ? node->child : NULL; m; m = m->next) {
        if (m->string && !strcmp(m->string, "$ref") && cJSON_IsString(m) &&
            m->valuestring[0] == '#') {
            size_t n = strlen(prefix) + strlen(m->valuestring) + 1;
            char *moved = malloc(n);
            if (!moved)
                return false;
            snprintf(moved, n, "#%s%s", prefix, m->valuestring + 1);
            bool ok = cJSON_SetValuestring(m, moved) != NULL;
            free(moved);
            if (!ok)
                return false;
        } else if ((cJSON_IsObject(m) || cJSON_IsArray(m)) && !data_keyword(m->string) &&
                   !move_refs(m, prefix)) {
            return false;
        }
    }
    return true;
}

/* {"type": "object", "properties": {"name": {"const": name}, "parameters":
 * P}, "required": ["name", "parameters"], "additionalProperties": false},
 * P the function's parameters (their references moved under `prefix`) or,
 * without any, the empty object OpenAI takes an absent list to mean. NULL
 * out of memory. */
static cJSON *call_schema(const char *name, const cJSON *parameters, const char *prefix)
{
    cJSON *params = parameters ? cJSON_Duplicate(parameters, true) : cJSON_CreateObject();
    bool ok = params && (parameters ? move_refs(params, prefix)
                                    : cJSON_AddStringToObject(params, "type", "object") &&
                                          cJSON_AddFalseToObject(params, "additionalProperties"));
    cJSON *call = cJSON_CreateObject();
    cJSON *props = NULL, *name_schema = NULL;
    ok = ok && call && cJSON_AddStringToObject(call, "type", "object") &&
         (props = cJSON_AddObjectToObject(call, "properties")) &&
         (name_schema = cJSON_AddObjectToObject(props, "name")) &&
         cJSON_AddStringToObject(name_schema, "const", name);
    if (ok && cJSON_AddItemToObject(props, "parameters", params))
        params = NULL; /* the call's now */
    else
        ok = false;
    static const char *const required[] = {"name", "parameters"};
    cJSON *req = ok ? cJSON_CreateStringArray(required, 2) : NULL;
    if (req && cJSON_AddItemToObject(call, "required", req))
        req = NULL;
    else
        ok = false;
    ok = ok && cJSON_AddFalseToObject(call, "additionalProperties");
    cJSON_Delete(req);
    cJSON_Delete(params);
    if (!ok) {
        cJSON_Delete(call);
        return NULL;
    }
    return call;
}

/* The schema of one call of the tools tool_choice allows: the named one's,
 * or an anyOf over all of them (the root's references were each
 * function's own root's). */
static svc_error keep_call_schema(parser *p, const cJSON *tools)
{
    svc_request *req = &p->r->pub;
    bool one = req->tool_choice == SVC_TOOL_CHOICE_FUNCTION || req->n_tools == 1;
    cJSON *schema = one ? NULL : cJSON_CreateObject();
    cJSON *any = one ? NULL : cJSON_AddArrayToObject(schema, "anyOf");
    if (!one && !any) {
        cJSON_Delete(schema);
        return out_of_memory(p);
    }
    size_t i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        if (!one || i == req->tool_named) {
            char prefix[64];
            if (one)
                snprintf(prefix, sizeof prefix, "/properties/parameters");
            else
                snprintf(prefix, sizeof prefix, "/anyOf/%zu/properties/parameters",
                         (size_t)cJSON_GetArraySize(any));
            const cJSON *fn = member(t, "function");
            cJSON *call = call_schema(req->tools[i].name, member(fn, "parameters"), prefix);
            if (!call || (!one && !cJSON_AddItemToArray(any, call))) {
                cJSON_Delete(call);
                cJSON_Delete(schema);
                return out_of_memory(p);
            }
            if (one)
                schema = call;
        }
        i++;
    }
    svc_error e = svc_request_keep_schema(p, schema, "tools (the schema of a call)",
                                          &req->tool_call_schema, &req->tool_call_schema_len);
    cJSON_Delete(schema);
    return e;
}

/* Member `key` of obj as written in the body (json_span.h): what the chat
 * template prints must be the text the client wrote. The body is scanned
 * once, at the first call. An absent span after reporting why: the body
 * cannot be read strictly, or the key is spelled with escapes (cJSON reads
 * "t\u006fols" as tools; the span scanner compares keys as written, and a
 * request has no reason to escape a plain name). `field` names it. */
static svc_span written_member(parser *p, svc_span obj, const char *key, const char *field)
{
    if (!p->root.p) {
        p->root = svc_json_value(p->body, p->body_len);
        if (!p->root.p) {
            fail(p, SVC_ERROR_INVALID_REQUEST,
                 "%s: the request cannot be read as written (a raw control character or "
                 "invalid UTF-8 in a string, an unpaired surrogate escape, a number over %d "
                 "characters or nesting deeper than %d levels)",
                 field, SVC_JSON_NUMBER_MAX, SVC_JSON_DEPTH_MAX);
            return (svc_span){NULL, 0};
        }
    }
    svc_span v = svc_json_member(obj.p ? obj : p->root, key);
    if (!v.p)
        fail(p, SVC_ERROR_INVALID_REQUEST, "%s: write the key \"%s\" without escapes", field,
             key);
    return v;
}

static svc_error parse_tool(parser *p, const cJSON *t, size_t i, svc_span text, svc_tool *out)
{
    const cJSON *type = member(t, "type");
    if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tools[%zu]: expected {\"type\": \"function\", \"function\": {...}}", i);
    const cJSON *fn = member(t, "function");
    const cJSON *name = cJSON_IsObject(fn) ? member(fn, "name") : NULL;
    if (!cJSON_IsString(name) || !svc_valid_openai_name(name->valuestring,
                                                         strlen(name->valuestring)))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tools[%zu].function.name: expected 1..%d characters [A-Za-z0-9_-]", i,
                    SVC_OPENAI_NAME_MAX);
    const cJSON *description = member(fn, "description");
    if (description && !cJSON_IsString(description))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tools[%zu].function.description: expected a string", i);
    const cJSON *params = member(fn, "parameters");
    if (params && !cJSON_IsObject(params))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tools[%zu].function.parameters: expected a JSON Schema object", i);
    const cJSON *strict = member(fn, "strict");
    if (strict && !cJSON_IsBool(strict))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tools[%zu].function.strict: expected true or false", i);
    /* The tool is printed into the prompt: its text counts as message text. */
    if (text.n > p->lim->max_text_bytes - p->r->pub.n_text_bytes)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tools[%zu]: the request's text exceeds the limit of %zu bytes", i,
                    p->lim->max_text_bytes);
    p->r->pub.n_text_bytes += text.n;
    out->name = svc_arena_strndup(&p->r->arena, name->valuestring, strlen(name->valuestring));
    out->json = svc_arena_strndup(&p->r->arena, text.p, text.n);
    out->json_len = text.n;
    return out->name && out->json ? SVC_ERROR_NONE : out_of_memory(p);
}

/* tools, parsed from arr, their text as written. */
static svc_error parse_tool_list(parser *p, const cJSON *tools, svc_span arr)
{
    svc_request *req = &p->r->pub;
    size_t n = (size_t)cJSON_GetArraySize(tools);
    if (n > SVC_TOOLS_MAX)
        return fail(p, SVC_ERROR_INVALID_REQUEST, "tools: %zu tools, at most %d", n,
                    SVC_TOOLS_MAX);
    svc_tool *list = svc_arena_alloc(&p->r->arena, n * sizeof *list);
    if (!list)
        return out_of_memory(p);
    size_t i = 0;
    const cJSON *t;
    svc_span text = svc_json_first(arr);
    cJSON_ArrayForEach(t, tools)
    {
        svc_error e = parse_tool(p, t, i, text, &list[i]);
        if (e)
            return e;
        for (size_t k = 0; k < i; k++)
            if (!strcmp(list[k].name, list[i].name))
                return fail(p, SVC_ERROR_INVALID_REQUEST,
                            "tools[%zu].function.name: \"%s\" is also tools[%zu]'s", i,
                            list[i].name, k);
        text = svc_json_next(arr, text);
        i++;
    }
    req->tools = list;
    req->n_tools = n;
    return SVC_ERROR_NONE;
}

/* tool_choice: "none", "auto", "required" or {"type": "function",
 * "function": {"name": N}}; absent: "auto" with tools, "none" without. */
static svc_error parse_tool_choice(parser *p, const cJSON *choice)
{
    svc_request *req = &p->r->pub;
    if (!choice) {
        req->tool_choice = req->n_tools ? SVC_TOOL_CHOICE_AUTO : SVC_TOOL_CHOICE_NONE;
        return SVC_ERROR_NONE;
    }
    static const struct {
        const char *name;
        svc_tool_choice choice;
    } modes[] = {{"none", SVC_TOOL_CHOICE_NONE},
                 {"auto", SVC_TOOL_CHOICE_AUTO},
                 {"required", SVC_TOOL_CHOICE_REQUIRED}};
    const cJSON *fn = cJSON_IsObject(choice) ? member(choice, "function") : NULL;
    const cJSON *name = cJSON_IsObject(fn) ? member(fn, "name") : NULL;
    const cJSON *type = cJSON_IsObject(choice) ? member(choice, "type") : NULL;
    bool named = cJSON_IsString(type) && !strcmp(type->valuestring, "function") &&
                 cJSON_IsString(name);
    bool known = named;
    for (size_t k = 0; !known && cJSON_IsString(choice) && k < sizeof modes / sizeof modes[0];
         k++)
        if (!strcmp(choice->valuestring, modes[k].name)) {
            req->tool_choice = modes[k].choice;
            known = true;
        }
    if (!known)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": "
                    "\"function\", \"function\": {\"name\": ...}}");
    if (req->tool_choice == SVC_TOOL_CHOICE_NONE && !named)
        return SVC_ERROR_NONE;
    if (!req->n_tools)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tool_choice: a choice other than \"none\" needs tools");
    if (!named)
        return SVC_ERROR_NONE;
    for (size_t i = 0; i < req->n_tools; i++)
        if (!strcmp(req->tools[i].name, name->valuestring)) {
            req->tool_choice = SVC_TOOL_CHOICE_FUNCTION;
            req->tool_named = i;
            return SVC_ERROR_NONE;
        }
    return fail(p, SVC_ERROR_INVALID_REQUEST,
                "tool_choice.function.name: \"%.64s\" is not one of the tools", name->valuestring);
}

svc_error svc_request_parse_tools(parser *p, const cJSON *root)
{
    svc_request *req = &p->r->pub;
    const cJSON *given = member(root, "tools");
    if (given && !cJSON_IsArray(given))
        return fail(p, SVC_ERROR_INVALID_REQUEST, "tools: expected an array of tools");
    /* The tools are read from their text as written, the one the prompt
     * prints (written_member), so what is checked is what is rendered
     * (were "tools" given twice, once with an escaped key, cJSON and the
     * scanner would each see another). */
    cJSON *tools = NULL;
    svc_span arr = {NULL, 0};
    if (given && cJSON_GetArraySize(given) > 0) {
        arr = written_member(p, (svc_span){NULL, 0}, "tools", "tools");
        if (!arr.p)
            return p->first;
        if (!(tools = cJSON_ParseWithLength(arr.p, arr.n)))
            return out_of_memory(p);
    }
    svc_error e = SVC_ERROR_NONE;
    if (tools && !cJSON_IsArray(tools))
        e = fail(p, SVC_ERROR_INVALID_REQUEST, "tools: expected an array of tools");
    if (!e && tools)
        e = parse_tool_list(p, tools, arr);
    req->parallel_tool_calls = true;
    if (!e)
        e = opt_bool(p, root, "parallel_tool_calls", &req->parallel_tool_calls);
    if (!e)
        e = parse_tool_choice(p, member(root, "tool_choice"));
    /* What a call could not be answered with: its document is the answer,
     * so there is no room for another format, and a stop string met inside
     * the arguments would cut the call short. */
    bool calls = req->tool_choice != SVC_TOOL_CHOICE_NONE;
    if (!e && calls && (req->json_object || req->json_schema))
        e = fail(p, SVC_ERROR_INVALID_REQUEST,
                 "response_format: only \"text\" goes with tools (a tool_choice other than "
                 "\"none\"): a call is a document of its own");
    if (!e && calls && req->n_stop)
        e = fail(p, SVC_ERROR_INVALID_REQUEST,
                 "stop: stop strings do not go with tools (a tool_choice other than "
                 "\"none\"): one inside a call's arguments would cut it short");
    if (!e && calls)
        e = keep_call_schema(p, tools);
    cJSON_Delete(tools);
    return e;
}

svc_error svc_request_check_tools(parser *p)
{
    const svc_request *req = &p->r->pub;
    if (req->tool_choice != SVC_TOOL_CHOICE_NONE && req->n_images)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "tools: tool calling does not work with images in the prompt (Llama 3.2 "
                    "Vision calls tools for text-only prompts; the published chat template "
                    "would drop the image); send tool_choice \"none\" or no image");
    return SVC_ERROR_NONE;
}

/* Message i's span in the body: the messages are walked once, the first
 * time one is needed. */
static svc_span message_span(parser *p, size_t i)
{
    const svc_request *req = &p->r->pub;
    if (!p->msg_spans) {
        svc_span msgs = written_member(p, (svc_span){NULL, 0}, "messages", "messages");
        if (!svc_json_is(msgs, '['))
            return (svc_span){NULL, 0};
        p->msg_spans = svc_arena_alloc(&p->r->arena, req->n_messages * sizeof *p->msg_spans);
        if (!p->msg_spans) {
            out_of_memory(p);
            return (svc_span){NULL, 0};
        }
        svc_span m = svc_json_first(msgs);
        for (size_t k = 0; k < req->n_messages; k++, m = svc_json_next(msgs, m))
            p->msg_spans[k] = m;
    }
    return p->msg_spans[i];
}

svc_error svc_request_parse_tool_content(parser *p, svc_message *m, size_t i)
{
    /* Read from its text as written, the one the prompt prints. */
    svc_span span = message_span(p, i);
    char field[64];
    snprintf(field, sizeof field, "messages[%zu].content", i);
    svc_span c = span.p ? written_member(p, span, "content", field) : span;
    if (!c.p)
        return p->first ? p->first : out_of_memory(p);
    cJSON *content = cJSON_ParseWithLength(c.p, c.n);
    if (!content)
        return out_of_memory(p);
    bool text = cJSON_IsString(content);
    const cJSON *parts = cJSON_IsArray(content) ? content : NULL, *part;
    cJSON_ArrayForEach(part, parts)
    {
        const cJSON *type = member(part, "type");
        text = cJSON_IsString(type) && !strcmp(type->valuestring, "text") &&
               cJSON_IsString(member(part, "text"));
        if (!text)
            break;
    }
    cJSON_Delete(content);
    if (!text)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "%s: a tool result is a string or an array of text parts", field);
    if (c.n > p->lim->max_text_bytes - p->r->pub.n_text_bytes)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "%s: the request's text exceeds the limit of %zu bytes", field,
                    p->lim->max_text_bytes);
    p->r->pub.n_text_bytes += c.n;
    m->content_json = svc_arena_strndup(&p->r->arena, c.p, c.n);
    return m->content_json ? SVC_ERROR_NONE : out_of_memory(p);
}

svc_error svc_request_parse_tool_call(parser *p, svc_message *m, const cJSON *calls, size_t i)
{
    if (!cJSON_IsArray(calls) || cJSON_GetArraySize(calls) != 1)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].tool_calls: expected one call (the model makes one call per "
                    "turn; its chat template refuses more)", i);
    const cJSON *call = calls->child;
    const cJSON *type = member(call, "type");
    const cJSON *fn = member(call, "function");
    const cJSON *name = cJSON_IsObject(fn) ? member(fn, "name") : NULL;
    const cJSON *args = cJSON_IsObject(fn) ? member(fn, "arguments") : NULL;
    if (!cJSON_IsObject(call) || (type && !(cJSON_IsString(type) &&
                                            !strcmp(type->valuestring, "function"))))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].tool_calls[0]: expected {\"type\": \"function\", "
                    "\"function\": {\"name\": ..., \"arguments\": ...}}", i);
    if (!cJSON_IsString(name) || !svc_valid_openai_name(name->valuestring,
                                                         strlen(name->valuestring)))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].tool_calls[0].function.name: expected 1..%d characters "
                    "[A-Za-z0-9_-]", i, SVC_OPENAI_NAME_MAX);
    size_t len = cJSON_IsString(args) ? strlen(args->valuestring) : 0;
    if (!svc_json_is(svc_json_value(cJSON_IsString(args) ? args->valuestring : "", len), '{'))
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].tool_calls[0].function.arguments: expected a string holding "
                    "a JSON object", i);
    if (len > p->lim->max_text_bytes - p->r->pub.n_text_bytes)
        return fail(p, SVC_ERROR_INVALID_REQUEST,
                    "messages[%zu].tool_calls[0].function.arguments: the request's text exceeds "
                    "the limit of %zu bytes", i, p->lim->max_text_bytes);
    p->r->pub.n_text_bytes += len;
    m->tool_call_name =
        svc_arena_strndup(&p->r->arena, name->valuestring, strlen(name->valuestring));
    m->tool_call_arguments = svc_arena_strndup(&p->r->arena, args->valuestring, len);
    return m->tool_call_name && m->tool_call_arguments ? SVC_ERROR_NONE : out_of_memory(p);
}

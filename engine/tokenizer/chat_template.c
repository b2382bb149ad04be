/* The Llama 3.2 Vision Instruct chat template (see chat_template.h). */
#include "tokenizer/chat_template.h"

#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tokenizer/pyjson.h"
#include "tokenizer/unicode.h"

/* The special tokens the template writes. Only these become special ids in
 * ml_chat_encode; the same text inside a message is encoded as text. */
typedef enum marker {
    MARKER_BOS,
    MARKER_HEADER_START,
    MARKER_HEADER_END,
    MARKER_EOT,
    MARKER_IMAGE,
    N_MARKERS,
} marker;

static const char *const MARKER_TEXT[N_MARKERS] = {
    [MARKER_BOS] = "<|begin_of_text|>",
    [MARKER_HEADER_START] = "<|start_header_id|>",
    [MARKER_HEADER_END] = "<|end_header_id|>",
    [MARKER_EOT] = "<|eot_id|>",
    [MARKER_IMAGE] = "<|image|>",
};

static const char HEADER_GAP[] = "\n\n";
static const char SYSTEM_PREAMBLE[] = "Cutting Knowledge Date: December 2023\nToday Date: ";
static const char DATE_END[] = "\n\n";
static const char IMAGE_WITH_SYSTEM[] = "Prompting with images is incompatible with system messages.";
/* The tool branches: the system block's first line, the tools' user block
 * before the tools, each tool's end, and an assistant call around its
 * arguments. */
static const char TOOLS_ENVIRONMENT[] = "Environment: ipython\n";
static const char TOOLS_PROMPT[] =
    "Given the following functions, please respond with a JSON for a function call "
    "with its proper arguments that best answers the given prompt.\n\n"
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument "
    "name and its value}.Do not use variables.\n\n";
static const char TOOL_END[] = "\n\n";
static const char CALL_NAME[] = "{\"name\": \"";
static const char CALL_PARAMETERS[] = "\", \"parameters\": ";
static const char CALL_END[] = "}";
/* The header tool results get, whichever of the two roles sent them. */
static const char TOOL_RESULT_ROLE[] = "ipython";
/* The indent the template gives tojson for the tools. */
#define TOOLS_JSON_INDENT 4
/* Room for pyjson's reason, which the template's message wraps. */
#define JSON_ERR_BYTES 160

/* ---- the date ------------------------------------------------------------ */

/* %b of the C locale: the template's strftime_now runs in Python, whose
 * default is the C locale whatever the environment says. */
static const char *const MONTH_ABBR[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
/* The years %Y writes in 4 digits. */
#define DATE_YEAR_MIN 1000
#define DATE_YEAR_MAX 9999

ml_status ml_chat_format_date(time_t t, char out[ML_CHAT_DATE_BYTES])
{
    struct tm utc;
    if (!gmtime_r(&t, &utc) || utc.tm_mon < 0 || utc.tm_mon > 11 ||
        utc.tm_year > DATE_YEAR_MAX - 1900 || utc.tm_year < DATE_YEAR_MIN - 1900) {
        memcpy(out, ML_CHAT_DEFAULT_DATE, sizeof ML_CHAT_DEFAULT_DATE);
        return ML_ERR_INVALID_ARG;
    }
    snprintf(out, ML_CHAT_DATE_BYTES, "%02d %s %04d", utc.tm_mday, MONTH_ABBR[utc.tm_mon],
             utc.tm_year + 1900);
    return ML_OK;
}

const char *ml_chat_date_today(char out[ML_CHAT_DATE_BYTES])
{
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0 ||
        ml_chat_format_date(now.tv_sec, out) != ML_OK)
        memcpy(out, ML_CHAT_DEFAULT_DATE, sizeof ML_CHAT_DEFAULT_DATE);
    return out;
}

/* ---- rendering ------------------------------------------------------------ */

/* One marker the template wrote, at byte `at` of the rendered prompt. */
typedef struct mark {
    size_t at;
    marker what;
} mark;

/* Rendering runs twice: once counting (buf NULL), once writing. marks, when
 * not NULL, receives every marker written (room for the count of the first
 * pass); n_marks counts them either way. */
typedef struct sink {
    char *buf;
    size_t len;
    mark *marks;
    size_t n_marks;
} sink;

static void put(sink *s, const char *p, size_t n)
{
    if (s->buf)
        memcpy(s->buf + s->len, p, n);
    s->len += n;
}

static void put_str(sink *s, const char *p) { put(s, p, strlen(p)); }

static void put_marker(sink *s, marker what)
{
    if (s->marks)
        s->marks[s->n_marks] = (mark){.at = s->len, .what = what};
    s->n_marks++;
    put_str(s, MARKER_TEXT[what]);
}

static void put_header(sink *s, const char *role)
{
    put_marker(s, MARKER_HEADER_START);
    put_str(s, role);
    put_marker(s, MARKER_HEADER_END);
    put_str(s, HEADER_GAP);
}

/* [*start, *end) = s[0..n) without leading and trailing Python whitespace.
 * Ill-formed UTF-8 bytes count as non-space. */
static void py_strip(const char *s, size_t n, size_t *start, size_t *end)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0, first = n, last_end = 0;
    while (i < n) {
        uint32_t cp;
        size_t len;
        bool space = ml_utf8_scan(p + i, n - i, &cp, &len) == ML_UTF8_OK &&
                     ml_unicode_is_py_space(cp);
        if (!space) {
            if (first == n)
                first = i;
            last_end = i + len;
        }
        i += len;
    }
    *start = first == n ? 0 : first;
    *end = first == n ? 0 : last_end;
}

static bool is_role(const ml_chat_message *m, const char *role) { return !strcmp(m->role, role); }

static bool is_tool_result(const ml_chat_message *m)
{
    return is_role(m, "tool") || is_role(m, "ipython");
}

static ml_status check_messages(const ml_chat_message *msgs, size_t n_msgs,
                                const ml_chat_options *opt, char *err, size_t errlen)
{
    if (!msgs || n_msgs == 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: no messages");
    if (opt->n_tools && !opt->tools)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: %zu tools but NULL tools",
                       opt->n_tools);
    for (size_t t = 0; t < opt->n_tools; t++)
        if (!opt->tools[t])
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: tool %zu is NULL", t);
    for (size_t i = 0; i < n_msgs; i++) {
        const ml_chat_message *m = &msgs[i];
        if (!m->role)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: message %zu has no role",
                           i);
        if (!is_role(m, "system") && !is_role(m, "user") && !is_role(m, "assistant") &&
            !is_tool_result(m))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "chat template: message %zu: role '%.32s' is not system, user, "
                           "assistant, tool or ipython",
                           i, m->role);
        if (!m->tool_call_name != !m->tool_call_arguments)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "chat template: message %zu: a tool call needs both a name and "
                           "arguments",
                           i);
        if (m->tool_call_name && !is_role(m, "assistant"))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "chat template: message %zu: only an assistant message makes tool "
                           "calls, not '%.32s'",
                           i, m->role);
        if (m->content_json && !is_tool_result(m))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "chat template: message %zu: content_json is for tool results, not "
                           "'%.32s' messages",
                           i, m->role);
        if (m->n_parts && !m->parts)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "chat template: message %zu has NULL parts", i);
        for (size_t k = 0; k < m->n_parts; k++) {
            const ml_chat_part *p = &m->parts[k];
            if (p->type == ML_CHAT_PART_TEXT && !p->text)
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "chat template: message %zu part %zu: text part without text", i,
                               k);
            if (p->type != ML_CHAT_PART_TEXT && p->type != ML_CHAT_PART_IMAGE)
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "chat template: message %zu part %zu: unknown part type %d", i, k,
                               (int)p->type);
            if (i == 0 && p->type == ML_CHAT_PART_IMAGE && is_role(m, "system"))
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "chat template: the system message can hold only text");
            if (p->type == ML_CHAT_PART_IMAGE && is_tool_result(m))
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "chat template: message %zu: a tool result can hold only text", i);
        }
    }
    return ML_OK;
}

static void put_parts(sink *s, const ml_chat_message *m)
{
    for (size_t k = 0; k < m->n_parts; k++) {
        if (m->parts[k].type == ML_CHAT_PART_IMAGE)
            put_marker(s, MARKER_IMAGE);
        else
            put_str(s, m->parts[k].text);
    }
}

/* A piece of plan.json. */
typedef struct span {
    size_t at;
    size_t len;
} span;

/* What the two rendering passes write, worked out before them. */
typedef struct plan {
    const ml_chat_message *msgs;
    size_t n_msgs;
    const ml_chat_options *opt;
    size_t first; /* the first message the message loop renders */
    bool has_images;
    char *system; /* the leading system message's text joined, or NULL */
    size_t system_start, system_end; /* its trimmed part */
    /* With tools: the first user message's text joined, and its trimmed part. */
    char *tools_user;
    size_t tools_user_start, tools_user_end;
    ml_pyjson_buf json; /* every tojson text, back to back */
    span *tool_json;    /* opt->n_tools: each tool's, indented; message_json follows */
    span *message_json; /* n_msgs, in tool_json's allocation: a call's arguments or a tool
                           result's content; len 0: none */
} plan;

static void plan_deinit(plan *pl)
{
    free(pl->system);
    free(pl->tools_user);
    ml_pyjson_buf_deinit(&pl->json);
    free(pl->tool_json);
}

/* m's parts' text joined (a new string in *text) and its Python-trimmed
 * part [*start, *end). */
static ml_status join_trimmed(const ml_chat_message *m, char **text, size_t *start, size_t *end,
                              char *err, size_t errlen)
{
    sink s = {0};
    put_parts(&s, m);
    s.buf = malloc(s.len + 1);
    if (!s.buf)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "chat template: out of memory");
    s.len = 0;
    put_parts(&s, m);
    py_strip(s.buf, s.len, start, end);
    *text = s.buf;
    return ML_OK;
}

/* The JSON a text must hold: the first bytes tojson may write for it, and
 * its name for an error. */
typedef struct json_kind {
    const char *first;
    const char *name;
} json_kind;

/* A tool and a call's arguments. */
static const json_kind JSON_OBJECT = {"{", "an object"};
/* A tool result: what the template's `is mapping or iterable` sends to
 * tojson (a string is iterable). */
static const json_kind JSON_TOOL_RESULT = {"\"[{", "a string, an array or an object"};

/* Append tojson(json) to pl->json and record where it went in *at. what and
 * index name the text in an error. */
static ml_status add_json(plan *pl, const char *json, int indent, const json_kind *kind, span *at,
                          const char *what, size_t index, char *err, size_t errlen)
{
    char why[JSON_ERR_BYTES];
    size_t start = pl->json.len;
    ml_status st = ml_pyjson_dumps(json, strlen(json), indent, &pl->json, why, sizeof why);
    if (st != ML_OK)
        return ml_fail(err, errlen, st, "chat template: %s %zu: %s", what, index, why);
    if (!strchr(kind->first, pl->json.data[start])) {
        pl->json.len = start;
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: %s %zu is not %s", what,
                       index, kind->name);
    }
    *at = (span){.at = start, .len = pl->json.len - start};
    return ML_OK;
}

static ml_status make_json(plan *pl, char *err, size_t errlen)
{
    size_t n_tools = pl->opt->n_tools;
    pl->tool_json = calloc(n_tools + pl->n_msgs, sizeof *pl->tool_json);
    if (!pl->tool_json)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "chat template: out of memory");
    pl->message_json = pl->tool_json + n_tools;
    ml_status st = ML_OK;
    for (size_t t = 0; t < n_tools && st == ML_OK; t++)
        st = add_json(pl, pl->opt->tools[t], TOOLS_JSON_INDENT, &JSON_OBJECT, &pl->tool_json[t],
                      "tool", t, err, errlen);
    for (size_t i = pl->first; i < pl->n_msgs && st == ML_OK; i++) {
        const ml_chat_message *m = &pl->msgs[i];
        if (m->tool_call_arguments)
            st = add_json(pl, m->tool_call_arguments, ML_PYJSON_NO_INDENT, &JSON_OBJECT,
                          &pl->message_json[i], "tool call arguments of message", i, err, errlen);
        else if (m->content_json)
            st = add_json(pl, m->content_json, ML_PYJSON_NO_INDENT, &JSON_TOOL_RESULT,
                          &pl->message_json[i], "content_json of message", i, err, errlen);
    }
    return st;
}

static ml_status make_plan(plan *pl, const ml_chat_message *msgs, size_t n_msgs,
                           const ml_chat_options *opt, char *err, size_t errlen)
{
    *pl = (plan){.msgs = msgs, .n_msgs = n_msgs, .opt = opt};
    ml_status st = check_messages(msgs, n_msgs, opt, err, errlen);
    if (st == ML_OK && is_role(&msgs[0], "system")) {
        pl->first = 1;
        st = join_trimmed(&msgs[0], &pl->system, &pl->system_start, &pl->system_end, err,
                          errlen);
    }
    if (st != ML_OK)
        return st;

    for (size_t i = pl->first; i < n_msgs; i++)
        for (size_t k = 0; k < msgs[i].n_parts; k++)
            pl->has_images |= msgs[i].parts[k].type == ML_CHAT_PART_IMAGE;
    if (pl->has_images && pl->system_end > pl->system_start)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: %s", IMAGE_WITH_SYSTEM);

    if (opt->n_tools) {
        if (pl->has_images)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "chat template: tool calling does not work with images (the "
                           "template would drop the image)");
        /* The template takes the message after the system message as the
         * user's, whatever its role (it would render "None" or a list). */
        const ml_chat_message *u = pl->first < n_msgs ? &msgs[pl->first] : NULL;
        if (!u || !is_role(u, "user"))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "chat template: with tools the first message after the system "
                           "message must be a user message (the template puts the tools in "
                           "it)");
        pl->first++;
        st = join_trimmed(u, &pl->tools_user, &pl->tools_user_start, &pl->tools_user_end, err,
                          errlen);
    }
    if (st == ML_OK)
        st = make_json(pl, err, errlen);
    return st;
}

static void put_span(sink *s, const char *base, size_t start, size_t end)
{
    put(s, base + start, end - start);
}

static void render(sink *s, const plan *pl)
{
    const ml_chat_options *opt = pl->opt;
    put_marker(s, MARKER_BOS);
    if (!pl->has_images) {
        put_header(s, "system");
        if (opt->n_tools)
            put_str(s, TOOLS_ENVIRONMENT);
        put_str(s, SYSTEM_PREAMBLE);
        put_str(s, opt->date_string ? opt->date_string : ML_CHAT_DEFAULT_DATE);
        put_str(s, DATE_END);
        if (pl->system)
            put_span(s, pl->system, pl->system_start, pl->system_end);
        put_marker(s, MARKER_EOT);
    }
    if (opt->n_tools) {
        put_header(s, "user");
        put_str(s, TOOLS_PROMPT);
        for (size_t t = 0; t < opt->n_tools; t++) {
            put(s, pl->json.data + pl->tool_json[t].at, pl->tool_json[t].len);
            put_str(s, TOOL_END);
        }
        put_span(s, pl->tools_user, pl->tools_user_start, pl->tools_user_end);
        put_marker(s, MARKER_EOT);
    }
    for (size_t i = pl->first; i < pl->n_msgs; i++) {
        const ml_chat_message *m = &pl->msgs[i];
        const span *json = &pl->message_json[i];
        if (m->tool_call_name) {
            /* The name is written as is, not as a JSON string: so does the
             * template. */
            put_header(s, "assistant");
            put_str(s, CALL_NAME);
            put_str(s, m->tool_call_name);
            put_str(s, CALL_PARAMETERS);
            put(s, pl->json.data + json->at, json->len);
            put_str(s, CALL_END);
        } else if (is_tool_result(m)) {
            put_header(s, TOOL_RESULT_ROLE);
            if (m->content_json)
                put(s, pl->json.data + json->at, json->len);
            else
                put_parts(s, m);
        } else {
            put_header(s, m->role);
            put_parts(s, m);
        }
        put_marker(s, MARKER_EOT);
    }
    if (opt->add_generation_prompt)
        put_header(s, "assistant");
}

/* ml_chat_render, plus the markers it wrote when marks is not NULL: *marks
 * is then a new array (owned by the caller: free()) of *n_marks entries in
 * prompt order. */
static ml_status render_prompt(const ml_chat_message *msgs, size_t n_msgs,
                               const ml_chat_options *opt, char **prompt, size_t *len,
                               mark **marks, size_t *n_marks, char *err, size_t errlen)
{
    static const ml_chat_options defaults = {0};
    if (!opt)
        opt = &defaults;
    plan pl;
    ml_status st = make_plan(&pl, msgs, n_msgs, opt, err, errlen);
    if (st != ML_OK) {
        plan_deinit(&pl);
        return st;
    }
    sink out = {0};
    render(&out, &pl);
    out.buf = malloc(out.len + 1);
    if (marks)
        out.marks = malloc(out.n_marks * sizeof *out.marks);
    if (!out.buf || (marks && !out.marks)) {
        free(out.buf);
        free(out.marks);
        plan_deinit(&pl);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "chat template: out of memory");
    }
    out.len = 0;
    out.n_marks = 0;
    render(&out, &pl);
    out.buf[out.len] = '\0';
    plan_deinit(&pl);
    *prompt = out.buf;
    *len = out.len;
    if (marks) {
        *marks = out.marks;
        *n_marks = out.n_marks;
    }
    return ML_OK;
}

ml_status ml_chat_render(const ml_chat_message *msgs, size_t n_msgs, const ml_chat_options *opt,
                         char **prompt, size_t *len, char *err, size_t errlen)
{
    if (!prompt || !len)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: NULL argument");
    return render_prompt(msgs, n_msgs, opt, prompt, len, NULL, NULL, err, errlen);
}

/* The prompt is split at the markers the template wrote and nowhere else:
 * each marker is its special id, and the text between two markers (template
 * text such as "\n\n" together with message text) is encoded with special
 * parsing off. For a prompt whose only special-token text is the template's,
 * these are exactly the pieces HF's added-token split makes, so the ids are
 * HF's; special-token text in a message stays text. */
ml_status ml_chat_encode(const ml_tokenizer *tok, const ml_chat_message *msgs, size_t n_msgs,
                         const ml_chat_options *opt, ml_token_buf *ids, char *err, size_t errlen)
{
    if (!tok || !ids)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: NULL argument");
    int32_t marker_id[N_MARKERS];
    for (int m = 0; m < N_MARKERS; m++) {
        marker_id[m] = ml_tokenizer_token_id(tok, MARKER_TEXT[m]);
        if (!ml_tokenizer_is_special(tok, marker_id[m]))
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                           "chat template: the tokenizer has no special token %s",
                           MARKER_TEXT[m]);
    }
    char *prompt;
    size_t len, n_marks;
    mark *marks;
    ml_status st = render_prompt(msgs, n_msgs, opt, &prompt, &len, &marks, &n_marks, err, errlen);
    if (st != ML_OK)
        return st;
    size_t n0 = ids->n, at = 0;
    for (size_t i = 0; i <= n_marks && st == ML_OK; i++) {
        size_t end = i < n_marks ? marks[i].at : len;
        st = ml_tokenizer_encode(tok, prompt + at, end - at, 0, ids, err, errlen);
        if (st == ML_OK && i < n_marks) {
            st = ml_token_buf_push(ids, marker_id[marks[i].what]);
            if (st != ML_OK)
                ml_fail(err, errlen, st, "chat template: out of memory");
            at = end + strlen(MARKER_TEXT[marks[i].what]);
        }
    }
    free(marks);
    free(prompt);
    if (st != ML_OK)
        ids->n = n0;
    return st;
}

/* The Llama 3.2 Vision Instruct chat template (see chat_template.h). */
#include "tokenizer/chat_template.h"

#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

static ml_status check_messages(const ml_chat_message *msgs, size_t n_msgs, char *err,
                                size_t errlen)
{
    if (!msgs || n_msgs == 0)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: no messages");
    for (size_t i = 0; i < n_msgs; i++) {
        const ml_chat_message *m = &msgs[i];
        if (!m->role)
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: message %zu has no role",
                           i);
        if (!strcmp(m->role, "tool") || !strcmp(m->role, "ipython"))
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                           "chat template: message %zu: role '%s' (tool calls) is not supported", i,
                           m->role);
        if (strcmp(m->role, "system") && strcmp(m->role, "user") && strcmp(m->role, "assistant"))
            return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                           "chat template: message %zu: role '%.32s' is not system, user or "
                           "assistant",
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
            if (i == 0 && p->type == ML_CHAT_PART_IMAGE && !strcmp(m->role, "system"))
                return ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                               "chat template: the system message can hold only text");
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

/* system: the leading system message's text, already trimmed. */
static void render(sink *s, const ml_chat_message *msgs, size_t n_msgs, size_t first,
                   const char *system, size_t system_len, bool has_images,
                   const ml_chat_options *opt)
{
    put_marker(s, MARKER_BOS);
    if (!has_images) {
        put_header(s, "system");
        put_str(s, SYSTEM_PREAMBLE);
        put_str(s, opt->date_string ? opt->date_string : ML_CHAT_DEFAULT_DATE);
        put_str(s, DATE_END);
        put(s, system, system_len);
        put_marker(s, MARKER_EOT);
    }
    for (size_t i = first; i < n_msgs; i++) {
        put_header(s, msgs[i].role);
        put_parts(s, &msgs[i]);
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
    ml_status st = check_messages(msgs, n_msgs, err, errlen);
    if (st != ML_OK)
        return st;
    static const ml_chat_options defaults = {0};
    if (!opt)
        opt = &defaults;

    /* The leading system message, concatenated and trimmed. */
    size_t first = 0;
    sink sys = {0};
    if (!strcmp(msgs[0].role, "system")) {
        first = 1;
        put_parts(&sys, &msgs[0]);
        sys.buf = malloc(sys.len + 1);
        if (!sys.buf)
            return ml_fail(err, errlen, ML_ERR_NOMEM, "chat template: out of memory");
        sys.len = 0;
        put_parts(&sys, &msgs[0]);
    }
    size_t sys_start = 0, sys_end = 0;
    if (sys.buf)
        py_strip(sys.buf, sys.len, &sys_start, &sys_end);

    bool has_images = false;
    for (size_t i = first; i < n_msgs; i++)
        for (size_t k = 0; k < msgs[i].n_parts; k++)
            has_images |= msgs[i].parts[k].type == ML_CHAT_PART_IMAGE;
    if (has_images && sys_end > sys_start) {
        free(sys.buf);
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "chat template: %s", IMAGE_WITH_SYSTEM);
    }

    const char *system = sys.buf ? sys.buf + sys_start : "";
    size_t system_len = sys_end - sys_start;
    sink out = {0};
    render(&out, msgs, n_msgs, first, system, system_len, has_images, opt);
    out.buf = malloc(out.len + 1);
    if (marks)
        out.marks = malloc(out.n_marks * sizeof *out.marks);
    if (!out.buf || (marks && !out.marks)) {
        free(out.buf);
        free(out.marks);
        free(sys.buf);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "chat template: out of memory");
    }
    out.len = 0;
    out.n_marks = 0;
    render(&out, msgs, n_msgs, first, system, system_len, has_images, opt);
    out.buf[out.len] = '\0';
    free(sys.buf);
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

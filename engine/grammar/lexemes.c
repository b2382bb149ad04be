/* String lexemes (lexemes.h): the one form of each character, string
 * contents under length, pattern and format, and the content of a given
 * text. The numbers are in lexemes_number.c.
 *
 * Formats are written as anchored patterns (regex.c) and are on the narrow
 * side of what Python's `jsonschema` FormatChecker accepts (with fqdn,
 * rfc3987 or rfc3986-validator, rfc3339-validator and isoduration
 * installed), never wider:
 *   - date: YYYY-MM-DD, year 0001..9999, the day within its month (29
 *     February in leap years only), as date.fromisoformat wants;
 *   - time: HH:MM:SS[.frac](Z|+HH:MM|-HH:MM), hours 00..23, no leap second
 *     (rfc3339-validator has none), upper-case Z only;
 *   - date-time: date "T" time, upper-case T only;
 *   - duration: RFC 3339 appendix A's grammar (P with Y[M[D]], M[D], D
 *     and T with H[M[S]], M[S], S; or W alone), integers only;
 *   - email: a dot-atom local part, "@", a hostname without its length
 *     bound (jsonschema only wants an "@"; no quoted local parts, no
 *     address literals);
 *   - hostname: labels of ASCII letters, digits and inner hyphens (fqdn's
 *     rule), no trailing dot, and, for fqdn's bound of 253 characters, at
 *     most 8 labels of at most 30 characters (counting to 253 across
 *     labels of up to 63 costs 24000 states);
 *   - ipv4: four decimal octets 0..255 without leading zeros;
 *   - ipv6: RFC 4291 text forms (RFC 3986's IPv6address), no zone;
 *   - uri: RFC 3986's URI with a registered name or IPv4 host (no IP
 *     literal in brackets), ASCII only;
 *   - uuid: 8-4-4-4-12 hex digits.
 * Every other format is refused (ML_ERR_UNSUPPORTED). */
#include "grammar/lexemes.h"

#include <stdlib.h>
#include <string.h>

#include "grammar/regex.h"
#include "grammar/utf8.h"

#define LEX_FIRST_PRINTABLE 0x20u
#define LEX_ESCAPE_MAX 7 /* \u00XX */

/* ---- one character ------------------------------------------------------------- */

/* The escaped form of cp when it has one (a control, '"' or '\'): its
 * length, written to out; 0 when cp is written raw. */
static size_t escaped_form(uint32_t cp, char out[LEX_ESCAPE_MAX])
{
    static const char hex[] = "0123456789abcdef";
    char short_form = 0;
    switch (cp) {
    case '"':
        short_form = '"';
        break;
    case '\\':
        short_form = '\\';
        break;
    case '\b':
        short_form = 'b';
        break;
    case '\f':
        short_form = 'f';
        break;
    case '\n':
        short_form = 'n';
        break;
    case '\r':
        short_form = 'r';
        break;
    case '\t':
        short_form = 't';
        break;
    default:
        if (cp >= LEX_FIRST_PRINTABLE)
            return 0;
        memcpy(out, "\\u00", 4);
        out[4] = hex[cp >> 4];
        out[5] = hex[cp & 0xF];
        return 6;
    }
    out[0] = '\\';
    out[1] = short_form;
    return 2;
}

static void set_bit(uint8_t set[32], uint8_t b)
{
    set[b >> 3] |= (uint8_t)(1u << (b & 7));
}

/* The escaped forms of the characters marked in special (the controls,
 * then '"' and '\' at LEX_FIRST_PRINTABLE and + 1), built as "\" then one
 * letter or "u00" and two hex digits, not as a union per character. */
static ml_fsm *escapes(ml_fsm_ctx *c, const bool *special)
{
    uint8_t letters[32] = {0}, hex_low[2][32] = {{0}};
    for (uint32_t cp = 0; cp < LEX_FIRST_PRINTABLE + 2; cp++) {
        if (!special[cp])
            continue;
        char form[LEX_ESCAPE_MAX];
        uint32_t x = cp < LEX_FIRST_PRINTABLE ? cp : cp == LEX_FIRST_PRINTABLE ? '"' : '\\';
        if (escaped_form(x, form) == 2)
            set_bit(letters, (uint8_t)form[1]);
        else
            set_bit(hex_low[x >> 4], (uint8_t)form[5]);
    }
    ml_fsm *u =
        ml_fsm_union(c, ml_fsm_concat(c, ml_fsm_literal(c, "0", 1), ml_fsm_byte_set(c, hex_low[0])),
                     ml_fsm_concat(c, ml_fsm_literal(c, "1", 1), ml_fsm_byte_set(c, hex_low[1])));
    ml_fsm *after = ml_fsm_union(c, ml_fsm_byte_set(c, letters),
                                 ml_fsm_concat(c, ml_fsm_literal(c, "u00", 3), u));
    return ml_fsm_concat(c, ml_fsm_literal(c, "\\", 1), after);
}

ml_fsm *ml_lex_json_char(ml_fsm_ctx *c, const uint32_t (*ranges)[2], size_t n)
{
    /* The raw part: every range without the controls, '"' and '\'. */
    static const uint32_t raw_windows[][2] = {
        {LEX_FIRST_PRINTABLE, '"' - 1}, {'"' + 1, '\\' - 1}, {'\\' + 1, ML_UTF8_MAX_CP}};
    size_t n_windows = sizeof raw_windows / sizeof raw_windows[0];
    uint32_t(*raw)[2] = malloc((n * n_windows + 1) * sizeof *raw);
    if (!raw) {
        ml_fsm_ctx_fail(c, ML_ERR_NOMEM, "out of memory building a string lexeme");
        return NULL;
    }
    size_t n_raw = 0;
    /* The characters with an escaped form: the controls, then '"' and '\'. */
    bool special[LEX_FIRST_PRINTABLE + 2] = {0};
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = ranges[i][0], hi = ranges[i][1];
        for (size_t w = 0; w < n_windows; w++) {
            uint32_t a = lo > raw_windows[w][0] ? lo : raw_windows[w][0];
            uint32_t b = hi < raw_windows[w][1] ? hi : raw_windows[w][1];
            if (a <= b) {
                raw[n_raw][0] = a;
                raw[n_raw][1] = b;
                n_raw++;
            }
        }
        for (uint32_t cp = lo; cp < LEX_FIRST_PRINTABLE && cp <= hi; cp++)
            special[cp] = true;
        special[LEX_FIRST_PRINTABLE] |= lo <= '"' && '"' <= hi;
        special[LEX_FIRST_PRINTABLE + 1] |= lo <= '\\' && '\\' <= hi;
    }
    ml_fsm *a = n_raw ? ml_fsm_utf8(c, (const uint32_t(*)[2])raw, n_raw) : ml_fsm_nothing(c);
    free(raw);
    return ml_fsm_union(c, a, escapes(c, special));
}

/* ---- a given text -------------------------------------------------------------- */

ml_fsm *ml_lex_json_string_content_of(ml_fsm_ctx *c, const char *utf8, size_t n)
{
    if (ml_fsm_ctx_status(c) != ML_OK)
        return NULL;
    /* Each byte becomes at most 6 (a control as \u00XX). */
    char *out = malloc(n * (LEX_ESCAPE_MAX - 1) + 1);
    if (!out) {
        ml_fsm_ctx_fail(c, ML_ERR_NOMEM, "out of memory building a string lexeme");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)utf8;
    size_t len = 0;
    for (size_t i = 0; i < n;) {
        size_t start = i;
        int32_t cp = ml_utf8_decode(p, n, &i);
        if (cp < 0) {
            free(out);
            ml_fsm_ctx_fail(c, ML_ERR_INVALID_ARG, "string: invalid UTF-8 at byte %zu", start);
            return NULL;
        }
        size_t k = escaped_form((uint32_t)cp, out + len);
        if (k == 0) {
            memcpy(out + len, p + start, i - start);
            k = i - start;
        }
        len += k;
    }
    ml_fsm *a = ml_fsm_literal(c, out, len);
    free(out);
    return ml_fsm_tag(c, a, ML_FSM_TAG_IN_STRING);
}

/* ---- formats ------------------------------------------------------------------- */

#define DIGIT "[0-9]"
/* Years 0001..9999. */
#define YEAR                                                                                       \
    "(?:" DIGIT "{3}[1-9]|" DIGIT "{2}[1-9]" DIGIT "|" DIGIT "[1-9]" DIGIT "{2}|[1-9]" DIGIT       \
    "{3})"
/* Leap years: divisible by 4 and not by 100, or by 400 (never 0000). */
#define LEAP_YEAR                                                                                  \
    "(?:" DIGIT "{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
#define DATE                                                                                       \
    "(?:" YEAR "-(?:0[13578]|1[02])-(?:0[1-9]|[12]" DIGIT "|3[01])|" YEAR                          \
    "-(?:0[469]|11)-(?:0[1-9]|[12]" DIGIT "|30)|" YEAR "-02-(?:0[1-9]|1" DIGIT                     \
    "|2[0-8])|" LEAP_YEAR "-02-29)"
#define HOUR "(?:[01]" DIGIT "|2[0-3])"
#define MINUTE "[0-5]" DIGIT
#define TIME HOUR ":" MINUTE ":" MINUTE "(?:\\." DIGIT "+)?(?:Z|[+-]" HOUR ":" MINUTE ")"
#define DUR_TIME                                                                                   \
    "T(?:" DIGIT "+H(?:" DIGIT "+M(?:" DIGIT "+S)?)?|" DIGIT "+M(?:" DIGIT "+S)?|" DIGIT "+S)"
#define DUR_DATE                                                                                   \
    "(?:" DIGIT "+D|" DIGIT "+M(?:" DIGIT "+D)?|" DIGIT "+Y(?:" DIGIT "+M(?:" DIGIT "+D)?)?)"
#define LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define HOSTNAME LABEL "(?:\\." LABEL ")*"
/* The hostname format's labels: 8 * 30 + 7 dots <= 253. */
#define HOST_LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?"
#define HOST HOST_LABEL "(?:\\." HOST_LABEL "){0,7}"
#define ATEXT "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
#define OCTET "(?:25[0-5]|2[0-4]" DIGIT "|1" DIGIT "{2}|[1-9]?" DIGIT ")"
#define IPV4 OCTET "\\." OCTET "\\." OCTET "\\." OCTET
#define H16 "[0-9A-Fa-f]{1,4}"
#define LS32 "(?:" H16 ":" H16 "|" IPV4 ")"
#define IPV6                                                                                       \
    "(?:(?:" H16 ":){6}" LS32 "|::(?:" H16 ":){5}" LS32 "|(?:" H16 ")?::(?:" H16 ":){4}" LS32      \
    "|(?:(?:" H16 ":){0,1}" H16 ")?::(?:" H16 ":){3}" LS32 "|(?:(?:" H16 ":){0,2}" H16             \
    ")?::(?:" H16 ":){2}" LS32 "|(?:(?:" H16 ":){0,3}" H16 ")?::" H16 ":" LS32 "|(?:(?:" H16       \
    ":){0,4}" H16 ")?::" LS32 "|(?:(?:" H16 ":){0,5}" H16 ")?::" H16 "|(?:(?:" H16 ":){0,6}" H16   \
    ")?::)"
#define UNRESERVED "A-Za-z0-9._~\\-"
#define SUB_DELIMS "!$&'()*+,;="
#define PCT "%[0-9A-Fa-f]{2}"
#define PCHAR "(?:[" UNRESERVED SUB_DELIMS ":@]|" PCT ")"
#define SEGMENT PCHAR "*"
#define URI                                                                                        \
    "[A-Za-z][A-Za-z0-9+.-]*:(?://(?:(?:[" UNRESERVED SUB_DELIMS ":]|" PCT                         \
    ")*@)?(?:[" UNRESERVED SUB_DELIMS "]|" PCT ")*(?::" DIGIT "*)?(?:/" SEGMENT ")*|/(?:" PCHAR    \
    "+(?:/" SEGMENT ")*)?|" PCHAR "+(?:/" SEGMENT ")*|)(?:\\?(?:" PCHAR "|[/?])*)?(?:#(?:" PCHAR   \
    "|[/?])*)?"
#define HEX "[0-9A-Fa-f]"

static const struct format {
    const char *name, *pattern;
} formats[] = {
    {"date", "^" DATE "$"},
    {"time", "^" TIME "$"},
    {"date-time", "^" DATE "T" TIME "$"},
    {"duration", "^P(?:" DUR_DATE "(?:" DUR_TIME ")?|" DUR_TIME "|" DIGIT "+W)$"},
    {"email", "^" ATEXT "+(?:\\." ATEXT "+)*@" HOSTNAME "$"},
    {"hostname", "^" HOST "$"},
    {"ipv4", "^" IPV4 "$"},
    {"ipv6", "^" IPV6 "$"},
    {"uri", "^" URI "$"},
    {"uuid", "^" HEX "{8}-" HEX "{4}-" HEX "{4}-" HEX "{4}-" HEX "{12}$"},
};

const char *const ml_lex_formats[] = {
    "date", "time", "date-time", "duration", "email", "hostname",
    "ipv4", "ipv6", "uri",       "uuid",     NULL,
};

_Static_assert(sizeof formats / sizeof formats[0] + 1 ==
                   sizeof ml_lex_formats / sizeof ml_lex_formats[0],
               "every format is listed");

/* The formats JSON Schema defines (draft 2020-12's format vocabulary, draft
 * 3's color) that a validator checks when asked to (Python jsonschema's
 * FormatChecker): one of them lexemes.c does not build is refused. Any
 * other format ("byte", "url", "path"...) is an annotation validators
 * ignore, so ignoring it is exact. */
static const char *const checked_formats[] = {
    "date",      "time",      "date-time",     "duration",      "email",
    "idn-email", "hostname",  "idn-hostname",  "ipv4",          "ipv6",
    "uri",       "uri-reference", "iri",       "iri-reference", "uuid",
    "uri-template", "json-pointer", "relative-json-pointer", "regex", "color",
};

bool ml_lex_format_ignored(const char *name)
{
    for (size_t i = 0; i < sizeof checked_formats / sizeof checked_formats[0]; i++)
        if (!strcmp(checked_formats[i], name))
            return false;
    return true;
}

bool ml_lex_format_check(ml_fsm_ctx *c, const char *name)
{
    if (ml_lex_format_ignored(name))
        return true;
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (!strcmp(formats[i].name, name))
            return true;
    ml_fsm_ctx_fail(c, ML_ERR_UNSUPPORTED, "format \"%s\" is not supported", name);
    return false;
}

/* The content of a format that is not ignored (ml_lex_format_ignored). */
static ml_fsm *format_content(ml_fsm_ctx *c, const char *name)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (!strcmp(formats[i].name, name))
            return ml_regex_compile(c, formats[i].pattern, strlen(formats[i].pattern));
    ml_lex_format_check(c, name);
    return NULL;
}

/* Any characters, between min and max of them (max ML_FSM_UNBOUNDED: no bound). */
static ml_fsm *any_chars(ml_fsm_ctx *c, uint32_t min, uint32_t max)
{
    static const uint32_t all[][2] = {{0, ML_UTF8_MAX_CP}};
    return ml_fsm_repeat(c, ml_lex_json_char(c, all, 1), min, max);
}

ml_fsm *ml_lex_json_string(ml_fsm_ctx *c, const ml_lex_string *s)
{
    if (ml_fsm_ctx_status(c) != ML_OK)
        return NULL;
    if (s->min_length > s->max_length)
        return ml_fsm_nothing(c);
    const char *format = s->format && !ml_lex_format_ignored(s->format) ? s->format : NULL;
    ml_fsm *content = NULL;
    if (s->min_length > 0 || s->max_length != ML_FSM_UNBOUNDED || (!s->pattern && !format))
        content = ml_fsm_tag(c, any_chars(c, s->min_length, s->max_length), ML_FSM_TAG_IN_STRING);
    if (format) {
        ml_fsm *f = format_content(c, format);
        content = content ? ml_fsm_intersect(c, content, f) : f;
    }
    if (s->pattern) {
        ml_fsm *p = ml_regex_compile(c, s->pattern, s->pattern_len);
        content = content ? ml_fsm_intersect(c, content, p) : p;
    }
    return ml_fsm_concat(c, ml_fsm_literal(c, "\"", 1),
                         ml_fsm_concat(c, content, ml_fsm_literal(c, "\"", 1)));
}

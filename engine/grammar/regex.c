/* ECMA-262 patterns to automata over string content (regex.h): a recursive
 * descent parser that builds the automaton as it reads, each atom a set of
 * code points (ml_lex_json_char) and each operator an fsm.h composition.
 *
 * Narrowing. The accepted contents must also match under Python's `re`
 * (what the `jsonschema` package runs), whose character classes are wider
 * on Unicode than ECMA's. Where the two disagree the automaton takes what
 * both accept:
 *   - \s is ECMA's white space without U+FEFF (not white space to Python);
 *     \S excludes ECMA's and Python's white space (U+001C..U+001F, U+0085);
 *   - \D and \W match ASCII characters only (Python's \D and \W exclude
 *     every Unicode digit, letter and number; no table of them is kept);
 *   - inside a negated class, \d \w \s count as wide as either engine
 *     reads them (\d and \w as every non-ASCII character too), so the
 *     complement is narrow;
 *   - a \u escape of a surrogate is refused (ECMA pairs two of them into
 *     one character outside its Unicode mode, Python reads two code points).
 * Python's own differences are narrower already: its `.` excludes only
 * \n and its `$` also matches before a final \n.
 *
 * Refused: see regex.h; also escapes of ASCII letters and digits that have
 * no ECMA meaning (Python reads some of them differently: \a, \Z, \A) and
 * legacy octal escapes. */
#include "grammar/regex.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/lexemes.h"

#define RX_MAX_DEPTH 128 /* nesting of groups */
#define RX_MAX_CP 0x10FFFFu
#define RX_SURROGATE_LO 0xD800u
#define RX_SURROGATE_HI 0xDFFFu
#define RX_ASCII_MAX 0x7Fu
#define RX_CONTROL_MASK 0x1Fu

typedef struct rx {
    ml_fsm_ctx *c;
    const uint8_t *p;
    size_t n, pos;
    int depth;
} rx;

/* A set of code points: ranges, normalised (sorted, disjoint, not
 * adjacent) by cps_normalise. */
typedef struct cpset {
    uint32_t (*r)[2];
    size_t n, cap;
    bool oom;
} cpset;

/* ---- character sets -------------------------------------------------------------- */

static void cps_add(cpset *s, uint32_t lo, uint32_t hi)
{
    if (s->oom || lo > hi)
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        uint32_t(*r)[2] = realloc(s->r, cap * sizeof *r);
        if (!r) {
            s->oom = true;
            return;
        }
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
}

static void cps_add_table(cpset *s, const uint32_t (*t)[2], size_t n)
{
    for (size_t i = 0; i < n; i++)
        cps_add(s, t[i][0], t[i][1]);
}

static int cmp_range(const void *x, const void *y)
{
    const uint32_t *a = x, *b = y;
    return (a[0] > b[0]) - (a[0] < b[0]);
}

static void cps_normalise(cpset *s)
{
    if (s->n == 0)
        return;
    qsort(s->r, s->n, sizeof *s->r, cmp_range);
    size_t k = 0;
    for (size_t i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[k][1] + 1) {
            if (s->r[i][1] > s->r[k][1])
                s->r[k][1] = s->r[i][1];
        } else
            memcpy(s->r[++k], s->r[i], sizeof s->r[i]);
    }
    s->n = k + 1;
}

/* The complement within U+0000..U+10FFFF, in place. */
static void cps_complement(cpset *s)
{
    cps_normalise(s);
    cpset out = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->r[i][0] > next)
            cps_add(&out, next, s->r[i][0] - 1);
        next = s->r[i][1] + 1;
    }
    if (next <= RX_MAX_CP)
        cps_add(&out, next, RX_MAX_CP);
    out.oom |= s->oom;
    free(s->r);
    *s = out;
}

/* ---- the class escapes, narrow and wide ------------------------------------------ */

static const uint32_t ecma_space[][2] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
    {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF},
};
/* Python's white space that ECMA's lacks. */
static const uint32_t python_space_extra[][2] = {{0x1C, 0x1F}, {0x85, 0x85}};
static const uint32_t ascii_word[][2] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
static const uint32_t ascii_digit[][2] = {{'0', '9'}};
static const uint32_t non_ascii[][2] = {{RX_ASCII_MAX + 1, RX_MAX_CP}};
static const uint32_t byte_order_mark = 0xFEFF;
static const uint32_t line_terminators[][2] = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

#define N_OF(t) (sizeof(t) / sizeof((t)[0]))

/* \s as both engines read it (narrow) or as either reads it (wide). */
static void add_space(cpset *s, bool wide)
{
    if (wide) {
        cps_add_table(s, ecma_space, N_OF(ecma_space));
        cps_add_table(s, python_space_extra, N_OF(python_space_extra));
        return;
    }
    for (size_t i = 0; i < N_OF(ecma_space); i++)
        if (ecma_space[i][0] != byte_order_mark)
            cps_add(s, ecma_space[i][0], ecma_space[i][1]);
}

/* The class escape letter (d D w W s S) into s, narrow or wide. */
static void add_class_escape(cpset *s, uint8_t letter, bool wide)
{
    cpset part = {0};
    bool negated = letter == 'D' || letter == 'W' || letter == 'S';
    /* The complement of a narrow set is wide and the other way round. */
    bool part_wide = negated ? !wide : wide;
    switch (letter | 0x20) {
    case 'd':
        cps_add_table(&part, ascii_digit, N_OF(ascii_digit));
        break;
    case 'w':
        cps_add_table(&part, ascii_word, N_OF(ascii_word));
        break;
    default:
        add_space(&part, part_wide);
        break;
    }
    if ((letter | 0x20) != 's' && part_wide)
        cps_add_table(&part, non_ascii, N_OF(non_ascii));
    if (negated)
        cps_complement(&part);
    s->oom |= part.oom;
    cps_add_table(s, (const uint32_t(*)[2])part.r, part.n);
    free(part.r);
}

/* ---- reading -------------------------------------------------------------------- */

static ml_fsm *rx_fail(rx *x, ml_status st, const char *what, size_t at)
{
    ml_fsm_ctx_fail(x->c, st, "pattern: %s at byte %zu", what, at);
    return NULL;
}

static bool at_end(const rx *x)
{
    return x->pos >= x->n;
}

static int peek(const rx *x)
{
    return at_end(x) ? -1 : x->p[x->pos];
}

/* One UTF-8 code point of the pattern; false (latched) when malformed. */
static bool read_utf8(rx *x, uint32_t *cp)
{
    size_t at = x->pos;
    uint8_t b = x->p[x->pos++];
    int len = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3
            : b >= 0xF0 && b <= 0xF4                ? 4
                                                    : 0;
    if (len == 0)
        return rx_fail(x, ML_ERR_INVALID_ARG, "invalid UTF-8", at) != NULL;
    uint32_t v = len == 1 ? b : b & (0x3Fu >> (len - 1));
    for (int i = 1; i < len; i++) {
        if (at_end(x) || (x->p[x->pos] & 0xC0) != 0x80)
            return rx_fail(x, ML_ERR_INVALID_ARG, "invalid UTF-8", at) != NULL;
        v = v << 6 | (x->p[x->pos++] & 0x3F);
    }
    static const uint32_t min_of_len[] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_of_len[len] || v > RX_MAX_CP || (v >= RX_SURROGATE_LO && v <= RX_SURROGATE_HI))
        return rx_fail(x, ML_ERR_INVALID_ARG, "invalid UTF-8", at) != NULL;
    *cp = v;
    return true;
}

static int hex_value(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f')
        return (ch | 0x20) - 'a' + 10;
    return -1;
}

/* n hex digits into *v; false when they are not there. */
static bool read_hex(rx *x, int n, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        int h = hex_value(peek(x));
        if (h < 0)
            return false;
        *v = *v << 4 | (uint32_t)h;
        x->pos++;
    }
    return true;
}

/* \u escapes: HHHH or {H...}. */
static bool read_unicode_escape(rx *x, uint32_t *v, size_t at)
{
    if (peek(x) != '{') {
        if (read_hex(x, 4, v))
            return true;
        return rx_fail(x, ML_ERR_INVALID_ARG, "\\u needs 4 hex digits", at) != NULL;
    }
    x->pos++;
    *v = 0;
    int digits = 0;
    for (int h; (h = hex_value(peek(x))) >= 0; x->pos++, digits++) {
        *v = *v << 4 | (uint32_t)h;
        if (*v > RX_MAX_CP)
            return rx_fail(x, ML_ERR_INVALID_ARG, "\\u{...} past U+10FFFF", at) != NULL;
    }
    if (digits == 0 || peek(x) != '}')
        return rx_fail(x, ML_ERR_INVALID_ARG, "malformed \\u{...}", at) != NULL;
    x->pos++;
    return true;
}

/* The escape after a backslash (x->pos past it) as a set of code points
 * into s. In a class, \b is the backspace and \d-style escapes are read
 * wide when the class is negated. */
static bool read_escape(rx *x, cpset *s, bool in_class, bool wide)
{
    size_t at = x->pos - 1;
    if (at_end(x))
        return rx_fail(x, ML_ERR_INVALID_ARG, "trailing backslash", at) != NULL;
    int ch = peek(x);
    uint32_t v = 0;
    if (ch >= 0x80) {
        if (!read_utf8(x, &v))
            return false;
        cps_add(s, v, v);
        return true;
    }
    x->pos++;
    switch (ch) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        add_class_escape(s, (uint8_t)ch, wide);
        return true;
    case 't': v = '\t'; break;
    case 'n': v = '\n'; break;
    case 'r': v = '\r'; break;
    case 'f': v = '\f'; break;
    case 'v': v = '\v'; break;
    case '0':
        if (peek(x) >= '0' && peek(x) <= '9')
            return rx_fail(x, ML_ERR_UNSUPPORTED, "legacy octal escape", at) != NULL;
        v = 0;
        break;
    case 'x':
        if (!read_hex(x, 2, &v))
            return rx_fail(x, ML_ERR_INVALID_ARG, "\\x needs 2 hex digits", at) != NULL;
        break;
    case 'u':
        if (!read_unicode_escape(x, &v, at))
            return false;
        if (v >= RX_SURROGATE_LO && v <= RX_SURROGATE_HI)
            return rx_fail(x, ML_ERR_UNSUPPORTED, "surrogate escape", at) != NULL;
        break;
    case 'c': {
        int l = peek(x);
        if (!((l | 0x20) >= 'a' && (l | 0x20) <= 'z'))
            return rx_fail(x, ML_ERR_INVALID_ARG, "\\c needs a letter", at) != NULL;
        x->pos++;
        v = (uint32_t)l & RX_CONTROL_MASK;
        break;
    }
    case 'b':
        if (!in_class)
            return rx_fail(x, ML_ERR_UNSUPPORTED, "word boundary \\b", at) != NULL;
        v = '\b';
        break;
    case 'B':
        return rx_fail(x, ML_ERR_UNSUPPORTED, "word boundary \\B", at) != NULL;
    case 'p': case 'P':
        return rx_fail(x, ML_ERR_UNSUPPORTED, "Unicode property escape", at) != NULL;
    case 'k':
        return rx_fail(x, ML_ERR_UNSUPPORTED, "named backreference", at) != NULL;
    default:
        if (ch >= '1' && ch <= '9')
            return rx_fail(x, ML_ERR_UNSUPPORTED, "backreference", at) != NULL;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_')
            return rx_fail(x, ML_ERR_UNSUPPORTED, "unknown escape", at) != NULL;
        v = (uint32_t)ch; /* an escaped punctuation character is itself */
        break;
    }
    cps_add(s, v, v);
    return true;
}

/* The automaton of one character in s (normalised); frees s's ranges. */
static ml_fsm *set_fsm(rx *x, cpset *s)
{
    ml_fsm *a = NULL;
    if (s->oom) {
        ml_fsm_ctx_fail(x->c, ML_ERR_NOMEM, "out of memory reading a pattern");
    } else {
        cps_normalise(s);
        a = ml_lex_json_char(x->c, (const uint32_t(*)[2])s->r, s->n);
    }
    free(s->r);
    memset(s, 0, sizeof *s);
    return a;
}

/* A class [...] (x->pos past '['). */
static ml_fsm *read_class(rx *x)
{
    size_t at = x->pos - 1;
    bool negated = peek(x) == '^';
    if (negated)
        x->pos++;
    cpset s = {0};
    while (peek(x) != ']') {
        if (at_end(x)) {
            free(s.r);
            return rx_fail(x, ML_ERR_INVALID_ARG, "unterminated class", at);
        }
        /* One class atom: a single character (lo) or a set (an escape). */
        cpset atom = {0};
        size_t atom_at = x->pos;
        bool ok;
        if (peek(x) == '\\') {
            x->pos++;
            ok = read_escape(x, &atom, true, negated);
        } else {
            uint32_t v;
            ok = read_utf8(x, &v);
            cps_add(&atom, v, v);
        }
        bool single = ok && atom.n == 1 && atom.r[0][0] == atom.r[0][1];
        if (ok && single && peek(x) == '-' && x->pos + 1 < x->n && x->p[x->pos + 1] != ']') {
            x->pos++;
            cpset hi = {0};
            if (peek(x) == '\\') {
                x->pos++;
                ok = read_escape(x, &hi, true, negated);
            } else {
                uint32_t v;
                ok = read_utf8(x, &v);
                cps_add(&hi, v, v);
            }
            if (ok && !(hi.n == 1 && hi.r[0][0] == hi.r[0][1])) {
                /* [a-\d]: Annex B reads the '-' literally. */
                cps_add(&s, '-', '-');
                cps_add_table(&s, (const uint32_t(*)[2])hi.r, hi.n);
            } else if (ok && hi.r[0][0] < atom.r[0][0]) {
                ok = rx_fail(x, ML_ERR_INVALID_ARG, "class range out of order", atom_at) != NULL;
            } else if (ok) {
                atom.r[0][1] = hi.r[0][0];
            }
            s.oom |= hi.oom;
            free(hi.r);
        }
        if (ok)
            cps_add_table(&s, (const uint32_t(*)[2])atom.r, atom.n);
        s.oom |= atom.oom;
        free(atom.r);
        if (!ok) {
            free(s.r);
            return NULL;
        }
    }
    x->pos++;
    if (negated)
        cps_complement(&s);
    return set_fsm(x, &s);
}

/* ---- the grammar ------------------------------------------------------------------ */

static ml_fsm *read_disjunction(rx *x, bool top);

/* {n}, {n,} or {n,m} at x->pos; false without moving when the text is not
 * one (Annex B: then '{' is a literal). Bounds past ML_REGEX_MAX_REPEAT
 * saturate there, for the caller to refuse. */
static bool read_braces(rx *x, uint32_t *min, uint32_t *max)
{
    size_t save = x->pos, i = x->pos + 1;
    uint32_t v[2] = {0, 0};
    int k = 0, digits[2] = {0, 0};
    for (; i < x->n; i++) {
        uint8_t ch = x->p[i];
        if (ch >= '0' && ch <= '9') {
            v[k] = v[k] > ML_REGEX_MAX_REPEAT ? v[k] : v[k] * 10 + (ch - '0');
            digits[k]++;
        } else if (ch == ',' && k == 0 && digits[0] > 0) {
            k = 1;
        } else
            break;
    }
    if (i >= x->n || x->p[i] != '}' || digits[0] == 0) {
        x->pos = save;
        return false;
    }
    *min = v[0];
    *max = k == 0 ? v[0] : digits[1] == 0 ? ML_FSM_UNBOUNDED : v[1];
    x->pos = i + 1;
    return true;
}

/* A quantifier at x->pos, if any: true with the bounds, x->pos past it
 * (and past a lazy '?'). */
static bool read_quantifier(rx *x, uint32_t *min, uint32_t *max)
{
    switch (peek(x)) {
    case '*': *min = 0; *max = ML_FSM_UNBOUNDED; x->pos++; break;
    case '+': *min = 1; *max = ML_FSM_UNBOUNDED; x->pos++; break;
    case '?': *min = 0; *max = 1; x->pos++; break;
    case '{':
        if (!read_braces(x, min, max))
            return false;
        break;
    default:
        return false;
    }
    if (peek(x) == '?')
        x->pos++; /* lazy: the same language */
    return true;
}

/* A group (x->pos past '('). */
static ml_fsm *read_group(rx *x)
{
    size_t at = x->pos - 1;
    if (peek(x) == '?') {
        x->pos++;
        int ch = peek(x);
        if (ch == ':') {
            x->pos++;
        } else if (ch == '<' && x->pos + 1 < x->n && x->p[x->pos + 1] != '=' &&
                   x->p[x->pos + 1] != '!') {
            while (!at_end(x) && peek(x) != '>')
                x->pos++;
            if (at_end(x))
                return rx_fail(x, ML_ERR_INVALID_ARG, "unterminated group name", at);
            x->pos++;
        } else if (ch == '=' || ch == '!' || ch == '<') {
            return rx_fail(x, ML_ERR_UNSUPPORTED, "lookaround", at);
        } else {
            return rx_fail(x, ML_ERR_UNSUPPORTED, "group modifier or flags", at);
        }
    }
    if (++x->depth > RX_MAX_DEPTH)
        return rx_fail(x, ML_ERR_TOO_LARGE, "groups nested too deep", at);
    ml_fsm *a = read_disjunction(x, false);
    x->depth--;
    if (!a)
        return NULL;
    if (peek(x) != ')') {
        ml_fsm_free(a);
        return rx_fail(x, ML_ERR_INVALID_ARG, "unterminated group", at);
    }
    x->pos++;
    return a;
}

/* One atom, or NULL at the end of the alternative (*done set) or on error. */
static ml_fsm *read_atom(rx *x, bool top, bool *done)
{
    size_t at = x->pos;
    int ch = peek(x);
    uint32_t min, max;
    *done = false;
    if (ch < 0 || ch == '|' || ch == ')') {
        *done = true;
        return NULL;
    }
    if (ch == '$' && top && (x->pos + 1 == x->n || x->p[x->pos + 1] == '|')) {
        *done = true;
        return NULL;
    }
    cpset s = {0};
    switch (ch) {
    case '^':
    case '$':
        return rx_fail(x, ML_ERR_UNSUPPORTED, "anchor inside the expression", at);
    case '*':
    case '+':
    case '?':
        return rx_fail(x, ML_ERR_INVALID_ARG, "nothing to repeat", at);
    case '{':
        if (read_braces(x, &min, &max))
            return rx_fail(x, ML_ERR_INVALID_ARG, "nothing to repeat", at);
        x->pos++;
        cps_add(&s, '{', '{');
        return set_fsm(x, &s);
    case '(':
        x->pos++;
        return read_group(x);
    case '[':
        x->pos++;
        return read_class(x);
    case '.':
        x->pos++;
        cps_add_table(&s, line_terminators, N_OF(line_terminators));
        cps_complement(&s);
        return set_fsm(x, &s);
    case '\\':
        x->pos++;
        if (!read_escape(x, &s, false, false)) {
            free(s.r);
            return NULL;
        }
        return set_fsm(x, &s);
    default: {
        uint32_t v;
        if (!read_utf8(x, &v))
            return NULL;
        cps_add(&s, v, v);
        return set_fsm(x, &s);
    }
    }
}

/* Terms up to '|', ')' or the end (or a final '$' at the top level). */
static ml_fsm *read_alternative(rx *x, bool top)
{
    ml_fsm *seq = ml_fsm_epsilon(x->c);
    for (;;) {
        bool done;
        ml_fsm *atom = read_atom(x, top, &done);
        if (done)
            return seq;
        if (!atom) {
            ml_fsm_free(seq);
            return NULL;
        }
        size_t at = x->pos;
        uint32_t min, max;
        if (read_quantifier(x, &min, &max)) {
            if (min > ML_REGEX_MAX_REPEAT || (max != ML_FSM_UNBOUNDED && max > ML_REGEX_MAX_REPEAT)) {
                ml_fsm_free(atom);
                ml_fsm_free(seq);
                return rx_fail(x, ML_ERR_TOO_LARGE, "repeat bound over 1000", at);
            }
            if (min > max) {
                ml_fsm_free(atom);
                ml_fsm_free(seq);
                return rx_fail(x, ML_ERR_INVALID_ARG, "repeat bounds out of order", at);
            }
            atom = ml_fsm_repeat(x->c, atom, min, max);
            int next = peek(x);
            if (next == '*' || next == '+' || next == '?' ||
                (next == '{' && read_braces(x, &min, &max))) {
                ml_fsm_free(atom);
                ml_fsm_free(seq);
                return rx_fail(x, ML_ERR_INVALID_ARG, "nothing to repeat", x->pos);
            }
        }
        seq = ml_fsm_concat(x->c, seq, atom);
        if (!seq)
            return NULL;
    }
}

static ml_fsm *any_string(ml_fsm_ctx *c)
{
    static const uint32_t all[][2] = {{0, RX_MAX_CP}};
    return ml_fsm_repeat(c, ml_lex_json_char(c, all, 1), 0, ML_FSM_UNBOUNDED);
}

/* Alternatives separated by '|'. At the top level each may be anchored
 * (^ first, $ last) and is otherwise searched for: any text around it. */
static ml_fsm *read_disjunction(rx *x, bool top)
{
    ml_fsm *all = ml_fsm_nothing(x->c);
    for (;;) {
        bool start = top && peek(x) == '^';
        if (start)
            x->pos++;
        ml_fsm *alt = read_alternative(x, top);
        bool end = top && peek(x) == '$';
        if (end)
            x->pos++;
        if (top && !start)
            alt = ml_fsm_concat(x->c, any_string(x->c), alt);
        if (top && !end)
            alt = ml_fsm_concat(x->c, alt, any_string(x->c));
        all = ml_fsm_union(x->c, all, alt);
        if (!all || peek(x) != '|')
            return all;
        x->pos++;
    }
}

ml_fsm *ml_regex_compile(ml_fsm_ctx *c, const char *pattern, size_t len)
{
    if (ml_fsm_ctx_status(c) != ML_OK)
        return NULL;
    rx x = {.c = c, .p = (const uint8_t *)pattern, .n = len};
    ml_fsm *a = read_disjunction(&x, true);
    if (a && !at_end(&x)) {
        ml_fsm_free(a);
        return rx_fail(&x, ML_ERR_INVALID_ARG, "unmatched ')'", x.pos);
    }
    return ml_fsm_tag(c, a, ML_FSM_TAG_IN_STRING);
}

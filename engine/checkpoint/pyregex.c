/* Python re -> POSIX ERE (pyregex.h). */
#include "checkpoint/pyregex.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* A translated expression grows at most this much per input character
 * (\w becomes the 12 characters of [A-Za-z0-9_]), plus "^(" and ")$". */
#define REGEX_GROWTH 6
#define REGEX_WRAP 5

/* Append s to out[*o] within cap (the caller sized cap for the worst case). */
static void emit(char *out, size_t cap, size_t *o, const char *s)
{
    size_t n = strlen(s);
    if (*o + n < cap) {
        memcpy(out + *o, s, n);
        *o += n;
    }
}

static void emit_char(char *out, size_t cap, size_t *o, char c)
{
    const char s[2] = {c, '\0'};
    emit(out, cap, o, s);
}

/* What came last, for the quantifier rules of Python's re. */
typedef enum regex_prev {
    PREV_NONE,  /* start, '(' , '|' or an anchor: nothing to repeat */
    PREV_ATOM,
    PREV_QUANT, /* a quantifier; a '?' after it makes it lazy */
    PREV_LAZY,
} regex_prev;

#define REGEX_FAIL(...) ml_fail(err, errlen, ML_ERR_UNSUPPORTED, __VA_ARGS__)

/* Translate the Python pattern `pat` (field names it in messages) into a
 * POSIX ERE anchored as `mode` says, with the same match set, in out (cap
 * bytes). Only the subset where the two syntaxes agree is accepted: lazy
 * quantifiers become greedy (whether a match exists does not depend on
 * laziness), (?: becomes (, \d and \w become ASCII classes. */
static ml_status translate_regex(const char *pat, ml_pyregex_mode mode, const char *field,
                                 char *out, size_t cap, char *err, size_t errlen)
{
    size_t o = 0;
    int depth = 0;
    regex_prev prev = PREV_NONE;
    emit(out, cap, &o, "^(");
    for (size_t i = 0; pat[i]; i++) {
        const unsigned char ch = (unsigned char)pat[i];
        if (ch < 0x20 || ch > 0x7e)
            return REGEX_FAIL("%s: character 0x%02x at offset %zu (only printable ASCII)", field,
                              ch, i);
        switch (ch) {
        case '\\': {
            const unsigned char e = (unsigned char)pat[i + 1];
            if (e == 'd') {
                emit(out, cap, &o, "[0-9]");
            } else if (e == 'w') {
                emit(out, cap, &o, "[A-Za-z0-9_]");
            } else if (e && strchr(".^$*+?()[]{}|\\", e)) { /* ERE specials stay escaped */
                emit_char(out, cap, &o, '\\');
                emit_char(out, cap, &o, (char)e);
            } else if (e > ' ' && e <= '~' && !isalnum(e)) { /* other punctuation: literal */
                emit_char(out, cap, &o, (char)e);
            } else {
                return REGEX_FAIL("%s: escape '\\%c' at offset %zu is not supported", field,
                                  e > ' ' && e <= '~' ? e : '?', i);
            }
            i++;
            prev = PREV_ATOM;
            break;
        }
        case '(':
            if (pat[i + 1] == '?') {
                if (pat[i + 2] != ':')
                    return REGEX_FAIL("%s: '(?' construct at offset %zu is not supported", field,
                                      i);
                i += 2;
            }
            emit(out, cap, &o, "(");
            depth++;
            prev = PREV_NONE;
            break;
        case ')':
            if (depth == 0)
                return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: unbalanced ')' at offset %zu",
                               field, i);
            if (prev == PREV_NONE)
                return REGEX_FAIL("%s: empty group or alternative before offset %zu", field, i);
            emit(out, cap, &o, ")");
            depth--;
            prev = PREV_ATOM;
            break;
        case '|':
            if (prev == PREV_NONE)
                return REGEX_FAIL("%s: empty alternative before offset %zu", field, i);
            emit(out, cap, &o, "|");
            prev = PREV_NONE;
            break;
        case '*':
        case '+':
        case '?':
            if (ch == '?' && prev == PREV_QUANT) {
                prev = PREV_LAZY;
                break;
            }
            if (prev != PREV_ATOM)
                return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: nothing to repeat at offset %zu",
                               field, i);
            emit_char(out, cap, &o, (char)ch);
            prev = PREV_QUANT;
            break;
        case '{':
        case '}':
            return REGEX_FAIL("%s: repetition counts ({m,n}) at offset %zu are not supported",
                              field, i);
        case '[': {
            /* A set: '^' and a leading ']' mean the same in both syntaxes;
             * backslashes and '[' (POSIX classes) do not. */
            size_t j = i + 1;
            emit(out, cap, &o, "[");
            if (pat[j] == '^')
                emit_char(out, cap, &o, pat[j++]);
            if (pat[j] == ']')
                emit_char(out, cap, &o, pat[j++]);
            for (; pat[j] != ']'; j++) {
                const unsigned char c = (unsigned char)pat[j];
                if (!c)
                    return ml_fail(err, errlen, ML_ERR_FORMAT,
                                   "%s: '[' at offset %zu is never closed", field, i);
                if (c == '\\' || c == '[' || c < 0x20 || c > 0x7e)
                    return REGEX_FAIL("%s: character '%c' inside [...] at offset %zu is not "
                                      "supported",
                                      field, c >= 0x20 && c <= 0x7e ? c : '?', j);
                emit_char(out, cap, &o, (char)c);
            }
            emit(out, cap, &o, "]");
            i = j;
            prev = PREV_ATOM;
            break;
        }
        case '^':
        case '$':
            emit_char(out, cap, &o, (char)ch);
            prev = PREV_NONE;
            break;
        default:
            emit_char(out, cap, &o, (char)ch);
            prev = PREV_ATOM;
        }
    }
    if (depth)
        return ml_fail(err, errlen, ML_ERR_FORMAT, "%s: unbalanced '('", field);
    if (prev == PREV_NONE && o > 2 && out[o - 1] == '|')
        return REGEX_FAIL("%s: empty alternative at the end", field);
    if (o == 2)
        return REGEX_FAIL("%s: empty expression", field);
    emit(out, cap, &o, mode == ML_PYREGEX_FULLMATCH ? ")$" : ")");
    out[o] = '\0';
    return ML_OK;
}

ml_status ml_pyregex_compile(regex_t *re, const char *pat, ml_pyregex_mode mode,
                             const char *field, char *err, size_t errlen)
{
    const size_t cap = REGEX_GROWTH * strlen(pat) + REGEX_WRAP;
    char *ere = malloc(cap);
    if (!ere)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "%s: out of memory", field);
    ml_status rc = translate_regex(pat, mode, field, ere, cap, err, errlen);
    if (rc == ML_OK) {
        int e = regcomp(re, ere, REG_EXTENDED | REG_NOSUB);
        if (e != 0) {
            char why[128];
            regerror(e, re, why, sizeof why);
            rc = ml_fail(err, errlen, ML_ERR_FORMAT, "%s: invalid regular expression: %s",
                         field, why);
        }
    }
    free(ere);
    return rc;
}

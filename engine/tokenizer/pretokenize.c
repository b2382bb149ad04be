/* The Llama 3 pre-tokenizer: the split regex of tokenizer.json, hand-written.
 *
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)        A1 contractions
 *   |[^\r\n\p{L}\p{N}]?\p{L}+           A2 a word, with one leading non-letter
 *   |\p{N}{1,3}                         A3 up to three digits
 *   | ?[^\s\p{L}\p{N}]+[\r\n]*          A4 punctuation run, optional space before
 *   |\s*[\r\n]+                         A5 whitespace up to the last line break
 *   |\s+(?!\S)                          A6 whitespace not touching the next word
 *   |\s+                                A7 any other whitespace
 *
 * `tokenizers` runs it with Oniguruma (leftmost-first alternation,
 * backtracking) as "Isolated" splits: consecutive matches tile the text,
 * because every character is matched by some alternative, so splitting is
 * "match at 0, then match at the end of that match". ml_pretoken_len is one
 * such match. The backtracking outcomes, worked out per alternative:
 *   A2: the optional character can only be taken when a letter follows it,
 *       so the match is either letters from 0 or one non-letter then letters.
 *   A4: the space is taken only if a non-space, non-letter, non-number
 *       character follows; otherwise the space cannot start A4 at all.
 *   A5: \s* first eats the whole whitespace run and then gives characters
 *       back until [\r\n]+ can match: the match ends just after the run's
 *       last \r or \n.
 *   A6: the run fails (?!\S) at a following non-space, so it gives back its
 *       last character, which then satisfies the lookahead: the match is the
 *       run minus its last character (the whole run at the end of the text,
 *       and no match for a single character followed by a non-space).
 * Case-insensitivity of A1 follows Oniguruma's case folding: besides ASCII
 * case, U+017F LATIN SMALL LETTER LONG S folds to 's' (checked against the
 * real pre-tokenizer over every letter of Unicode 16).
 *
 * Invalid UTF-8: each byte that does not begin a well-formed sequence is one
 * character of class ML_UCLASS_OTHER (HF never receives such input). */
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

typedef struct uchar {
    uint32_t cp; /* CP_INVALID for an ill-formed byte */
    ml_uclass cls;
    size_t len; /* bytes */
} uchar;

#define CP_INVALID 0xFFFFFFFFu
#define LONG_S_BYTE0 0xC5 /* U+017F in UTF-8 */
#define LONG_S_BYTE1 0xBF

static inline uchar read_char(const uint8_t *s, size_t n)
{
    uchar c;
    if (s[0] < 0x80) {
        c.cp = s[0];
        c.len = 1;
        c.cls = ml_unicode_class(c.cp);
        return c;
    }
    if (ml_utf8_scan(s, n, &c.cp, &c.len) != ML_UTF8_OK) {
        c.cp = CP_INVALID;
        c.len = 1;
        c.cls = ML_UCLASS_OTHER;
        return c;
    }
    c.cls = ml_unicode_class(c.cp);
    return c;
}

static inline int is_line_break(uint32_t cp) { return cp == '\r' || cp == '\n'; }

static inline uint8_t ascii_lower(uint8_t b) { return b >= 'A' && b <= 'Z' ? b + ('a' - 'A') : b; }

/* A1 at s[0] == '\''; returns the match length or 0. */
static size_t contraction_len(const uint8_t *s, size_t n)
{
    if (n < 2)
        return 0;
    uint8_t a = ascii_lower(s[1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (n < 3)
        return 0;
    if (s[1] == LONG_S_BYTE0 && s[2] == LONG_S_BYTE1)
        return 3;
    uint8_t b = ascii_lower(s[2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* Length of the longest prefix made of characters of class cls, at most
 * max_chars characters. */
static size_t run_len(const uint8_t *s, size_t n, ml_uclass cls, size_t max_chars)
{
    size_t i = 0;
    for (size_t k = 0; k < max_chars && i < n; k++) {
        uchar c = read_char(s + i, n - i);
        if (c.cls != cls)
            break;
        i += c.len;
    }
    return i;
}

size_t ml_pretoken_len(const uint8_t *s, size_t n)
{
    uchar c0 = read_char(s, n);

    if (c0.cp == '\'') {
        size_t m = contraction_len(s, n);
        if (m)
            return m;
    }

    /* A2: letters, or one character that is not a letter, number or line
     * break followed by letters. */
    if (c0.cls == ML_UCLASS_LETTER)
        return c0.len + run_len(s + c0.len, n - c0.len, ML_UCLASS_LETTER, SIZE_MAX);
    if (c0.cls != ML_UCLASS_NUMBER && !is_line_break(c0.cp)) {
        size_t m = run_len(s + c0.len, n - c0.len, ML_UCLASS_LETTER, SIZE_MAX);
        if (m)
            return c0.len + m;
    }

    /* A3 */
    if (c0.cls == ML_UCLASS_NUMBER)
        return c0.len + run_len(s + c0.len, n - c0.len, ML_UCLASS_NUMBER, 2);

    /* A4: c0 is OTHER, or a space with an OTHER character after it. */
    size_t p = c0.cp == ' ' ? 1 : 0;
    if (p < n && read_char(s + p, n - p).cls == ML_UCLASS_OTHER) {
        size_t e = p + run_len(s + p, n - p, ML_UCLASS_OTHER, SIZE_MAX);
        while (e < n && is_line_break(s[e]))
            e++;
        return e;
    }

    /* c0 is whitespace: A5, A6, A7 over the run of whitespace. */
    size_t end = 0, last_start = 0, after_break = 0;
    while (end < n) {
        uchar c = read_char(s + end, n - end);
        if (c.cls != ML_UCLASS_SPACE)
            break;
        last_start = end;
        end += c.len;
        if (is_line_break(c.cp))
            after_break = end;
    }
    if (after_break)
        return after_break;
    if (end == n || last_start == 0)
        return end;
    return last_start;
}

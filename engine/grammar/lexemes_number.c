/* Number lexemes (lexemes.h): integers under bounds and multipleOf, numbers
 * under bounds. A range of values becomes two automata over magnitudes,
 * "at least a" and "at most b" for decimal strings a and b, intersected;
 * negative values are "-" and a magnitude range. multipleOf is a residue
 * automaton over the digits.
 *
 * Narrowing (what is refused although Python's jsonschema would accept it):
 *   - integer texts (no fraction, no exponent) have at most 19 digits, and
 *     at most 2^53 in magnitude under multipleOf (Python divides a float
 *     multipleOf in floats, exact only up to 2^53); Python refuses integer
 *     texts of more than 4300 digits outright;
 *   - "-0" and negative zeros ("-0.0") are refused;
 *   - a bound of 2^53 or more in magnitude is first moved one double
 *     inward: the schema may have written an integer Python keeps exact
 *     while the double it was read into rounded it;
 *   - under a bound, number texts have no exponent, and each bound is moved
 *     inward to a decimal of at most 17 significant digits and 30
 *     decimals (so "exclusiveMinimum": 0 refuses values below 1e-30).
 * A number text is compared exactly as a decimal with the moved bound s:
 * as s is inside the double bound, both Python's exact comparison of an
 * integer and its comparison of the rounded float of a fraction (rounding
 * is monotone, and an exclusive bound is first replaced by the next double
 * inside) agree that the text is within. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/fsm_internal.h"
#include "grammar/lexemes.h"

#define NUM_MAX_INT_TEXT_DIGITS 19
#define NUM_BOUND_SIG_DIGITS 17
#define NUM_BOUND_FRAC_DIGITS 30
/* A double's exact decimal expansion has at most 1074 decimals and 309
 * integer digits. */
#define NUM_EXACT_DECIMALS 1080
#define NUM_TEXT_MAX (NUM_EXACT_DECIMALS + 320)
#define NUM_INT_BOUND_LIMIT 9223372036854775808.0    /* 2^63 */
#define NUM_EXACT_FLOAT_LIMIT "9007199254740992"     /* 2^53 */
#define NUM_EXACT_DOUBLE_INTEGERS 9007199254740992.0 /* 2^53 */
#define NUM_RADIX 10u

/* A nonnegative decimal: integer digits (no leading zero but "0") and
 * fraction digits (no trailing zero, may be empty). */
typedef struct decimal {
    char int_part[NUM_TEXT_MAX];
    char frac[NUM_TEXT_MAX];
} decimal;

/* ---- digit automata ---------------------------------------------------------------- */

static ml_fsm *ch(ml_fsm_ctx *c, char x)
{
    return ml_fsm_byte_range(c, (uint8_t)x, (uint8_t)x);
}

static ml_fsm *digits(ml_fsm_ctx *c, char lo, char hi, uint32_t min, uint32_t max)
{
    return ml_fsm_repeat(c, ml_fsm_byte_range(c, (uint8_t)lo, (uint8_t)hi), min, max);
}

/* Canonical naturals of at most max_digits digits (ML_FSM_UNBOUNDED: any). */
static ml_fsm *naturals(ml_fsm_ctx *c, uint32_t max_digits)
{
    uint32_t more = max_digits == ML_FSM_UNBOUNDED ? ML_FSM_UNBOUNDED : max_digits - 1;
    return ml_fsm_union(c, ch(c, '0'),
                        ml_fsm_concat(c, digits(c, '1', '9', 1, 1), digits(c, '0', '9', 0, more)));
}

/* "." and one or more digits, optional when `optional`. */
static ml_fsm *fraction(ml_fsm_ctx *c, bool optional)
{
    ml_fsm *f = ml_fsm_concat(c, ch(c, '.'), digits(c, '0', '9', 1, ML_FSM_UNBOUNDED));
    return optional ? ml_fsm_repeat(c, f, 0, 1) : f;
}

/* Digit strings of the length of s (n digits) that compare above s (gt)
 * or below it (lt, the first digit at least first_min). */
static ml_fsm *same_length(ml_fsm_ctx *c, const char *s, size_t n, bool gt, char first_min)
{
    ml_fsm *a = ml_fsm_nothing(c);
    for (size_t i = n; i-- > 0;) {
        ml_fsm *other;
        char lo = gt ? (char)(s[i] + 1) : i == 0 ? first_min : '0';
        char hi = gt ? '9' : (char)(s[i] - 1);
        if (lo <= hi)
            other =
                ml_fsm_concat(c, digits(c, lo, hi, 1, 1),
                              digits(c, '0', '9', (uint32_t)(n - 1 - i), (uint32_t)(n - 1 - i)));
        else
            other = ml_fsm_nothing(c);
        a = ml_fsm_union(c, ml_fsm_concat(c, ch(c, s[i]), a), other);
    }
    return a;
}

/* Fraction digit strings F with 0.F >= 0.f (ge) or <= 0.f. */
static ml_fsm *fraction_cmp(ml_fsm_ctx *c, const char *f, bool ge)
{
    size_t n = strlen(f);
    ml_fsm *a =
        ge ? digits(c, '0', '9', 0, ML_FSM_UNBOUNDED) : digits(c, '0', '0', 0, ML_FSM_UNBOUNDED);
    for (size_t i = n; i-- > 0;) {
        char lo = ge ? (char)(f[i] + 1) : '0', hi = ge ? '9' : (char)(f[i] - 1);
        ml_fsm *other = lo <= hi ? ml_fsm_concat(c, digits(c, lo, hi, 1, 1),
                                                 digits(c, '0', '9', 0, ML_FSM_UNBOUNDED))
                                 : ml_fsm_nothing(c);
        a = ml_fsm_union(c, ml_fsm_concat(c, ch(c, f[i]), a), other);
        if (!ge)
            a = ml_fsm_union(c, a, ml_fsm_epsilon(c));
    }
    return a;
}

/* Canonical nonnegative decimal texts (a fraction when allow_frac) whose
 * value is at least d (ge) or at most d. */
static ml_fsm *decimal_cmp(ml_fsm_ctx *c, const decimal *d, bool ge, bool allow_frac)
{
    size_t n = strlen(d->int_part);
    ml_fsm *other_ints; /* integer parts strictly beyond d's */
    if (ge)
        other_ints = ml_fsm_union(c,
                                  ml_fsm_concat(c, digits(c, '1', '9', 1, 1),
                                                digits(c, '0', '9', (uint32_t)n, ML_FSM_UNBOUNDED)),
                                  same_length(c, d->int_part, n, true, '0'));
    else
        other_ints = ml_fsm_union(c, n >= 2 ? naturals(c, (uint32_t)n - 1) : ml_fsm_nothing(c),
                                  same_length(c, d->int_part, n, false, n > 1 ? '1' : '0'));
    ml_fsm *any_frac = allow_frac ? fraction(c, true) : ml_fsm_epsilon(c);
    ml_fsm *same_frac; /* fractions after d's integer part */
    if (!allow_frac)
        same_frac = ge && d->frac[0] ? ml_fsm_nothing(c) : ml_fsm_epsilon(c);
    else if (ge && !d->frac[0])
        same_frac = fraction(c, true);
    else if (ge)
        same_frac = ml_fsm_concat(c, ch(c, '.'), fraction_cmp(c, d->frac, true));
    else
        same_frac =
            ml_fsm_union(c, ml_fsm_epsilon(c),
                         ml_fsm_concat(c, ch(c, '.'),
                                       ml_fsm_intersect(c, fraction_cmp(c, d->frac, false),
                                                        digits(c, '0', '9', 1, ML_FSM_UNBOUNDED))));
    return ml_fsm_union(c, ml_fsm_concat(c, other_ints, any_frac),
                        ml_fsm_concat(c, ml_fsm_literal(c, d->int_part, n), same_frac));
}

/* Magnitudes within [lo, hi] (NULL: no bound) in canonical form. */
static ml_fsm *magnitudes(ml_fsm_ctx *c, const decimal *lo, const decimal *hi, bool allow_frac)
{
    ml_fsm *a = lo ? decimal_cmp(c, lo, true, allow_frac)
                   : ml_fsm_concat(c, naturals(c, ML_FSM_UNBOUNDED),
                                   allow_frac ? fraction(c, true) : ml_fsm_epsilon(c));
    return hi ? ml_fsm_intersect(c, a, decimal_cmp(c, hi, false, allow_frac)) : a;
}

/* ---- decimals of bounds --------------------------------------------------------- */

static void decimal_strip(char *int_part, char *frac)
{
    size_t lead = 0, n = strlen(int_part);
    while (lead + 1 < n && int_part[lead] == '0')
        lead++;
    memmove(int_part, int_part + lead, n - lead + 1);
    for (size_t f = strlen(frac); f > 0 && frac[f - 1] == '0'; f--)
        frac[f - 1] = 0;
}

/* x >= 0 (finite) as a decimal of at most 17 significant digits and 30
 * decimals, rounded up (up) or down from x's exact value. */
static void decimal_of(double x, bool up, decimal *d)
{
    char text[NUM_TEXT_MAX + 8];
    snprintf(text, sizeof text, "%.*f", NUM_EXACT_DECIMALS, x); /* glibc: exact */
    char *dot = strchr(text, '.');
    size_t n_int = (size_t)(dot - text);
    /* The digits without the point: text[0, n_int) then the decimals. */
    memmove(dot, dot + 1, strlen(dot + 1) + 1);
    size_t len = strlen(text), first = 0;
    while (first < len && text[first] == '0')
        first++;
    size_t cut = first + NUM_BOUND_SIG_DIGITS;
    if (cut > n_int + NUM_BOUND_FRAC_DIGITS)
        cut = n_int + NUM_BOUND_FRAC_DIGITS;
    if (cut > len)
        cut = len;
    bool rest = false;
    for (size_t i = cut; i < len; i++)
        rest |= text[i] != '0';
    memset(text + cut, '0', len - cut);
    if (up && rest) {
        size_t i = cut;
        while (i > 0 && text[i - 1] == '9')
            text[--i] = '0';
        if (i > 0) {
            text[i - 1]++;
        } else { /* all nines: one more integer digit */
            memmove(text + 1, text, len + 1);
            text[0] = '1';
            n_int++;
            len++;
        }
    }
    memcpy(d->int_part, text, n_int);
    d->int_part[n_int] = 0;
    snprintf(d->frac, sizeof d->frac, "%s", text + n_int);
    decimal_strip(d->int_part, d->frac);
}

static void decimal_of_text(const char *digits_text, decimal *d)
{
    snprintf(d->int_part, sizeof d->int_part, "%s", digits_text);
    d->frac[0] = 0;
}

/* x, a nonnegative integer below 2^63, exactly. */
static void decimal_of_integer(double x, decimal *d)
{
    snprintf(d->int_part, sizeof d->int_part, "%.0f", x);
    d->frac[0] = 0;
}

/* ---- integers ------------------------------------------------------------------- */

/* Digit strings whose value is a multiple of m (the empty string too: the
 * caller intersects with canonical forms). Takes the trailing zeros of m
 * as a literal suffix so multipleOf 1000 costs 4 states, not 1000. */
static ml_fsm *multiples(ml_fsm_ctx *c, uint64_t m)
{
    uint32_t zeros = 0;
    while (m % NUM_RADIX == 0) {
        m /= NUM_RADIX;
        zeros++;
    }
    if (ml_fsm_ctx_status(c) != ML_OK)
        return NULL;
    if (m > c->max_states) {
        ml_fsm_ctx_fail(c, ML_ERR_TOO_LARGE, "multipleOf: %llu needs more than %u states",
                        (unsigned long long)m, c->max_states);
        return NULL;
    }
    ml_fsm *a = fsm_alloc(c);
    for (uint64_t r = 0; a && r < m; r++)
        if (fsm_add_state(c, a, r == 0, 0) == FSM_NONE) {
            ml_fsm_free(a);
            return NULL;
        }
    for (uint64_t r = 0; a && r < m; r++) {
        fsm_open(a, (uint32_t)r);
        for (uint32_t digit = 0; digit < NUM_RADIX; digit++)
            if (!fsm_add_edge(c, a, '0' + digit, '0' + digit,
                              (uint32_t)((r * NUM_RADIX + digit) % m))) {
                ml_fsm_free(a);
                return NULL;
            }
    }
    if (a)
        fsm_seal(a);
    a = fsm_finish(c, a);
    return ml_fsm_union(c, ch(c, '0'), ml_fsm_concat(c, a, digits(c, '0', '0', zeros, zeros)));
}

/* A bound of 2^53 or more in magnitude moved to the next double inside
 * (toward the allowed values): the schema may have written an integer
 * that Python keeps exact and the double rounded by up to half a step. */
static double inward(double v, bool lower)
{
    if (fabs(v) < NUM_EXACT_DOUBLE_INTEGERS)
        return v;
    return nextafter(v, lower ? INFINITY : -INFINITY);
}

static bool bound_ok(ml_fsm_ctx *c, ml_lex_bound b, double limit, const char *what)
{
    if (!b.present)
        return true;
    if (!isfinite(b.value)) {
        ml_fsm_ctx_fail(c, ML_ERR_INVALID_ARG, "%s: bound is not a finite number", what);
        return false;
    }
    if (fabs(b.value) >= limit) {
        ml_fsm_ctx_fail(c, ML_ERR_UNSUPPORTED, "%s: bound %g beyond +-2^63", what, b.value);
        return false;
    }
    return true;
}

ml_fsm *ml_lex_json_integer(ml_fsm_ctx *c, ml_lex_bound lo, ml_lex_bound hi, uint64_t multiple_of)
{
    if (ml_fsm_ctx_status(c) != ML_OK || !bound_ok(c, lo, NUM_INT_BOUND_LIMIT, "integer") ||
        !bound_ok(c, hi, NUM_INT_BOUND_LIMIT, "integer"))
        return NULL;
    /* The integer bounds, exact in doubles below 2^63. */
    double lv = inward(lo.value, true), hv = inward(hi.value, false);
    double l = lo.exclusive ? floor(lv) + 1 : ceil(lv);
    double h = hi.exclusive ? ceil(hv) - 1 : floor(hv);
    decimal d_lo, d_hi, d_cap, d_one;
    char text[NUM_TEXT_MAX];
    if (multiple_of)
        decimal_of_text(NUM_EXACT_FLOAT_LIMIT, &d_cap);
    else {
        memset(text, '9', NUM_MAX_INT_TEXT_DIGITS);
        text[NUM_MAX_INT_TEXT_DIGITS] = 0;
        decimal_of_text(text, &d_cap);
    }
    decimal_of_text("1", &d_one);
    ml_fsm *cap = decimal_cmp(c, &d_cap, false, false);

    ml_fsm *nonneg = ml_fsm_nothing(c), *neg = ml_fsm_nothing(c);
    if (!hi.present || h >= 0) {
        if (lo.present && l > 0)
            decimal_of_integer(l, &d_lo);
        if (hi.present)
            decimal_of_integer(h, &d_hi);
        ml_fsm_free(nonneg);
        nonneg = ml_fsm_intersect(
            c, magnitudes(c, lo.present && l > 0 ? &d_lo : NULL, hi.present ? &d_hi : NULL, false),
            ml_fsm_copy(c, cap));
    }
    if (!lo.present || l < 0) {
        if (lo.present)
            decimal_of_integer(-l, &d_hi);
        if (hi.present && h < 0)
            decimal_of_integer(-h, &d_lo);
        ml_fsm_free(neg);
        neg = ml_fsm_intersect(
            c,
            magnitudes(c, hi.present && h < 0 ? &d_lo : &d_one, lo.present ? &d_hi : NULL, false),
            ml_fsm_copy(c, cap));
    }
    ml_fsm_free(cap);
    if (multiple_of) {
        nonneg = ml_fsm_intersect(c, nonneg, multiples(c, multiple_of));
        neg = ml_fsm_intersect(c, neg, multiples(c, multiple_of));
    }
    return ml_fsm_union(c, nonneg, ml_fsm_concat(c, ch(c, '-'), neg));
}

/* ---- numbers -------------------------------------------------------------------- */

/* Canonical nonnegative texts where integer texts have at most 19 digits. */
static ml_fsm *capped_shape(ml_fsm_ctx *c, bool exponent)
{
    ml_fsm *with_frac = ml_fsm_concat(c, naturals(c, ML_FSM_UNBOUNDED), fraction(c, false));
    ml_fsm *a = ml_fsm_union(c, naturals(c, NUM_MAX_INT_TEXT_DIGITS), with_frac);
    if (!exponent)
        return a;
    uint8_t e_set[32] = {0}, sign_set[32] = {0};
    e_set['e' >> 3] |= (uint8_t)(1u << ('e' & 7));
    e_set['E' >> 3] |= (uint8_t)(1u << ('E' & 7));
    sign_set['+' >> 3] |= (uint8_t)(1u << ('+' & 7));
    sign_set['-' >> 3] |= (uint8_t)(1u << ('-' & 7));
    ml_fsm *exponent_part =
        ml_fsm_concat(c, ml_fsm_byte_set(c, e_set),
                      ml_fsm_concat(c, ml_fsm_repeat(c, ml_fsm_byte_set(c, sign_set), 0, 1),
                                    digits(c, '0', '9', 1, ML_FSM_UNBOUNDED)));
    ml_fsm *with_exp = ml_fsm_concat(
        c, ml_fsm_concat(c, naturals(c, ML_FSM_UNBOUNDED), fraction(c, true)), exponent_part);
    return ml_fsm_union(c, a, with_exp);
}

static bool number_bound_ok(ml_fsm_ctx *c, ml_lex_bound b)
{
    if (b.present && !isfinite(b.value)) {
        ml_fsm_ctx_fail(c, ML_ERR_INVALID_ARG, "number: bound is not a finite number");
        return false;
    }
    return true;
}

ml_fsm *ml_lex_json_number(ml_fsm_ctx *c, ml_lex_bound lo, ml_lex_bound hi)
{
    if (ml_fsm_ctx_status(c) != ML_OK || !number_bound_ok(c, lo) || !number_bound_ok(c, hi))
        return NULL;
    if (!lo.present && !hi.present) {
        ml_fsm *a = capped_shape(c, true);
        ml_fsm *pos = ml_fsm_copy(c, a); /* before the concat below frees a */
        return ml_fsm_union(c, pos, ml_fsm_concat(c, ch(c, '-'), a));
    }
    /* Exclusive bounds become inclusive ones at the next double inside. */
    double lv = inward(lo.value, true), hv = inward(hi.value, false);
    double l = lo.exclusive ? nextafter(lv, INFINITY) : lv;
    double h = hi.exclusive ? nextafter(hv, -INFINITY) : hv;
    decimal d_lo, d_hi;
    ml_fsm *nonneg = ml_fsm_nothing(c), *neg = ml_fsm_nothing(c);
    if (!hi.present || h >= 0) {
        if (lo.present && l > 0)
            decimal_of(l, true, &d_lo);
        if (hi.present)
            decimal_of(h, false, &d_hi);
        ml_fsm_free(nonneg);
        nonneg = ml_fsm_intersect(
            c, magnitudes(c, lo.present && l > 0 ? &d_lo : NULL, hi.present ? &d_hi : NULL, true),
            capped_shape(c, false));
    }
    if (!lo.present || l < 0) {
        if (lo.present)
            decimal_of(-l, false, &d_hi);
        if (hi.present && h < 0)
            decimal_of(-h, true, &d_lo);
        ml_fsm *zeros = ml_fsm_concat(
            c, ch(c, '0'),
            ml_fsm_repeat(c, ml_fsm_concat(c, ch(c, '.'), digits(c, '0', '0', 1, ML_FSM_UNBOUNDED)),
                          0, 1));
        ml_fsm_free(neg);
        neg = ml_fsm_minus(c,
                           ml_fsm_intersect(c,
                                            magnitudes(c, hi.present && h < 0 ? &d_lo : NULL,
                                                       lo.present ? &d_hi : NULL, true),
                                            capped_shape(c, false)),
                           zeros);
    }
    return ml_fsm_union(c, nonneg, ml_fsm_concat(c, ch(c, '-'), neg));
}

/* The automata of the values of one JSON type under a schema's keywords
 * (schema_internal.h): scalars through lexemes.h, arrays composed with
 * fsm.h (objects: schema_object.c), enum/const values, and the shared "any
 * value" machine. Whitespace gaps ([ \t\n\r]*) sit between every two tokens inside
 * arrays and objects, never before or after a value: the container around a
 * value owns the gaps, so a document has none at either end. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/lexemes.h"
#include "grammar/regex.h"
#include "grammar/schema_internal.h"

/* Integers up to 2^53 are exact in a double, so their decimal text is
 * exactly the schema's number. */
#define SCHEMA_EXACT_INTEGER 9007199254740992.0
/* Digits enough for any double to read back the same (%.17g). */
#define SCHEMA_DOUBLE_DIGITS 17
/* A count keyword (maxLength, maxItems) at or over this is no bound: no
 * document the engine can generate is that long. */
#define SCHEMA_COUNT_UNBOUNDED 4294967295.0
/* A maxLength or maxItems above this is enforced as this (or minLength /
 * minItems when larger): a bounded repeat costs a copy of the item per
 * unit, so maxLength 32767 would need some 300000 states. A narrowing:
 * longer strings and arrays are refused. */
#define SCHEMA_MAX_ENFORCED_BOUND 1024u

/* ---- building blocks -------------------------------------------------------- */

ml_fsm *schema_lit(ml_fsm_ctx *fc, const char *s)
{
    return ml_fsm_literal(fc, s, strlen(s));
}

ml_fsm *schema_gap(ml_fsm_ctx *fc)
{
    uint8_t set[32] = {0};
    static const char ws[] = " \t\n\r";
    for (const char *p = ws; *p; p++)
        set[(uint8_t)*p >> 3] |= (uint8_t)(1u << ((uint8_t)*p & 7));
    return ml_fsm_repeat(fc, ml_fsm_byte_set(fc, set), 0, ML_FSM_UNBOUNDED);
}

ml_fsm *schema_comma(ml_fsm_ctx *fc)
{
    return cat(fc, schema_lit(fc, ","), schema_gap(fc));
}

ml_fsm *schema_member(ml_fsm_ctx *fc, ml_fsm *key, ml_fsm *value)
{
    return cat(fc, key, schema_gap(fc), schema_lit(fc, ":"), schema_gap(fc), value, schema_gap(fc));
}

ml_fsm *schema_copy(ml_fsm_ctx *fc, const ml_fsm *a)
{
    return a ? ml_fsm_copy(fc, a) : NULL;
}

char *schema_string_form(const char *utf8, size_t *n)
{
    size_t len = strlen(utf8);
    char *out = malloc(6 * len + 1); /* \u00XX is the longest form of a byte */
    if (!out)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)utf8[i];
        const char *esc = c == '"'    ? "\\\""
                          : c == '\\' ? "\\\\"
                          : c == '\b' ? "\\b"
                          : c == '\f' ? "\\f"
                          : c == '\n' ? "\\n"
                          : c == '\r' ? "\\r"
                          : c == '\t' ? "\\t"
                                      : NULL;
        if (esc) {
            memcpy(out + k, esc, 2);
            k += 2;
        } else if (c < 0x20) {
            k += (size_t)snprintf(out + k, 7, "\\u%04x", c);
        } else {
            out[k++] = (char)c;
        }
    }
    out[k] = '\0';
    *n = k;
    return out;
}

ml_fsm *schema_key_of(schema_compiler *sc, const char *name)
{
    ml_fsm_ctx *fc = sc->fc;
    return cat(fc, schema_lit(fc, "\""), ml_lex_json_string_content_of(fc, name, strlen(name)),
               schema_lit(fc, "\""));
}

bool schema_key_matches(schema_compiler *sc, const ml_fsm *a, const char *name)
{
    size_t n;
    char *form = schema_string_form(name, &n);
    char *quoted = form ? malloc(n + 2) : NULL;
    bool r = false;
    if (quoted) {
        quoted[0] = '"';
        memcpy(quoted + 1, form, n);
        quoted[n + 1] = '"';
        r = ml_fsm_matches(a, quoted, n + 2);
    } else {
        ml_fsm_ctx_fail(sc->fc, ML_ERR_NOMEM, "schema: out of memory");
    }
    free(form);
    free(quoted);
    return r;
}

ml_fsm *schema_any_string(ml_fsm_ctx *fc)
{
    ml_lex_string s = {.min_length = 0, .max_length = ML_FSM_UNBOUNDED};
    return ml_lex_json_string(fc, &s);
}

/* Keys of printable ASCII only (their one form: \" and \\ escaped): where
 * regex.c's automata match exactly what Python's re does (they are
 * narrower elsewhere: line terminators, Unicode classes), so a key outside
 * a pattern's automaton is surely outside the pattern. */
ml_fsm *schema_ascii_key(ml_fsm_ctx *fc)
{
    uint8_t plain[32] = {0};
    for (int b = 0x20; b < 0x7f; b++)
        if (b != '"' && b != '\\')
            plain[b >> 3] |= (uint8_t)(1u << (b & 7));
    ml_fsm *ch =
        alt(fc, ml_fsm_byte_set(fc, plain), schema_lit(fc, "\\\""), schema_lit(fc, "\\\\"));
    ml_fsm *body = ml_fsm_tag(fc, ml_fsm_repeat(fc, ch, 0, ML_FSM_UNBOUNDED), ML_FSM_TAG_IN_STRING);
    return cat(fc, schema_lit(fc, "\""), body, schema_lit(fc, "\""));
}

bool schema_ascii_printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return false;
    return true;
}

/* ---- keyword values ---------------------------------------------------------- */

/* A count keyword's value v (minLength, maxItems...): *out = it, or absent
 * when v is NULL; ML_FSM_UNBOUNDED at or over 2^32 - 1. False when it is
 * not a non-negative integer. */
static bool count_value(const cJSON *v, uint32_t absent, uint32_t *out)
{
    *out = absent;
    if (!v)
        return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return false;
    *out = v->valuedouble >= SCHEMA_COUNT_UNBOUNDED ? ML_FSM_UNBOUNDED : (uint32_t)v->valuedouble;
    return true;
}

/* count_value of node's key, refused (latched) when not a count. */
static bool count_of(schema_compiler *sc, const cJSON *node, const char *key, uint32_t absent,
                     uint32_t *out)
{
    if (count_value(cJSON_GetObjectItemCaseSensitive(node, key), absent, out))
        return true;
    schema_refuse(sc, ML_ERR_INVALID_ARG, key, "not a non-negative integer");
    return false;
}

/* The upper bound enforced for [min, max] (SCHEMA_MAX_ENFORCED_BOUND). */
static uint32_t enforced_max(uint32_t min, uint32_t max)
{
    if (max == ML_FSM_UNBOUNDED || max <= SCHEMA_MAX_ENFORCED_BOUND)
        return max;
    return min > SCHEMA_MAX_ENFORCED_BOUND ? min : SCHEMA_MAX_ENFORCED_BOUND;
}

/* ---- scalars ----------------------------------------------------------------- */

static ml_fsm *schema_string(schema_compiler *sc, const cJSON *node)
{
    ml_lex_string s = {0};
    if (!count_of(sc, node, "minLength", 0, &s.min_length) ||
        !count_of(sc, node, "maxLength", ML_FSM_UNBOUNDED, &s.max_length))
        return NULL;
    s.max_length = enforced_max(s.min_length, s.max_length);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(node, "pattern");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(node, "format");
    if (p && !cJSON_IsString(p))
        return schema_refuse(sc, ML_ERR_INVALID_ARG, "pattern", "not a string");
    if (f && !cJSON_IsString(f))
        return schema_refuse(sc, ML_ERR_INVALID_ARG, "format", "not a string");
    if (p) {
        s.pattern = p->valuestring;
        s.pattern_len = strlen(p->valuestring);
    }
    s.format = f ? f->valuestring : NULL;
    ml_fsm *a = ml_lex_json_string(sc->fc, &s);
    if (!a)
        schema_locate(sc);
    return a;
}

/* True when node's keywords other than annotations (schema_check's: the
 * table's and unknown ones) are the type keyword, equal to type, and those
 * named in also (NULL-terminated). */
static bool only_keywords(const cJSON *node, const char *type, const char *const *also)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(node, "type");
    if (!cJSON_IsObject(node) || !cJSON_IsString(t) || strcmp(t->valuestring, type) != 0)
        return false;
    for (const cJSON *m = node->child; m; m = m->next) {
        const schema_kw *kw = schema_keyword(m->string);
        bool listed = !strcmp(m->string, "type");
        for (const char *const *a = also; *a && !listed; a++)
            listed = !strcmp(m->string, *a);
        if (!listed && kw && kw->cls != KW_ANNOTATION) /* unknown: an annotation */
            return false;
    }
    return true;
}

/* True when node or a schema under it has a format lexemes.h refuses
 * (neither built nor ignored). */
static bool has_unknown_format(const cJSON *node)
{
    for (const cJSON *m = node ? node->child : NULL; m; m = m->next) {
        if (m->string && !strcmp(m->string, "format") && cJSON_IsString(m) &&
            !ml_lex_format_ignored(m->valuestring)) {
            const char *const *f = ml_lex_formats;
            while (*f && strcmp(*f, m->valuestring) != 0)
                f++;
            if (!*f)
                return true;
        }
        if (has_unknown_format(m))
            return true;
    }
    return false;
}

/* True when compiling string schema node (only_keywords) refuses nothing,
 * in schema_string's order; false (latched when surely) otherwise. */
static bool string_refuses_nothing(schema_compiler *sc, const cJSON *node)
{
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(node, "minLength");
    const cJSON *hi = cJSON_GetObjectItemCaseSensitive(node, "maxLength");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(node, "pattern");
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(node, "format");
    uint32_t min, max;
    if (!count_value(lo, 0, &min) || !count_value(hi, ML_FSM_UNBOUNDED, &max) ||
        (p && !cJSON_IsString(p)) || (f && !cJSON_IsString(f)))
        return false;
    if (min > enforced_max(min, max))
        return true; /* no string: neither format nor pattern is read */
    if (f && !ml_lex_format_check(sc->fc, f->valuestring)) {
        schema_locate(sc);
        return false;
    }
    if (!p)
        return true;
    /* Whether regex.h takes the pattern, apart from the compilation. */
    ml_fsm_ctx *scratch = ml_fsm_ctx_create(sc->max_states, sc->deadline_ms);
    ml_fsm *a = scratch ? ml_regex_compile(scratch, p->valuestring, strlen(p->valuestring)) : NULL;
    ml_fsm_free(a);
    ml_fsm_ctx_destroy(scratch);
    return a != NULL;
}

static bool refuses_nothing(schema_compiler *sc, const cJSON *node);

/* refuses_nothing of node's key (its pointer pushed as compiling does). */
static bool refuses_nothing_at(schema_compiler *sc, const cJSON *node, const char *key,
                               const char *name)
{
    size_t at = schema_pointer_push(sc, key, 0);
    if (name)
        schema_pointer_push(sc, name, 0);
    bool r = refuses_nothing(sc, node);
    schema_pointer_pop(sc, at);
    return r;
}

/* True when compiling node refuses nothing (bounds aside), walked in the
 * order compiling takes; false at the first node that may refuse, with
 * the error latched when it surely does (an unknown format). */
static bool refuses_nothing(schema_compiler *sc, const cJSON *node)
{
    static const char *const none[] = {NULL};
    static const char *const string_kw[] = {"format", "pattern", "minLength", "maxLength", NULL};
    static const char *const array_kw[] = {"items", NULL};
    static const char *const object_kw[] = {"properties", "required", "additionalProperties",
                                            NULL};
    static const char *const scalars[] = {"integer", "number", "boolean", "null"};
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++)
        if (only_keywords(node, scalars[i], none))
            return true;
    if (only_keywords(node, "string", string_kw))
        return string_refuses_nothing(sc, node);
    if (only_keywords(node, "array", array_kw))
        return refuses_nothing_at(sc, cJSON_GetObjectItemCaseSensitive(node, "items"), "items",
                                  NULL);
    if (!only_keywords(node, "object", object_kw))
        return false;
    /* members_init's checks, then the values in order. */
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(node, "additionalProperties");
    if ((props && !cJSON_IsObject(props)) || (req && !cJSON_IsArray(req)) ||
        (add && !cJSON_IsBool(add)))
        return false;
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r))
            return false;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next)
        for (const cJSON *q = props->child; q != p; q = q->next)
            if (!strcmp(p->string, q->string))
                return false;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next)
        if (!refuses_nothing_at(sc, p, "properties", p->string))
            return false;
    return true;
}

void schema_refuse_early(schema_compiler *sc, const cJSON *root)
{
    if (has_unknown_format(root))
        refuses_nothing(sc, root);
}

/* One side's bound: key (inclusive) and its exclusive twin, in the draft-4
 * form (a boolean modifying key) or the later one (a number); the stricter
 * when both are numbers. */
static bool bound_of(schema_compiler *sc, const cJSON *node, const char *key, const char *excl,
                     bool lower, ml_lex_bound *b)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, key);
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(node, excl);
    *b = (ml_lex_bound){0};
    if (v && !cJSON_IsNumber(v)) {
        schema_refuse(sc, ML_ERR_INVALID_ARG, key, "not a number");
        return false;
    }
    if (x && !cJSON_IsNumber(x) && !cJSON_IsBool(x)) {
        schema_refuse(sc, ML_ERR_INVALID_ARG, excl, "not a number or a boolean");
        return false;
    }
    if (v)
        *b = (ml_lex_bound){.present = true, .exclusive = cJSON_IsTrue(x), .value = v->valuedouble};
    if (cJSON_IsNumber(x)) {
        double xv = x->valuedouble;
        if (!b->present || (lower ? xv >= b->value : xv <= b->value))
            *b = (ml_lex_bound){.present = true, .exclusive = true, .value = xv};
    }
    return true;
}

/* Integers, or numbers when !integer; a number schema with an integer
 * multipleOf admits integers only (narrower: 4.0 is refused, 4 accepted). */
static ml_fsm *schema_numeric(schema_compiler *sc, const cJSON *node, bool integer)
{
    ml_lex_bound lo, hi;
    if (!bound_of(sc, node, "minimum", "exclusiveMinimum", true, &lo) ||
        !bound_of(sc, node, "maximum", "exclusiveMaximum", false, &hi))
        return NULL;
    uint64_t mult = 0;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(node, "multipleOf");
    if (m) {
        if (!cJSON_IsNumber(m) || !(m->valuedouble > 0))
            return schema_refuse(sc, ML_ERR_INVALID_ARG, "multipleOf", "not a number above 0");
        if (m->valuedouble != floor(m->valuedouble) || m->valuedouble > 0x1p63)
            return schema_refuse(sc, ML_ERR_UNSUPPORTED, "multipleOf",
                                 "only integer divisors up to 2^63 are enforced exactly");
        mult = (uint64_t)m->valuedouble;
        integer = true;
    }
    return integer ? ml_lex_json_integer(sc->fc, lo, hi, mult)
                   : ml_lex_json_number(sc->fc, lo, hi);
}

/* ---- arrays ------------------------------------------------------------------ */

/* A value then its trailing gap; *none when no value is valid. */
static ml_fsm *element(schema_compiler *sc, const cJSON *schema, const char *key, int index,
                       bool *none)
{
    bool any;
    ml_fsm *v = schema ? schema_compile_at(sc, schema, key, index, &any) : schema_any(sc);
    *none = v && ml_fsm_is_empty(v);
    return ml_fsm_concat(sc->fc, v, schema_gap(sc->fc));
}

static ml_fsm *schema_array(schema_compiler *sc, const cJSON *node)
{
    ml_fsm_ctx *fc = sc->fc;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(node, "prefixItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(node, "items");
    const cJSON *rest = items;
    const char *rest_key = "items";
    if (pre && (!cJSON_IsArray(pre) || cJSON_IsArray(items)))
        return schema_refuse(sc, ML_ERR_INVALID_ARG, "prefixItems",
                             "not an array of schemas, or beside an array 'items'");
    if (cJSON_IsArray(items)) { /* draft 4: items as an array, additionalItems after it */
        pre = items;
        rest = cJSON_GetObjectItemCaseSensitive(node, "additionalItems");
        rest_key = "additionalItems";
    }
    uint32_t min, max;
    if (!count_of(sc, node, "minItems", 0, &min) ||
        !count_of(sc, node, "maxItems", ML_FSM_UNBOUNDED, &max))
        return NULL;
    max = enforced_max(min, max);
    uint32_t m = pre ? (uint32_t)cJSON_GetArraySize(pre) : 0;

    /* The elements after the prefix: between lo and hi of them. */
    bool rest_none;
    ml_fsm *er = element(sc, rest, rest_key, 0, &rest_none);
    uint32_t lo = min > m ? min - m : 0;
    uint32_t hi = rest_none ? 0 : max == ML_FSM_UNBOUNDED ? ML_FSM_UNBOUNDED : max > m ? max - m : 0;
    /* The elements after the prefix: with no prefix, the first has no comma
     * before it (tail_first); after a prefix, each has (r). */
    ml_fsm *tail_first = NULL, *r = NULL;
    if (lo > hi || hi == 0) {
        *(m == 0 ? &tail_first : &r) = lo > hi ? ml_fsm_nothing(fc) : ml_fsm_epsilon(fc);
    } else if (m == 0) {
        uint32_t more_hi = hi == ML_FSM_UNBOUNDED ? ML_FSM_UNBOUNDED : hi - 1;
        tail_first = cat(fc, schema_copy(fc, er),
                         ml_fsm_repeat(fc, cat(fc, schema_comma(fc), schema_copy(fc, er)),
                                       lo ? lo - 1 : 0, more_hi));
        if (lo == 0)
            tail_first = ml_fsm_union(fc, tail_first, ml_fsm_epsilon(fc));
    } else {
        r = ml_fsm_repeat(fc, cat(fc, schema_comma(fc), schema_copy(fc, er)), lo, hi);
    }
    ml_fsm_free(er);

    /* r: what may follow i elements (a comma first), from i = m down to 1. */
    ml_fsm *body;
    if (m == 0) {
        body = tail_first;
    } else {
        ml_fsm **e = calloc(m, sizeof *e);
        if (!e) {
            ml_fsm_free(r);
            ml_fsm_ctx_fail(fc, ML_ERR_NOMEM, "schema: out of memory");
            return NULL;
        }
        size_t at = schema_pointer_push(sc, cJSON_IsArray(items) ? "items" : "prefixItems", 0);
        int i = 0;
        for (const cJSON *p = pre->child; p; p = p->next, i++) {
            bool none;
            e[i] = element(sc, p, NULL, i, &none);
        }
        schema_pointer_pop(sc, at);
        for (uint32_t k = m - 1; k >= 1; k--) {
            ml_fsm *cont = k < max ? cat(fc, schema_comma(fc), e[k], r)
                                   : (ml_fsm_free(e[k]), ml_fsm_free(r), ml_fsm_nothing(fc));
            r = k >= min ? ml_fsm_union(fc, ml_fsm_epsilon(fc), cont) : cont;
        }
        ml_fsm *cont = max > 0 ? cat(fc, e[0], r)
                               : (ml_fsm_free(e[0]), ml_fsm_free(r), ml_fsm_nothing(fc));
        body = min == 0 ? ml_fsm_union(fc, ml_fsm_epsilon(fc), cont) : cont;
        free(e);
    }
    return cat(fc, schema_lit(fc, "["), schema_gap(fc), body, schema_lit(fc, "]"));
}

/* ---- types, any value, literals ---------------------------------------------- */

ml_fsm *schema_typed(schema_compiler *sc, const cJSON *node, unsigned types)
{
    ml_fsm_ctx *fc = sc->fc;
    ml_fsm *r[7];
    size_t n = 0;
    if (types & SCHEMA_T_NULL)
        r[n++] = schema_lit(fc, "null");
    if (types & SCHEMA_T_BOOLEAN) {
        r[n++] = schema_lit(fc, "true");
        r[n++] = schema_lit(fc, "false");
    }
    if (types & (SCHEMA_T_NUMBER | SCHEMA_T_INTEGER))
        r[n++] = schema_numeric(sc, node, !(types & SCHEMA_T_NUMBER));
    if (types & SCHEMA_T_STRING)
        r[n++] = schema_string(sc, node);
    if (types & SCHEMA_T_ARRAY)
        r[n++] = schema_array(sc, node);
    if (types & SCHEMA_T_OBJECT)
        r[n++] = schema_object(sc, node);
    return ml_fsm_union_n(fc, r, n);
}

/* Every JSON value with containers nested at most depth deep. */
static ml_fsm *any_nested(ml_fsm_ctx *fc, uint32_t depth)
{
    ml_lex_bound none = {0};
    ml_fsm *scalar =
        alt(fc, schema_lit(fc, "null"), schema_lit(fc, "true"), schema_lit(fc, "false"),
            ml_lex_json_number(fc, none, none), schema_any_string(fc));
    ml_fsm *v = schema_copy(fc, scalar);
    for (uint32_t d = 0; d < depth; d++) {
        ml_fsm *item = cat(fc, schema_copy(fc, v), schema_gap(fc));
        ml_fsm *more = ml_fsm_repeat(fc, cat(fc, schema_comma(fc), schema_copy(fc, item)), 0,
                                     ML_FSM_UNBOUNDED);
        ml_fsm *arr =
            cat(fc, schema_lit(fc, "["), schema_gap(fc),
                ml_fsm_union(fc, ml_fsm_epsilon(fc), cat(fc, item, more)), schema_lit(fc, "]"));
        ml_fsm *mem = schema_member(fc, schema_any_string(fc), v);
        ml_fsm *mems =
            ml_fsm_repeat(fc, cat(fc, schema_comma(fc), schema_copy(fc, mem)), 0, ML_FSM_UNBOUNDED);
        ml_fsm *obj =
            cat(fc, schema_lit(fc, "{"), schema_gap(fc),
                ml_fsm_union(fc, ml_fsm_epsilon(fc), cat(fc, mem, mems)), schema_lit(fc, "}"));
        v = alt(fc, schema_copy(fc, scalar), arr, obj);
    }
    ml_fsm_free(scalar);
    return v;
}

ml_fsm *schema_any(schema_compiler *sc)
{
    ml_fsm_ctx *fc = sc->fc;
    if (sc->regular_depth) {
        if (!sc->any_regular)
            sc->any_regular = any_nested(fc, sc->regular_depth);
        return schema_copy(fc, sc->any_regular);
    }
    if (sc->any_machine < 0) {
        int k = schema_machine_new(sc, "any value");
        if (k < 0)
            return NULL;
        sc->any_machine = k;
        ml_lex_bound none = {0};
        ml_fsm *v = ml_fsm_call(fc, (uint32_t)k);
        ml_fsm *items =
            cat(fc, schema_copy(fc, v), schema_gap(fc),
                ml_fsm_repeat(fc, cat(fc, schema_comma(fc), schema_copy(fc, v), schema_gap(fc)), 0,
                              ML_FSM_UNBOUNDED));
        ml_fsm *arr = cat(fc, schema_lit(fc, "["), schema_gap(fc),
                          ml_fsm_union(fc, ml_fsm_epsilon(fc), items), schema_lit(fc, "]"));
        ml_fsm *mem = schema_member(fc, schema_any_string(fc), v);
        ml_fsm *more = ml_fsm_repeat(fc, cat(fc, schema_comma(fc), schema_copy(fc, mem)), 0,
                                     ML_FSM_UNBOUNDED);
        ml_fsm *mems = cat(fc, mem, more);
        ml_fsm *obj = cat(fc, schema_lit(fc, "{"), schema_gap(fc),
                          ml_fsm_union(fc, ml_fsm_epsilon(fc), mems), schema_lit(fc, "}"));
        sc->machines[k].fsm =
            alt(fc, schema_lit(fc, "null"), schema_lit(fc, "true"), schema_lit(fc, "false"),
                ml_lex_json_number(fc, none, none), schema_any_string(fc), arr, obj);
        if (!sc->machines[k].fsm)
            return NULL;
    }
    return ml_fsm_call(fc, (uint32_t)sc->any_machine);
}

/* A number's one text: the integer when it is one exactly (|v| < 2^53),
 * else the shortest %g that reads back the same double. */
static ml_fsm *number_literal(schema_compiler *sc, double v)
{
    char buf[64];
    if (!isfinite(v))
        return schema_refuse(sc, ML_ERR_INVALID_ARG, "enum", "a number out of range");
    if (v == floor(v)) {
        if (fabs(v) >= SCHEMA_EXACT_INTEGER)
            return schema_refuse(sc, ML_ERR_UNSUPPORTED, "enum",
                                 "an integer beyond 2^53 (its exact value is not kept)");
        snprintf(buf, sizeof buf, "%.0f", v);
    } else {
        for (int p = 1; p <= SCHEMA_DOUBLE_DIGITS; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, v);
            if (strtod(buf, NULL) == v)
                break;
        }
    }
    return schema_lit(sc->fc, buf);
}

ml_fsm *schema_literal(schema_compiler *sc, const cJSON *v)
{
    ml_fsm_ctx *fc = sc->fc;
    if (cJSON_IsNull(v))
        return schema_lit(fc, "null");
    if (cJSON_IsTrue(v))
        return schema_lit(fc, "true");
    if (cJSON_IsFalse(v))
        return schema_lit(fc, "false");
    if (cJSON_IsNumber(v))
        return number_literal(sc, v->valuedouble);
    if (cJSON_IsString(v))
        return schema_key_of(sc, v->valuestring);
    bool obj = cJSON_IsObject(v);
    ml_fsm *r = cat(fc, schema_lit(fc, obj ? "{" : "["), schema_gap(fc));
    for (const cJSON *e = v->child; e; e = e->next) {
        if (e != v->child)
            r = cat(fc, r, schema_comma(fc));
        if (obj)
            r = cat(fc, r, schema_key_of(sc, e->string), schema_gap(fc), schema_lit(fc, ":"),
                    schema_gap(fc));
        r = cat(fc, r, schema_literal(sc, e), schema_gap(fc));
    }
    return cat(fc, r, schema_lit(fc, obj ? "}" : "]"));
}

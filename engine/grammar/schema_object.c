/* Object schemas (schema_internal.h): properties, required names,
 * patternProperties, additionalProperties and propertyNames as one
 * automaton over an object's members, built from schema_value.c's blocks.
 * Gaps as in schema_value.c: between every two tokens inside the object. */
#include <stdlib.h>
#include <string.h>

#include "grammar/lexemes.h"
#include "grammar/regex.h"
#include "grammar/schema_internal.h"

/* ---- objects ----------------------------------------------------------------- */

/* What an object schema's members are built from. */
typedef struct members {
    size_t n;              /* named members: properties, then required names not in them */
    const char **name;     /* borrowed */
    const cJSON **schema;  /* borrowed: the property's schema, NULL for a required-only name */
    bool *required;
    size_t n_pat;
    ml_fsm *pat_key[SCHEMA_MAX_PATTERN_PROPERTIES];   /* owned: quoted keys matching */
    const cJSON *pat_node[SCHEMA_MAX_PATTERN_PROPERTIES]; /* borrowed: their schemas */
    ml_fsm *add_value; /* owned: additionalProperties' values (empty when false) */
    ml_fsm *names; /* owned: propertyNames as quoted keys, NULL when unconstrained */
} members;

static void members_deinit(members *mb)
{
    free(mb->name);
    free(mb->schema);
    free(mb->required);
    for (size_t i = 0; i < mb->n_pat; i++) {
        ml_fsm_free(mb->pat_key[i]);
    }
    ml_fsm_free(mb->add_value);
    ml_fsm_free(mb->names);
}

static bool members_init(schema_compiler *sc, const cJSON *node, members *mb)
{
    ml_fsm_ctx *fc = sc->fc;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *pats = cJSON_GetObjectItemCaseSensitive(node, "patternProperties");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(node, "additionalProperties");
    const cJSON *pn = cJSON_GetObjectItemCaseSensitive(node, "propertyNames");
    if ((props && !cJSON_IsObject(props)) || (pats && !cJSON_IsObject(pats))) {
        schema_refuse(sc, ML_ERR_INVALID_ARG, props && !cJSON_IsObject(props) ? "properties"
                                                                               : "patternProperties",
                      "not an object of schemas");
        return false;
    }
    if (req && !cJSON_IsArray(req)) {
        schema_refuse(sc, ML_ERR_INVALID_ARG, "required", "not an array of names");
        return false;
    }
    size_t cap = (size_t)cJSON_GetArraySize(props) + (size_t)cJSON_GetArraySize(req);
    mb->name = calloc(cap + 1, sizeof *mb->name);
    mb->schema = calloc(cap + 1, sizeof *mb->schema);
    mb->required = calloc(cap + 1, sizeof *mb->required);
    if (!mb->name || !mb->schema || !mb->required) {
        ml_fsm_ctx_fail(fc, ML_ERR_NOMEM, "schema: out of memory");
        return false;
    }
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        for (size_t i = 0; i < mb->n; i++)
            if (!strcmp(mb->name[i], p->string)) {
                schema_refuse(sc, ML_ERR_INVALID_ARG, "properties", "a name given twice");
                return false;
            }
        mb->name[mb->n] = p->string;
        mb->schema[mb->n++] = p;
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) {
            schema_refuse(sc, ML_ERR_INVALID_ARG, "required", "not an array of names");
            return false;
        }
        size_t i = 0;
        while (i < mb->n && strcmp(mb->name[i], r->valuestring))
            i++;
        if (i == mb->n)
            mb->name[mb->n++] = r->valuestring;
        mb->required[i] = true;
    }

    size_t n_pat = (size_t)cJSON_GetArraySize(pats);
    if (n_pat > SCHEMA_MAX_PATTERN_PROPERTIES) {
        schema_refuse(sc, ML_ERR_UNSUPPORTED, "patternProperties",
                      "more than 4 patterns (their key regions grow as 2^n)");
        return false;
    }
    size_t at = schema_pointer_push(sc, "patternProperties", 0);
    for (const cJSON *p = pats ? pats->child : NULL; p; p = p->next) {
        size_t k = mb->n_pat++;
        mb->pat_key[k] =
            cat(fc, schema_lit(fc, "\""), ml_regex_compile(fc, p->string, strlen(p->string)),
                schema_lit(fc, "\""));
        mb->pat_node[k] = p;
        if (!mb->pat_key[k])
            schema_locate(sc);
    }
    schema_pointer_pop(sc, at);
    bool any;
    mb->add_value = add ? schema_compile_at(sc, add, "additionalProperties", 0, &any)
                        : schema_any(sc);
    if (pn) {
        at = schema_pointer_push(sc, "propertyNames", 0);
        mb->names = schema_compile_strings(sc, pn, &any);
        schema_pointer_pop(sc, at);
        if (any) {
            ml_fsm_free(mb->names);
            mb->names = NULL;
        }
    }
    return ml_fsm_ctx_status(fc) == ML_OK;
}

/* The value of named member i: its property's schema, and each pattern its
 * name matches, or else additionalProperties; nothing when propertyNames
 * refuses the name. */
static ml_fsm *member_value(schema_compiler *sc, const members *mb, size_t i)
{
    ml_fsm_ctx *fc = sc->fc;
    if (mb->names && !schema_key_matches(sc, mb->names, mb->name[i]))
        return ml_fsm_nothing(fc);
    const cJSON *nodes[SCHEMA_MAX_PATTERN_PROPERTIES + 1];
    size_t n = 0;
    if (mb->schema[i])
        nodes[n++] = mb->schema[i];
    for (size_t k = 0; k < mb->n_pat; k++) {
        if (schema_key_matches(sc, mb->pat_key[k], mb->name[i]))
            nodes[n++] = mb->pat_node[k];
        else if (!schema_ascii_printable(mb->name[i]))
            return schema_refuse(sc, ML_ERR_UNSUPPORTED, "patternProperties",
                                 "a property name beyond printable ASCII, where whether a "
                                 "pattern matches it is not decided exactly");
    }
    if (n == 0)
        return schema_copy(fc, mb->add_value);
    size_t at = schema_pointer_push(sc, "properties", 0);
    size_t at2 = schema_pointer_push(sc, mb->name[i], 0);
    bool any;
    ml_fsm *r = schema_compile_all(sc, nodes, n, &any);
    schema_pointer_pop(sc, at2);
    schema_pointer_pop(sc, at);
    return r;
}

/* The members not named: one region per set of patterns a key matches
 * (and none: additionalProperties), each key under the intersection of
 * their schemas; NULL (not an error) when no such key is valid. */
static ml_fsm *additional_members(schema_compiler *sc, const members *mb)
{
    ml_fsm_ctx *fc = sc->fc;
    if (mb->n_pat == 0 && ml_fsm_is_empty(mb->add_value))
        return NULL;
    ml_fsm *base = schema_any_string(fc);
    if (mb->n_pat) /* a key outside a pattern must surely be outside it */
        base = ml_fsm_intersect(fc, base, schema_ascii_key(fc));
    if (mb->names)
        base = ml_fsm_intersect(fc, base, schema_copy(fc, mb->names));
    if (mb->n) {
        ml_fsm **named = calloc(mb->n, sizeof *named);
        if (!named) {
            ml_fsm_free(base);
            ml_fsm_ctx_fail(fc, ML_ERR_NOMEM, "schema: out of memory");
            return NULL;
        }
        for (size_t i = 0; i < mb->n; i++)
            named[i] = schema_key_of(sc, mb->name[i]);
        base = ml_fsm_minus(fc, base, ml_fsm_union_n(fc, named, mb->n));
        free(named);
    }
    ml_fsm *regions[1u << SCHEMA_MAX_PATTERN_PROPERTIES];
    size_t n_regions = 0;
    for (unsigned set = 0; set < (1u << mb->n_pat) && base; set++) {
        ml_fsm *key = schema_copy(fc, base);
        for (size_t k = 0; k < mb->n_pat; k++)
            key = (set >> k) & 1 ? ml_fsm_intersect(fc, key, schema_copy(fc, mb->pat_key[k]))
                                 : ml_fsm_minus(fc, key, schema_copy(fc, mb->pat_key[k]));
        if (!key || ml_fsm_is_empty(key)) {
            ml_fsm_free(key);
            continue;
        }
        ml_fsm *value;
        if (set == 0) {
            value = schema_copy(fc, mb->add_value);
        } else {
            const cJSON *nodes[SCHEMA_MAX_PATTERN_PROPERTIES];
            size_t n = 0;
            for (size_t k = 0; k < mb->n_pat; k++)
                if ((set >> k) & 1)
                    nodes[n++] = mb->pat_node[k];
            bool any;
            size_t at = schema_pointer_push(sc, "patternProperties", 0);
            value = schema_compile_all(sc, nodes, n, &any);
            schema_pointer_pop(sc, at);
        }
        if (value && ml_fsm_is_empty(value)) {
            ml_fsm_free(key);
            ml_fsm_free(value);
            continue;
        }
        regions[n_regions++] = schema_member(fc, key, value);
    }
    ml_fsm_free(base);
    return n_regions ? ml_fsm_union_n(fc, regions, n_regions) : NULL;
}

/* A run of consecutive members (a leaf: one defined member, or the
 * additional ones): first, its non-empty selections written with commas
 * between them and none before (owned); empty, whether it may write
 * nothing (no required member in it). */
typedef struct span {
    ml_fsm *first;
    bool empty;
} span;

/* The members of l then r: a selection of both is l's, a comma, r's. Built
 * as a balanced tree of joins, so each member's automaton is copied about
 * log n times instead of n (a chain of suffixes costs n^2 states). */
static span join(ml_fsm_ctx *fc, span l, span r)
{
    ml_fsm *after = cat(fc, schema_comma(fc), schema_copy(fc, r.first));
    if (r.empty)
        after = ml_fsm_union(fc, ml_fsm_epsilon(fc), after);
    ml_fsm *first = cat(fc, l.first, after);
    if (l.empty)
        first = ml_fsm_union(fc, first, r.first);
    else
        ml_fsm_free(r.first);
    return (span){.first = first, .empty = l.empty && r.empty};
}

static span join_range(ml_fsm_ctx *fc, span *s, size_t lo, size_t hi)
{
    if (hi - lo == 1)
        return s[lo];
    size_t mid = lo + (hi - lo) / 2;
    span l = join_range(fc, s, lo, mid);
    return join(fc, l, join_range(fc, s, mid, hi));
}

/* Defined members first, in order, each optional one skippable, then any
 * number of additional ones, commas between them. */
ml_fsm *schema_object(schema_compiler *sc, const cJSON *node)
{
    ml_fsm_ctx *fc = sc->fc;
    members mb = {0};
    span *spans = NULL;
    ml_fsm *body = NULL;
    if (!members_init(sc, node, &mb))
        goto out;
    spans = calloc(mb.n + 1, sizeof *spans);
    if (!spans) {
        ml_fsm_ctx_fail(fc, ML_ERR_NOMEM, "schema: out of memory");
        goto out;
    }
    size_t n = 0;
    for (size_t i = 0; i < mb.n; i++)
        spans[n++] = (span){
            .first = schema_member(fc, schema_key_of(sc, mb.name[i]), member_value(sc, &mb, i)),
            .empty = !mb.required[i]};
    ml_fsm *x = additional_members(sc, &mb);
    if (x) {
        ml_fsm *more =
            ml_fsm_repeat(fc, cat(fc, schema_comma(fc), schema_copy(fc, x)), 0, ML_FSM_UNBOUNDED);
        spans[n++] = (span){.first = cat(fc, x, more), .empty = true};
    }
    if (n == 0) {
        body = ml_fsm_epsilon(fc);
    } else {
        span all = join_range(fc, spans, 0, n);
        body = all.empty ? ml_fsm_union(fc, ml_fsm_epsilon(fc), all.first) : all.first;
    }
out:
    free(spans);
    members_deinit(&mb);
    return cat(fc, schema_lit(fc, "{"), schema_gap(fc), body, schema_lit(fc, "}"));
}

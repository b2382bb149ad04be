/* The JSON Schema compiler's combinators (schema_internal.h): anyOf, oneOf,
 * enum, the conjunction of a schema's parts, and, where a part holds a call
 * and cannot be intersected, the merge of keywords (allOf and $ref inlined,
 * anyOf and oneOf distributed over the merged rest). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/schema_internal.h"

/* anyOf branches times anyOf branches when two anyOf meet in one allOf. */
#define SCHEMA_MAX_ANYOF_PRODUCT 64

/* ---- first bytes ----------------------------------------------------------- */

/* The bytes any JSON value may begin with. */
static void schema_value_first(uint8_t set[32])
{
    static const char starts[] = "\"{[-0123456789tfn";
    for (const char *p = starts; *p; p++)
        set[(uint8_t)*p >> 3] |= (uint8_t)(1u << ((uint8_t)*p & 7));
}

/* OR into set the bytes a's strings may begin with; a call contributes its
 * machine's first bytes, or every value's first byte while the machine is
 * being compiled. seen marks machines on the way (a cycle adds nothing). */
static void schema_first(const schema_compiler *sc, const ml_fsm *a, uint8_t set[32],
                         uint8_t *seen)
{
    const ml_fsm_edge *e;
    size_t n = ml_fsm_edges(a, 0, &e);
    for (size_t i = 0; i < n; i++) {
        for (uint32_t s = e[i].lo; s <= e[i].hi && s < ML_FSM_N_BYTES; s++)
            set[s >> 3] |= (uint8_t)(1u << (s & 7));
        for (uint32_t s = e[i].lo > ML_FSM_N_BYTES ? e[i].lo : ML_FSM_N_BYTES; s <= e[i].hi; s++) {
            uint32_t k = s - ML_FSM_N_BYTES;
            if (seen[k])
                continue;
            seen[k] = 1;
            if (sc->machines[k].fsm)
                schema_first(sc, sc->machines[k].fsm, set, seen);
            else
                schema_value_first(set);
        }
    }
}

/* ---- combinators ----------------------------------------------------------- */

/* The branches of an array keyword, compiled; NULL (latched) when it is not a
 * non-empty array of schemas. Owned array of n owned automata; anys[i] set
 * for a branch that admits every value. */
static ml_fsm **schema_branches(schema_compiler *sc, const cJSON *node, const char *key,
                                size_t *n, bool **anys)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(node, key);
    *n = 0;
    *anys = NULL;
    if (!cJSON_IsArray(arr) || !arr->child) {
        schema_refuse(sc, ML_ERR_INVALID_ARG, key, "not a non-empty array of schemas");
        return NULL;
    }
    size_t count = (size_t)cJSON_GetArraySize(arr);
    ml_fsm **out = calloc(count, sizeof *out);
    *anys = calloc(count, sizeof **anys);
    if (!out || !*anys) {
        free(out);
        free(*anys);
        *anys = NULL;
        ml_fsm_ctx_fail(sc->fc, ML_ERR_NOMEM, "schema: out of memory");
        return NULL;
    }
    size_t at = schema_pointer_push(sc, key, 0);
    int i = 0;
    for (const cJSON *b = arr->child; b; b = b->next, i++) {
        out[i] = schema_compile_at(sc, b, NULL, i, &(*anys)[i]);
        if (!out[i])
            break;
    }
    schema_pointer_pop(sc, at);
    *n = count;
    return out;
}

static void schema_free_all(ml_fsm **a, size_t n)
{
    for (size_t i = 0; a && i < n; i++)
        ml_fsm_free(a[i]);
    free(a);
}

static ml_fsm *schema_any_of(schema_compiler *sc, const cJSON *node, bool *any)
{
    size_t n;
    bool *anys;
    ml_fsm **b = schema_branches(sc, node, "anyOf", &n, &anys);
    ml_fsm *r = NULL;
    *any = false;
    for (size_t i = 0; i < n; i++)
        *any |= anys[i];
    if (ml_fsm_ctx_status(sc->fc) != ML_OK) {
        /* nothing: the error is latched */
    } else if (*any) {
        r = schema_any(sc);
    } else {
        r = b[0];
        for (size_t i = 1; i < n; i++)
            r = ml_fsm_union(sc->fc, r, b[i]);
        free(b);
        free(anys);
        return r;
    }
    schema_free_all(b, n);
    free(anys);
    return r;
}

/* Exactly one of n branches: each branch minus the union of the others when
 * all are regular; with calls, only branches told apart by their first
 * byte (their languages are then disjoint). Takes ownership of b. */
static ml_fsm *schema_one_of_list(schema_compiler *sc, ml_fsm **b, const bool *anys, size_t n)
{
    if (n == 1) {
        ml_fsm *r = b[0];
        free(b);
        return r;
    }
    bool calls = false, any = false;
    for (size_t i = 0; i < n; i++) {
        calls |= ml_fsm_has_calls(b[i]);
        any |= anys[i];
    }
    ml_fsm *r = NULL;
    if (any) {
        schema_refuse(sc, ML_ERR_UNSUPPORTED, "oneOf",
                      "a branch admits every value: the others' complement is not built");
    } else if (!calls) {
        r = ml_fsm_nothing(sc->fc);
        for (size_t i = 0; i < n; i++) {
            ml_fsm *others = ml_fsm_nothing(sc->fc);
            for (size_t j = 0; j < n; j++)
                if (j != i)
                    others = ml_fsm_union(sc->fc, others, ml_fsm_copy(sc->fc, b[j]));
            r = ml_fsm_union(sc->fc, r, ml_fsm_minus(sc->fc, ml_fsm_copy(sc->fc, b[i]), others));
        }
    } else {
        uint8_t first[32] = {0};
        uint8_t *seen = calloc(ML_FSM_MAX_CALLS, 1);
        bool overlap = !seen;
        for (size_t i = 0; i < n && !overlap; i++) {
            uint8_t fi[32] = {0};
            memset(seen, 0, ML_FSM_MAX_CALLS);
            schema_first(sc, b[i], fi, seen);
            for (int w = 0; w < 32; w++) {
                overlap |= (first[w] & fi[w]) != 0;
                first[w] |= fi[w];
            }
        }
        free(seen);
        if (overlap) {
            schema_refuse(sc, ML_ERR_UNSUPPORTED, "oneOf",
                          "branches holding recursive references may begin with the same "
                          "byte, so exclusivity cannot be decided");
        } else {
            r = b[0];
            b[0] = NULL;
            for (size_t i = 1; i < n; i++) {
                r = ml_fsm_union(sc->fc, r, b[i]);
                b[i] = NULL;
            }
        }
    }
    schema_free_all(b, n);
    return r;
}

static ml_fsm *schema_one_of(schema_compiler *sc, const cJSON *node)
{
    size_t n;
    bool *anys;
    ml_fsm **b = schema_branches(sc, node, "oneOf", &n, &anys);
    if (ml_fsm_ctx_status(sc->fc) != ML_OK) {
        schema_free_all(b, n);
        free(anys);
        return NULL;
    }
    size_t at = schema_pointer_push(sc, "oneOf", 0);
    ml_fsm *r = schema_one_of_list(sc, b, anys, n);
    schema_pointer_pop(sc, at);
    free(anys);
    return r;
}

static ml_fsm *schema_enum(schema_compiler *sc, const cJSON *node)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(node, "enum");
    if (!cJSON_IsArray(e))
        return schema_refuse(sc, ML_ERR_INVALID_ARG, "enum", "not an array");
    ml_fsm *r = ml_fsm_nothing(sc->fc);
    for (const cJSON *v = e->child; v; v = v->next)
        r = ml_fsm_union(sc->fc, r, schema_literal(sc, v));
    return r;
}

/* ---- merging (allOf with recursive parts) ---------------------------------- */

static bool schema_merge_into(schema_compiler *sc, cJSON *m, const cJSON *src, int depth);

static bool schema_nomem(schema_compiler *sc)
{
    ml_fsm_ctx_fail(sc->fc, ML_ERR_NOMEM, "schema: out of memory");
    return false;
}

/* {"allOf": [a, b]} referring to a and b (not copies). */
static cJSON *schema_all_of_pair(const cJSON *a, const cJSON *b)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "allOf");
    if (!arr || !cJSON_AddItemReferenceToArray(arr, (cJSON *)a) ||
        !cJSON_AddItemReferenceToArray(arr, (cJSON *)b)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static bool schema_set(cJSON *m, const char *key, cJSON *v)
{
    if (!v)
        return false;
    if (cJSON_GetObjectItemCaseSensitive(m, key))
        return cJSON_ReplaceItemInObjectCaseSensitive(m, key, v);
    return cJSON_AddItemToObject(m, key, v);
}

/* A node standing for v without copying it: a reference to its members
 * or items (a copy for a scalar). NULL when out of memory. */
static cJSON *schema_alias(const cJSON *v)
{
    if (cJSON_IsObject(v))
        return cJSON_CreateObjectReference(v->child);
    if (cJSON_IsArray(v))
        return cJSON_CreateArrayReference(v->child);
    return cJSON_Duplicate(v, true);
}

/* The schema src imposes on a member named name: its property, else its
 * additionalProperties, else NULL (none). */
static const cJSON *schema_member_schema(const cJSON *src, const char *name)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(src, "properties"), name);
    return p ? p : cJSON_GetObjectItemCaseSensitive(src, "additionalProperties");
}

/* properties / additionalProperties of m and src merged: every name of
 * either, in m's order then src's, under both sides' schema for it. */
static bool schema_merge_members(schema_compiler *sc, cJSON *m, const cJSON *src)
{
    if (cJSON_GetObjectItemCaseSensitive(m, "patternProperties") ||
        cJSON_GetObjectItemCaseSensitive(src, "patternProperties")) {
        schema_refuse(sc, ML_ERR_UNSUPPORTED, "allOf",
                      "patternProperties in a merged object with recursive values");
        return false;
    }
    const cJSON *mp = cJSON_GetObjectItemCaseSensitive(m, "properties");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(src, "properties");
    cJSON *props = cJSON_CreateObject();
    if (!props)
        return schema_nomem(sc);
    for (int side = 0; side < 2; side++) {
        const cJSON *list = side ? sp : mp;
        for (const cJSON *p = list ? list->child : NULL; p; p = p->next) {
            if (cJSON_GetObjectItemCaseSensitive(props, p->string))
                continue;
            const cJSON *a = schema_member_schema(m, p->string);
            const cJSON *b = schema_member_schema(src, p->string);
            cJSON *v = !a ? schema_alias(b) : !b ? schema_alias(a) : schema_all_of_pair(a, b);
            if (!v || !cJSON_AddItemToObject(props, p->string, v)) {
                cJSON_Delete(v);
                cJSON_Delete(props);
                return schema_nomem(sc);
            }
        }
    }
    const cJSON *ma = cJSON_GetObjectItemCaseSensitive(m, "additionalProperties");
    const cJSON *sa = cJSON_GetObjectItemCaseSensitive(src, "additionalProperties");
    bool ok = true;
    if (ma && sa)
        ok = schema_set(m, "additionalProperties", schema_all_of_pair(ma, sa));
    else if (sa)
        ok = schema_set(m, "additionalProperties", schema_alias(sa));
    if (!ok) {
        cJSON_Delete(props);
        return schema_nomem(sc);
    }
    return schema_set(m, "properties", props) || schema_nomem(sc);
}

/* A numeric keyword both sides give: the stricter one (larger for lower
 * bounds, smaller for upper bounds). */
static bool schema_merge_bound(cJSON *m, const cJSON *v, bool lower)
{
    const cJSON *old = cJSON_GetObjectItemCaseSensitive(m, v->string);
    if (!cJSON_IsNumber(old) || !cJSON_IsNumber(v))
        return false;
    double keep = lower ? fmax(old->valuedouble, v->valuedouble)
                        : fmin(old->valuedouble, v->valuedouble);
    return schema_set(m, v->string, cJSON_CreateNumber(keep));
}

static cJSON *schema_type_array(unsigned set)
{
    cJSON *arr = cJSON_CreateArray();
    static const char *const names[] = {"null", "boolean", "integer", "number",
                                        "string", "array",  "object"};
    for (unsigned i = 0; arr && i < 7; i++) {
        unsigned bit = 1u << i;
        if (!(set & bit) || (bit == SCHEMA_T_INTEGER && (set & SCHEMA_T_NUMBER)))
            continue;
        cJSON_AddItemToArray(arr, cJSON_CreateString(names[i]));
    }
    return arr;
}

static bool schema_merge_key(schema_compiler *sc, cJSON *m, const cJSON *v, int depth)
{
    const char *k = v->string;
    const cJSON *old = cJSON_GetObjectItemCaseSensitive(m, k);
    if (!strcmp(k, "$ref")) {
        if (!cJSON_IsString(v)) {
            schema_refuse(sc, ML_ERR_INVALID_ARG, "$ref", "not a string");
            return false;
        }
        const cJSON *target = schema_resolve(sc, v->valuestring);
        if (!target)
            return false;
        for (size_t i = 0; i < sc->n_targets; i++)
            if (sc->targets[i].node == target && sc->targets[i].in_progress) {
                schema_refuse(sc, ML_ERR_UNSUPPORTED, "allOf",
                              "a recursive $ref merged with sibling keywords");
                return false;
            }
        return schema_merge_into(sc, m, target, depth + 1);
    }
    if (!strcmp(k, "allOf")) {
        if (!cJSON_IsArray(v)) {
            schema_refuse(sc, ML_ERR_INVALID_ARG, k, "not an array of schemas");
            return false;
        }
        for (const cJSON *b = v->child; b; b = b->next)
            if (!schema_merge_into(sc, m, b, depth + 1))
                return false;
        return true;
    }
    if (!old) {
        return schema_set(m, k, schema_alias(v)) || schema_nomem(sc);
    }
    if (cJSON_Compare(old, v, true))
        return true;
    if (!strcmp(k, "type")) {
        unsigned a = schema_types(sc, m), b = schema_type_set(sc, v);
        if (!a || !b)
            return false;
        return schema_set(m, "type", schema_type_array(a & b)) || schema_nomem(sc);
    }
    if (!strcmp(k, "required")) {
        if (!cJSON_IsArray(v)) {
            schema_refuse(sc, ML_ERR_INVALID_ARG, k, "not an array of names");
            return false;
        }
        cJSON *req = cJSON_Duplicate(old, true);
        for (const cJSON *e = v->child; req && e; e = e->next) {
            bool have = false;
            for (const cJSON *f = req->child; f; f = f->next)
                have |= cJSON_Compare(e, f, true);
            if (!have)
                cJSON_AddItemToArray(req, cJSON_Duplicate(e, true));
        }
        return schema_set(m, k, req) || schema_nomem(sc);
    }
    if (!strcmp(k, "minimum") || !strcmp(k, "minLength") || !strcmp(k, "minItems") ||
        (!strcmp(k, "exclusiveMinimum") && cJSON_IsNumber(v)))
        return schema_merge_bound(m, v, true) || schema_nomem(sc);
    if (!strcmp(k, "maximum") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
        (!strcmp(k, "exclusiveMaximum") && cJSON_IsNumber(v)))
        return schema_merge_bound(m, v, false) || schema_nomem(sc);
    if (!strcmp(k, "items") && cJSON_IsObject(v) && cJSON_IsObject(old))
        return schema_set(m, k, schema_all_of_pair(old, v)) || schema_nomem(sc);
    if (!strcmp(k, "additionalItems") || !strcmp(k, "propertyNames"))
        return schema_set(m, k, schema_all_of_pair(old, v)) || schema_nomem(sc);
    if (!strcmp(k, "anyOf")) {
        /* A ∩ (B1 ∪ ...) ∩ (C1 ∪ ...) = ∪ (A ∩ Bi ∩ Cj). */
        if (!cJSON_IsArray(v) || !cJSON_IsArray(old)) {
            schema_refuse(sc, ML_ERR_INVALID_ARG, k, "not an array of schemas");
            return false;
        }
        if (cJSON_GetArraySize(v) * cJSON_GetArraySize(old) > SCHEMA_MAX_ANYOF_PRODUCT) {
            schema_refuse(sc, ML_ERR_TOO_LARGE, k, "two anyOf in one allOf with too many pairs");
            return false;
        }
        cJSON *prod = cJSON_CreateArray();
        for (const cJSON *a = old->child; prod && a; a = a->next)
            for (const cJSON *b = v->child; b; b = b->next)
                cJSON_AddItemToArray(prod, schema_all_of_pair(a, b));
        return schema_set(m, k, prod) || schema_nomem(sc);
    }
    schema_refuse(sc, ML_ERR_UNSUPPORTED, k,
                  "given twice with different values in an allOf with recursive parts");
    return false;
}

/* Merge src's keywords into m (m refers to src's subschemas, never copies
 * them). $ref and allOf are inlined; properties merged per name. */
static bool schema_merge_into(schema_compiler *sc, cJSON *m, const cJSON *src, int depth)
{
    if (depth > SCHEMA_MAX_NESTING) {
        ml_fsm_ctx_fail(sc->fc, ML_ERR_UNSUPPORTED,
                        "schema: allOf/$ref at %s nest deeper than %d (a cycle that consumes "
                        "nothing?)",
                        schema_where(sc), SCHEMA_MAX_NESTING);
        return false;
    }
    if (cJSON_IsBool(src)) {
        return cJSON_IsTrue(src) ||
               schema_set(m, "type", cJSON_CreateArray()) || schema_nomem(sc);
    }
    if (!cJSON_IsObject(src)) {
        schema_refuse(sc, ML_ERR_INVALID_ARG, "allOf", "a branch is not a schema");
        return false;
    }
    bool typed, has_type, compose;
    if (!schema_check(sc, src, &typed, &has_type, &compose))
        return false;
    bool members = false;
    for (const cJSON *v = src->child; v; v = v->next) {
        const schema_kw *kw = schema_keyword(v->string);
        if (kw->cls == KW_ANNOTATION)
            continue;
        if (!strcmp(v->string, "properties") || !strcmp(v->string, "additionalProperties")) {
            members = true;
            continue;
        }
        if (!schema_merge_key(sc, m, v, depth))
            return false;
    }
    return !members || schema_merge_members(sc, m, src);
}

/* ---- a schema -------------------------------------------------------------- */

ml_fsm *schema_conjoin(schema_compiler *sc, ml_fsm **parts, const bool *anys, size_t n,
                       bool *any, bool *calls)
{
    size_t kept = 0;
    bool with_calls = false;
    for (size_t i = 0; i < n; i++)
        if (!anys[i]) {
            kept++;
            with_calls |= ml_fsm_has_calls(parts[i]);
        }
    *calls = kept >= 2 && with_calls;
    *any = kept == 0;
    ml_fsm *r = NULL;
    for (size_t i = 0; i < n; i++) {
        if (*calls || (anys[i] && !(*any && i == 0)))
            ml_fsm_free(parts[i]); /* every part "any": parts[0], a call of it, stays */
        else
            r = r ? ml_fsm_intersect(sc->fc, r, parts[i]) : parts[i];
    }
    return r;
}

static ml_fsm *schema_merged(schema_compiler *sc, const cJSON *node, bool *any);

/* The parts of node (a checked schema object) intersected; with
 * allow_merge, parts that cannot be intersected are merged instead. */
ml_fsm *schema_parts(schema_compiler *sc, const cJSON *node, bool typed, bool has_type,
                            bool allow_merge, bool *any)
{
    enum { MAX_PARTS = 8 };
    ml_fsm *parts[MAX_PARTS];
    bool anys[MAX_PARTS] = {false};
    size_t n = 0;
    unsigned types = schema_types(sc, node);
    if (!types)
        return NULL;
    if (typed || has_type) {
        parts[n] = schema_typed(sc, node, types);
        n++;
    }
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "$ref"))) {
        size_t at = schema_pointer_push(sc, "$ref", 0);
        parts[n] = schema_ref_of(sc, v, &anys[n]);
        n++;
        schema_pointer_pop(sc, at);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "allOf"))) {
        size_t nb;
        bool *banys;
        ml_fsm **b = schema_branches(sc, node, "allOf", &nb, &banys);
        ml_fsm *all = NULL;
        bool all_any = false, calls = false;
        if (ml_fsm_ctx_status(sc->fc) == ML_OK)
            all = schema_conjoin(sc, b, banys, nb, &all_any, &calls);
        else
            schema_free_all(b, nb), b = NULL;
        free(b);
        free(banys);
        if (calls) {
            for (size_t i = 0; i < n; i++)
                ml_fsm_free(parts[i]);
            return allow_merge ? schema_merged(sc, node, any)
                               : schema_refuse(sc, ML_ERR_UNSUPPORTED, "allOf",
                                               "branches with recursive values cannot be merged");
        }
        parts[n] = all;
        anys[n] = all_any;
        n++;
    }
    if (cJSON_GetObjectItemCaseSensitive(node, "anyOf")) {
        parts[n] = schema_any_of(sc, node, &anys[n]);
        n++;
    }
    if (cJSON_GetObjectItemCaseSensitive(node, "oneOf")) {
        parts[n] = schema_one_of(sc, node);
        n++;
    }
    if (cJSON_GetObjectItemCaseSensitive(node, "enum")) {
        parts[n] = schema_enum(sc, node);
        n++;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "const"))) {
        size_t at = schema_pointer_push(sc, "const", 0);
        parts[n] = schema_literal(sc, v);
        n++;
        schema_pointer_pop(sc, at);
    }
    if (!typed && !has_type && n == 0) { /* annotations, or "not" alone */
        parts[n] = schema_any(sc);
        anys[n] = true;
        n++;
    }
    if (ml_fsm_ctx_status(sc->fc) != ML_OK) {
        for (size_t i = 0; i < n; i++)
            ml_fsm_free(parts[i]);
        return NULL;
    }
    bool calls;
    ml_fsm *r = schema_conjoin(sc, parts, anys, n, any, &calls);
    if (calls)
        return allow_merge ? schema_merged(sc, node, any)
                           : schema_refuse(sc, ML_ERR_UNSUPPORTED,
                                           cJSON_GetObjectItemCaseSensitive(node, "enum")    ? "enum"
                                           : cJSON_GetObjectItemCaseSensitive(node, "const") ? "const"
                                                                                             : "allOf",
                                           "intersected with a value holding recursive "
                                           "references (or any value)");
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "not"))) {
        bool not_any;
        ml_fsm *no = schema_compile_at(sc, v, "not", 0, &not_any);
        if (!no || !r) {
            ml_fsm_free(no);
            ml_fsm_free(r);
            return NULL;
        }
        if (not_any) {
            ml_fsm_free(no);
            ml_fsm_free(r);
            *any = false;
            return ml_fsm_nothing(sc->fc);
        }
        if (*any || ml_fsm_has_calls(r) || ml_fsm_has_calls(no)) {
            ml_fsm_free(no);
            ml_fsm_free(r);
            return schema_refuse(sc, ML_ERR_UNSUPPORTED, "not",
                                 "the complement is built only within a regular sibling "
                                 "(a typed scalar, an enum...), not within recursive values");
        }
        r = ml_fsm_minus(sc->fc, r, no);
    }
    return r;
}

/* node's keywords merged (allOf and $ref inlined), then anyOf and oneOf
 * distributed over the merged rest, each branch merged in turn. */
static ml_fsm *schema_merged_object(schema_compiler *sc, cJSON *m, bool *any)
{
    cJSON *split = NULL;
    const char *how = NULL;
    if ((split = cJSON_DetachItemFromObjectCaseSensitive(m, "anyOf")))
        how = "anyOf";
    else if ((split = cJSON_DetachItemFromObjectCaseSensitive(m, "oneOf")))
        how = "oneOf";
    if (!split) {
        bool typed, has_type, compose;
        if (!schema_check(sc, m, &typed, &has_type, &compose))
            return NULL;
        return schema_parts(sc, m, typed, has_type, false, any);
    }
    size_t n = (size_t)cJSON_GetArraySize(split);
    ml_fsm **b = n && cJSON_IsArray(split) ? calloc(n, sizeof *b) : NULL;
    bool *anys = b ? calloc(n, sizeof *anys) : NULL;
    if (!anys) {
        free(b);
        cJSON_Delete(split);
        return n ? (schema_nomem(sc), NULL)
                 : schema_refuse(sc, ML_ERR_INVALID_ARG, how, "not a non-empty array");
    }
    size_t i = 0;
    for (const cJSON *br = split->child; br; br = br->next, i++) {
        cJSON *mb = cJSON_CreateObject();
        for (const cJSON *e = m->child; mb && e; e = e->next) {
            cJSON_AddItemToObject(mb, e->string, schema_alias(e));
        }
        if (!mb) {
            schema_nomem(sc);
            break;
        }
        if (schema_merge_into(sc, mb, br, 1)) {
            size_t at = schema_pointer_push(sc, how, (int)i);
            b[i] = schema_merged(sc, mb, &anys[i]);
            schema_pointer_pop(sc, at);
        }
        cJSON_Delete(mb);
        if (!b[i])
            break;
    }
    cJSON_Delete(split);
    if (ml_fsm_ctx_status(sc->fc) != ML_OK) {
        schema_free_all(b, n);
        free(anys);
        return NULL;
    }
    ml_fsm *r;
    *any = false;
    if (!strcmp(how, "oneOf")) {
        r = schema_one_of_list(sc, b, anys, n);
    } else {
        bool all = false;
        for (i = 0; i < n; i++)
            all |= anys[i];
        if (all) {
            schema_free_all(b, n);
            *any = true;
            r = schema_any(sc);
        } else {
            r = b[0];
            for (i = 1; i < n; i++)
                r = ml_fsm_union(sc->fc, r, b[i]);
            free(b);
        }
    }
    free(anys);
    return r;
}

static ml_fsm *schema_merged(schema_compiler *sc, const cJSON *node, bool *any)
{
    if (++sc->nesting > SCHEMA_MAX_NESTING) {
        sc->nesting--;
        ml_fsm_ctx_fail(sc->fc, ML_ERR_UNSUPPORTED,
                        "schema: allOf/$ref at %s nest deeper than %d (a cycle that consumes "
                        "nothing?)",
                        schema_where(sc), SCHEMA_MAX_NESTING);
        return NULL;
    }
    cJSON *m = cJSON_CreateObject();
    ml_fsm *r = NULL;
    if (!m)
        schema_nomem(sc);
    else if (schema_merge_into(sc, m, node, 0))
        r = schema_merged_object(sc, m, any);
    cJSON_Delete(m);
    sc->nesting--;
    return r;
}


ml_fsm *schema_compile_all(schema_compiler *sc, const cJSON *const *nodes, size_t n, bool *any)
{
    if (n == 1)
        return schema_compile(sc, nodes[0], any);
    cJSON *all = cJSON_CreateObject();
    cJSON *arr = all ? cJSON_AddArrayToObject(all, "allOf") : NULL;
    bool ok = arr != NULL;
    for (size_t i = 0; ok && i < n; i++)
        ok = cJSON_AddItemToArray(arr, schema_alias(nodes[i]));
    ml_fsm *r = ok ? schema_compile(sc, all, any) : (schema_nomem(sc), NULL);
    cJSON_Delete(all);
    return r;
}

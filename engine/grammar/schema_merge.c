/* Merging a schema's keywords (schema_internal.h), for the parts that hold
 * a call and so cannot be intersected as automata: allOf branches and $ref
 * targets are inlined into one schema object, keyword by keyword (bounds
 * tightened, members merged, anyOf and oneOf distributed over the rest),
 * which schema_combine.c then compiles. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/schema_internal.h"

/* anyOf branches times anyOf branches when two anyOf meet in one allOf. */
#define SCHEMA_MAX_ANYOF_PRODUCT 64

bool schema_nomem(schema_compiler *sc)
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

/* Set m's key to v (taken). The value it replaces is not freed but kept in
 * sc->replaced until the compilation ends: merged values (allOf pairs,
 * aliases of members) may refer to it. */
static bool schema_set(schema_compiler *sc, cJSON *m, const char *key, cJSON *v)
{
    if (!v)
        return false;
    cJSON *old = cJSON_DetachItemFromObjectCaseSensitive(m, key);
    if (old && !sc->replaced)
        sc->replaced = cJSON_CreateArray();
    if (old && (!sc->replaced || !cJSON_AddItemToArray(sc->replaced, old))) {
        cJSON_AddItemToObject(m, key, old); /* back where it was: m stays whole */
        cJSON_Delete(v);
        return false;
    }
    if (!cJSON_AddItemToObject(m, key, v)) {
        cJSON_Delete(v);
        return false;
    }
    return true;
}

/* A node standing for v without copying it: a reference to its members
 * or items (a copy for a scalar). NULL when out of memory. */
cJSON *schema_alias(const cJSON *v)
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
        ok = schema_set(sc, m, "additionalProperties", schema_all_of_pair(ma, sa));
    else if (sa)
        ok = schema_set(sc, m, "additionalProperties", schema_alias(sa));
    if (!ok) {
        cJSON_Delete(props);
        return schema_nomem(sc);
    }
    return schema_set(sc, m, "properties", props) || schema_nomem(sc);
}

/* A numeric keyword both sides give: the stricter one (larger for lower
 * bounds, smaller for upper bounds). */
static bool schema_merge_bound(schema_compiler *sc, cJSON *m, const cJSON *v, bool lower)
{
    const cJSON *old = cJSON_GetObjectItemCaseSensitive(m, v->string);
    if (!cJSON_IsNumber(old) || !cJSON_IsNumber(v)) {
        schema_refuse(sc, ML_ERR_UNSUPPORTED, v->string,
                      "given twice in an allOf with recursive parts, not both numbers");
        return false;
    }
    double keep = lower ? fmax(old->valuedouble, v->valuedouble)
                        : fmin(old->valuedouble, v->valuedouble);
    return schema_set(sc, m, v->string, cJSON_CreateNumber(keep)) || schema_nomem(sc);
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
        return schema_set(sc, m, k, schema_alias(v)) || schema_nomem(sc);
    }
    if (cJSON_Compare(old, v, true))
        return true;
    if (!strcmp(k, "type")) {
        unsigned a = schema_types(sc, m), b = schema_type_set(sc, v);
        if (!a || !b)
            return false;
        return schema_set(sc, m, "type", schema_type_array(a & b)) || schema_nomem(sc);
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
        return schema_set(sc, m, k, req) || schema_nomem(sc);
    }
    if (!strcmp(k, "minimum") || !strcmp(k, "minLength") || !strcmp(k, "minItems") ||
        (!strcmp(k, "exclusiveMinimum") && cJSON_IsNumber(v)))
        return schema_merge_bound(sc, m, v, true);
    if (!strcmp(k, "maximum") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
        (!strcmp(k, "exclusiveMaximum") && cJSON_IsNumber(v)))
        return schema_merge_bound(sc, m, v, false);
    if (!strcmp(k, "items") && cJSON_IsObject(v) && cJSON_IsObject(old))
        return schema_set(sc, m, k, schema_all_of_pair(old, v)) || schema_nomem(sc);
    if (!strcmp(k, "additionalItems") || !strcmp(k, "propertyNames"))
        return schema_set(sc, m, k, schema_all_of_pair(old, v)) || schema_nomem(sc);
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
        return schema_set(sc, m, k, prod) || schema_nomem(sc);
    }
    schema_refuse(sc, ML_ERR_UNSUPPORTED, k,
                  "given twice with different values in an allOf with recursive parts");
    return false;
}

/* Merge src's keywords into m (m refers to src's subschemas, never copies
 * them). $ref and allOf are inlined; properties merged per name. */
bool schema_merge_into(schema_compiler *sc, cJSON *m, const cJSON *src, int depth)
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
               schema_set(sc, m, "type", cJSON_CreateArray()) || schema_nomem(sc);
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
        if (!kw || kw->cls == KW_ANNOTATION) /* unknown: an annotation (schema_check) */
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

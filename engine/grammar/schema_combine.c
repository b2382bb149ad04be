/* The JSON Schema compiler's combinators (schema_internal.h): anyOf, oneOf,
 * enum, the conjunction of a schema's parts, and, where a part holds a call
 * and cannot be intersected, the schema of the merged keywords
 * (schema_merge.c: allOf and $ref inlined, anyOf and oneOf distributed over
 * the merged rest). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/schema_internal.h"

static unsigned schema_value_types(const cJSON *v);

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
        r = ml_fsm_union_n(sc->fc, b, n);
        free(b);
        free(anys);
        return r;
    }
    schema_free_all(b, n);
    free(anys);
    return r;
}

/* ---- exactness ----------------------------------------------------------- */

/* A difference A minus B is exact only if B's automaton holds every text of
 * A's automaton that B's schema admits; the automata of numbers, patterns,
 * formats and of objects with ordered properties are narrower than their
 * schemas (lexemes.c, README.md), so subtracting them would admit texts the
 * schema matches. Two tools keep oneOf and not sound: type classes (an
 * over-approximation of the JSON types a schema admits: branches of
 * disjoint classes are disjoint, nothing to subtract), and exactness (a
 * schema whose automaton is its language, on the one spelling per value
 * that every automaton here uses). Branches told apart by a required
 * property with disjoint values (a discriminator) are disjoint too. */

/* The JSON types node may admit (an over-approximation; integers are
 * numbers). */
static unsigned schema_classes(schema_compiler *sc, const cJSON *node, int depth)
{
    if (cJSON_IsBool(node))
        return cJSON_IsTrue(node) ? SCHEMA_T_ALL : 0;
    if (!cJSON_IsObject(node) || depth > SCHEMA_MAX_NESTING)
        return SCHEMA_T_ALL;
    unsigned t = SCHEMA_T_ALL;
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "type"))) {
        unsigned set = schema_type_set(sc, v);
        t &= set ? set : SCHEMA_T_ALL;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "enum")) && cJSON_IsArray(v)) {
        unsigned set = 0;
        for (const cJSON *e = v->child; e; e = e->next)
            set |= schema_value_types(e);
        t &= set;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "const")))
        t &= schema_value_types(v);
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "$ref")) && cJSON_IsString(v)) {
        const cJSON *target = schema_resolve(sc, v->valuestring);
        t &= target ? schema_classes(sc, target, depth + 1) : SCHEMA_T_ALL;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(node, "allOf")) && cJSON_IsArray(v))
        for (const cJSON *b = v->child; b; b = b->next)
            t &= schema_classes(sc, b, depth + 1);
    static const char *const unions[] = {"anyOf", "oneOf"};
    for (int u = 0; u < 2; u++)
        if ((v = cJSON_GetObjectItemCaseSensitive(node, unions[u])) && cJSON_IsArray(v)) {
            unsigned set = 0;
            for (const cJSON *b = v->child; b; b = b->next)
                set |= schema_classes(sc, b, depth + 1);
            t &= set;
        }
    if (t & (SCHEMA_T_INTEGER | SCHEMA_T_NUMBER))
        t |= SCHEMA_T_INTEGER | SCHEMA_T_NUMBER;
    return t & SCHEMA_T_ALL;
}

/* A value whose literal automaton is exact: no number (one text of many),
 * no object of two or more members (one order of many). */
static bool schema_exact_value(const cJSON *v)
{
    if (cJSON_IsNumber(v) || (cJSON_IsObject(v) && v->child && v->child->next))
        return false;
    for (const cJSON *e = v->child; e; e = e->next)
        if (!schema_exact_value(e))
            return false;
    return true;
}

/* True when node's automaton is exactly its language (on the one
 * spelling): no numbers (node admits none), and only keywords whose
 * automata are exact. Conservative. */
static bool schema_exact(schema_compiler *sc, const cJSON *node, int depth)
{
    if (cJSON_IsBool(node))
        return true;
    if (!cJSON_IsObject(node) || depth > SCHEMA_MAX_NESTING)
        return false;
    bool constrained = false;
    static const char *const counts[] = {"minLength", "maxLength", "minItems", "maxItems",
                                         "uniqueItems", "type"};
    static const char *const subschemas[] = {"items", "additionalItems"};
    static const char *const lists[] = {"prefixItems", "items", "anyOf", "allOf"};
    for (const cJSON *m = node->child; m; m = m->next) {
        const schema_kw *kw = schema_keyword(m->string);
        if (kw->cls == KW_ANNOTATION)
            continue;
        constrained = true;
        bool ok = false;
        for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
            ok |= !strcmp(m->string, counts[i]);
        for (size_t i = 0; i < sizeof subschemas / sizeof subschemas[0]; i++)
            if (!strcmp(m->string, subschemas[i]) && !cJSON_IsArray(m))
                ok |= schema_exact(sc, m, depth + 1);
        for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++)
            if (!strcmp(m->string, lists[i]) && cJSON_IsArray(m)) {
                ok = true;
                for (const cJSON *b = m->child; b; b = b->next)
                    ok &= schema_exact(sc, b, depth + 1);
            }
        if (!strcmp(m->string, "enum") || !strcmp(m->string, "const")) {
            ok = true;
            for (const cJSON *e = !strcmp(m->string, "enum") ? m->child : m; e;
                 e = !strcmp(m->string, "enum") ? e->next : NULL)
                ok &= schema_exact_value(e);
        }
        if (!strcmp(m->string, "$ref") && cJSON_IsString(m)) {
            const cJSON *target = schema_resolve(sc, m->valuestring);
            ok = target && schema_exact(sc, target, depth + 1);
        }
        if (!ok)
            return false;
    }
    /* Every value (no keyword) is exact: the automaton holds every text the
     * others here write. Constrained numbers are not. */
    return !constrained || !(schema_classes(sc, node, depth) & SCHEMA_T_NUMBER);
}

ml_fsm *schema_compile_regular(schema_compiler *sc, const cJSON *node)
{
    uint32_t saved = sc->regular_depth;
    sc->regular_depth = SCHEMA_REGULAR_DEPTH;
    bool any;
    ml_fsm *r = schema_compile(sc, node, &any);
    r = ml_fsm_intersect(sc->fc, r, schema_any(sc));
    sc->regular_depth = saved;
    return r;
}

/* Each branch minus the union of the others (regular branches). */
static ml_fsm *schema_exclusive(schema_compiler *sc, ml_fsm *const *b, size_t n)
{
    ml_fsm **part = calloc(2 * n, sizeof *part), **others = part + n;
    if (!part) {
        ml_fsm_ctx_fail(sc->fc, ML_ERR_NOMEM, "schema: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        for (size_t j = 0; j < n; j++)
            if (j != i)
                others[k++] = ml_fsm_copy(sc->fc, b[j]);
        part[i] = ml_fsm_minus(sc->fc, ml_fsm_copy(sc->fc, b[i]), ml_fsm_union_n(sc->fc, others, k));
    }
    ml_fsm *r = ml_fsm_union_n(sc->fc, part, n);
    free(part);
    return r;
}

/* node with its top-level $ref followed while it is alone (annotations
 * aside), for a look at its keywords. */
static const cJSON *schema_deref(schema_compiler *sc, const cJSON *node)
{
    for (int hops = 0; cJSON_IsObject(node) && hops < SCHEMA_MAX_NESTING; hops++) {
        const cJSON *ref = NULL;
        for (const cJSON *m = node->child; m; m = m->next) {
            const schema_kw *kw = schema_keyword(m->string);
            if (!strcmp(m->string, "$ref"))
                ref = m;
            else if (kw->cls != KW_ANNOTATION)
                return node;
        }
        if (!cJSON_IsString(ref))
            return node;
        const cJSON *t = schema_resolve(sc, ref->valuestring);
        if (!t)
            return node;
        node = t;
    }
    return node;
}

/* The values enum or const allows at node, NULL when neither is there. */
static const cJSON *schema_value_list(const cJSON *node, bool *one)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, "const");
    *one = v != NULL;
    return v ? v : cJSON_GetObjectItemCaseSensitive(node, "enum");
}

/* True when no value is valid under both a and b, seen from their type
 * classes or, for objects, a property both require whose schemas admit
 * disjoint classes or disjoint enum/const values (a discriminator). */
static bool schema_disjoint(schema_compiler *sc, const cJSON *a, const cJSON *b, int depth)
{
    if (!(schema_classes(sc, a, 0) & schema_classes(sc, b, 0)))
        return true;
    a = schema_deref(sc, a);
    b = schema_deref(sc, b);
    bool one_a = false, one_b = false;
    const cJSON *va = cJSON_IsObject(a) ? schema_value_list(a, &one_a) : NULL;
    const cJSON *vb = cJSON_IsObject(b) ? schema_value_list(b, &one_b) : NULL;
    if (va && vb && (one_a || cJSON_IsArray(va)) && (one_b || cJSON_IsArray(vb))) {
        for (const cJSON *x = one_a ? va : va->child; x; x = one_a ? NULL : x->next)
            for (const cJSON *y = one_b ? vb : vb->child; y; y = one_b ? NULL : y->next)
                if (cJSON_Compare(x, y, true))
                    return false;
        return true;
    }
    if (depth > 0 || !cJSON_IsObject(a) || !cJSON_IsObject(b))
        return false;
    const cJSON *ra = cJSON_GetObjectItemCaseSensitive(a, "required");
    const cJSON *rb = cJSON_GetObjectItemCaseSensitive(b, "required");
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(a, "properties");
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    if (!cJSON_IsArray(ra) || !cJSON_IsArray(rb))
        return false;
    for (const cJSON *x = ra->child; x; x = x->next)
        for (const cJSON *y = rb->child; y; y = y->next) {
            if (!cJSON_IsString(x) || !cJSON_Compare(x, y, true))
                continue;
            const cJSON *sa = cJSON_GetObjectItemCaseSensitive(pa, x->valuestring);
            const cJSON *sb = cJSON_GetObjectItemCaseSensitive(pb, x->valuestring);
            if (sa && sb && schema_disjoint(sc, sa, sb, depth + 1))
                return true;
        }
    return false;
}

/* Exactly one of n branches (b, compiled from nodes). Pairwise disjoint
 * branches (schema_disjoint): their union. Otherwise each branch minus the
 * union of the others, which needs every branch exact (schema_exact), and
 * regular: branches holding calls are compiled again within
 * SCHEMA_REGULAR_DEPTH nested containers (deeper documents are refused: a
 * narrowing). Takes ownership of b. */
static ml_fsm *schema_one_of_list(schema_compiler *sc, ml_fsm **b, size_t n,
                                  const cJSON *const *nodes)
{
    bool disjoint = true, exact = true, calls = false;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i && disjoint; j++)
            disjoint = schema_disjoint(sc, nodes[i], nodes[j], 0);
        exact &= schema_exact(sc, nodes[i], 0);
        calls |= ml_fsm_has_calls(b[i]);
    }
    ml_fsm *r = NULL;
    if (n == 1 || disjoint) {
        r = ml_fsm_union_n(sc->fc, b, n);
        free(b);
        return r;
    }
    if (!exact) {
        schema_refuse(sc, ML_ERR_UNSUPPORTED, "oneOf",
                      "branches that may overlap, one of them enforced narrower than its "
                      "schema (numbers, patterns, formats, ordered properties): excluding it "
                      "would admit documents it matches");
    } else {
        for (size_t i = 0; calls && i < n; i++) {
            ml_fsm_free(b[i]);
            b[i] = schema_compile_regular(sc, nodes[i]);
        }
        r = schema_exclusive(sc, b, n);
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
    const cJSON **nodes = calloc(n, sizeof *nodes);
    if (!nodes) {
        schema_free_all(b, n);
        free(anys);
        return (schema_nomem(sc), NULL);
    }
    size_t i = 0;
    for (const cJSON *br = cJSON_GetObjectItemCaseSensitive(node, "oneOf")->child; br;
         br = br->next)
        nodes[i++] = br;
    size_t at = schema_pointer_push(sc, "oneOf", 0);
    ml_fsm *r = schema_one_of_list(sc, b, n, nodes);
    schema_pointer_pop(sc, at);
    free(nodes);
    free(anys);
    return r;
}

/* The type bits of a JSON value (an integral number is an integer too). */
static unsigned schema_value_types(const cJSON *v)
{
    if (cJSON_IsNull(v))
        return SCHEMA_T_NULL;
    if (cJSON_IsBool(v))
        return SCHEMA_T_BOOLEAN;
    if (cJSON_IsNumber(v))
        return v->valuedouble == floor(v->valuedouble) ? SCHEMA_T_NUMBER | SCHEMA_T_INTEGER
                                                       : SCHEMA_T_NUMBER;
    if (cJSON_IsString(v))
        return SCHEMA_T_STRING;
    return cJSON_IsArray(v) ? SCHEMA_T_ARRAY : SCHEMA_T_OBJECT;
}

/* The values of enum (an array) or const (one value, when one is true)
 * whose type is in types. */
static ml_fsm *schema_values(schema_compiler *sc, const cJSON *v, bool one, unsigned types)
{
    if (!one && !cJSON_IsArray(v))
        return schema_refuse(sc, ML_ERR_INVALID_ARG, "enum", "not an array");
    ml_fsm **lits = calloc(one ? 1 : (size_t)cJSON_GetArraySize(v) + 1, sizeof *lits);
    if (!lits) {
        ml_fsm_ctx_fail(sc->fc, ML_ERR_NOMEM, "schema: out of memory");
        return NULL;
    }
    size_t at = schema_pointer_push(sc, one ? "const" : "enum", 0), n = 0;
    for (const cJSON *e = one ? v : v->child; e; e = one ? NULL : e->next)
        if (schema_value_types(e) & types)
            lits[n++] = schema_literal(sc, e);
    schema_pointer_pop(sc, at);
    ml_fsm *r = ml_fsm_union_n(sc->fc, lits, n);
    free(lits);
    return r;
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
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(node, "enum");
    const cJSON *co = cJSON_GetObjectItemCaseSensitive(node, "const");
    /* A "type" beside enum/const and no other type keyword filters the
     * values instead of being intersected (an object or array type holds
     * calls, which cannot be). */
    bool filter = has_type && !typed && (en || co);
    if ((typed || has_type) && !filter) {
        parts[n] = schema_typed(sc, node, types);
        n++;
    }
    unsigned value_types = filter ? types : SCHEMA_T_ALL;
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
            return allow_merge ? schema_merged(sc, node, any) : schema_compile_regular(sc, node);
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
    if (en) {
        parts[n] = schema_values(sc, en, false, value_types);
        n++;
    }
    if (co) {
        parts[n] = schema_values(sc, co, true, value_types);
        n++;
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
        return allow_merge ? schema_merged(sc, node, any) : schema_compile_regular(sc, node);
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
        /* The siblings' classes: node's own, "not" aside (it only removes). */
        unsigned own = SCHEMA_T_ALL;
        for (const cJSON *m = node->child; m; m = m->next)
            if (strcmp(m->string, "not")) {
                cJSON one = *m;
                one.next = one.prev = NULL;
                cJSON holder = {.type = cJSON_Object, .child = &one};
                own &= schema_classes(sc, &holder, 0);
            }
        if (!(own & schema_classes(sc, v, 0))) {
            ml_fsm_free(no); /* disjoint: nothing to take away */
        } else if (!schema_exact(sc, v, 0)) {
            ml_fsm_free(no);
            ml_fsm_free(r);
            return schema_refuse(sc, ML_ERR_UNSUPPORTED, "not",
                                 "a schema enforced narrower than it is (numbers, patterns, "
                                 "formats, ordered properties): its complement would admit "
                                 "documents it matches");
        } else if ((*any && !sc->regular_depth) || ml_fsm_has_calls(r) || ml_fsm_has_calls(no)) {
            /* Not regular: the whole schema within SCHEMA_REGULAR_DEPTH. */
            ml_fsm_free(no);
            ml_fsm_free(r);
            *any = false;
            return schema_compile_regular(sc, node);
        } else {
            *any = false;
            r = ml_fsm_minus(sc->fc, r, no);
        }
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
    cJSON **mbs = calloc(n, sizeof *mbs); /* kept for schema_one_of_list */
    if (!mbs) {
        free(b);
        free(anys);
        cJSON_Delete(split);
        return (schema_nomem(sc), NULL);
    }
    size_t i = 0;
    for (const cJSON *br = split->child; br; br = br->next, i++) {
        cJSON *mb = mbs[i] = cJSON_CreateObject();
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
        if (!b[i])
            break;
    }
    ml_fsm *r = NULL;
    *any = false;
    if (ml_fsm_ctx_status(sc->fc) != ML_OK) {
        schema_free_all(b, n);
    } else if (!strcmp(how, "oneOf")) {
        r = schema_one_of_list(sc, b, n, (const cJSON *const *)mbs);
    } else {
        bool all = false;
        for (i = 0; i < n; i++)
            all |= anys[i];
        if (all) {
            schema_free_all(b, n);
            *any = true;
            r = schema_any(sc);
        } else {
            r = ml_fsm_union_n(sc->fc, b, n);
            free(b);
        }
    }
    for (i = 0; i < n; i++)
        cJSON_Delete(mbs[i]);
    free(mbs);
    cJSON_Delete(split);
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

/* The JSON Schema compiler (grammar.h): a schema document compiled into byte
 * automata (fsm.h), one per recursive $ref target plus the document, then
 * into the grammar tables (schema_emit.c). This file holds the entry points,
 * the digest, the keyword check, $ref resolution and the dispatch of one
 * schema; the combinators are schema_combine.c's, the automata of each type
 * schema_value.c's. engine/grammar/README.md says what is enforced and what
 * is refused, and why.
 *
 * A schema is the conjunction of its parts: its own type keywords, $ref,
 * each allOf branch, anyOf, oneOf, enum, const and not. When every part is a
 * regular language (no call of a recursive machine inside) the parts are
 * intersected exactly. A part holding a call (a recursive $ref, or "any
 * value", whose automaton calls itself) cannot be intersected, so then the
 * keywords themselves are merged (schema_combine.c); a merge that cannot be
 * exact is refused. */
#include "grammar/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "grammar/grammar_internal.h"
#include "grammar/lexemes.h"
#include "grammar/schema_internal.h"
#include "sha256.h"

#define SCHEMA_DEFAULT_MAX_BYTES (256u * 1024u)
#define SCHEMA_DEFAULT_MAX_STATES 200000u
#define SCHEMA_DEFAULT_MAX_COMPILE_MS 2000.0

void ml_schema_limits_default(ml_schema_limits *lim)
{
    lim->max_schema_bytes = SCHEMA_DEFAULT_MAX_BYTES;
    lim->max_states = SCHEMA_DEFAULT_MAX_STATES;
    lim->max_compile_ms = SCHEMA_DEFAULT_MAX_COMPILE_MS;
    lim->max_whitespace = 0;
}

/* lim's whitespace bound, the default for 0; false when out of range. */
static bool schema_max_ws(const ml_schema_limits *lim, uint8_t *ws)
{
    uint32_t v = lim->max_whitespace ? lim->max_whitespace : ML_JSON_MAX_WHITESPACE;
    *ws = (uint8_t)v;
    return v >= 1 && v <= ML_JSON_MAX_WHITESPACE;
}

/* ---- parsing and the digest ------------------------------------------------ */

/* The schema document, or NULL with err set (ML_ERR_TOO_LARGE over the
 * bound, before anything is parsed; ML_ERR_INVALID_ARG when not JSON). */
static cJSON *schema_parse(const char *text, size_t len, const ml_schema_limits *lim,
                           ml_status *st, char *err, size_t errlen)
{
    if (!text || !lim) {
        *st = ml_fail(err, errlen, ML_ERR_INVALID_ARG, "schema: no text or limits");
        return NULL;
    }
    uint8_t ws;
    if (!schema_max_ws(lim, &ws)) {
        *st = ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                      "schema: max_whitespace %u is outside [1, %d]", lim->max_whitespace,
                      ML_JSON_MAX_WHITESPACE);
        return NULL;
    }
    if (len > lim->max_schema_bytes) {
        *st = ml_fail(err, errlen, ML_ERR_TOO_LARGE,
                      "schema: %zu bytes, over the bound of %zu (max_schema_bytes)", len,
                      lim->max_schema_bytes);
        return NULL;
    }
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!doc) {
        *st = ml_fail(err, errlen, ML_ERR_INVALID_ARG, "schema: not JSON (at byte %zu)",
                      end && end >= text ? (size_t)(end - text) : (size_t)0);
        return NULL;
    }
    /* Only whitespace may follow the value. */
    for (size_t i = (size_t)(end - text); i < len; i++)
        if (!strchr(" \t\n\r", text[i])) {
            cJSON_Delete(doc);
            *st = ml_fail(err, errlen, ML_ERR_INVALID_ARG,
                          "schema: not JSON (bytes after the value at byte %zu)", i);
            return NULL;
        }
    *st = ML_OK;
    return doc;
}

/* Sort every object's members by key (bytes), recursively: the canonical
 * form; except the members of a "properties" object, whose order is the
 * order generated documents follow, so two orders are two grammars.
 * Insertion sort of the linked list: schemas have few keys per object. */
static void schema_sort(cJSON *v)
{
    for (cJSON *c = v->child; c; c = c->next)
        schema_sort(c);
    if (!cJSON_IsObject(v) || !v->child || (v->string && !strcmp(v->string, "properties")))
        return;
    cJSON *sorted = NULL;
    for (cJSON *c = v->child, *next; c; c = next) {
        next = c->next;
        cJSON **at = &sorted;
        while (*at && strcmp((*at)->string, c->string) <= 0)
            at = &(*at)->next;
        c->next = *at;
        *at = c;
    }
    /* cJSON's lists are doubly linked, the head's prev pointing at the tail. */
    cJSON *prev = NULL;
    for (cJSON *c = sorted; c; c = c->next) {
        c->prev = prev;
        prev = c;
    }
    sorted->prev = prev;
    v->child = sorted;
}

/* The digest of the canonical form and, when not the default, the
 * whitespace bound (the default's digest is the canonical form's alone,
 * as before the bound could be chosen). */
static ml_status schema_digest_of(cJSON *doc, const ml_schema_limits *lim, uint8_t digest[32],
                                  char *err, size_t errlen)
{
    schema_sort(doc);
    char *canon = cJSON_PrintUnformatted(doc);
    if (!canon)
        return ml_fail(err, errlen, ML_ERR_NOMEM, "schema: out of memory");
    ml_sha256_ctx c;
    ml_sha256_init(&c);
    ml_sha256_update(&c, canon, strlen(canon));
    uint8_t ws;
    schema_max_ws(lim, &ws);
    if (ws != ML_JSON_MAX_WHITESPACE) {
        /* After the text's own bytes, a NUL no JSON text holds. */
        char tag[32];
        int n = snprintf(tag, sizeof tag, "%cmax_whitespace=%u", '\0', (unsigned)ws);
        ml_sha256_update(&c, tag, (size_t)n);
    }
    ml_sha256_final(&c, digest);
    cJSON_free(canon);
    return ML_OK;
}

ml_status ml_schema_digest(const char *text, size_t len, const ml_schema_limits *lim,
                           uint8_t digest[32], char *err, size_t errlen)
{
    ml_status st;
    cJSON *doc = schema_parse(text, len, lim, &st, err, errlen);
    if (!doc)
        return st;
    st = schema_digest_of(doc, lim, digest, err, errlen);
    cJSON_Delete(doc);
    return st;
}

/* ---- pointers and errors --------------------------------------------------- */

/* Append "/seg" (with ~0 ~1 escapes) to the current pointer, cut at the
 * buffer's end; returns the previous length, for schema_pointer_pop. */
size_t schema_pointer_push(schema_compiler *sc, const char *key, int index)
{
    size_t old = sc->pointer_len;
    char seg[32];
    if (!key) {
        snprintf(seg, sizeof seg, "%d", index);
        key = seg;
    }
    size_t n = sc->pointer_len;
    if (n + 1 < SCHEMA_MAX_POINTER)
        sc->pointer[n++] = '/';
    for (const char *p = key; *p && n + 2 < SCHEMA_MAX_POINTER; p++) {
        if (*p == '~' || *p == '/') {
            sc->pointer[n++] = '~';
            sc->pointer[n++] = *p == '~' ? '0' : '1';
        } else {
            sc->pointer[n++] = *p;
        }
    }
    sc->pointer[n] = '\0';
    sc->pointer_len = n;
    return old;
}

void schema_pointer_pop(schema_compiler *sc, size_t old)
{
    sc->pointer_len = old;
    sc->pointer[old] = '\0';
}

const char *schema_where(const schema_compiler *sc)
{
    return sc->pointer_len ? sc->pointer : "the root";
}

ml_fsm *schema_refuse(schema_compiler *sc, ml_status st, const char *keyword, const char *why)
{
    if (st == ML_ERR_UNSUPPORTED)
        ml_fsm_ctx_fail(sc->fc, st, "unsupported keyword '%s' at %s: %s", keyword,
                        schema_where(sc), why);
    else
        ml_fsm_ctx_fail(sc->fc, st, "invalid keyword '%s' at %s: %s", keyword, schema_where(sc),
                        why);
    return NULL;
}

void schema_locate(schema_compiler *sc)
{
    char where[SCHEMA_MAX_POINTER + 4];
    snprintf(where, sizeof where, "at %s", schema_where(sc));
    ml_fsm_ctx_locate(sc->fc, where);
}

int schema_machine_new(schema_compiler *sc, const char *pointer)
{
    if (sc->n_machines >= ML_FSM_MAX_CALLS) {
        ml_fsm_ctx_fail(sc->fc, ML_ERR_TOO_LARGE,
                        "schema: more than %u recursive $ref targets", ML_FSM_MAX_CALLS);
        return -1;
    }
    if (sc->n_machines == sc->cap_machines) {
        uint32_t cap = sc->cap_machines ? 2 * sc->cap_machines : 8;
        schema_machine *m = realloc(sc->machines, cap * sizeof *m);
        if (!m) {
            ml_fsm_ctx_fail(sc->fc, ML_ERR_NOMEM, "schema: out of memory");
            return -1;
        }
        sc->machines = m;
        sc->cap_machines = cap;
    }
    sc->machines[sc->n_machines] = (schema_machine){.fsm = NULL, .pointer = pointer};
    return (int)sc->n_machines++;
}

/* ---- keywords -------------------------------------------------------------- */

static const schema_kw schema_keywords[] = {
    {"title", KW_ANNOTATION, NULL},
    {"description", KW_ANNOTATION, NULL},
    {"examples", KW_ANNOTATION, NULL},
    {"default", KW_ANNOTATION, NULL},
    {"$schema", KW_ANNOTATION, NULL},
    {"$id", KW_ANNOTATION, NULL},
    {"id", KW_ANNOTATION, NULL},
    {"$comment", KW_ANNOTATION, NULL},
    {"$anchor", KW_ANNOTATION, NULL},         /* "#name" references are refused */
    {"$dynamicAnchor", KW_ANNOTATION, NULL},  /* $dynamicRef is refused */
    {"$vocabulary", KW_ANNOTATION, NULL},
    {"$defs", KW_ANNOTATION, NULL},           /* reached through $ref only */
    {"definitions", KW_ANNOTATION, NULL},
    {"readOnly", KW_ANNOTATION, NULL},
    {"writeOnly", KW_ANNOTATION, NULL},
    {"deprecated", KW_ANNOTATION, NULL},
    {"contentMediaType", KW_ANNOTATION, NULL},
    {"contentEncoding", KW_ANNOTATION, NULL},
    {"contentSchema", KW_ANNOTATION, NULL},
    {"$ref", KW_COMPOSE, NULL},
    {"allOf", KW_COMPOSE, NULL},
    {"anyOf", KW_COMPOSE, NULL},
    {"oneOf", KW_COMPOSE, NULL},
    {"not", KW_COMPOSE, NULL},
    {"enum", KW_COMPOSE, NULL},
    {"const", KW_COMPOSE, NULL},
    {"type", KW_TYPE, NULL},
    {"minLength", KW_TYPED, NULL},
    {"maxLength", KW_TYPED, NULL},
    {"pattern", KW_TYPED, NULL},
    {"format", KW_TYPED, NULL},
    {"minimum", KW_TYPED, NULL},
    {"maximum", KW_TYPED, NULL},
    {"exclusiveMinimum", KW_TYPED, NULL},
    {"exclusiveMaximum", KW_TYPED, NULL},
    {"multipleOf", KW_TYPED, NULL},
    {"items", KW_TYPED, NULL},
    {"prefixItems", KW_TYPED, NULL},
    {"additionalItems", KW_TYPED, NULL},
    {"minItems", KW_TYPED, NULL},
    {"maxItems", KW_TYPED, NULL},
    {"uniqueItems", KW_TYPED, NULL}, /* false only: true is refused in schema_check */
    {"properties", KW_TYPED, NULL},
    {"required", KW_TYPED, NULL},
    {"additionalProperties", KW_TYPED, NULL},
    {"patternProperties", KW_TYPED, NULL},
    {"propertyNames", KW_TYPED, NULL},
    {"minProperties", KW_REFUSED,
     "the member count a validator sees depends on duplicate keys, which a document may hold"},
    {"maxProperties", KW_REFUSED,
     "the member count a validator sees depends on duplicate keys, which a document may hold"},
    {"contains", KW_REFUSED, "a count of matching items is not enforced"},
    {"minContains", KW_REFUSED, "a count of matching items is not enforced"},
    {"maxContains", KW_REFUSED, "a count of matching items is not enforced"},
    {"dependencies", KW_REFUSED, "conditional members are not enforced"},
    {"dependentRequired", KW_REFUSED, "conditional members are not enforced"},
    {"dependentSchemas", KW_REFUSED, "conditional members are not enforced"},
    {"if", KW_REFUSED, "conditionals are not enforced"},
    {"then", KW_REFUSED, "conditionals are not enforced"},
    {"else", KW_REFUSED, "conditionals are not enforced"},
    {"unevaluatedProperties", KW_REFUSED, "annotation-dependent keywords are not enforced"},
    {"unevaluatedItems", KW_REFUSED, "annotation-dependent keywords are not enforced"},
    {"$dynamicRef", KW_REFUSED, "dynamic references are not resolved"},
    {"$recursiveRef", KW_REFUSED, "dynamic references are not resolved"},
    {"$recursiveAnchor", KW_REFUSED, "dynamic references are not resolved"},
    /* Draft 3's validation keywords, which its validators enforce. */
    {"disallow", KW_REFUSED, "draft 3's disallow is not enforced"},
    {"extends", KW_REFUSED, "draft 3's extends is not enforced"},
    {"divisibleBy", KW_REFUSED, "draft 3's divisibleBy is not enforced"},
};

/* A keyword JSON Schema does not define is an annotation: validators ignore
 * it (draft 2020-12 §4.3.1), so ignoring it is exact, even for a misspelt one
 * ("additonalProperties") or a vendor's ("x-kubernetes-group-version-kind",
 * OpenAPI's "nullable"). */
static const schema_kw schema_undefined = {"", KW_ANNOTATION, NULL};

const schema_kw *schema_keyword(const char *name)
{
    for (size_t i = 0; i < sizeof schema_keywords / sizeof schema_keywords[0]; i++)
        if (!strcmp(schema_keywords[i].name, name))
            return &schema_keywords[i];
    return &schema_undefined;
}

/* Refuse what cannot be enforced; say whether node has type-specific
 * keywords (*typed), a type (*has_type) and parts to combine (*compose). */
bool schema_check(schema_compiler *sc, const cJSON *node, bool *typed, bool *has_type,
                         bool *compose)
{
    *typed = *has_type = *compose = false;
    for (const cJSON *m = node->child; m; m = m->next) {
        const schema_kw *kw = schema_keyword(m->string);
        switch (kw->cls) {
        case KW_ANNOTATION:
            break;
        case KW_COMPOSE:
            *compose = true;
            break;
        case KW_TYPE:
            *has_type = true;
            break;
        case KW_TYPED:
            if (!strcmp(m->string, "uniqueItems")) {
                if (!cJSON_IsBool(m)) {
                    schema_refuse(sc, ML_ERR_INVALID_ARG, m->string, "not a boolean");
                    return false;
                }
                if (cJSON_IsTrue(m)) {
                    schema_refuse(sc, ML_ERR_UNSUPPORTED, m->string,
                                  "telling every item apart from every other needs memory "
                                  "that grows with the array; no automaton enforces it");
                    return false;
                }
                break;
            }
            *typed = true;
            break;
        case KW_REFUSED:
            schema_refuse(sc, ML_ERR_UNSUPPORTED, m->string, kw->why);
            return false;
        }
    }
    return true;
}

/* The type set a "type" value names (a name or an array of names); 0 with
 * the error latched when malformed. A set naming "number" covers integers;
 * an empty array is SCHEMA_T_NONE (nothing is valid). */
unsigned schema_type_set(schema_compiler *sc, const cJSON *t)
{
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {
        {"null", SCHEMA_T_NULL},         {"boolean", SCHEMA_T_BOOLEAN},
        {"integer", SCHEMA_T_INTEGER},   {"number", SCHEMA_T_NUMBER | SCHEMA_T_INTEGER},
        {"string", SCHEMA_T_STRING},     {"array", SCHEMA_T_ARRAY},
        {"object", SCHEMA_T_OBJECT},
    };
    unsigned set = 0;
    bool one = cJSON_IsString(t);
    if (!one && !cJSON_IsArray(t))
        goto bad;
    for (const cJSON *e = one ? t : t->child; e; e = one ? NULL : e->next) {
        if (!cJSON_IsString(e))
            goto bad;
        size_t i = 0;
        while (i < sizeof names / sizeof names[0] && strcmp(names[i].name, e->valuestring))
            i++;
        if (i == sizeof names / sizeof names[0])
            goto bad;
        set |= names[i].bit;
    }
    return set ? set : SCHEMA_T_NONE;
bad:
    schema_refuse(sc, ML_ERR_INVALID_ARG, "type", "not a type name or an array of them");
    return 0;
}

/* The type set of node's "type" (SCHEMA_T_ALL when absent). */
unsigned schema_types(schema_compiler *sc, const cJSON *node)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(node, "type");
    return t ? schema_type_set(sc, t) : SCHEMA_T_ALL;
}

/* ---- $ref ------------------------------------------------------------------ */

/* The node at a "#..." reference (JSON Pointer in a URI fragment: %xx, then
 * ~1 and ~0), NULL with the error latched. */
const cJSON *schema_resolve(schema_compiler *sc, const char *ref)
{
    if (ref[0] != '#') {
        schema_refuse(sc, ML_ERR_UNSUPPORTED, "$ref", "only references inside the schema (#...)");
        return NULL;
    }
    if (ref[1] != '\0' && ref[1] != '/') {
        schema_refuse(sc, ML_ERR_UNSUPPORTED, "$ref",
                      "only JSON Pointer references (#/...), not anchors");
        return NULL;
    }
    size_t n = strlen(ref);
    char *dec = malloc(n + 1);
    if (!dec) {
        ml_fsm_ctx_fail(sc->fc, ML_ERR_NOMEM, "schema: out of memory");
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        int h1, h2;
        if (ref[i] == '%' && i + 2 < n && (h1 = ml_hex_digit(ref[i + 1])) >= 0 &&
            (h2 = ml_hex_digit(ref[i + 2])) >= 0) {
            dec[k++] = (char)(h1 * 16 + h2);
            i += 2;
        } else {
            dec[k++] = ref[i];
        }
    }
    dec[k] = '\0';
    const cJSON *at = sc->root;
    char *p = dec;
    while (at && *p == '/') {
        char *seg = ++p, *w = seg;
        while (*p && *p != '/') {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
                *w++ = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                *w++ = *p++;
            }
        }
        char save = *p;
        *w = '\0';
        if (cJSON_IsArray(at)) {
            char *end;
            long idx = strtol(seg, &end, 10);
            bool ok = *seg && !*end && (seg[0] != '0' || !seg[1]) && seg[0] != '-';
            at = ok ? cJSON_GetArrayItem(at, (int)idx) : NULL;
        } else if (cJSON_IsObject(at)) {
            at = cJSON_GetObjectItemCaseSensitive(at, seg);
        } else {
            at = NULL;
        }
        *p = save;
    }
    bool whole = *p == '\0';
    free(dec);
    if (!at || !whole)
        schema_refuse(sc, ML_ERR_INVALID_ARG, "$ref", "the reference does not resolve");
    return at;
}

/* The target entry of node, created on first sight; -1 when out of memory. */
static long schema_target_of(schema_compiler *sc, const cJSON *node, const char *ref)
{
    for (size_t i = 0; i < sc->n_targets; i++)
        if (sc->targets[i].node == node)
            return (long)i;
    if (sc->n_targets == sc->cap_targets) {
        size_t cap = sc->cap_targets ? 2 * sc->cap_targets : 16;
        schema_target *t = realloc(sc->targets, cap * sizeof *t);
        if (!t)
            goto nomem;
        sc->targets = t;
        sc->cap_targets = cap;
    }
    char *pointer = strdup(ref[1] ? ref + 1 : "");
    if (!pointer)
        goto nomem;
    sc->targets[sc->n_targets] =
        (schema_target){.node = node, .pointer = pointer, .machine = -1};
    return (long)sc->n_targets++;
nomem:
    ml_fsm_ctx_fail(sc->fc, ML_ERR_NOMEM, "schema: out of memory");
    return -1;
}

/* The values of a reference's target: compiled once; a reference met while
 * its target is being compiled makes the target a machine, and every
 * reference to it a call. */
static ml_fsm *schema_ref(schema_compiler *sc, const cJSON *node, const char *ref, bool *any)
{
    long ti = schema_target_of(sc, node, ref);
    if (ti < 0)
        return NULL;
    schema_target *t = &sc->targets[ti];
    if (sc->regular_depth && !(t->memo && !ml_fsm_has_calls(t->memo))) {
        /* Compiled regular: a fresh copy (the memo is the unbounded one),
         * refused when recursive. */
        if (t->in_progress)
            return schema_refuse(sc, ML_ERR_UNSUPPORTED, "$ref",
                                 "a recursive reference inside a schema that must be regular "
                                 "(the complement of oneOf or not, an enum beside it)");
        t->in_progress = true;
        ml_fsm *r = schema_compile(sc, node, any);
        sc->targets[ti].in_progress = false;
        return r;
    }
    if (t->memo) {
        *any = t->memo_any;
        return ml_fsm_copy(sc->fc, t->memo);
    }
    if (t->in_progress) {
        if (t->machine < 0)
            t->machine = schema_machine_new(sc, t->pointer[0] ? t->pointer : "the root");
        return t->machine < 0 ? NULL : ml_fsm_call(sc->fc, (uint32_t)t->machine);
    }
    t->in_progress = true;
    char saved[SCHEMA_MAX_POINTER];
    size_t saved_len = sc->pointer_len;
    memcpy(saved, sc->pointer, saved_len + 1);
    snprintf(sc->pointer, sizeof sc->pointer, "%s", t->pointer);
    sc->pointer_len = strlen(sc->pointer);
    ml_fsm *r = schema_compile(sc, node, any);
    memcpy(sc->pointer, saved, saved_len + 1);
    sc->pointer_len = saved_len;
    t = &sc->targets[ti]; /* the array may have moved */
    t->in_progress = false;
    if (!r)
        return NULL;
    if (t->machine >= 0) {
        sc->machines[t->machine].fsm = r;
        *any = false;
        r = ml_fsm_call(sc->fc, (uint32_t)t->machine);
    }
    t->memo = ml_fsm_copy(sc->fc, r);
    t->memo_any = *any;
    return r;
}

ml_fsm *schema_ref_of(schema_compiler *sc, const cJSON *ref, bool *any)
{
    if (!cJSON_IsString(ref))
        return schema_refuse(sc, ML_ERR_INVALID_ARG, "$ref", "not a string");
    const cJSON *node = schema_resolve(sc, ref->valuestring);
    return node ? schema_ref(sc, node, ref->valuestring, any) : NULL;
}

ml_fsm *schema_compile(schema_compiler *sc, const cJSON *node, bool *any)
{
    *any = false;
    if (ml_fsm_ctx_status(sc->fc) != ML_OK)
        return NULL;
    if (cJSON_IsBool(node)) {
        *any = cJSON_IsTrue(node);
        return *any ? schema_any(sc) : ml_fsm_nothing(sc->fc);
    }
    if (!cJSON_IsObject(node)) {
        ml_fsm_ctx_fail(sc->fc, ML_ERR_INVALID_ARG, "schema at %s: not an object or a boolean",
                        schema_where(sc));
        return NULL;
    }
    if (++sc->nesting > SCHEMA_MAX_NESTING) {
        sc->nesting--;
        ml_fsm_ctx_fail(sc->fc, ML_ERR_TOO_LARGE, "schema at %s: nested deeper than %d",
                        schema_where(sc), SCHEMA_MAX_NESTING);
        return NULL;
    }
    bool typed, has_type, compose;
    ml_fsm *r = NULL;
    if (schema_check(sc, node, &typed, &has_type, &compose)) {
        if (!compose && !typed && !has_type) {
            *any = true;
            r = schema_any(sc);
        } else if (!compose) {
            unsigned types = schema_types(sc, node);
            r = types ? schema_typed(sc, node, types) : NULL;
        } else {
            r = schema_parts(sc, node, typed, has_type, true, any);
        }
    }
    sc->nesting--;
    return r;
}

ml_fsm *schema_compile_at(schema_compiler *sc, const cJSON *node, const char *key, int index,
                          bool *any)
{
    size_t at = schema_pointer_push(sc, key, index);
    ml_fsm *r = schema_compile(sc, node, any);
    schema_pointer_pop(sc, at);
    return r;
}

ml_fsm *schema_compile_strings(schema_compiler *sc, const cJSON *node, bool *any)
{
    *any = false;
    if (cJSON_IsObject(node)) {
        bool typed, has_type, compose;
        if (!schema_check(sc, node, &typed, &has_type, &compose))
            return NULL;
        if (!compose) {
            *any = !typed && !has_type;
            unsigned types = schema_types(sc, node);
            return types ? schema_typed(sc, node, types & SCHEMA_T_STRING) : NULL;
        }
    }
    ml_fsm *r = schema_compile(sc, node, any);
    if (r && !*any && ml_fsm_has_calls(r)) {
        ml_fsm_free(r);
        return schema_refuse(sc, ML_ERR_UNSUPPORTED, "propertyNames",
                             "a schema whose strings cannot be told apart from its other values");
    }
    if (*any)
        return r;
    ml_lex_string all = {.min_length = 0, .max_length = ML_FSM_UNBOUNDED};
    return ml_fsm_intersect(sc->fc, r, ml_lex_json_string(sc->fc, &all));
}

/* Refuse a $ref under a subschema with its own $id (or draft 4's id): it
 * would resolve against that resource, and references here resolve
 * against the document root only. */
static bool schema_check_ids(schema_compiler *sc, const cJSON *v, bool nested_id)
{
    if (cJSON_IsObject(v) && v != sc->root) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(v, "$id");
        if (!id)
            id = cJSON_GetObjectItemCaseSensitive(v, "id");
        nested_id |= cJSON_IsString(id) && id->valuestring[0] != '#';
        if (nested_id && cJSON_GetObjectItemCaseSensitive(v, "$ref")) {
            ml_fsm_ctx_fail(sc->fc, ML_ERR_UNSUPPORTED,
                            "unsupported keyword '$ref' under a nested '$id': references "
                            "resolve against the document root only");
            return false;
        }
    }
    for (const cJSON *c = v->child; c; c = c->next)
        if (!schema_check_ids(sc, c, nested_id))
            return false;
    return true;
}

/* ---- entry point ----------------------------------------------------------- */

static void schema_compiler_deinit(schema_compiler *sc)
{
    for (size_t i = 0; i < sc->n_targets; i++) {
        free(sc->targets[i].pointer);
        ml_fsm_free(sc->targets[i].memo);
    }
    free(sc->targets);
    for (uint32_t i = 0; i < sc->n_machines; i++)
        ml_fsm_free(sc->machines[i].fsm);
    free(sc->machines);
    ml_fsm_free(sc->any_regular);
    cJSON_Delete(sc->replaced);
}

ml_status ml_grammar_compile_schema(const char *text, size_t len, const ml_schema_limits *lim,
                                    ml_grammar **out, char *err, size_t errlen)
{
    if (!out)
        return ml_fail(err, errlen, ML_ERR_INVALID_ARG, "schema: no output");
    double t0 = ml_clock_ms();
    ml_status st;
    cJSON *doc = schema_parse(text, len, lim, &st, err, errlen);
    if (!doc)
        return st;
    /* cJSON ends a string at U+0000: a schema string holding one would be
     * read cut short, and enforced as the shorter string. */
    for (size_t i = 0; i + 6 <= len; i++)
        if (text[i] == '\\' && text[i + 1] == 'u' && !memcmp(text + i + 2, "0000", 4)) {
            cJSON_Delete(doc);
            return ml_fail(err, errlen, ML_ERR_UNSUPPORTED,
                           "schema: a string holding \\u0000 at byte %zu", i);
        }
    ml_fsm_ctx *fc = ml_fsm_ctx_create(lim->max_states,
                                       lim->max_compile_ms > 0 ? t0 + lim->max_compile_ms : 0);
    if (!fc) {
        cJSON_Delete(doc);
        return ml_fail(err, errlen, ML_ERR_NOMEM, "schema: out of memory");
    }
    ml_fsm_ctx_defer_minimal(fc);
    schema_compiler sc = {.fc = fc,
                          .max_states = lim->max_states,
                          .deadline_ms = lim->max_compile_ms > 0 ? t0 + lim->max_compile_ms : 0,
                          .root = doc,
                          .any_machine = -1};
    /* Machine 0, the document: the root compiled as a $ref target, so that
     * "#" references to it make it a machine of its own. */
    ml_grammar *g = NULL;
    if (schema_check_ids(&sc, doc, false) && schema_machine_new(&sc, "the document") == 0) {
        bool any;
        schema_refuse_early(&sc, doc);
        /* Apart from the store: compiling may grow sc.machines. */
        ml_fsm *document = ml_fsm_ctx_status(fc) == ML_OK ? schema_ref(&sc, doc, "#", &any) : NULL;
        sc.machines[0].fsm = document;
        if (sc.machines[0].fsm && ml_fsm_is_empty(sc.machines[0].fsm))
            ml_fsm_ctx_fail(fc, ML_ERR_INVALID_ARG, "schema: no JSON value is valid under it");
        /* The tables are of the minimal automata (fsm.h: minimisation
         * deferred while composing). */
        for (size_t k = 0; k < sc.n_machines && ml_fsm_ctx_status(fc) == ML_OK; k++)
            sc.machines[k].fsm = ml_fsm_minimal(fc, sc.machines[k].fsm);
        if (ml_fsm_ctx_status(fc) == ML_OK)
            g = schema_emit(&sc);
    }
    st = ml_fsm_ctx_status(fc);
    if (st == ML_OK && g) {
        schema_max_ws(lim, &g->max_ws);
        /* The digest is of the canonical form, which sorting makes: last, as
         * it reorders the document the compiler walked. */
        st = schema_digest_of(doc, lim, g->digest, err, errlen);
        if (st == ML_OK)
            *out = g;
        else
            ml_grammar_unref(g);
    } else {
        if (st == ML_OK)
            st = ML_ERR_NOMEM;
        ml_fail(err, errlen, st, "%s", ml_fsm_ctx_error(fc)[0] ? ml_fsm_ctx_error(fc)
                                                                : "schema: out of memory");
        ml_grammar_unref(g);
    }
    schema_compiler_deinit(&sc);
    ml_fsm_ctx_destroy(fc);
    cJSON_Delete(doc);
    return st;
}

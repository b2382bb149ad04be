/* The schema oracle (schema_oracle.h): JSON Schema validation written from
 * the specification (json-schema.org draft 2020-12 core and validation),
 * without reference to the grammar compiler it checks; patterns and formats
 * are in schema_oracle_regex.c and schema_oracle_format.c. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_oracle.h"
#include "schema_oracle_internal.h"

/* Nested schema evaluations ($ref chains, deep instances) before the oracle
 * gives up on a schema that recurses without consuming the instance. */
#define ORACLE_MAX_DEPTH 512
/* Instance JSON Pointer kept for messages (longer ones are cut). */
#define ORACLE_PATH_CAP 256

/* ==== JSON values as json.loads sees them ===================================== */

/* An object's member for key: the last one, as a duplicate key overrides. */
static const cJSON *obj_get(const cJSON *obj, const char *key)
{
    const cJSON *found = NULL, *m;
    cJSON_ArrayForEach(m, obj)
        if (m->string && !strcmp(m->string, key))
            found = m;
    return found;
}

/* m is the member its key resolves to (no later duplicate). */
static bool member_is_last(const cJSON *m)
{
    for (const cJSON *p = m->next; p; p = p->next)
        if (!strcmp(p->string, m->string))
            return false;
    return true;
}

/* The object's distinct keys. */
static size_t obj_count(const cJSON *obj)
{
    size_t n = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, obj)
        n += member_is_last(m);
    return n;
}

/* jsonschema's `equal`: numbers by value (1 == 1.0), booleans never equal
 * numbers, arrays element by element, objects by their distinct keys. */
static bool json_equal(const cJSON *a, const cJSON *b)
{
    if (cJSON_IsNumber(a) || cJSON_IsNumber(b))
        return cJSON_IsNumber(a) && cJSON_IsNumber(b) && a->valuedouble == b->valuedouble;
    if (cJSON_IsBool(a) || cJSON_IsBool(b))
        return cJSON_IsBool(a) && cJSON_IsBool(b) && cJSON_IsTrue(a) == cJSON_IsTrue(b);
    if (cJSON_IsNull(a) || cJSON_IsNull(b))
        return cJSON_IsNull(a) && cJSON_IsNull(b);
    if (cJSON_IsString(a) || cJSON_IsString(b))
        return cJSON_IsString(a) && cJSON_IsString(b) && !strcmp(a->valuestring, b->valuestring);
    if (cJSON_IsArray(a) || cJSON_IsArray(b)) {
        if (!cJSON_IsArray(a) || !cJSON_IsArray(b))
            return false;
        const cJSON *x = a->child, *y = b->child;
        for (; x && y; x = x->next, y = y->next)
            if (!json_equal(x, y))
                return false;
        return !x && !y;
    }
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b) || obj_count(a) != obj_count(b))
        return false;
    const cJSON *m;
    cJSON_ArrayForEach(m, a) {
        if (!member_is_last(m))
            continue;
        const cJSON *other = obj_get(b, m->string);
        if (!other || !json_equal(m, other))
            return false;
    }
    return true;
}

static bool is_integer(const cJSON *x)
{
    return cJSON_IsNumber(x) && isfinite(x->valuedouble) && floor(x->valuedouble) == x->valuedouble;
}

/* ==== validation ================================================================ */

typedef struct oracle {
    const cJSON *root; /* borrowed: what "#..." resolves against */
    char *why;         /* borrowed: the caller's message buffer */
    size_t nwhy;
    int quiet;         /* > 0 inside anyOf/oneOf/not/if/contains: failures are expected */
    int depth;
    bool said;         /* why holds the first failure */
    bool refused;      /* the oracle cannot judge: the answer is false whatever wraps it */
    char path[ORACLE_PATH_CAP]; /* the instance's JSON Pointer */
    size_t path_len;
} oracle;

static bool fail(oracle *o, const char *kw, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records the first failure (outside combinators) and returns false. */
static bool fail(oracle *o, const char *kw, const char *fmt, ...)
{
    if (o->quiet || o->said || !o->why || !o->nwhy)
        return false;
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    snprintf(o->why, o->nwhy, "at '%s': %s: %s", o->path, kw, detail);
    o->said = true;
    return false;
}

static bool refuse(oracle *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The oracle cannot judge this schema: the message replaces any other. */
static bool refuse(oracle *o, const char *fmt, ...)
{
    if (!o->refused && o->why && o->nwhy) {
        char detail[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
        snprintf(o->why, o->nwhy, "oracle: %s", detail);
    }
    o->refused = o->said = true;
    return false;
}

/* Appends "/token" (escaped) to the instance path; returns the old length
 * for path_pop. */
static size_t path_push(oracle *o, const char *token)
{
    size_t old = o->path_len;
    size_t k = o->path_len;
    if (k + 1 < sizeof o->path)
        o->path[k++] = '/';
    for (const char *c = token; *c && k + 2 < sizeof o->path; c++) {
        if (*c == '~' || *c == '/') {
            o->path[k++] = '~';
            o->path[k++] = *c == '~' ? '0' : '1';
        } else {
            o->path[k++] = *c;
        }
    }
    o->path[k] = '\0';
    o->path_len = k;
    return old;
}

static size_t path_push_index(oracle *o, size_t i)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%zu", i);
    return path_push(o, buf);
}

static void path_pop(oracle *o, size_t old)
{
    o->path_len = old;
    o->path[old] = '\0';
}

static bool validate(oracle *o, const cJSON *s, const cJSON *x);

static bool validate_at(oracle *o, const cJSON *s, const cJSON *x, const char *key, size_t index)
{
    size_t old = key ? path_push(o, key) : path_push_index(o, index);
    bool ok = validate(o, s, x);
    path_pop(o, old);
    return ok;
}

/* x validates against s without recording a failure (combinator branches). */
static bool validate_quiet(oracle *o, const cJSON *s, const cJSON *x)
{
    o->quiet++;
    bool ok = validate(o, s, x);
    o->quiet--;
    return ok;
}

/* ---- $ref ---------------------------------------------------------------- */

/* The schema a local reference names: "#" or "#/json/pointer" (percent-
 * decoded, then ~1 and ~0 unescaped); NULL when it names nothing. */
static const cJSON *resolve_ref(const cJSON *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    size_t n = strlen(ref);
    char *ptr = malloc(n + 1);
    if (!ptr)
        return NULL;
    size_t k = 0;
    for (size_t i = 1; i < n; i++) {
        if (ref[i] == '%' && i + 2 < n && oracle_hex_value((unsigned char)ref[i + 1]) >= 0 &&
            oracle_hex_value((unsigned char)ref[i + 2]) >= 0) {
            ptr[k++] = (char)(oracle_hex_value((unsigned char)ref[i + 1]) * 16 +
                              oracle_hex_value((unsigned char)ref[i + 2]));
            i += 2;
        } else {
            ptr[k++] = ref[i];
        }
    }
    ptr[k] = '\0';
    const cJSON *at = root;
    if (k > 0 && ptr[0] != '/')
        at = NULL; /* "#name": an anchor, not supported */
    char *tok = ptr + (k > 0);
    while (at && k > 0) {
        char *slash = strchr(tok, '/');
        if (slash)
            *slash = '\0';
        char *w = tok;
        for (char *c = tok; *c; c++) {
            if (c[0] == '~' && (c[1] == '0' || c[1] == '1')) {
                *w++ = c[1] == '0' ? '~' : '/';
                c++;
            } else {
                *w++ = *c;
            }
        }
        *w = '\0';
        if (cJSON_IsObject(at)) {
            at = obj_get(at, tok);
        } else if (cJSON_IsArray(at)) {
            char *end;
            long i = strtol(tok, &end, 10);
            at = *tok && !*end && i >= 0 ? cJSON_GetArrayItem(at, (int)i) : NULL;
        } else {
            at = NULL;
        }
        if (!slash)
            break;
        tok = slash + 1;
    }
    free(ptr);
    return at;
}

/* ---- keywords by instance type ------------------------------------------------ */

/* A keyword's value as a number; refuses a non-number. */
static bool kw_number(oracle *o, const cJSON *s, const char *kw, double *v, bool *present)
{
    const cJSON *k = obj_get(s, kw);
    *present = k != NULL;
    if (!k)
        return true;
    if (!cJSON_IsNumber(k))
        return refuse(o, "'%s' is not a number", kw);
    *v = k->valuedouble;
    return true;
}

static bool type_matches(oracle *o, const cJSON *x, const char *t)
{
    if (!strcmp(t, "null"))
        return cJSON_IsNull(x);
    if (!strcmp(t, "boolean"))
        return cJSON_IsBool(x);
    if (!strcmp(t, "object"))
        return cJSON_IsObject(x);
    if (!strcmp(t, "array"))
        return cJSON_IsArray(x);
    if (!strcmp(t, "string"))
        return cJSON_IsString(x);
    if (!strcmp(t, "number"))
        return cJSON_IsNumber(x);
    if (!strcmp(t, "integer"))
        return is_integer(x);
    return refuse(o, "unknown type '%s'", t);
}

static bool check_type(oracle *o, const cJSON *t, const cJSON *x)
{
    if (cJSON_IsString(t))
        return type_matches(o, x, t->valuestring) || fail(o, "type", "not %s", t->valuestring);
    if (!cJSON_IsArray(t))
        return refuse(o, "'type' is neither a string nor an array");
    const cJSON *e;
    cJSON_ArrayForEach(e, t) {
        if (!cJSON_IsString(e))
            return refuse(o, "'type' holds a non-string");
        if (type_matches(o, x, e->valuestring))
            return true;
    }
    return !o->refused && fail(o, "type", "none of the types matches");
}

static bool check_number(oracle *o, const cJSON *s, double x)
{
    double v = 0;
    bool has;
    const cJSON *exmin = obj_get(s, "exclusiveMinimum"), *exmax = obj_get(s, "exclusiveMaximum");
    if (!kw_number(o, s, "minimum", &v, &has))
        return false;
    if (has && (cJSON_IsTrue(exmin) ? !(x > v) : !(x >= v)))
        return fail(o, "minimum", "%.17g below %.17g", x, v);
    if (!kw_number(o, s, "maximum", &v, &has))
        return false;
    if (has && (cJSON_IsTrue(exmax) ? !(x < v) : !(x <= v)))
        return fail(o, "maximum", "%.17g above %.17g", x, v);
    if (exmin && !cJSON_IsBool(exmin)) {
        if (!kw_number(o, s, "exclusiveMinimum", &v, &has))
            return false;
        if (!(x > v))
            return fail(o, "exclusiveMinimum", "%.17g not above %.17g", x, v);
    }
    if (exmax && !cJSON_IsBool(exmax)) {
        if (!kw_number(o, s, "exclusiveMaximum", &v, &has))
            return false;
        if (!(x < v))
            return fail(o, "exclusiveMaximum", "%.17g not below %.17g", x, v);
    }
    if (!kw_number(o, s, "multipleOf", &v, &has))
        return false;
    if (has) {
        if (!(v > 0))
            return refuse(o, "'multipleOf' is not positive");
        /* jsonschema: a float divisor by the quotient (falling back to an
         * exact remainder when it overflows), an integer one by x % v. */
        double q = x / v;
        bool multiple = (floor(v) == v || !isfinite(q)) ? fmod(x, v) == 0 : floor(q) == q;
        if (!multiple)
            return fail(o, "multipleOf", "%.17g is not a multiple of %.17g", x, v);
    }
    return true;
}

static bool check_string(oracle *o, const cJSON *s, const char *x)
{
    double v = 0;
    bool has;
    size_t len = oracle_utf8_count(x);
    if (!kw_number(o, s, "minLength", &v, &has))
        return false;
    if (has && (double)len < v)
        return fail(o, "minLength", "%zu code points, fewer than %.17g", len, v);
    if (!kw_number(o, s, "maxLength", &v, &has))
        return false;
    if (has && (double)len > v)
        return fail(o, "maxLength", "%zu code points, more than %.17g", len, v);
    const cJSON *pattern = obj_get(s, "pattern");
    if (pattern) {
        if (!cJSON_IsString(pattern))
            return refuse(o, "'pattern' is not a string");
        char msg[256];
        int m = oracle_pattern_search(pattern->valuestring, x, msg, sizeof msg);
        if (m < 0)
            return refuse(o, "%s", msg + strlen("oracle: "));
        if (!m)
            return fail(o, "pattern", "%s", msg);
    }
    const cJSON *format = obj_get(s, "format");
    if (cJSON_IsString(format) && !schema_oracle_format(format->valuestring, x))
        return fail(o, "format", "not a valid %s", format->valuestring);
    return true;
}

/* key matches one of patternProperties' patterns (the last match's schema
 * validates in check_object); -1 when a pattern cannot be judged. */
static int key_matches(oracle *o, const cJSON *pattern, const char *key)
{
    char msg[256];
    int m = oracle_pattern_search(pattern->string, key, msg, sizeof msg);
    if (m < 0)
        refuse(o, "%s", msg + strlen("oracle: "));
    return m;
}

static bool check_dependencies(oracle *o, const cJSON *deps, const cJSON *x, bool names_only,
                               bool schemas_only)
{
    const cJSON *d;
    cJSON_ArrayForEach(d, deps) {
        if (!member_is_last(d) || !obj_get(x, d->string))
            continue;
        if (cJSON_IsArray(d) && !schemas_only) {
            const cJSON *name;
            cJSON_ArrayForEach(name, d)
                if (cJSON_IsString(name) && !obj_get(x, name->valuestring))
                    return fail(o, "dependentRequired", "'%s' requires '%s'", d->string,
                                name->valuestring);
        } else if (!names_only && !validate(o, d, x)) {
            return false;
        }
    }
    return true;
}

static bool check_object(oracle *o, const cJSON *s, const cJSON *x)
{
    double v = 0;
    bool has;
    size_t count = obj_count(x);
    if (!kw_number(o, s, "minProperties", &v, &has))
        return false;
    if (has && (double)count < v)
        return fail(o, "minProperties", "%zu members, fewer than %.17g", count, v);
    if (!kw_number(o, s, "maxProperties", &v, &has))
        return false;
    if (has && (double)count > v)
        return fail(o, "maxProperties", "%zu members, more than %.17g", count, v);
    const cJSON *req = obj_get(s, "required"), *e;
    cJSON_ArrayForEach(e, req)
        if (cJSON_IsString(e) && !obj_get(x, e->valuestring))
            return fail(o, "required", "'%s' is missing", e->valuestring);
    const cJSON *props = obj_get(s, "properties"), *pats = obj_get(s, "patternProperties");
    const cJSON *extra = obj_get(s, "additionalProperties"), *names = obj_get(s, "propertyNames");
    const cJSON *m;
    cJSON_ArrayForEach(m, x) {
        if (!member_is_last(m))
            continue;
        bool matched = false;
        const cJSON *ps = props ? obj_get(props, m->string) : NULL;
        if (ps) {
            matched = true;
            if (!validate_at(o, ps, m, m->string, 0))
                return false;
        }
        const cJSON *p;
        cJSON_ArrayForEach(p, pats) {
            if (!member_is_last(p))
                continue;
            int hit = key_matches(o, p, m->string);
            if (hit < 0)
                return false;
            if (hit) {
                matched = true;
                if (!validate_at(o, p, m, m->string, 0))
                    return false;
            }
        }
        if (!matched && extra) {
            if (cJSON_IsFalse(extra))
                return fail(o, "additionalProperties", "'%s' is not allowed", m->string);
            if (!validate_at(o, extra, m, m->string, 0))
                return false;
        }
        if (names) {
            cJSON *key = cJSON_CreateString(m->string);
            if (!key)
                return refuse(o, "out of memory");
            bool ok = validate_at(o, names, key, m->string, 0);
            cJSON_Delete(key);
            if (!ok)
                return false;
        }
    }
    return check_dependencies(o, obj_get(s, "dependentRequired"), x, true, false) &&
           check_dependencies(o, obj_get(s, "dependentSchemas"), x, false, true) &&
           check_dependencies(o, obj_get(s, "dependencies"), x, false, false);
}

static bool check_array(oracle *o, const cJSON *s, const cJSON *x)
{
    double v = 0;
    bool has;
    size_t n = (size_t)cJSON_GetArraySize(x);
    if (!kw_number(o, s, "minItems", &v, &has))
        return false;
    if (has && (double)n < v)
        return fail(o, "minItems", "%zu items, fewer than %.17g", n, v);
    if (!kw_number(o, s, "maxItems", &v, &has))
        return false;
    if (has && (double)n > v)
        return fail(o, "maxItems", "%zu items, more than %.17g", n, v);
    const cJSON *prefix = obj_get(s, "prefixItems"), *items = obj_get(s, "items");
    const cJSON *rest = items;
    if (cJSON_IsArray(items)) { /* the draft-4 tuple form */
        prefix = items;
        rest = obj_get(s, "additionalItems");
    }
    const cJSON *p = prefix ? prefix->child : NULL, *e;
    size_t i = 0;
    cJSON_ArrayForEach(e, x) {
        const cJSON *sub = p ? p : rest;
        if (p)
            p = p->next;
        if (sub && !validate_at(o, sub, e, NULL, i))
            return cJSON_IsFalse(sub) ? fail(o, "items", "no item allowed at %zu", i) : false;
        i++;
    }
    const cJSON *contains = obj_get(s, "contains");
    if (contains) {
        double lo = 1, hi = INFINITY;
        if (!kw_number(o, s, "minContains", &v, &has))
            return false;
        if (has)
            lo = v;
        if (!kw_number(o, s, "maxContains", &v, &has))
            return false;
        if (has)
            hi = v;
        size_t found = 0;
        cJSON_ArrayForEach(e, x)
            found += validate_quiet(o, contains, e);
        if (o->refused)
            return false;
        if ((double)found < lo || (double)found > hi)
            return fail(o, "contains", "%zu items match, not within [%.17g, %.17g]", found, lo, hi);
    }
    if (cJSON_IsTrue(obj_get(s, "uniqueItems"))) {
        for (const cJSON *a = x->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (json_equal(a, b))
                    return fail(o, "uniqueItems", "two items are equal");
    }
    return true;
}

/* ---- combinators ------------------------------------------------------------- */

static bool check_combinators(oracle *o, const cJSON *s, const cJSON *x)
{
    const cJSON *all = obj_get(s, "allOf"), *any = obj_get(s, "anyOf"), *one = obj_get(s, "oneOf");
    const cJSON *b;
    cJSON_ArrayForEach(b, all)
        if (!validate(o, b, x))
            return false;
    if (any) {
        bool ok = false;
        cJSON_ArrayForEach(b, any)
            if ((ok = validate_quiet(o, b, x)))
                break;
        if (o->refused)
            return false;
        if (!ok)
            return fail(o, "anyOf", "no branch validates");
    }
    if (one) {
        int hits = 0;
        cJSON_ArrayForEach(b, one)
            hits += validate_quiet(o, b, x);
        if (o->refused)
            return false;
        if (hits != 1)
            return fail(o, "oneOf", "%d branches validate, not exactly one", hits);
    }
    const cJSON *not = obj_get(s, "not");
    if (not) {
        bool ok = validate_quiet(o, not, x);
        if (o->refused)
            return false;
        if (ok)
            return fail(o, "not", "the instance validates against 'not'");
    }
    const cJSON *cond = obj_get(s, "if");
    if (cond) {
        bool ok = validate_quiet(o, cond, x);
        if (o->refused)
            return false;
        const cJSON *branch = obj_get(s, ok ? "then" : "else");
        if (branch && !validate(o, branch, x))
            return false;
    }
    return true;
}

/* ---- one schema ------------------------------------------------------------- */

static const char *const oracle_refused_keywords[] = {
    "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
};

static bool validate_object_schema(oracle *o, const cJSON *s, const cJSON *x)
{
    for (size_t i = 0; i < sizeof oracle_refused_keywords / sizeof *oracle_refused_keywords; i++)
        if (obj_get(s, oracle_refused_keywords[i]))
            return refuse(o, "keyword '%s' is not implemented", oracle_refused_keywords[i]);
    const cJSON *ref = obj_get(s, "$ref");
    if (ref) {
        const cJSON *target = cJSON_IsString(ref) ? resolve_ref(o->root, ref->valuestring) : NULL;
        if (!target)
            return refuse(o, "$ref '%s' is not a local JSON Pointer to a schema",
                          cJSON_IsString(ref) ? ref->valuestring : "?");
        if (!validate(o, target, x))
            return false;
    }
    const cJSON *t = obj_get(s, "type");
    if (t && !check_type(o, t, x))
        return false;
    const cJSON *en = obj_get(s, "enum");
    if (en) {
        bool ok = false;
        const cJSON *e;
        cJSON_ArrayForEach(e, en)
            if ((ok = json_equal(e, x)))
                break;
        if (!ok)
            return fail(o, "enum", "not one of the values");
    }
    const cJSON *c = obj_get(s, "const");
    if (c && !json_equal(c, x))
        return fail(o, "const", "not the value");
    if (cJSON_IsNumber(x) && !check_number(o, s, x->valuedouble))
        return false;
    if (cJSON_IsString(x) && !check_string(o, s, x->valuestring))
        return false;
    if (cJSON_IsObject(x) && !check_object(o, s, x))
        return false;
    if (cJSON_IsArray(x) && !check_array(o, s, x))
        return false;
    return check_combinators(o, s, x);
}

static bool validate(oracle *o, const cJSON *s, const cJSON *x)
{
    if (o->refused)
        return false;
    if (cJSON_IsBool(s))
        return cJSON_IsTrue(s) || fail(o, "false", "no instance is valid");
    if (!cJSON_IsObject(s))
        return refuse(o, "a schema is neither an object nor a boolean");
    if (o->depth >= ORACLE_MAX_DEPTH)
        return refuse(o, "schemas nest deeper than %d (a $ref cycle?)", ORACLE_MAX_DEPTH);
    o->depth++;
    bool ok = validate_object_schema(o, s, x);
    o->depth--;
    return ok && !o->refused;
}

bool schema_oracle_valid(const cJSON *schema, const cJSON *instance, char *why, size_t n)
{
    oracle o = {.root = schema, .why = why, .nwhy = n};
    if (why && n)
        why[0] = '\0';
    return validate(&o, schema, instance);
}

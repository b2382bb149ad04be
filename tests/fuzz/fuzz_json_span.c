/* Fuzz target: the strict JSON scanner (protocol/json_span.h), which the
 * gateway reads reply records with, the request parser takes a request's
 * tools with and `mllama grammar` takes a schema's text with. Properties:
 *   what svc_json_value accepts, cJSON parses, and the span lies inside the input;
 *   a member found in an object with a single member of that name equals
 *   the one cJSON finds (keys compare as written: one spelled with escapes
 *   is not found, which callers refuse);
 *   walking an array with first/next visits as many elements as cJSON
 *   holds, each equal to cJSON's.
 * Aborts when one breaks. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "protocol/json_span.h"

static void require(bool ok)
{
    if (!ok)
        abort();
}

static bool one_member_named(const cJSON *obj, const char *key)
{
    int n = 0;
    for (const cJSON *m = obj->child; m; m = m->next)
        n += m->string && !strcmp(m->string, key);
    return n == 1;
}

/* The span parses with cJSON to what `want` prints to (printed rather
 * than cJSON_Compare'd: that looks members up by name and so differs from
 * itself on duplicate names). */
static void require_same(svc_span v, const cJSON *want)
{
    cJSON *got = cJSON_ParseWithLength(v.p, v.n);
    require(got != NULL);
    char *a = cJSON_PrintUnformatted(got);
    char *b = cJSON_PrintUnformatted(want);
    require(a && b && !strcmp(a, b));
    free(a);
    free(b);
    cJSON_Delete(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    svc_span root = svc_json_value(text, size);
    if (!root.p)
        return 0;
    require(root.p >= text && root.n > 0 && (size_t)(root.p - text) <= size - root.n);
    cJSON *whole = cJSON_ParseWithLength(text, size);
    require(whole != NULL);
    svc_span schema = svc_json_is(root, '{') ? svc_json_member(root, "schema") : (svc_span){0};
    if (schema.p && one_member_named(whole, "schema"))
        require_same(schema, cJSON_GetObjectItemCaseSensitive(whole, "schema"));
    if (svc_json_is(root, '[')) {
        const cJSON *want = whole->child;
        for (svc_span e = svc_json_first(root); e.p; e = svc_json_next(root, e)) {
            require(want != NULL);
            require_same(e, want);
            want = want->next;
        }
        require(want == NULL);
    }
    cJSON_Delete(whole);
    return 0;
}

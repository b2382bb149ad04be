/* Fuzz target: svc_json_member_span, which `mllama grammar` uses to take a
 * schema's text from an input line as written. Properties:
 *   a found span lies inside the input and is one whole JSON value;
 *   a found span's value equals the member cJSON finds when the input is
 *   one JSON object with a single member of that name.
 * Aborts when one breaks. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/cli_util.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *start = NULL;
    size_t n = 0;
    if (!svc_json_member_span(text, size, "schema", &start, &n))
        return 0;
    require(start >= text && n > 0 && n <= size && (size_t)(start - text) <= size - n);
    cJSON *value = cJSON_ParseWithLength(start, n);
    require(value != NULL);
    cJSON *whole = cJSON_ParseWithLength(text, size);
    if (cJSON_IsObject(whole) && one_member_named(whole, "schema")) {
        /* Printed rather than cJSON_Compare'd: that looks members up by
         * name and so differs from itself on duplicate names. */
        char *a = cJSON_PrintUnformatted(value);
        char *b = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(whole, "schema"));
        require(a && b && !strcmp(a, b));
        free(a);
        free(b);
    }
    cJSON_Delete(whole);
    cJSON_Delete(value);
    return 0;
}

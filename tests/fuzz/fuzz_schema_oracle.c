/* Fuzz target: the schema oracle (tests/engine/schema_oracle.h) over hostile
 * input, so that a crash or a hang of the oracle never passes for a
 * verdict. The input is "schema\ninstance": both read by cJSON and judged;
 * the first line is also a pattern searched in the second and every format
 * checked on it, and the whole input goes to the strict JSON text check.
 * Properties, checked with abort():
 *   - schema_oracle_json_text accepts only what cJSON also reads;
 *   - a verdict of "valid" comes with an empty message, "invalid" with one. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "schema_oracle.h"

static const char *const formats[] = {"date", "time", "date-time", "duration", "email",
                                      "hostname", "ipv4", "ipv6", "uri", "uuid"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char why[256];
    if (schema_oracle_json_text(text, size, why, sizeof why)) {
        cJSON *all = cJSON_ParseWithLength(text, size);
        if (!all)
            abort();
        cJSON_Delete(all);
    }
    char *nl = strchr(text, '\n');
    const char *second = nl ? nl + 1 : "";
    if (nl)
        *nl = '\0';
    schema_oracle_pattern(text, second, why, sizeof why);
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        schema_oracle_format(formats[i], second);
    cJSON *schema = cJSON_Parse(text), *inst = cJSON_Parse(second);
    if (schema && inst) {
        why[0] = 'x';
        bool ok = schema_oracle_valid(schema, inst, why, sizeof why);
        if (ok != (why[0] == '\0'))
            abort();
    }
    cJSON_Delete(schema);
    cJSON_Delete(inst);
    free(text);
    return 0;
}

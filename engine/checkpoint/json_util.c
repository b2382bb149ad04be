#include "checkpoint/json_util.h"

#include <string.h>

const char *ml_json_type_name(const cJSON *v)
{
    if (cJSON_IsNull(v))
        return "null";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "an invalid value";
}

const cJSON *ml_json_member(const cJSON *obj, const char *key)
{
    const cJSON *found = NULL;
    for (const cJSON *it = obj ? obj->child : NULL; it; it = it->next)
        if (it->string && !strcmp(it->string, key))
            found = it;
    return found;
}

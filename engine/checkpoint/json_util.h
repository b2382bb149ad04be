/* Small cJSON helpers shared by the model's JSON parsers (config.json and its
 * quantization_config, adapter_config.json). */
#ifndef ML_CHECKPOINT_JSON_UTIL_H
#define ML_CHECKPOINT_JSON_UTIL_H

#include <cjson/cJSON.h>

/* "null", "a boolean", "a number", "a string", "an array", "an object" (or
 * "an invalid value"), for error messages. Never NULL. */
const char *ml_json_type_name(const cJSON *v);

/* obj's member named key (case-sensitive), or NULL (also for a NULL obj).
 * Python's json keeps the last of duplicate keys, and so does this. */
const cJSON *ml_json_member(const cJSON *obj, const char *key);

#endif

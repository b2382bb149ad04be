/* The parser of config.json's quantization_config, for config.c; the
 * struct and the ignore matcher are public in config.h. */
#ifndef ML_CHECKPOINT_QUANT_CONFIG_H
#define ML_CHECKPOINT_QUANT_CONFIG_H

#include <cjson/cJSON.h>

#include "checkpoint/config.h"

/* Fill *q from v, the quantization_config member (NULL when absent): absent
 * or null is ML_QUANT_NONE. Errors name the field path
 * ("quantization_config.config_groups.group_0.weights.strategy: ..."):
 * ML_ERR_FORMAT (wrong types, missing required fields, an ignore pattern
 * that is not a valid expression), ML_ERR_UNSUPPORTED (any scheme or
 * feature but those config.h lists), ML_ERR_TOO_LARGE (the ignore list).
 * *q is zeroed first, whatever the result. */
ml_status ml_quant_config_parse(ml_quant_config *q, const cJSON *v, char *err, size_t errlen);

#endif

/* Fuzz target: bytes -> ml_lora_config_parse (adapter_config.json parsing,
 * the refused-feature checks and the translation of target_modules
 * expressions into POSIX regular expressions), then PEFT's matching of
 * module names of both checkpoint layouts against whatever parses. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/lora.h"

static const char *const names[] = {
    "language_model.model.layers.0.self_attn.q_proj",
    "language_model.model.layers.13.cross_attn.k_proj",
    "language_model.model.layers.2.mlp.down_proj",
    "language_model.lm_head",
    "vision_model.transformer.layers.31.mlp.fc1",
    "vision_model.global_transformer.layers.7.self_attn.o_proj",
    "multi_modal_projector",
    "model.language_model.layers.0.self_attn.v_proj",
    "lm_head",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_lora_config *c = NULL;
    char err[256];
    if (ml_lora_config_parse(&c, (const char *)data, size, err, sizeof err) != ML_OK) {
        if (c)
            abort(); /* an error leaves no object */
        return 0;
    }
    int r = ml_lora_config_rank(c);
    if (r < 1 || r > ML_LORA_MAX_RANK || !isfinite(ml_lora_config_scale(c)))
        abort();
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        (void)ml_lora_config_targets(c, names[i]);
    ml_lora_config_destroy(c);
    return 0;
}

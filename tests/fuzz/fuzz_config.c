/* Fuzz target: bytes -> ml_config_parse (config.json parsing and every
 * validation rule, quantization_config included), then the derived
 * quantities of whatever validates and its ignore matching. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "checkpoint/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static ml_config cfg; /* large: the ignore list */
    char err[256];
    if (ml_config_parse(&cfg, (const char *)data, size, err, sizeof err) != ML_OK)
        return 0;
    int self = 0;
    for (int l = 0; l < cfg.text.num_hidden_layers; l++)
        self += ml_config_cross_index(&cfg, l) < 0;
    if (self != ml_config_n_self_layers(&cfg))
        abort();
    if (ml_config_num_patches_padded(&cfg) < ml_config_num_patches(&cfg))
        abort();
    float *inv_freq = malloc((size_t)(cfg.text.head_dim / 2) * sizeof *inv_freq + 1);
    if (inv_freq)
        ml_config_rope_inv_freq(&cfg, inv_freq);
    free(inv_freq);
    /* every pattern compiled at parse time, so matching cannot fail */
    int ignored;
    if (ml_quant_config_ignores(&cfg.quant, "language_model.model.layers.0.mlp.up_proj", &ignored,
                                err, sizeof err) != ML_OK)
        abort();
    return 0;
}

/* Random-weight Mllama checkpoints of the real architecture, written in the
 * Hugging Face layout (config.json, sharded bf16 safetensors, tokenizer and
 * preprocessor files), for demos and benchmarks where no published
 * checkpoint is at hand. The graph, the loader and the tokenizer are the
 * real ones; only the weight values are random. */
#ifndef ML_MODEL_MKMODEL_H
#define ML_MODEL_MKMODEL_H

#include <stdint.h>

#include "status.h"

/* Presets, from smallest: "micro" (service tests: 56-pixel tiles, 3
 * layers, the real vocabulary), "tiny" (demo, ~70M parameters, real vocabulary
 * and tile geometry), "small" (~0.5B), "1b" (a ~1B-parameter text decoder
 * with real-width vision layers, for bandwidth measurements) and "11b" (the
 * published Llama 3.2 11B Vision shapes). */
extern const char *const ml_mkmodel_presets[];

/* Write the preset into dir (created if absent). tokenizer_dir holds
 * tokenizer.json and tokenizer_config.json to copy in. The same seed gives
 * the same bytes. With fp8, a compressed-tensors FP8 checkpoint of the same
 * weights: the published FP8-dynamic quantization_config (ignoring the
 * vision tower, the projector and lm_head) and every text-decoder Linear
 * quantized as compressed-tensors does (fp8_quant.h), F8_E4M3 with a BF16
 * weight_scale. Errors: ML_ERR_INVALID_ARG (unknown preset), ML_ERR_IO,
 * ML_ERR_NOMEM; err says which file. */
ml_status ml_mkmodel(const char *preset, const char *dir, const char *tokenizer_dir,
                     uint64_t seed, int fp8, char *err, size_t errlen);

#endif

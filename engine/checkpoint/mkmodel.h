/* Random-weight Mllama checkpoints of the real architecture, written in the
 * Hugging Face layout (config.json, sharded bf16 safetensors, tokenizer and
 * preprocessor files), for demos and benchmarks where no published
 * checkpoint is at hand. The graph, the loader and the tokenizer are the
 * real ones; only the weight values are random. */
#ifndef ML_CHECKPOINT_MKMODEL_H
#define ML_CHECKPOINT_MKMODEL_H

#include <stdint.h>

#include "status.h"

/* Presets, from smallest: "micro" (service tests: 56-pixel tiles, 3
 * layers, the real vocabulary), "tiny" (demo, ~70M parameters, real vocabulary
 * and tile geometry), "small" (~0.5B), "1b" (a ~1B-parameter text decoder
 * with real-width vision layers, for bandwidth measurements), "11b" and
 * "90b" (the published Llama 3.2 11B / 90B Vision shapes; 90b is
 * header-only). */
extern const char *const ml_mkmodel_presets[];

/* ml_mkmodel's flags. FP8: a compressed-tensors FP8 checkpoint of the same
 * weights: the published FP8-dynamic quantization_config (ignoring the
 * vision tower, the projector and lm_head) and every text-decoder Linear
 * quantized as compressed-tensors does (fp8_quant.h), F8_E4M3 with a BF16
 * weight_scale. HEADER_ONLY: the real tensor names, shapes and dtypes with
 * no values: every tensor is a hole of the sparse shard files (ftruncate),
 * so the 90B checkpoint (~90 GB apparent size in FP8) is written in a
 * moment on a small disk and reads as zeros; shards are cut at
 * save_pretrained's 5 GB, as published checkpoints are. */
#define ML_MKMODEL_FP8 1u
#define ML_MKMODEL_HEADER_ONLY 2u

/* Write the preset into dir (created if absent). tokenizer_dir holds
 * tokenizer.json and tokenizer_config.json to copy in. The same seed gives
 * the same bytes. flags: ML_MKMODEL_* (0: bf16 random values). Errors:
 * ML_ERR_INVALID_ARG (unknown preset, a header-only preset without
 * ML_MKMODEL_HEADER_ONLY), ML_ERR_IO, ML_ERR_NOMEM; err says which file. */
ml_status ml_mkmodel(const char *preset, const char *dir, const char *tokenizer_dir,
                     uint64_t seed, unsigned flags, char *err, size_t errlen);

#endif

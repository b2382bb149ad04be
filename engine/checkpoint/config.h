/* config.json of a Mllama checkpoint (transformers `MllamaConfig`,
 * engine/model/README.md §1): parsing, validation and the derived quantities the model
 * needs.
 *
 * Defaults: a key that is absent (or JSON null, for the keys where
 * transformers treats None as "use the default") takes the default of the
 * transformers class constructor (MllamaVisionConfig / MllamaTextConfig,
 * v4.47), listed next to each field below. One exception, on purpose:
 * vision_config.image_size has no default, because the class default (448)
 * is not what published checkpoints use (560) and a silent 448 would load
 * the wrong tile geometry.
 *
 * Validated but not stored, because only one value is supported:
 * model_type ("mllama" when present), vision_config.hidden_act ("gelu"),
 * text_config.hidden_act ("silu"), text_config.tie_word_embeddings (false:
 * published checkpoints are untied, and a tied lm_head would be the
 * (vocab+8)-row embedding, producing vocab+8 logits; we refuse it with
 * ML_ERR_UNSUPPORTED rather than guess).
 *
 * Token ids (bos, pad, eos, image_token_index) are not checked against the
 * vocabulary: tiny test configs keep the 128k defaults with small
 * vocabularies, and transformers accepts that too. Whoever embeds a token
 * checks its range.
 *
 * ml_config is a plain value: no heap memory, copy it freely (it is about
 * 70 KB, mostly the quantization ignore list: keep it off small stacks). */
#ifndef ML_CHECKPOINT_CONFIG_H
#define ML_CHECKPOINT_CONFIG_H

#include <stddef.h>

#include "dtype.h"
#include "status.h"

/* Capacity of the list fields. Larger lists are rejected as ML_ERR_TOO_LARGE;
 * the published models use 8 aspect ratios, 5 intermediate layers, 100 text
 * layers and 3 eos ids. */
#define ML_CONFIG_MAX_LAYERS 512
#define ML_CONFIG_MAX_ASPECT_RATIOS 64
#define ML_CONFIG_MAX_INTERMEDIATE 64
#define ML_CONFIG_MAX_EOS 16
/* config.json larger than this is rejected before parsing (published: 6 KB). */
#define ML_CONFIG_MAX_FILE_BYTES (16u << 20)

typedef enum ml_rope_type {
    ML_ROPE_DEFAULT, /* plain RoPE: rope_scaling absent/null or rope_type "default" */
    ML_ROPE_LLAMA3,  /* _compute_llama3_parameters (engine/model/README.md §4.3) */
} ml_rope_type;

typedef struct ml_rope_scaling {
    ml_rope_type type;
    /* llama3 only (0 for the default type). */
    float factor;                         /* 8.0 */
    float low_freq_factor;                /* 1.0 */
    float high_freq_factor;               /* 4.0 */
    int original_max_position_embeddings; /* 8192 */
} ml_rope_scaling;

typedef struct ml_vision_config {
    int hidden_size;       /* default 1280 */
    int attention_heads;   /* key attention_heads, or num_attention_heads; default 16 */
    int head_dim;          /* derived: hidden_size / attention_heads */
    int intermediate_size; /* default 5120 */
    int num_hidden_layers; /* local (ungated) layers; default 32 */
    int num_global_layers; /* gated layers; default 8 */
    int image_size;        /* tile side in pixels; required */
    int patch_size;        /* default 14 */
    int num_channels;      /* default 3 */
    float norm_eps;        /* default 1e-5 */
    int max_num_tiles;     /* default 4 */
    /* (tiles_high, tiles_wide) pairs; default the 8 pairs of §1.1, which
     * transformers only allows with max_num_tiles == 4. */
    int n_aspect_ratios;
    int supported_aspect_ratios[ML_CONFIG_MAX_ASPECT_RATIOS][2];
    /* Indices into the local encoder's hidden states, each in
     * [0, num_hidden_layers] (§3.7); default [3, 7, 15, 23, 30]. */
    int n_intermediate_layers;
    int intermediate_layers_indices[ML_CONFIG_MAX_INTERMEDIATE];
    int vision_output_dim; /* = hidden_size * (1 + n_intermediate_layers); default 7680 */
} ml_vision_config;

typedef struct ml_text_config {
    int vocab_size;          /* default 128256; embed_tokens has vocab_size + 8 rows */
    int hidden_size;         /* default 4096 */
    int intermediate_size;   /* default 14336 */
    int num_hidden_layers;   /* self + cross; default 40 */
    int num_attention_heads; /* default 32 */
    int num_key_value_heads; /* default 8 */
    /* hidden_size / num_attention_heads, as MllamaTextSelfAttention derives
     * it; a head_dim key is accepted only when it agrees. */
    int head_dim;
    /* Sorted, unique, each in [0, num_hidden_layers); default
     * [3, 8, 13, 18, 23, 28, 33, 38]. */
    int n_cross_layers;
    int cross_attention_layers[ML_CONFIG_MAX_LAYERS];
    float rms_norm_eps; /* default 1e-5 */
    /* rope_theta (default 500000), or rope_parameters.rope_theta when the
     * newer rope_parameters object is present (it then wins over
     * rope_theta/rope_scaling). */
    double rope_theta;
    ml_rope_scaling rope_scaling;
    int max_position_embeddings; /* default 131072 */
    int bos_token_id;            /* default 128000; -1 when null */
    int pad_token_id;            /* default 128004; -1 when null */
    int n_eos;                   /* eos_token_id: an int or a list; default [128001]; 0 when null */
    int eos_token_ids[ML_CONFIG_MAX_EOS];
} ml_text_config;

/* quantization_config (quant_config.c). Only compressed-tensors'
 * "float-quantized" format with FP8 E4M3 weights, one symmetric scale per
 * output channel (strategy "channel") and input activations either FP8
 * dynamic per token (the published "FP8-dynamic" checkpoints) or not
 * quantized (FP8 weight-only): the scheme of the published FP8 Llama 3.2
 * Vision checkpoints. Per-tensor and static scales, other bit widths, group
 * or block strategies, output-activation and K/V quantization are refused
 * with ML_ERR_UNSUPPORTED naming the field. */
typedef enum ml_quant_scheme {
    ML_QUANT_NONE,        /* no quantization_config: every weight as stored */
    ML_QUANT_FP8_CHANNEL, /* Linear weights F8_E4M3 + a (out_features, 1) weight_scale */
} ml_quant_scheme;

/* Capacity of the ignore list: entries and their bytes with terminators
 * (published lists are three regexes, or a few hundred module names). */
#define ML_QUANT_MAX_IGNORE 1024
#define ML_QUANT_IGNORE_BYTES (64u << 10)

typedef struct ml_quant_config {
    ml_quant_scheme scheme;
    /* 0: the checkpoint stores the scheme (F8_E4M3 + weight_scale); 1: it
     * stores float weights, quantized when they are bound (ml_quant_config_
     * fp8_at_load). */
    int at_load;
    /* 1: lm_head is FP8 whatever `ignore` says (model.fp8_lm_head): stored
     * F8_E4M3 it binds as stored, stored float it is quantized when bound,
     * as at_load quantizes the others. 0: as `ignore` says (the published
     * lists keep it bf16). */
    int lm_head_fp8;
    /* input_activations {type float, num_bits 8, strategy token, dynamic}:
     * the reference quantizes each activation row to FP8 at run time (W8A8);
     * 0 when input_activations is null (W8A16). */
    int act_dynamic_token;
    /* `ignore`: module names (exact) and "re:" Python patterns (re.match,
     * a prefix of the name), in file order, each NUL-terminated, back to
     * back; the modules they name keep their stored dtype. */
    int n_ignore;
    char ignore[ML_QUANT_IGNORE_BYTES];
} ml_quant_config;

typedef struct ml_config {
    ml_vision_config vision;
    ml_text_config text;
    ml_quant_config quant;
    int image_token_index; /* default 128256 */
    /* `dtype` (newer transformers) or `torch_dtype`: bfloat16, float16 or
     * float32; BF16 when absent. Informational: ml_weights converts every
     * weight to bf16 regardless. */
    ml_dtype dtype;
} ml_config;

/* Parse and validate config.json held in json[0..len) (not NUL-terminated).
 * Returns ML_OK and fills *cfg; otherwise *cfg is unchanged and err names
 * the field path, e.g. "text_config.cross_attention_layers[3]: 41 out of
 * range [0, 40)". Errors: ML_ERR_FORMAT (bad JSON, wrong type, inconsistent
 * or out-of-range value), ML_ERR_UNSUPPORTED (well-formed but not handled:
 * another activation, rope type or dtype, tied embeddings), ML_ERR_TOO_LARGE
 * (a list over its capacity). */
ml_status ml_config_parse(ml_config *cfg, const char *json, size_t len, char *err, size_t errlen);

/* ml_config_parse on the file at path (at most ML_CONFIG_MAX_FILE_BYTES).
 * Also ML_ERR_IO / ML_ERR_NOT_FOUND when the file cannot be read; messages
 * are prefixed with the path. */
ml_status ml_config_load(ml_config *cfg, const char *path, char *err, size_t errlen);

/* The scheme for quantizing a bf16 checkpoint at load (model.weights =
 * "fp8"): FP8 channel weights, W8A16, with the published checkpoints'
 * ignore list (the vision tower, the projector and lm_head stay as stored;
 * both key layouts), so the text decoder's Linears are FP8. */
void ml_quant_config_fp8_at_load(ml_quant_config *q);

/* Whether the quantization_config's ignore list names module (a Linear's
 * name as the checkpoint stores it, without ".weight"), as compressed-tensors
 * matches it: an entry equal to the name, or "re:<pattern>" whose pattern
 * re.match-es it. Returns ML_OK and *ignored, or ML_ERR_NOMEM (a pattern
 * could not be compiled again; every pattern compiled when the config was
 * parsed). */
ml_status ml_quant_config_ignores(const ml_quant_config *q, const char *module, int *ignored,
                                  char *err, size_t errlen);

/* ---- derived quantities (cfg must have been validated) ------------------ */

/* Number of self-attention decoder layers (num_hidden_layers - n_cross_layers). */
int ml_config_n_self_layers(const ml_config *cfg);

/* Position of text layer `layer` in cross_attention_layers, or -1 when it is
 * a self-attention layer (or out of range). */
int ml_config_cross_index(const ml_config *cfg, int layer);

/* Tokens per tile: (image_size / patch_size)² patches + 1 CLS (1601 for 560/14). */
int ml_config_num_patches(const ml_config *cfg);

/* ml_config_num_patches rounded up to a multiple of 8 (1608), §3.6. */
int ml_config_num_patches_padded(const ml_config *cfg);

/* Rows of the aspect-ratio tables: len(supported_aspect_ratios) + 1 (id 0 =
 * padding image), i.e. max_aspect_ratio_id + 1 = 9. */
int ml_config_n_aspect_ratio_ids(const ml_config *cfg);

/* The RoPE inverse frequencies of the text decoder, head_dim/2 floats, as
 * transformers computes them in float32 (_compute_default_rope_parameters,
 * then _compute_llama3_parameters for llama3 scaling; engine/model/README.md §4.3).
 * out must hold text.head_dim / 2 floats. */
void ml_config_rope_inv_freq(const ml_config *cfg, float *out);

#endif

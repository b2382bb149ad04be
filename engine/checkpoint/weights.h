/* The Mllama tensor set (engine/model/README.md §6) bound to a checkpoint and checked
 * against a config: every weight the graph reads, by role, with its shape.
 *
 * Dtypes: the graph reads bf16 only (backend.h). BF16 tensors are borrowed
 * straight from the checkpoint's mapping; F16 and F32 tensors (and a BF16
 * tensor a hostile file left misaligned) are converted once, at load, into
 * one bf16 buffer owned by ml_weights, rounding to nearest even as
 * torch's `.to(torch.bfloat16)` does. So an F16/F32 checkpoint loads and
 * computes exactly as its bf16 cast would. Integer tensors are rejected.
 *
 * Gates (shape (1)) are read into floats holding the bf16 value, so
 * tanh(gate) can be evaluated as the reference does (bf16, §9).
 *
 * Layout conventions: an ml_weight is a row-major (rows, cols) bf16 matrix;
 * a Linear weight is (out_features, in_features); a 1-D tensor (n) is one row
 * (rows = 1, cols = n); a tensor of more dimensions is (shape[0], product of
 * the rest), e.g. the patch conv (1280, 3, 14, 14) is (1280, 588) in
 * (c, ky, kx) order, which is what patchify produces.
 *
 * Ownership: ml_weights borrows the checkpoint (which must outlive it) and
 * owns only its layer arrays and the converted copies.
 * @locality: any thread; read-only after ml_weights_create. */
#ifndef ML_CHECKPOINT_WEIGHTS_H
#define ML_CHECKPOINT_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "status.h"

/* A bf16 weight has data; an FP8 Linear (config quant ML_QUANT_FP8_CHANNEL,
 * not ignored) has f8 and scale instead, its value being f8[r][c] ·
 * scale[r] exactly: compressed-tensors' decompression into a float32 model
 * (backend.h matmul_f8 applies the scale to each sum). Neither set: absent
 * (a row-parallel bias off rank 0, shard.h). */
typedef struct ml_weight {
    const uint16_t *data; /* borrowed: the checkpoint's mapping or ml_weights' buffer; bf16 */
    const uint8_t *f8;    /* borrowed: the mapping; F8_E4M3 (rows, cols), or NULL */
    const float *scale;   /* borrowed: ml_weights' buffer; (rows) weight_scale, when f8 */
    int64_t rows, cols;
} ml_weight;

/* One vision encoder layer (MllamaVisionEncoderLayer), D_v = vision hidden. */
typedef struct ml_vision_layer {
    ml_weight q_proj, k_proj, v_proj, o_proj;               /* (D_v, D_v), no bias */
    ml_weight fc1_weight;                                   /* (I_v, D_v) */
    ml_weight fc1_bias;                                     /* (1, I_v) */
    ml_weight fc2_weight;                                   /* (D_v, I_v) */
    ml_weight fc2_bias;                                     /* (1, D_v) */
    ml_weight input_layernorm_weight, input_layernorm_bias; /* (1, D_v) */
    ml_weight post_attention_layernorm_weight, post_attention_layernorm_bias; /* (1, D_v) */
    /* Global layers only (is_gated): the residual gates before tanh. Local
     * layers have no gates (their branches are added with weight 1) and
     * hold 0 here. */
    int is_gated;
    float gate_attn, gate_ffn;
} ml_vision_layer;

/* MllamaVisionModel. P = num_patches (1601), T = max_num_tiles, A = number of
 * aspect ratio ids (len(supported_aspect_ratios) + 1). */
typedef struct ml_vision_weights {
    ml_weight patch_embedding;         /* (D_v, C·p·p): patch_embedding.weight */
    ml_weight class_embedding;         /* (1, D_v) */
    ml_weight position_embedding;      /* (P, D_v): gated_positional_embedding.embedding */
    float position_gate;               /* gated_positional_embedding.gate */
    ml_weight tile_position_embedding; /* (A, T·P·D_v):
                                          gated_positional_embedding.tile_embedding.weight */
    ml_weight pre_tile_embedding;  /* (A, T·D_v): pre_tile_positional_embedding.embedding.weight */
    float pre_tile_gate;           /* pre_tile_positional_embedding.gate */
    ml_weight post_tile_embedding; /* (A, T·D_v) */
    float post_tile_gate;
    ml_weight layernorm_pre_weight, layernorm_pre_bias;   /* (1, D_v) */
    ml_weight layernorm_post_weight, layernorm_post_bias; /* (1, D_v) */
    int n_layers;                                         /* vision_config.num_hidden_layers */
    ml_vision_layer *layers;        /* owned (n_layers): transformer.layers.i */
    int n_global_layers;            /* vision_config.num_global_layers */
    ml_vision_layer *global_layers; /* owned (n_global_layers): global_transformer.layers.i */
} ml_vision_weights;

/* Self-attention of a text layer (MllamaTextSelfSdpaAttention). H = heads,
 * KV = key/value heads, hd = head_dim, D = text hidden. */
typedef struct ml_text_self_attn {
    ml_weight q_proj; /* (H·hd, D) */
    ml_weight k_proj; /* (KV·hd, D) */
    ml_weight v_proj; /* (KV·hd, D) */
    ml_weight o_proj; /* (D, H·hd) */
} ml_text_self_attn;

/* Cross-attention of a text layer (MllamaTextCrossSdpaAttention and the
 * gates of MllamaCrossAttentionDecoderLayer). */
typedef struct ml_text_cross_attn {
    ml_weight q_proj; /* (H·hd, D) */
    ml_weight k_proj; /* (KV·hd, D), applied to projected vision states */
    ml_weight v_proj; /* (KV·hd, D) */
    ml_weight o_proj; /* (D, H·hd) */
    ml_weight q_norm; /* (1, hd) */
    ml_weight k_norm; /* (1, hd) */
    float attn_gate;  /* cross_attn_attn_gate, before tanh */
    float mlp_gate;   /* cross_attn_mlp_gate, before tanh */
} ml_text_cross_attn;

/* Text decoder layer i (language_model.model.layers.i), self or cross as
 * text_config.cross_attention_layers says. */
typedef struct ml_text_layer {
    int is_cross;
    ml_text_self_attn self;             /* valid when !is_cross, zeroed otherwise */
    ml_text_cross_attn cross;           /* valid when is_cross, zeroed otherwise */
    ml_weight input_layernorm;          /* (1, D) */
    ml_weight post_attention_layernorm; /* (1, D) */
    ml_weight gate_proj;                /* (I, D) */
    ml_weight up_proj;                  /* (I, D) */
    ml_weight down_proj;                /* (D, I) */
} ml_text_layer;

typedef struct ml_text_weights {
    ml_weight embed_tokens; /* (vocab + 8, D): the 8 extra rows hold <|image|> and spares */
    ml_weight norm;         /* (1, D) */
    ml_weight lm_head;      /* (vocab, D) */
    int n_layers;           /* text_config.num_hidden_layers */
    ml_text_layer *layers;  /* owned (n_layers), in checkpoint layer order */
} ml_text_weights;

typedef struct ml_weights {
    ml_vision_weights vision;
    ml_weight projector_weight; /* (D, vision_output_dim): multi_modal_projector.weight */
    ml_weight projector_bias;   /* (1, D) */
    ml_text_weights text;
    size_t n_bound;         /* checkpoint tensors used */
    size_t n_unused;        /* checkpoint tensors present but not part of the model */
    size_t bytes_borrowed;  /* bf16 bytes read in place from the mapping */
    size_t bytes_converted; /* bf16 bytes of converted copies (owned) */
    size_t bytes_f8;        /* F8_E4M3 bytes read in place from the mapping */
    size_t bytes_quantized; /* F8_E4M3 bytes quantized at load (owned) */
    size_t bytes_scales;    /* f32 bytes of the FP8 weights' scales (owned) */
} ml_weights;

/* Bind every tensor of the model described by cfg (validated) to ck.
 * Returns ML_OK and a new object in *out (owned by the caller; free with
 * ml_weights_destroy before ml_checkpoint_destroy), or *out = NULL and:
 * ML_ERR_NOT_FOUND (a tensor is missing; err names it), ML_ERR_FORMAT (a
 * shape differs from the config, "tensor X: shape (a, b), expected (c, d)",
 * or a weight has an integer dtype), ML_ERR_NOMEM. Nothing is read from the
 * mapping except the gates, the scales and the tensors that need
 * conversion, so binding a multi-GB checkpoint costs no I/O. Checkpoint
 * tensors the model does not use are ignored and counted in n_unused.
 * With cfg->quant FP8, every Linear the ignore list does not name must be
 * F8_E4M3 with a `<module>.weight_scale` of shape (out_features, 1) or
 * (out_features) in a float dtype (ML_ERR_FORMAT otherwise, naming the
 * tensor); the Linears it names bind as without quantization. With
 * cfg->quant.at_load they are float weights, quantized here
 * (fp8_quant.h) into a buffer ml_weights owns. With cfg->quant.lm_head_fp8,
 * lm_head is FP8 even when the ignore list names it: quantized here from
 * its float weight. */
ml_status ml_weights_create(ml_weights **out, const ml_checkpoint *ck, const ml_config *cfg,
                            char *err, size_t errlen);

/* Longest tensor name in a manifest (hub names are under 80 bytes). */
#define ML_MANIFEST_NAME_MAX 256

/* One tensor of the model a config describes, by its hub name. */
typedef struct ml_manifest_entry {
    char name[ML_MANIFEST_NAME_MAX];
    int ndim;
    int64_t shape[4];
    int is_gate;    /* a shape-(1) residual gate */
    ml_dtype dtype; /* BF16, or F8_E4M3 for a quantized Linear (its scale is BF16) */
    int quantized_at_load; /* a BF16 Linear that cfg->quant.at_load (or lm_head_fp8) makes
                              F8_E4M3 */
} ml_manifest_entry;

/* The tensors ml_weights_create binds for cfg (validated), in binding order:
 * what a checkpoint of this config must contain, from the same code that
 * binds it (`mllama mkmodel` writes exactly this). *out is malloc'd (owned by
 * the caller, free()), *n entries. Errors: ML_ERR_NOMEM. */
ml_status ml_weights_manifest(const ml_config *cfg, ml_manifest_entry **out, size_t *n,
                              char *err, size_t errlen);

/* Free the layer arrays and converted copies. NULL is a no-op. */
void ml_weights_destroy(ml_weights *w);

/* One line for the load log: tensors bound and unused, MiB by dtype and
 * origin (in place, converted, quantized at load, scales). Returns buf. */
const char *ml_weights_summary(const ml_weights *w, char *buf, size_t n);

#endif

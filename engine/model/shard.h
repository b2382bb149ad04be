/* A shard: what model.c loads on one backend and the layer code computes
 * on (model_internal.h holds its fields). A whole model is the shard of
 * world 1; under tensor parallelism (engine/model/README.md §11) a shard
 * is one rank's share of a group of `world` (shard.c). The model the
 * runtime holds (mllama.h, mllama.c) drives one shard, or one per rank on
 * threads. Not part of the engine's public surface. */
#ifndef ML_MODEL_SHARD_H
#define ML_MODEL_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "model/lora_internal.h"
#include "model/mllama.h"
#include "status.h"

typedef struct ml_shard ml_shard;

/* ---- a shard's share of the model (shard.c) ---------------------------------- */

/* A shard's share of a tensor-parallel group of `world` shards
 * (Megatron-LM's split, engine/model/README.md §11). Column-parallel Linears (q/k/v,
 * gate/up, vision fc1 and its bias) keep the shard's range of output rows,
 * a view into the checkpoint; row-parallel ones (o_proj, down_proj, vision
 * fc2) keep the shard's range of input columns, copied once into
 * row_slices, and their outputs are partial sums all-reduced over the
 * group; vision fc2's bias is added by rank 0 only. Everything else is
 * replicated. With world == 1 nothing is sliced or reduced. */
typedef struct ml_shard_dims {
    int rank, world;
    int n_heads, n_kv_heads, intermediate; /* text heads, K/V heads, MLP width of this shard */
    int vision_heads, vision_intermediate; /* vision heads, MLP width of this shard */
    uint16_t *row_slices;                  /* owned host bf16: the row-parallel column ranges */
} ml_shard_dims;

/* How a shard keeps a Linear (out, in) of every layer of that kind: one
 * table for the weights (ml_shard_weights) and the LoRA parts (lora.c). */
typedef enum ml_shard_split {
    ML_SHARD_WHOLE, /* replicated */
    ML_SHARD_OUT,   /* column-parallel: the shard's range of output rows */
    ML_SHARD_IN,    /* row-parallel: the shard's range of input columns, output all-reduced */
} ml_shard_split;

ml_shard_split ml_shard_split_vision(ml_lora_vision_module mod);
/* Self- and cross-attention projections alike. */
ml_shard_split ml_shard_split_text(ml_lora_text_module mod);

/* Whether cfg's split dimensions (text heads, K/V heads and MLP width,
 * vision heads and MLP width) divide into world shards: ML_OK,
 * ML_ERR_INVALID_ARG (world < 1) or ML_ERR_UNSUPPORTED naming the field. */
ml_status ml_shard_check_config(const ml_config *cfg, int world, char *err, size_t errlen);

/* Validate that every split dimension of m->cfg divides by world (and that
 * the backend can all-reduce when world > 1) and fill m->dims. Errors:
 * ML_ERR_INVALID_ARG (rank outside [0, world)), ML_ERR_UNSUPPORTED (a
 * dimension that does not divide, no all_reduce_sum). */
ml_status ml_shard_init(ml_shard *m, int rank, int world, char *err, size_t errlen);

/* Replace m->w's host views by this shard's slices (before they are bound
 * to the backend). Errors: ML_ERR_NOMEM. */
ml_status ml_shard_weights(ml_shard *m, char *err, size_t errlen);

/* x (n floats) = its sum over the shards; nothing when the model is whole. */
void ml_shard_all_reduce(ml_shard *m, float *x, size_t n);

/* ---- a shard's life (model.c) ------------------------------------------------ */

/* Load config.json and the checkpoint under dir as shard `rank` of `world`
 * on be (borrowed), bind the weights to be and size the workspace: the
 * contract of mllama.h ml_model_load_shard. *out is owned by the caller
 * (ml_shard_destroy). */
ml_status ml_shard_load(ml_shard **out, const char *dir, ml_backend *be,
                        const ml_model_limits *limits, int rank, int world, char *err,
                        size_t errlen);

/* NULL is a no-op; a half-loaded shard may be destroyed. */
void ml_shard_destroy(ml_shard *m);

/* ---- one shard's computation (vision.c, text.c) ------------------------------ */

/* ml_model_encode_image and ml_model_forward of one shard: mllama.c calls
 * them directly for a model of one shard and through the rank threads for
 * a tensor-parallel one. A LoRA slot given must be one of this shard's. */
ml_status ml_shard_encode_image(ml_shard *m, const float *pixels, int aspect_ratio_id,
                                const uint8_t *aspect_ratio_mask, const ml_lora *lora,
                                void *state, const ml_vision_taps *taps, char *err,
                                size_t errlen);
ml_status ml_shard_forward(ml_shard *m, ml_kv_cache *kv, const ml_step_seq *seqs, int n_seqs,
                           float *logits, const ml_text_taps *taps, char *err, size_t errlen);

/* ml_model_image_state_bytes of one shard (1/world of the model's). */
size_t ml_shard_image_state_bytes(const ml_shard *m);

#endif

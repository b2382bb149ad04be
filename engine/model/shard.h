/* Tensor parallelism inside the model (engine/model/README.md §11): a
 * model's share of a group of `world` shards (shard.c), one shard's
 * computation (vision.c, text.c), and the tensor-parallel model that drives
 * its shards as one (tp.c). Not part of the engine's public surface. */
#ifndef ML_MODEL_SHARD_H
#define ML_MODEL_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "model/lora_internal.h"
#include "model/mllama.h"
#include "status.h"

/* ---- a shard (shard.c) --------------------------------------------------------- */

/* This model's share of a tensor-parallel group of `world` shards
 * (Megatron-LM's split, engine/model/README.md §11). Column-parallel Linears (q/k/v,
 * gate/up, vision fc1 and its bias) keep the shard's range of output rows,
 * a view into the checkpoint; row-parallel ones (o_proj, down_proj, vision
 * fc2) keep the shard's range of input columns, copied once into
 * row_slices, and their outputs are partial sums all-reduced over the
 * group; vision fc2's bias is added by rank 0 only. Everything else is
 * replicated. With world == 1 nothing is sliced or reduced. */
typedef struct ml_shard {
    int rank, world;
    int n_heads, n_kv_heads, intermediate; /* text heads, K/V heads, MLP width of this shard */
    int vision_heads, vision_intermediate; /* vision heads, MLP width of this shard */
    uint16_t *row_slices;                  /* owned host bf16: the row-parallel column ranges */
} ml_shard;

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
 * the backend can all-reduce when world > 1) and fill m->shard. Errors:
 * ML_ERR_INVALID_ARG (rank outside [0, world)), ML_ERR_UNSUPPORTED (a
 * dimension that does not divide, no all_reduce_sum). */
ml_status ml_shard_init(ml_model *m, int rank, int world, char *err, size_t errlen);

/* Replace m->w's host views by this shard's slices (before they are bound
 * to the backend). Errors: ML_ERR_NOMEM. */
ml_status ml_shard_weights(ml_model *m, char *err, size_t errlen);

/* x (n floats) = its sum over the shards; nothing when the model is whole. */
void ml_shard_all_reduce(ml_model *m, float *x, size_t n);

/* ---- one shard's computation (vision.c, text.c) ------------------------------ */

/* ml_model_encode_image and ml_model_forward of one shard (a whole model is
 * the shard of world 1): the public calls (tp.c) come here directly for a
 * model loaded whole and through the rank threads for a tensor-parallel one. */
ml_status ml_shard_encode_image(ml_model *m, const float *pixels, int aspect_ratio_id,
                                const uint8_t *aspect_ratio_mask, const ml_lora *lora,
                                void *state, const ml_vision_taps *taps, char *err,
                                size_t errlen);
ml_status ml_shard_forward(ml_model *m, ml_kv_cache *kv, const ml_step_seq *seqs, int n_seqs,
                           float *logits, const ml_text_taps *taps, char *err, size_t errlen);

/* ---- a tensor-parallel model driven as one (tp.c) ---------------------------- */

/* The shards of ml_model_load_tp and the threads that drive ranks 1... A
 * model with tp != NULL has only cfg, limits, be (rank 0's) and shard
 * (rank 0's geometry, no row_slices) of its own; tp.c, the only file that
 * tells the two kinds of model apart, sends its calls to the shards. */
typedef struct ml_tp ml_tp;

/* Join the threads and destroy the shards. NULL is a no-op. */
void ml_tp_destroy(ml_tp *tp);

#endif

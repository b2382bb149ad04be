/* The LoRA internals the graph and the tensor-parallel model share
 * (lora.c): how the adaptable Linears of a config are numbered ("sites"),
 * an adapter slot in backend memory, and the groups of rows that share an
 * adapter in one step or encode. The public surface is lora.h. */
#ifndef ML_MODEL_LORA_INTERNAL_H
#define ML_MODEL_LORA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "model/mllama.h"
#include "status.h"

/* One shard of the model (shard.h, model_internal.h). */
typedef struct ml_shard ml_shard;

/* LoRA sites: every Linear an adapter may adapt, numbered vision local
 * layers (ML_LORA_VISION_MODULES each), vision global layers, the
 * projector, lm_head, then text layers (ML_LORA_TEXT_MODULES each; q/k/v/o
 * are self_attn's or cross_attn's as the layer is). */
typedef enum ml_lora_vision_module {
    ML_LORA_VISION_Q,
    ML_LORA_VISION_K,
    ML_LORA_VISION_V,
    ML_LORA_VISION_O,
    ML_LORA_VISION_FC1,
    ML_LORA_VISION_FC2,
    ML_LORA_VISION_MODULES,
} ml_lora_vision_module;

typedef enum ml_lora_text_module {
    ML_LORA_TEXT_Q,
    ML_LORA_TEXT_K,
    ML_LORA_TEXT_V,
    ML_LORA_TEXT_O,
    ML_LORA_TEXT_GATE,
    ML_LORA_TEXT_UP,
    ML_LORA_TEXT_DOWN,
    ML_LORA_TEXT_MODULES,
} ml_lora_text_module;

int ml_lora_site_vision(const ml_config *cfg, int global, int layer, ml_lora_vision_module mod);
int ml_lora_site_projector(const ml_config *cfg);
int ml_lora_site_lm_head(const ml_config *cfg);
int ml_lora_site_text(const ml_config *cfg, int layer, ml_lora_text_module mod);

/* One adaptable Linear of a slot: its A (rank, in) and B (out, rank) in
 * the slot's backend memory; rank 0 when the adapter leaves it alone. */
typedef struct ml_lora_site {
    const uint16_t *a, *b;
    int rank;
} ml_lora_site;

/* A slot of a whole model or of one shard holds, for every site, the part
 * of A and B its shard keeps (lora.c): a column-parallel Linear's B rows of
 * the shard's output range, a row-parallel one's A columns of its input
 * range, a replicated one's A and B whole. The slot of a tensor-parallel
 * model (ml_model_load_tp) is a handle over one such slot per rank, which
 * mllama.c hands to each rank's steps and encodes. */
struct ml_lora {
    const ml_model *model;  /* borrowed: the model ml_lora_create made it for */
    ml_shard *shard;        /* borrowed: the shard a slot's memory is on; NULL in a handle */
    int max_rank;
    float scale;
    int touches_images;
    int n_sites;
    ml_lora_site *sites;    /* owned (n_sites); NULL in a tensor-parallel handle */
    uint16_t *mem;          /* owned backend buffer: every site's A then B at max_rank;
                               NULL in a tensor-parallel handle */
    size_t bytes;           /* of mem; of each rank's slot in a handle */
    /* A tensor-parallel handle only (else NULL and 0): */
    ml_lora **parts;        /* owned (n_parts): rank r's slot, in its shard's backend */
    int n_parts;            /* the model's world */
    uint16_t *stage;        /* owned host (max_rank, widest row-parallel input share):
                               ml_lora_set gathers A's column range here */
};

/* Rows of a step (or an image) that share one adapter. */
typedef struct ml_lora_group {
    const ml_lora *lora;    /* borrowed, non-NULL */
    int row_start, n_rows;  /* token rows */
    int logit_start, n_logits; /* logit rows (lm_head) */
} ml_lora_group;

/* ml_lora_create's slot for model m: with n_shards == 1 one slot on
 * shards[0]'s backend; otherwise a handle with a part on each of
 * shards[0 .. n_shards) (borrowed), the tensor-parallel model's ranks.
 * Errors as ml_lora_create, naming the rank that failed. */
ml_status ml_lora_slot_create(ml_lora **out, const ml_model *m, ml_shard *const *shards,
                              int n_shards, int max_rank, char *err, size_t errlen);

/* ml_lora_slot_bytes of one shard: the backend bytes its part of a slot
 * of max_rank takes. */
size_t ml_lora_shard_bytes(const ml_shard *s, int max_rank);

#endif

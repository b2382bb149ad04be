/* State shared by the model's translation units (model.c: load and
 * workspace; vision.c: the vision tower; text.c: the decoder). Not part of
 * the engine's public surface. */
#ifndef ML_MODEL_INTERNAL_H
#define ML_MODEL_INTERNAL_H

#include "model/mllama.h"
#include "model/safetensors.h"
#include "model/weights.h"

/* Largest text head_dim the RoPE table on the stack allows (published: 128). */
#define ML_MAX_HEAD_DIM 256
/* Largest vision sequence (max_num_tiles · padded patches) whose token mask
 * is built on the stack (published: 4 · 1608 = 6432). */
#define ML_VISION_MAX_TOKENS 16384
/* Upper bound of ml_model_limits.max_seq_images (per-layer pointer arrays
 * live on the stack). */
#define ML_MAX_SEQ_IMAGES 64

/* Buffers of one vision encode, carved from the workspace. Shapes use
 * T = max_num_tiles, P = num_patches, Pp = padded patches, S = T·Pp. */
typedef struct ml_vision_bufs {
    float *pixels;    /* (T, 3, side, side) */
    float *patches;   /* (T, P-1, 3·p·p) */
    float *h;         /* (S, D_v) residual stream */
    float *x;         /* (S, D_v) normed input of a sublayer */
    float *q, *k, *v; /* (S, D_v) */
    float *attn;      /* (S, D_v) */
    float *mlp;       /* (S, I_v) */
    float *vout;      /* (T·P, vision_output_dim) */
    uint8_t *valid;   /* (S) */
    /* After the encoders, aliasing q.. mlp: */
    float *proj;      /* (T·P, D) projector output */
    float *kv_tmp;    /* (T·P, KV·hd) one cross layer's K or V before conversion */
} ml_vision_bufs;

/* Buffers of one decoder step. N = max_step_tokens, R = max_logit_rows. */
typedef struct ml_text_bufs {
    float *h, *x;          /* (N, D) */
    float *q, *attn;       /* (N, H·hd) */
    float *k, *v;          /* (N, KV·hd) */
    float *gate, *up;      /* (N, I) */
    float *logits;         /* (R, vocab) */
    float *rows;           /* (R, D) hidden rows gathered for the lm_head */
    float *row_attn;       /* (N) 1 for tokens of sequences with images, else 0 */
    float *row_mlp;        /* (N) full_text_row_mask, 0 for text-only sequences */
    int32_t *tokens;       /* (N) */
    int32_t *pos;          /* (N) absolute positions */
    int32_t *slots;        /* (N) cache slots */
    int32_t *block_tables; /* (max_step_seqs, max_blocks_per_seq) */
    int32_t *seq_start;    /* (max_step_seqs + 1) */
    int32_t *pos0;         /* (max_step_seqs) */
    uint8_t *allowed;      /* (N, max_seq_images · T) */
} ml_text_bufs;

/* Host staging of the per-step metadata (the same fields as ml_text_bufs'
 * integer and mask arrays) before one upload per array. */
typedef struct ml_step_host {
    float *row_attn, *row_mlp;
    int32_t *tokens, *pos, *slots, *block_tables, *seq_start, *pos0;
    uint8_t *allowed;
} ml_step_host;

struct ml_model {
    ml_config cfg;
    ml_model_limits limits;
    ml_backend *be;            /* borrowed */
    ml_checkpoint *ckpt;       /* owned: the mmaps the host weights point into */
    ml_weights *host_weights;  /* owned: bf16 host views */
    ml_weights w;              /* backend views: same shapes, data from be->ops->weight;
                                  layer arrays owned */
    int max_blocks_per_seq;
    int n_self_layers;
    int *self_index;           /* owned (text layers): index into the kv cache, -1 for cross */
    float *inv_freq;           /* backend (head_dim/2) */
    void *workspace;           /* owned backend buffer */
    size_t workspace_bytes;
    ml_vision_bufs vb;
    ml_text_bufs tb;
    ml_step_host host;         /* owned host allocation */
};

/* A bump allocator over one buffer. With base == NULL it only measures, so
 * the same carving code sizes the workspace at load and slices it later. */
typedef struct ml_carver {
    char *base;
    size_t off;
} ml_carver;

void *ml_carve(ml_carver *c, size_t bytes);

/* Carve the vision (resp. text) buffers of m from c. */
void ml_vision_plan(const ml_model *m, ml_carver *c, ml_vision_bufs *b);
void ml_text_plan(const ml_model *m, ml_carver *c, ml_text_bufs *b);

#endif

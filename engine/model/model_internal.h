/* One shard of the model and its workspace, shared by the files that load
 * and compute on it (model.c: load; workspace.c: the workspace's layout;
 * vision.c: the vision tower; text.c: the decoder; linear.c, shard.c,
 * lora.c). A whole model is the shard of world 1. The model the runtime
 * holds (mllama.h) is mllama.c's, over one shard or the ranks of a
 * tensor-parallel group. The shard's calls are declared in shard.h, the
 * LoRA internals in lora_internal.h. Not part of the engine's public
 * surface. */
#ifndef ML_MODEL_INTERNAL_H
#define ML_MODEL_INTERNAL_H

#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "model/lora_internal.h"
#include "model/mllama.h"
#include "model/shard.h"

/* Largest text head_dim the RoPE table on the stack allows (published: 128). */
#define ML_MAX_HEAD_DIM 256
/* Largest vision sequence (max_num_tiles · padded patches) whose token mask
 * is built on the stack (published: 4 · 1608 = 6432). */
#define ML_VISION_MAX_TOKENS 16384
/* Upper bound of ml_model_limits.max_seq_images: every step stages a mask
 * of (max_step_tokens, max_seq_images · max_num_tiles) bytes, so the bound
 * keeps a mistaken limit from sizing a huge workspace. */
#define ML_MAX_SEQ_IMAGES 64

/* Buffers of one vision encode, carved from the workspace. Shapes use
 * T = max_num_tiles, P = num_patches, Pp = padded patches, S = T·Pp; D_a,
 * I_v and KV are this shard's (shard.h ml_shard_dims: D_v, I_v, KV over world). */
typedef struct ml_vision_bufs {
    float *pixels;    /* (T, 3, side, side) */
    float *patches;   /* (T, P-1, 3·p·p) */
    float *h;         /* (S, D_v) residual stream */
    float *x;         /* (S, D_v) normed input of a sublayer */
    float *q, *k, *v; /* (S, D_a) */
    float *attn;      /* (S, D_a) */
    float *mlp;       /* (S, I_v) */
    float *vout;      /* (T·P, vision_output_dim) */
    uint8_t *valid;   /* (S) */
    /* After the encoders, aliasing q.. mlp: */
    float *proj;      /* (T·P, D) projector output */
    float *kv_tmp;    /* (T·P, KV·hd) one cross layer's K or V before conversion */
    float *lora_t;    /* (S, max_lora_rank) the LoRA op's scratch */
} ml_vision_bufs;

/* Buffers of one decoder step. N = max_step_tokens, R = max_logit_rows;
 * H, KV and I are this shard's (shard.h ml_shard_dims). */
typedef struct ml_text_bufs {
    float *h, *x;          /* (N, D) */
    float *q, *attn;       /* (N, H·hd) */
    float *k, *v;          /* (N, KV·hd) */
    float *gate, *up;      /* (N, I) */
    float *logits;         /* (R, vocab) */
    float *rows;           /* (R, D) hidden rows gathered for the lm_head */
    /* The sample op's inputs and outputs (ml_sample_params), P =
     * max_step_seqs · vocab penalty entries (each sampled sequence lists
     * distinct ids), Q = max_step_seqs · ML_SAMPLE_MAX_BIAS bias entries: */
    ml_sample_row *sample_rows; /* (R) */
    int32_t *pen_id;       /* (P) */
    uint32_t *pen_count;   /* (P) */
    ml_logit_bias *bias;   /* (Q) */
    ml_sample_out *sampled; /* (R) */
    uint64_t *sample_mask; /* (max_step_seqs, (vocab + 63) / 64) the constrained rows' masks */
    void *sample_scratch;  /* sample_scratch_bytes(R, vocab) */
    float *row_attn;       /* (N) 1 for tokens of sequences with images, else 0 */
    float *row_mlp;        /* (N) full_text_row_mask, 0 for text-only sequences */
    int32_t *tokens;       /* (N) */
    int32_t *pos;          /* (N) absolute positions */
    int32_t *slots;        /* (N) cache slots */
    int32_t *block_tables; /* (max_step_seqs, max_blocks_per_seq) */
    int32_t *seq_start;    /* (max_step_seqs + 1) */
    int32_t *pos0;         /* (max_step_seqs) */
    /* Cross-attention inputs (ml_attn_cross_params), at fixed strides so a
     * recorded step replays with other images: */
    const void **image_states; /* (max_step_seqs, max_seq_images) state base pointers, NULL
                                  past a sequence's images */
    int32_t *n_images;     /* (max_step_seqs) */
    uint8_t *allowed;      /* (N, max_seq_images · T), 0 past a sequence's images */
    float *lora_t;         /* (max(N, R), max_lora_rank) the LoRA op's scratch */
} ml_text_bufs;

/* Host staging of the per-step metadata (the same fields as ml_text_bufs'
 * integer and mask arrays) before one upload per array, and the step's
 * adapter groups. */
typedef struct ml_step_host {
    float *row_attn, *row_mlp;
    int32_t *tokens, *pos, *slots, *block_tables, *seq_start, *pos0;
    const void **image_states;
    int32_t *n_images;
    uint8_t *allowed;
    ml_lora_group *lora_groups;   /* (max_step_seqs) */
    int n_lora_groups;
    ml_lora_segment *lora_segs;   /* (max_step_seqs) one LoRA op's segments */
    ml_sample_row *sample_rows;   /* (max_logit_rows) */
    int32_t *pen_id;              /* (max_step_seqs · vocab) */
    uint32_t *pen_count;          /* (max_step_seqs · vocab) */
    int n_pen;                    /* entries staged */
    ml_logit_bias *bias;          /* (max_step_seqs · ML_SAMPLE_MAX_BIAS) */
    int n_bias;                   /* entries staged */
    int n_mask;                   /* constrained rows staged (sample_rows[r].mask) */
    ml_sample_out *sampled;       /* (max_logit_rows) downloaded b->sampled */
} ml_step_host;

struct ml_shard {
    ml_config cfg;
    ml_model_limits limits;
    /* matmul_f8's quant_x for every FP8 Linear: limits.fp8_activations,
     * checked against the scheme at load. */
    int quant_x;
    ml_backend *be;            /* borrowed */
    ml_shard_dims dims;
    ml_checkpoint *ckpt;       /* owned: the mmaps the host weights point into */
    ml_weights *host_weights;  /* owned: bf16 host views */
    ml_weights w;              /* backend views: same shapes, data from be->ops->weight;
                                  layer arrays owned */
    int w_bound;               /* w's data are owned weight results, given back at destroy */
    int linears_borrowed;      /* a Linear's backend view is its host bytes (backend.h
                                  linear_weight), which must then stay */
    int max_blocks_per_seq;
    int n_self_layers;
    int *self_index;           /* owned (text layers): index into the kv cache, -1 for cross */
    float *inv_freq;           /* backend (head_dim/2) */
    void *workspace;           /* owned backend buffer */
    size_t workspace_bytes;
    ml_vision_bufs vb;
    ml_text_bufs tb;
    ml_step_host host;         /* owned host allocation */
    /* Decode graphs (text.c): recorded[slot] says the backend's graph slot
     * holds the decode step of its bucket, recorded against the K/V cache
     * of ml_kv_cache_id graph_kv. */
    uint8_t graph_recorded[ML_GRAPH_SLOTS];
    uint64_t graph_kv;
};

/* ---- the workspace (workspace.c) ---- */

/* A bump allocator over one buffer. With base == NULL it only measures, so
 * the same carving code sizes the workspace at load and slices it later. */
typedef struct ml_carver {
    char *base;
    size_t off;
} ml_carver;

void *ml_carve(ml_carver *c, size_t bytes);

/* The vision tower's sizes on shard m. T = max_num_tiles, P = patches per
 * tile + CLS, Pp = P padded to a multiple of 8, S = T·Pp, Dv = vision
 * hidden, Da = this shard's attention width (heads · hd), Iv = its MLP
 * width, D = text hidden, kv_width = its cross K/V width (KV heads · hd). */
typedef struct ml_vision_dims {
    int T, P, Pp, S, Dv, Da, Iv, heads, hd, side, patch, patch_len, n_inter, vout, D, kv_width;
} ml_vision_dims;

ml_vision_dims ml_vision_dims_of(const ml_shard *m);

/* Carve the vision (resp. text) buffers of m from c. */
void ml_vision_plan(const ml_shard *m, ml_carver *c, ml_vision_bufs *b);
void ml_text_plan(const ml_shard *m, ml_carver *c, ml_text_bufs *b);

/* Allocate m's workspace on its backend (one buffer: vision encodes and
 * decoder steps never overlap), carve m->vb and m->tb from it, and the host
 * staging m->host. Errors: ML_ERR_NOMEM. */
ml_status ml_workspace_create(ml_shard *m, char *err, size_t errlen);

#endif

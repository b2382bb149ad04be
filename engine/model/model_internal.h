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
/* Upper bound of ml_model_limits.max_seq_images: every step stages a mask
 * of (max_step_tokens, max_seq_images · max_num_tiles) bytes, so the bound
 * keeps a mistaken limit from sizing a huge workspace. */
#define ML_MAX_SEQ_IMAGES 64

/* Buffers of one vision encode, carved from the workspace. Shapes use
 * T = max_num_tiles, P = num_patches, Pp = padded patches, S = T·Pp; D_a,
 * I_v and KV are this shard's (ml_shard: D_v, I_v, KV over world). */
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
 * H, KV and I are this shard's (ml_shard). */
typedef struct ml_text_bufs {
    float *h, *x;          /* (N, D) */
    float *q, *attn;       /* (N, H·hd) */
    float *k, *v;          /* (N, KV·hd) */
    float *gate, *up;      /* (N, I) */
    float *logits;         /* (R, vocab) */
    float *rows;           /* (R, D) hidden rows gathered for the lm_head */
    /* The sample op's inputs and outputs (ml_sample_params), P =
     * max_step_seqs · vocab penalty entries (each sampled sequence lists
     * distinct ids): */
    ml_sample_row *sample_rows; /* (R) */
    int32_t *pen_id;       /* (P) */
    uint32_t *pen_count;   /* (P) */
    ml_sample_out *sampled; /* (R) */
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

/* ---- LoRA (lora.c) -------------------------------------------------------- */

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

int ml_lora_n_sites(const ml_config *cfg);
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
 * tp.c hands to each rank's steps and encodes. */
struct ml_lora {
    ml_model *model;        /* borrowed: whole, a shard, or tensor-parallel (model->tp) */
    int max_rank;
    float scale;
    int touches_images;
    int n_sites;
    ml_lora_site *sites;    /* owned (n_sites); NULL in a tensor-parallel handle */
    uint16_t *mem;          /* owned backend buffer: every site's A then B at max_rank;
                               NULL in a tensor-parallel handle */
    size_t bytes;           /* of mem; of each rank's slot in a handle */
    /* A tensor-parallel handle only (else NULL): */
    ml_lora **parts;        /* owned (world): rank r's slot, in its shard's backend */
    uint16_t *stage;        /* owned host (max_rank, widest row-parallel input share):
                               ml_lora_set gathers A's column range here */
};

/* Rows of a step (or an image) that share one adapter. */
typedef struct ml_lora_group {
    const ml_lora *lora;    /* borrowed, non-NULL */
    int row_start, n_rows;  /* token rows */
    int logit_start, n_logits; /* logit rows (lm_head) */
} ml_lora_group;

/* y (rows, N) += the LoRA of `site` for every group (token rows, or logit
 * rows with logit_rows != 0) whose adapter adapts it; scratch is an lora_t
 * buffer of the rows. Uses m->host.lora_segs (max_step_seqs entries, at
 * least n_groups). */
void ml_lora_apply(ml_model *m, float *y, const float *x, const ml_lora_group *groups,
                   int n_groups, int site, int K, int N, int logit_rows, float *scratch);

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
    ml_sample_out *sampled;       /* (max_logit_rows) downloaded b->sampled */
} ml_step_host;

/* ---- tensor parallelism (shard.c) ------------------------------------------- */

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

/* ---- one shard's computation (vision.c, text.c, lora.c) ---------------------- */

/* ml_model_encode_image and ml_model_forward of one shard (a whole model is
 * the shard of world 1): the public calls (tp.c) come here directly for a
 * model loaded whole and through the rank threads for a tensor-parallel one. */
ml_status ml_shard_encode_image(ml_model *m, const float *pixels, int aspect_ratio_id,
                                const uint8_t *aspect_ratio_mask, const ml_lora *lora,
                                void *state, const ml_vision_taps *taps, char *err,
                                size_t errlen);
ml_status ml_shard_forward(ml_model *m, ml_kv_cache *kv, const ml_step_seq *seqs, int n_seqs,
                           float *logits, const ml_text_taps *taps, char *err, size_t errlen);

/* ml_lora_create's slot: with n_shards == 0 one slot on m's own backend;
 * otherwise a handle for m with a part on each of shards[0 .. n_shards)
 * (borrowed), the tensor-parallel model's ranks. Errors as ml_lora_create,
 * naming the rank that failed. */
ml_status ml_lora_slot_create(ml_lora **out, ml_model *m, ml_model *const *shards, int n_shards,
                              int max_rank, char *err, size_t errlen);

/* ---- a tensor-parallel model driven as one (tp.c) ---------------------------- */

/* The shards of ml_model_load_tp and the threads that drive ranks 1... A
 * model with tp != NULL has only cfg, limits, be (rank 0's) and shard
 * (rank 0's geometry, no row_slices) of its own; tp.c, the only file that
 * tells the two kinds of model apart, sends its calls to the shards. */
typedef struct ml_tp ml_tp;

/* Join the threads and destroy the shards. NULL is a no-op. */
void ml_tp_destroy(ml_tp *tp);

struct ml_model {
    ml_config cfg;
    ml_model_limits limits;
    ml_backend *be;            /* borrowed */
    ml_shard shard;
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
    /* Decode graphs (text.c): recorded[slot] says the backend's graph slot
     * holds the decode step of its bucket, recorded against the K/V cache
     * of ml_kv_cache_id graph_kv. */
    uint8_t graph_recorded[ML_GRAPH_SLOTS];
    uint64_t graph_kv;
    ml_tp *tp;                 /* owned: the shards of a tensor-parallel model, else NULL */
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

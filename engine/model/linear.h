/* A Linear of the graph with its LoRA site (linear.c), llama.cpp's
 * build_lora_mm: vision.c and text.c make this one call for every nn.Linear
 * an adapter may adapt, so that a layer body reads as the transformers
 * module it reproduces. PEFT semantics (engine/model/README.md §12): y =
 * base(x) + B(A(x))·scale for the rows whose adapter adapts the Linear.
 * @locality: the thread that drives the model, as every op. */
#ifndef ML_MODEL_LINEAR_H
#define ML_MODEL_LINEAR_H

#include "checkpoint/weights.h"
#include "model/lora_internal.h"
#include "model/mllama.h"

/* The adapters a Linear's rows see: the groups of rows that share one
 * (n_groups 0: every row is the base model's), counted in token rows, or
 * with logit_rows != 0 in logit rows (lm_head); scratch is the LoRA op's,
 * (rows, max_lora_rank) in backend memory. */
typedef struct ml_lora_rows {
    const ml_lora_group *groups; /* borrowed (n_groups) */
    int n_groups;
    int logit_rows;
    float *scratch;              /* borrowed: the workspace's lora_t */
} ml_lora_rows;

/* y (M, N) = x (M, K) · wᵀ + bias, then y += the LoRA of `site` for every
 * group of `lora` whose adapter adapts it: one matmul, then at most one
 * segmented lora op over all those groups (Punica's SGMV shape). w is
 * (N, K) and bias (1, N) or NULL, both backend views; a bias whose data is
 * NULL (a row-parallel bias off rank 0, shard.h) is none. The ops are taken
 * from m->be->ops at the call, so a recording backend records them. Uses
 * m->host.lora_segs (max_step_seqs entries, at least lora->n_groups). */
void ml_linear(ml_shard *m, float *y, const float *x, const ml_weight *w, const ml_weight *bias,
               int M, int K, int N, const ml_lora_rows *lora, int site);

#endif

/* The Linears of the graph (linear.h): a matmul and the segmented LoRA of
 * its site. */
#include "model/linear.h"

#include <assert.h>

#include "model/model_internal.h"

void ml_linear(ml_shard *m, float *y, const float *x, const ml_weight *w, const ml_weight *bias,
               int M, int K, int N, const ml_lora_rows *lora, int site)
{
    ml_backend *be = m->be;
    /* Shapes are checked at load (weights.c) and kept by the slicing
     * (shard.c): a mismatch here is a graph bug. */
    assert(w->rows == N && w->cols == K);
    const uint16_t *b = bias ? bias->data : NULL;
    if (w->f8) /* matmul_f8 is present: the model refuses FP8 weights elsewhere at load */
        be->ops->matmul_f8(be, y, x, w->f8, w->scale, b, M, K, N, m->quant_x);
    else
        be->ops->matmul(be, y, x, w->data, b, M, K, N, 0);

    ml_lora_segment *segs = m->host.lora_segs;
    int n = 0;
    for (int g = 0; g < lora->n_groups; g++) {
        const ml_lora_group *gr = &lora->groups[g];
        const ml_lora_site *s = &gr->lora->sites[site];
        int start = lora->logit_rows ? gr->logit_start : gr->row_start;
        int rows = lora->logit_rows ? gr->n_logits : gr->n_rows;
        if (s->rank && rows)
            segs[n++] = (ml_lora_segment){start, rows, s->rank, gr->lora->scale, s->a, s->b};
    }
    if (n)
        be->ops->lora(be, y, x, segs, n, K, N, lora->scratch, m->limits.max_lora_rank);
}

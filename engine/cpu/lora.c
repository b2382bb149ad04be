/* lora: segmented LoRA (backend.h), y[rows] += scale · ((x[rows] · aᵀ) · bᵀ)
 * for every segment, f32 activations and bf16 adapter weights.
 *
 * One parallel-for over chunks of ROWS rows of every segment: a chunk runs
 * the shrink t = x · aᵀ for its rows, then the expand y += scale · t · bᵀ
 * for the same rows over all N. A decode step that mixes many adapters
 * (a row or two each) thus wakes the pool once per Linear, not once per
 * adapter and pass: at this size the wake-ups, not the arithmetic, are
 * what a LoRA op costs. Both halves run the matmul's gemv kernel (A's and
 * B's rows are its "weights"), so each chunk streams its adapter's A and B
 * once, which is the floor at decode. The order in which an element is
 * summed depends only on the ISA, never on the segment layout or the
 * thread count, so a sequence gets the same bits whichever adapters share
 * its batch. */
#include <assert.h>

#include "cpu/cpu_internal.h"

/* Rows per work item: large prefill and vision segments split into chunks
 * that re-read A and B from cache, decode segments are one item each. */
#define ROWS 16

typedef struct lora_job {
    float *y;                   /* (rows, N) */
    const float *x;             /* (rows, K) */
    const ml_lora_segment *segs;
    int n_segs, K, N;
    float *t;                   /* (rows, ldt): x · aᵀ */
    int ldt;
    const ml_cpu_backend *cb;
} lora_job;

static inline int imin(int a, int b)
{
    return a < b ? a : b;
}

/* Work items of a segment (0 when empty). */
static int64_t seg_items(const ml_lora_segment *s)
{
    return s->n_rows > 0 && s->rank > 0 ? (s->n_rows + ROWS - 1) / ROWS : 0;
}

/* t[r0 .. r1) = x · aᵀ, then y[r0 .. r1) += scale · t · bᵀ, for segment s. */
static void lora_rows(const lora_job *j, const ml_lora_segment *s, int r0, int r1)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const size_t K = (size_t)j->K, N = (size_t)j->N, rank = (size_t)s->rank;
    float dots[ML_CPU_GEMV_MAX_ROWS * ML_CPU_GEMV_MAX_COLS];
    for (int a = 0; a < s->rank; a += kn->gemv_rows) {
        const int rows = imin(kn->gemv_rows, s->rank - a);
        for (int r = r0; r < r1; r += kn->gemv_cols) {
            const int cols = imin(kn->gemv_cols, r1 - r);
            kn->gemv(rows, cols, j->K, s->a + (size_t)a * K, K, j->x + (size_t)r * K, K, dots);
            for (int i = 0; i < rows; i++)
                for (int c = 0; c < cols; c++)
                    j->t[(size_t)(r + c) * j->ldt + a + i] = dots[i * cols + c];
        }
    }
    for (int n = 0; n < j->N; n += kn->gemv_rows) {
        const int rows = imin(kn->gemv_rows, j->N - n);
        for (int r = r0; r < r1; r += kn->gemv_cols) {
            const int cols = imin(kn->gemv_cols, r1 - r);
            kn->gemv(rows, cols, s->rank, s->b + (size_t)n * rank, rank,
                     j->t + (size_t)r * j->ldt, (size_t)j->ldt, dots);
            for (int i = 0; i < rows; i++)
                for (int c = 0; c < cols; c++)
                    j->y[(size_t)(r + c) * N + (size_t)(n + i)] += s->scale * dots[i * cols + c];
        }
    }
}

/* Items [begin, end) of the concatenation of every segment's items. */
static void lora_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const lora_job *j = ctx;
    int64_t first = 0; /* index of segment s's first item */
    for (int s = 0; s < j->n_segs && first < end; s++) {
        const ml_lora_segment *sg = &j->segs[s];
        const int64_t n = seg_items(sg);
        for (int64_t i = begin > first ? begin - first : 0; i < n && first + i < end; i++) {
            const int r0 = sg->row_start + (int)i * ROWS;
            lora_rows(j, sg, r0, imin(r0 + ROWS, sg->row_start + sg->n_rows));
        }
        first += n;
    }
}

void ml_cpu_lora(ml_backend *be, float *y, const float *x, const ml_lora_segment *segs,
                 int n_segs, int K, int N, float *scratch, int max_rank)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    int64_t items = 0;
    double work = 0; /* multiply-adds */
    for (int s = 0; s < n_segs; s++) {
        assert(segs[s].rank <= max_rank && segs[s].row_start >= 0);
        items += seg_items(&segs[s]);
        if (seg_items(&segs[s]))
            work += (double)segs[s].n_rows * segs[s].rank * (K + N);
    }
    if (items == 0)
        return;
    lora_job job = {.y = y, .x = x, .segs = segs, .n_segs = n_segs, .K = K, .N = N,
                    .t = scratch, .ldt = max_rank, .cb = cb};
    ml_cpu_pool_for(cb->pool, items, ml_cpu_grain(work / (double)items), lora_part, &job);
}

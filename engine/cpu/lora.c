/* lora: segmented LoRA (backend.h), y[rows] += scale · ((x[rows] · aᵀ) · bᵀ)
 * for every segment, f32 activations and bf16 adapter weights.
 *
 * Two passes, each ONE parallel-for over the items of all segments, so a
 * step that mixes many adapters wakes the pool twice per Linear, not twice
 * per adapter:
 * - shrink: t[r, 0..rank) = x[r] · aᵀ, chunks of rows × all of A;
 * - expand: y[r, n] += scale · (t[r] · b[n]), chunks of rows × blocks of N.
 * Both run the matmul's gemv kernel (A's and B's rows are the "weights"), so
 * each adapter's A and B are streamed once per row chunk: at decode (a row
 * or two per adapter) the op is bound by reading the adapters, which is the
 * floor. The order in which an element is summed depends only on the ISA,
 * never on the segment layout or the thread count, so a sequence gets the
 * same bits whichever adapters share its batch. */
#include <assert.h>

#include "cpu/cpu_internal.h"

/* Rows of x per shrink item: A (rank, K) is read once per chunk. */
#define SHRINK_ROWS 16
/* Rows and output columns per expand item. */
#define EXPAND_ROWS 16
#define EXPAND_COLS 128

typedef enum lora_pass {
    PASS_SHRINK,
    PASS_EXPAND,
} lora_pass;

typedef struct lora_job {
    float *y;                   /* (rows, N) */
    const float *x;             /* (rows, K) */
    const ml_lora_segment *segs;
    int n_segs, K, N;
    float *t;                   /* (rows, ldt): x · aᵀ */
    int ldt;
    lora_pass pass;
    const ml_cpu_backend *cb;
} lora_job;

static inline int imin(int a, int b)
{
    return a < b ? a : b;
}

static inline int ceil_div(int a, int b)
{
    return (a + b - 1) / b;
}

static int col_blocks(const lora_job *j)
{
    return ceil_div(j->N, EXPAND_COLS);
}

/* Work items of segment s in the job's pass (0 for an empty segment). */
static int64_t seg_items(const lora_job *j, const ml_lora_segment *s)
{
    if (s->n_rows <= 0 || s->rank <= 0)
        return 0;
    if (j->pass == PASS_SHRINK)
        return ceil_div(s->n_rows, SHRINK_ROWS);
    return (int64_t)ceil_div(s->n_rows, EXPAND_ROWS) * col_blocks(j);
}

/* t[r0 .. r1) of segment s. */
static void shrink_rows(const lora_job *j, const ml_lora_segment *s, int r0, int r1)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const size_t K = (size_t)j->K;
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
}

/* y[r0 .. r1, n0 .. n1) of segment s. */
static void expand_block(const lora_job *j, const ml_lora_segment *s, int r0, int r1, int n0,
                         int n1)
{
    const ml_cpu_kernels *kn = j->cb->kern;
    const size_t rank = (size_t)s->rank, N = (size_t)j->N;
    float dots[ML_CPU_GEMV_MAX_ROWS * ML_CPU_GEMV_MAX_COLS];
    for (int n = n0; n < n1; n += kn->gemv_rows) {
        const int rows = imin(kn->gemv_rows, n1 - n);
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

/* Item `item` (0-based within segment s) of the job's pass. */
static void run_item(const lora_job *j, const ml_lora_segment *s, int64_t item)
{
    if (j->pass == PASS_SHRINK) {
        const int r0 = s->row_start + (int)item * SHRINK_ROWS;
        shrink_rows(j, s, r0, imin(r0 + SHRINK_ROWS, s->row_start + s->n_rows));
        return;
    }
    const int chunk = (int)(item / col_blocks(j)), block = (int)(item % col_blocks(j));
    const int r0 = s->row_start + chunk * EXPAND_ROWS, n0 = block * EXPAND_COLS;
    expand_block(j, s, r0, imin(r0 + EXPAND_ROWS, s->row_start + s->n_rows), n0,
                 imin(n0 + EXPAND_COLS, j->N));
}

/* Items [begin, end) of the concatenation of every segment's items. */
static void lora_part(void *ctx, int64_t begin, int64_t end, int tid)
{
    const lora_job *j = ctx;
    int64_t first = 0; /* index of segment s's first item */
    for (int s = 0; s < j->n_segs && first < end; s++) {
        const int64_t n = seg_items(j, &j->segs[s]);
        for (int64_t i = begin > first ? begin - first : 0; i < n && first + i < end; i++)
            run_item(j, &j->segs[s], i);
        first += n;
    }
}

/* Run one pass over every segment. */
static void run_pass(ml_cpu_backend *cb, lora_job *j, lora_pass pass)
{
    j->pass = pass;
    int64_t items = 0;
    double work = 0; /* multiply-adds */
    for (int s = 0; s < j->n_segs; s++) {
        const ml_lora_segment *sg = &j->segs[s];
        items += seg_items(j, sg);
        if (seg_items(j, sg) > 0)
            work += (double)sg->n_rows * sg->rank * (pass == PASS_SHRINK ? j->K : j->N);
    }
    if (items == 0)
        return;
    ml_cpu_pool_for(cb->pool, items, ml_cpu_grain(work / (double)items), lora_part, j);
}

void ml_cpu_lora(ml_backend *be, float *y, const float *x, const ml_lora_segment *segs,
                 int n_segs, int K, int N, float *scratch, int max_rank)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    for (int s = 0; s < n_segs; s++)
        assert(segs[s].rank <= max_rank && segs[s].row_start >= 0);
    lora_job job = {.y = y, .x = x, .segs = segs, .n_segs = n_segs, .K = K, .N = N,
                    .t = scratch, .ldt = max_rank, .cb = cb};
    /* Every t row is written before any is read: the pool's return is the barrier. */
    run_pass(cb, &job, PASS_SHRINK);
    run_pass(cb, &job, PASS_EXPAND);
}

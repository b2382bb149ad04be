/* lora: segmented LoRA (backend.h, Punica's SGMV), y[rows] += scale ·
 * ((x[rows] · aᵀ) · bᵀ) per segment, in two kernels queued back to back:
 * - shrink: one warp per (row, rank index): t[r, i] = x[r] · a[i], lanes
 *   striding over K;
 * - expand: one thread per (row, output column): y[r, n] += scale ·
 *   Σ_i t[r, i] · b[n, i].
 * The segment descriptors (a host array) travel by value in the kernel
 * parameters, LORA_SEGS_PER_LAUNCH at a time with each segment's first
 * work item, so the launches can be recorded in a graph. At decode (a row
 * or two per adapter) both passes are bound by reading A and B once.
 * Sums are f32 in another order than the CPU's: NMSE-level agreement. */
#include <cstring>

#include "mlk_internal.cuh"

/* Segments per launch: 64 × 32 bytes of parameters; steps with more
 * adapters than this (more than 64 sequences) take several launches. */
#define LORA_SEGS_PER_LAUNCH 64
#define LORA_THREADS 256
#define LORA_WARPS (LORA_THREADS / 32)

typedef struct lora_seg {
    int row_start, n_rows, rank;
    float scale;
    const uint16_t *a; /* (rank, K) */
    const uint16_t *b; /* (N, rank) */
} lora_seg;

typedef struct lora_args {
    float *y;          /* (rows, N) */
    const float *x;    /* (rows, K) */
    float *t;          /* (rows, ldt) */
    int K, N, ldt, n_segs;
    long long first[LORA_SEGS_PER_LAUNCH + 1]; /* segment s's items: [first[s], first[s+1]) */
    lora_seg seg[LORA_SEGS_PER_LAUNCH];
} lora_args;

/* The segment holding work item `item` (first[] ascending). */
__device__ __forceinline__ int find_seg(const lora_args &a, long long item)
{
    int s = 0;
    while (s + 1 < a.n_segs && a.first[s + 1] <= item)
        s++;
    return s;
}

/* Items: (row, rank index) pairs, one warp each. */
__global__ void __launch_bounds__(LORA_THREADS) lora_shrink_kernel(const __grid_constant__ lora_args a)
{
    const long long item = (long long)blockIdx.x * LORA_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (item >= a.first[a.n_segs])
        return;
    const int s = find_seg(a, item);
    const lora_seg &g = a.seg[s];
    const long long local = item - a.first[s];
    const int r = g.row_start + (int)(local / g.rank), i = (int)(local % g.rank);
    const float *xr = a.x + (size_t)r * a.K;
    const uint16_t *ar = g.a + (size_t)i * a.K;
    float acc = 0.0f;
    for (int k = lane; k < a.K; k += 32)
        acc = fmaf(xr[k], mlk_bf16(ar[k]), acc);
    acc = mlk_warp_sum(acc);
    if (lane == 0)
        a.t[(size_t)r * a.ldt + i] = acc;
}

/* Items: (row, output column) pairs, one thread each. */
__global__ void __launch_bounds__(LORA_THREADS) lora_expand_kernel(const __grid_constant__ lora_args a)
{
    const long long item = (long long)blockIdx.x * LORA_THREADS + threadIdx.x;
    if (item >= a.first[a.n_segs])
        return;
    const int s = find_seg(a, item);
    const lora_seg &g = a.seg[s];
    const long long local = item - a.first[s];
    const int r = g.row_start + (int)(local / a.N), n = (int)(local % a.N);
    const float *tr = a.t + (size_t)r * a.ldt;
    const uint16_t *br = g.b + (size_t)n * g.rank;
    float acc = 0.0f;
    for (int i = 0; i < g.rank; i++)
        acc = fmaf(tr[i], mlk_bf16(br[i]), acc);
    float *yp = a.y + (size_t)r * a.N + n;
    *yp = __fadd_rn(*yp, __fmul_rn(g.scale, acc));
}

void mlk_lora(ml_backend *be, float *y, const float *x, const ml_lora_segment *segs, int n_segs,
              int K, int N, float *scratch, int max_rank)
{
    mlk_backend *b = mlk_of(be);
    if (n_segs <= 0 || K <= 0 || N <= 0 || mlk_enter(b))
        return;
    for (int s0 = 0; s0 < n_segs; s0 += LORA_SEGS_PER_LAUNCH) {
        lora_args a;
        memset(&a, 0, sizeof a);
        a.y = y;
        a.x = x;
        a.t = scratch;
        a.K = K;
        a.N = N;
        a.ldt = max_rank;
        long long shrink = 0, expand = 0;
        for (int s = s0; s < n_segs && s < s0 + LORA_SEGS_PER_LAUNCH; s++) {
            const ml_lora_segment *g = &segs[s];
            if (g->rank < 1 || g->rank > max_rank || g->row_start < 0) {
                mlk_latch(b, ML_ERR_INVALID_ARG, "lora", "segment %d: rank %d (max %d), row %d",
                          s, g->rank, max_rank, g->row_start);
                return;
            }
            if (g->n_rows <= 0)
                continue;
            a.seg[a.n_segs] = lora_seg{g->row_start, g->n_rows, g->rank, g->scale, g->a, g->b};
            a.first[a.n_segs] = shrink;
            shrink += (long long)g->n_rows * g->rank;
            expand += (long long)g->n_rows * N;
            a.n_segs++;
        }
        if (a.n_segs == 0)
            continue;
        a.first[a.n_segs] = shrink;
        mlk_launch(lora_shrink_kernel, (unsigned)((shrink + LORA_WARPS - 1) / LORA_WARPS),
                   LORA_THREADS, 0, b->stream, a);
        mlk_launched(b, "lora (shrink)");
        /* The expand pass counts (row, column) items. */
        long long at = 0;
        for (int s = 0; s < a.n_segs; s++) {
            a.first[s] = at;
            at += (long long)a.seg[s].n_rows * N;
        }
        a.first[a.n_segs] = expand;
        mlk_launch(lora_expand_kernel, (unsigned)((expand + LORA_THREADS - 1) / LORA_THREADS),
                   LORA_THREADS, 0, b->stream, a);
        mlk_launched(b, "lora (expand)");
    }
}

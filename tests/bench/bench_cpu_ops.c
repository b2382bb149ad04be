/* Micro-benchmark of the CPU backend's heavy ops (label bench; skipped unless
 * ML_BENCH=1). Threads: ML_BENCH_THREADS (default 2). ISAs: every one this
 * machine supports, or only ML_CPU_ISA when set.
 *
 *   read bandwidth  multi-threaded streaming sum over a 1 GiB buffer: the
 *                   ceiling for the memory-bound decode matmul
 *   GEMV            M = 1 against 14336x4096 and 4096x14336 bf16 weights
 *                   (gate/up and down_proj of the 11B text MLP) and the
 *                   small preset's lm_head (128256x1024): GB/s of weight
 *                   bytes streamed; M = 2..32, decode batches (gate/up and
 *                   lm_head)
 *   layers          a decode step's small Linears (the small preset's
 *                   q/o, k/v and gate/up: K 1024 x N 1024, 256, 2816) at
 *                   M = 1, 8 and 16 rows, bf16 and FP8, as the model
 *                   calls them: from memory, each call on the next of
 *                   enough copies of the weights that none is still
 *                   cached (COLD_BYTES, past the L3s seen), and from L2
 *                   (one copy, over and over): GB/s of weight bytes and
 *                   GFLOP/s, the memory's share and the kernel's own rate
 *   GEMM            M = 6432 (4 vision tiles), the vision tower's Linears:
 *                   K = N = 1280 (q/k/v/o), K 1280 x N 5120 (fc1), K 5120 x
 *                   N 1280 (fc2); M = 512, a prefill chunk, through the
 *                   11B text MLP's gate/up (K 4096 x N 14336) and down
 *                   (K 14336 x N 4096): GFLOP/s
 *   bf16            on a CPU with AVX-512 BF16, the GEMMs, the M = 1..32
 *                   sweep and attn_vision again with bf16 activations
 *                   (ml_backend_cpu_bf16_activations), q/k/v/o's GEMM as a
 *                   ratio to the f32 path's in the same run
 *   attn_vision     1 x 6432 tokens x 16 heads x 80 (one vision layer) for
 *                   a 4-tile and a 2-tile image
 *   gelu            6432 x 5120 (one 11B vision MLP) and silu_mul 512 x 14336
 *                   (a prefill chunk of the 11B text MLP): ns per element
 *   attn_causal     one layer of a decode step's self-attention: 16
 *                   sequences, one row each, over the paged cache (the
 *                   11B's 32 heads, 8 kv heads x 128, 16-slot blocks in a
 *                   shuffled order) at 256 and 1,024 keys: GB/s of the K/V
 *                   read, which is what the step streams
 *   attn_cross      the cross layers of one decode step: one row against
 *                   one image in each of the 11B's 8 cross layers (32
 *                   heads, 8 kv heads x 128, 4 tile slots of 1601 keys;
 *                   416 MB of f32 K/V, past the L3), with 1 and with 4
 *                   real tiles: GB/s of the K/V the allowed tiles hold;
 *                   then 16 and 32 sequences, a row each, sharing that
 *                   image (n > 1 choices, questions about one document):
 *                   GFLOP/s of their products
 *                   (attn_causal and attn_cross run again over a bf16
 *                   cache, ml_backend_cpu_bf16_kv_cache)
 *
 * ML_BENCH_ONLY=name,... runs only those groups (bandwidth, gemv, layers,
 * gemm, attn_vision, activations, attn_causal, attn_cross, bf16).
 *
 * Each result is the best of a few runs, by wall clock and by CPU time
 * (process CPU seconds / threads). On a shared machine the wall figure is
 * what this run got; the CPU figure is what the code does when it has the
 * cores to itself (it still shares memory bandwidth). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

#define BW_BYTES ((size_t)1 << 30)
#define BW_PASSES 5
#define MAX_THREADS 64
#define VISION_TILE 1608 /* 1601 tokens padded to a multiple of 8 */
#define VISION_REAL 1601
#define VISION_TILES 4    /* max_num_tiles */
/* 11B text decoder: heads, kv heads, head_dim (cross-attention: one tile
 * slot of keys per vision tile) */
#define TEXT_HEADS 32
#define TEXT_KV_HEADS 8
#define TEXT_HEAD_DIM 128
#define TEXT_CROSS_LAYERS 8
/* Decode sequences sharing one image in attn_cross's batch cases: 16 (64
 * query rows at the 11B's GQA 4, one row block of the attention) and 32 */
#define CROSS_SEQS 32
/* MLP widths: 11B vision (fc1 out) and text (gate/up out); the text
 * hidden size; a prefill chunk */
#define VISION_MLP 5120
#define TEXT_MLP 14336
#define TEXT_HIDDEN 4096
#define PREFILL_ROWS 512

static int g_threads = 2;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The backend's memory, where the engine keeps its activations and caches
 * (on the CPU: huge pages from 2 MiB up, faulted in). malloc's 4 KiB pages
 * would time TLB misses the engine does not take: a vision head's keys
 * are a row a 5 KiB token apart, every one on its own base page. */
static void *backend_alloc(ml_backend *be, size_t bytes)
{
    void *p = be->ops->alloc(be, bytes);
    if (!p) {
        fprintf(stderr, "bench_cpu_ops: the backend cannot allocate %zu bytes\n", bytes);
        exit(1);
    }
    return p;
}

/* Best wall and CPU seconds (per thread) over `reps` calls of fn(ctx). */
typedef struct timing {
    double wall, cpu;
} timing;

static timing best_of(void (*fn)(void *), void *ctx, int reps)
{
    timing best = {1e30, 1e30};
    for (int r = 0; r < reps; r++) {
        const double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        fn(ctx);
        const double w = clock_s(CLOCK_MONOTONIC) - w0;
        const double c = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / g_threads;
        best.wall = w < best.wall ? w : best.wall;
        best.cpu = c < best.cpu ? c : best.cpu;
    }
    return best;
}

/* ---- memory read bandwidth ---------------------------------------------------- */

/* 16-byte integer vectors (GCC/clang vector extension, SSE2 registers): the
 * sum compiles to packed adds at the default -O2 and the baseline ISA, so one
 * core can outrun memory and the measurement is of memory, not of the loop. */
typedef uint64_t u64x2 __attribute__((vector_size(16)));

typedef struct bw_arg {
    const u64x2 *p;
    size_t n; /* vectors, a multiple of 4 */
    uint64_t sum;
} bw_arg;

static void *bw_sum(void *argp)
{
    bw_arg *a = argp;
    /* Four named accumulators (not an array) stay in registers at -O2. */
    u64x2 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i < a->n; i += 4) {
        s0 += a->p[i];
        s1 += a->p[i + 1];
        s2 += a->p[i + 2];
        s3 += a->p[i + 3];
    }
    const u64x2 all = s0 + s1 + s2 + s3;
    a->sum = all[0] + all[1];
    return NULL;
}

typedef struct bw_job {
    const u64x2 *buf;
    int threads;
    uint64_t sum;
} bw_job;

static void bw_pass(void *ctx)
{
    bw_job *j = ctx;
    const size_t chunks = BW_BYTES / sizeof *j->buf / 4;
    pthread_t tid[MAX_THREADS];
    bw_arg arg[MAX_THREADS];
    for (int t = 0; t < j->threads; t++) {
        const size_t lo = chunks * t / j->threads, hi = chunks * (t + 1) / j->threads;
        arg[t] = (bw_arg){.p = j->buf + 4 * lo, .n = 4 * (hi - lo)};
        if (pthread_create(&tid[t], NULL, bw_sum, &arg[t]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            exit(1);
        }
    }
    j->sum = 0;
    for (int t = 0; t < j->threads; t++) {
        pthread_join(tid[t], NULL);
        j->sum += arg[t].sum;
    }
}

/* The sums are checked so the loads cannot be elided. */
static void bench_bandwidth(int threads)
{
    u64x2 *buf = aligned_alloc(64, BW_BYTES);
    if (!buf) {
        fprintf(stderr, "out of memory (1 GiB)\n");
        exit(1);
    }
    memset(buf, 1, BW_BYTES); /* fault every page in before timing */
    bw_job job = {.buf = buf, .threads = threads};
    const int saved = g_threads;
    g_threads = threads;
    timing t = best_of(bw_pass, &job, BW_PASSES);
    g_threads = saved;
    if (job.sum != (BW_BYTES / sizeof(uint64_t)) * 0x0101010101010101ull) {
        fprintf(stderr, "read bandwidth: wrong sum\n");
        exit(1);
    }
    printf("read bandwidth, %d thread(s), 1 GiB: %6.1f GB/s wall  %6.1f GB/s cpu\n", threads,
           BW_BYTES / t.wall / 1e9, BW_BYTES / t.cpu / 1e9);
    free(buf);
}

/* ---- ops ------------------------------------------------------------------------ */

typedef struct mm_job {
    ml_backend *be;
    float *y;
    const float *x;
    const uint16_t *w;
    const uint8_t *w8;  /* the FP8 run's weights, (N, K) */
    const float *scale; /* (N) */
    int M, K, N;
} mm_job;

static void mm_run(void *ctx)
{
    mm_job *j = ctx;
    j->be->ops->matmul(j->be, j->y, j->x, j->w, NULL, j->M, j->K, j->N, 0);
}

static void mm_run_f8(void *ctx)
{
    mm_job *j = ctx;
    j->be->ops->matmul_f8(j->be, j->y, j->x, j->w8, j->scale, NULL, j->M, j->K, j->N, 0);
}

/* W8A8: the activation rows quantized per call, then the same FP8 matmul. */
static void mm_run_f8_a8(void *ctx)
{
    mm_job *j = ctx;
    j->be->ops->matmul_f8(j->be, j->y, j->x, j->w8, j->scale, NULL, j->M, j->K, j->N, 1);
}

/* The weights packed by the backend, as the model binds a Linear. */
static const void *packed(ml_backend *be, const void *w, int N, int K, size_t elem_size)
{
    const void *p = be->ops->linear_weight(be, w, N, K, elem_size);
    if (!p) {
        fprintf(stderr, "linear_weight %d x %d failed\n", N, K);
        exit(1);
    }
    return p;
}

/* A Linear's (N, K) weights drawn at random as bf16 and as FP8 codes,
 * with the FP8 run's per-row scale. */
typedef struct linear_draw {
    uint16_t *w;
    uint8_t *w8;
    float *scale; /* (N) */
} linear_draw;

static linear_draw linear_draw_make(int N, int K)
{
    linear_draw d = {.w = xmalloc((size_t)N * K * sizeof *d.w),
                     .w8 = xmalloc((size_t)N * K),
                     .scale = xmalloc((size_t)N * sizeof *d.scale)};
    for (size_t i = 0; i < (size_t)N * K; i++) {
        d.w[i] = ml_f32_to_bf16(frand(-1, 1));
        d.w8[i] = ml_f32_to_f8e4m3(frand(-ML_F8E4M3_MAX, ML_F8E4M3_MAX));
    }
    for (int n = 0; n < N; n++)
        d.scale[n] = 1.0f / ML_F8E4M3_MAX;
    return d;
}

static void linear_draw_free(linear_draw *d)
{
    free(d->w);
    free(d->w8);
    free(d->scale);
}

/* sweep: also M = 2..32 (the shapes marked for it). */
static void bench_gemv(ml_backend *be, int sweep)
{
    static const struct {
        int K, N, sweep;
    } shapes[] = {
        {4096, 14336, 1},   /* 11B gate/up_proj */
        {14336, 4096, 0},   /* 11B down_proj */
        {1024, 128256, 1},  /* the small preset's lm_head: 59% of its decode step's FLOPs */
    };
    static const int Ms[] = {1, 2, 4, 8, 16, 17, 24, 32};
    const int max_m = 32;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int K = shapes[s].K, N = shapes[s].N;
        linear_draw d = linear_draw_make(N, K);
        float *x = backend_alloc(be, (size_t)max_m * K * sizeof *x);
        float *y = backend_alloc(be, (size_t)max_m * N * sizeof *y);
        for (size_t i = 0; i < (size_t)max_m * K; i++)
            x[i] = frand(-1, 1);
        const double bytes = (double)N * K * sizeof *d.w;
        const uint16_t *pw = packed(be, d.w, N, K, sizeof *d.w);
        const uint8_t *pw8 = packed(be, d.w8, N, K, sizeof *d.w8);
        for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++) {
            mm_job j = {.be = be, .y = y, .x = x, .w = pw, .w8 = pw8, .scale = d.scale,
                        .M = Ms[m], .K = K, .N = N};
            timing t = best_of(mm_run, &j, 7);
            printf("  matmul M=%-2d K=%-5d N=%-5d %8.2f ms  weights %5.1f GB/s wall %5.1f cpu"
                   "  %6.1f GFLOP/s cpu\n",
                   j.M, K, N, t.wall * 1e3, bytes / t.wall / 1e9, bytes / t.cpu / 1e9,
                   2.0 * j.M * K * N / t.cpu / 1e9);
            /* FP8 weights right after, same shape: half the bytes */
            timing t8 = best_of(mm_run_f8, &j, 7);
            printf("  matmul_f8 M=%-2d K=%-5d N=%-5d %8.2f ms  weights %5.1f GB/s wall  "
                   "%.2fx the bf16 time\n",
                   j.M, K, N, t8.wall * 1e3, bytes / 2 / t8.wall / 1e9, t.wall / t8.wall);
            timing ta = best_of(mm_run_f8_a8, &j, 7);
            printf("  matmul_f8 W8A8 M=%-2d K=%-5d N=%-5d %8.2f ms  %.2fx the W8A16 time\n", j.M,
                   K, N, ta.wall * 1e3, t8.wall / ta.wall);
            if (!sweep || !shapes[s].sweep)
                break;
        }
        be->ops->linear_weight_free(be, pw);
        be->ops->linear_weight_free(be, pw8);
        linear_draw_free(&d);
        be->ops->free(be, x);
        be->ops->free(be, y);
    }
}

/* Bytes of weight copies a "from memory" run cycles through: past the
 * largest L3 of the development VMs (260 MiB), so that no call finds its
 * weights cached; and calls per run. */
#define COLD_BYTES ((size_t)768 << 20)
#define LAYER_CALLS 2000

typedef struct layer_job {
    mm_job mm;            /* its w or w8: the copy of the call */
    const void *const *w; /* copies, packed */
    int copies, f8;
} layer_job;

/* LAYER_CALLS calls, each on the next copy. */
static void layer_run(void *ctx)
{
    layer_job *j = ctx;
    for (int c = 0; c < LAYER_CALLS; c++) {
        if (j->f8) {
            j->mm.w8 = j->w[c % j->copies];
            mm_run_f8(&j->mm);
        } else {
            j->mm.w = j->w[c % j->copies];
            mm_run(&j->mm);
        }
    }
}

static void bench_layers(ml_backend *be)
{
    enum { K = 1024, MAX_M = 16 };
    static const int Ns[] = {1024, 256, 2816};
    static const int Ms[] = {1, 8, 16};
    float *x = backend_alloc(be, (size_t)MAX_M * K * sizeof *x);
    for (int i = 0; i < MAX_M * K; i++)
        x[i] = frand(-1, 1);
    for (size_t s = 0; s < sizeof Ns / sizeof Ns[0]; s++) {
        const int N = Ns[s];
        float *y = backend_alloc(be, (size_t)MAX_M * N * sizeof *y);
        linear_draw d = linear_draw_make(N, K);
        for (int f8 = 0; f8 < 2; f8++) {
            const size_t bytes = (size_t)N * K * (f8 ? sizeof *d.w8 : sizeof *d.w);
            const int cold = (int)((COLD_BYTES + bytes - 1) / bytes);
            const void **copies = xmalloc((size_t)cold * sizeof *copies);
            for (int c = 0; c < cold; c++)
                copies[c] = f8 ? packed(be, d.w8, N, K, sizeof *d.w8)
                               : packed(be, d.w, N, K, sizeof *d.w);
            for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++) {
                double gbs[2], gflops[2];
                for (int warm = 0; warm < 2; warm++) {
                    layer_job j = {.mm = {.be = be, .y = y, .x = x, .scale = d.scale,
                                          .M = Ms[m], .K = K, .N = N},
                                   .w = copies, .copies = warm ? 1 : cold, .f8 = f8};
                    const timing t = best_of(layer_run, &j, 3);
                    gbs[warm] = (double)bytes * LAYER_CALLS / t.wall / 1e9;
                    gflops[warm] = 2.0 * Ms[m] * K * N * LAYER_CALLS / t.wall / 1e9;
                }
                printf("  layer M=%-2d K=%d N=%-5d %-4s  from memory %5.1f GB/s %6.1f GFLOP/s"
                       "  from L2 %5.1f GB/s %6.1f GFLOP/s\n",
                       Ms[m], K, N, f8 ? "fp8" : "bf16", gbs[0], gflops[0], gbs[1], gflops[1]);
            }
            for (int c = 0; c < cold; c++)
                be->ops->linear_weight_free(be, copies[c]);
            free(copies);
        }
        linear_draw_free(&d);
        be->ops->free(be, y);
    }
    be->ops->free(be, x);
}

/* The vision tower's Linears at one 4-tile image's rows: q/k/v/o, fc1,
 * fc2. Returns the wall GFLOP/s of the first (the bf16 group's ratio). */
static double bench_gemm(ml_backend *be)
{
    static const struct {
        int M, K, N;
    } shapes[] = {{VISION_TILE * VISION_TILES, 1280, 1280},
                  {VISION_TILE * VISION_TILES, 1280, VISION_MLP},
                  {VISION_TILE * VISION_TILES, VISION_MLP, 1280},
                  {PREFILL_ROWS, TEXT_HIDDEN, TEXT_MLP},
                  {PREFILL_ROWS, TEXT_MLP, TEXT_HIDDEN}};
    double first = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        mm_job j = {.be = be, .M = shapes[s].M, .K = shapes[s].K, .N = shapes[s].N};
        uint16_t *w = xmalloc((size_t)j.N * j.K * sizeof *w);
        float *x = backend_alloc(be, (size_t)j.M * j.K * sizeof *x);
        float *y = backend_alloc(be, (size_t)j.M * j.N * sizeof *y);
        for (size_t i = 0; i < (size_t)j.N * j.K; i++)
            w[i] = ml_f32_to_bf16(frand(-1, 1));
        for (size_t i = 0; i < (size_t)j.M * j.K; i++)
            x[i] = frand(-1, 1);
        memset(y, 0, (size_t)j.M * j.N * sizeof *y);
        j.y = y;
        j.x = x;
        j.w = packed(be, w, j.N, j.K, sizeof *w);
        timing t = best_of(mm_run, &j, 3);
        const double flop = 2.0 * j.M * j.K * j.N;
        printf("  matmul M=%d K=%d N=%d   %8.1f ms  %6.1f GFLOP/s wall  %6.1f GFLOP/s cpu\n",
               j.M, j.K, j.N, t.wall * 1e3, flop / t.wall / 1e9, flop / t.cpu / 1e9);
        if (s == 0)
            first = flop / t.wall / 1e9;
        be->ops->linear_weight_free(be, j.w);
        free(w);
        be->ops->free(be, x);
        be->ops->free(be, y);
    }
    return first;
}

typedef struct attn_job {
    ml_backend *be;
    ml_attn_vision_params p;
} attn_job;

static void attn_run(void *ctx)
{
    attn_job *j = ctx;
    j->be->ops->attn_vision(j->be, &j->p);
}

static void bench_attn_vision(ml_backend *be)
{
    const int seq = VISION_TILES * VISION_TILE, heads = 16, hd = 80;
    const size_t n = (size_t)seq * heads * hd;
    float *q = backend_alloc(be, n * sizeof *q), *k = backend_alloc(be, n * sizeof *k);
    float *v = backend_alloc(be, n * sizeof *v), *out = backend_alloc(be, n * sizeof *out);
    uint8_t *valid = xmalloc((size_t)seq);
    for (size_t i = 0; i < n; i++) {
        q[i] = frand(-1, 1);
        k[i] = frand(-1, 1);
        v[i] = frand(-1, 1);
    }
    /* A 4-tile image, then a 2-tile one whose tiles 2 and 3 are padding
     * (their queries see only valid keys). GFLOP/s counts every (query,
     * key) pair, computed or skipped as masked. */
    for (int tiles = VISION_TILES; tiles >= VISION_TILES / 2; tiles -= VISION_TILES / 2) {
        for (int t = 0; t < seq; t++)
            valid[t] = t / VISION_TILE < tiles && t % VISION_TILE < VISION_REAL;
        attn_job j = {.be = be,
                      .p = {.out = out, .q = q, .k = k, .v = v, .valid = valid, .n_seq = 1,
                            .seq_len = seq, .n_heads = heads, .head_dim = hd,
                            .scale = 1.0f / sqrtf((float)hd)}};
        timing t = best_of(attn_run, &j, 2);
        const double flop = 4.0 * seq * seq * heads * hd;
        printf("  attn_vision 1x%d tokens x %d heads x %d, %d-tile image   %8.1f ms  %6.1f GFLOP/s "
               "wall  %6.1f GFLOP/s cpu\n",
               seq, heads, hd, tiles, t.wall * 1e3, flop / t.wall / 1e9, flop / t.cpu / 1e9);
    }
    be->ops->free(be, q);
    be->ops->free(be, k);
    be->ops->free(be, v);
    be->ops->free(be, out);
    free(valid);
}

typedef struct act_job {
    ml_backend *be;
    float *y;
    const float *gate, *up;
    size_t n;
} act_job;

static void gelu_run(void *ctx)
{
    act_job *j = ctx;
    j->be->ops->gelu(j->be, j->y, j->n);
}

static void silu_mul_run(void *ctx)
{
    act_job *j = ctx;
    j->be->ops->silu_mul(j->be, j->y, j->gate, j->up, j->n);
}

static void bench_activations(ml_backend *be)
{
    const size_t n_gelu = (size_t)VISION_TILES * VISION_TILE * VISION_MLP;
    const size_t n_silu = (size_t)PREFILL_ROWS * TEXT_MLP;
    const size_t n = n_gelu > n_silu ? n_gelu : n_silu;
    float *x = backend_alloc(be, n * sizeof *x), *g = backend_alloc(be, n * sizeof *g);
    float *u = backend_alloc(be, n * sizeof *u);
    for (size_t i = 0; i < n; i++) {
        g[i] = 4.0f * frand(-1, 1); /* pre-activations of a few units, as in the models */
        u[i] = frand(-1, 1);
    }
    act_job j = {.be = be, .y = x, .gate = g, .up = u, .n = n_gelu};
    /* gelu works in place: refill from g before each run, outside the timing */
    timing best = {1e30, 1e30};
    for (int r = 0; r < 3; r++) {
        memcpy(x, g, n_gelu * sizeof *x);
        const timing t = best_of(gelu_run, &j, 1);
        best.wall = t.wall < best.wall ? t.wall : best.wall;
        best.cpu = t.cpu < best.cpu ? t.cpu : best.cpu;
    }
    printf("  gelu n=%zu          %8.2f ms  %6.3f ns/elem wall  %6.3f ns/elem cpu\n", n_gelu,
           best.wall * 1e3, best.wall * 1e9 / n_gelu, best.cpu * 1e9 / n_gelu);
    j.n = n_silu;
    best = best_of(silu_mul_run, &j, 3);
    printf("  silu_mul n=%zu       %8.2f ms  %6.3f ns/elem wall  %6.3f ns/elem cpu\n", n_silu,
           best.wall * 1e3, best.wall * 1e9 / n_silu, best.cpu * 1e9 / n_silu);
    be->ops->free(be, x);
    be->ops->free(be, g);
    be->ops->free(be, u);
}

typedef struct causal_job {
    ml_backend *be;
    ml_attn_causal_params p;
} causal_job;

static void causal_run(void *ctx)
{
    causal_job *j = ctx;
    j->be->ops->attn_causal(j->be, &j->p);
}

/* n random elements in be's kv type (kv_store: f32, or bf16 under
 * ml_backend_cpu_bf16_kv_cache). */
static void *random_kv(ml_backend *be, size_t n)
{
    float *tmp = xmalloc(n * sizeof *tmp);
    for (size_t i = 0; i < n; i++)
        tmp[i] = frand(-1, 1);
    void *kv = backend_alloc(be, n * be->ops->kv_elem_size);
    be->ops->kv_store(be, kv, tmp, n);
    free(tmp);
    return kv;
}

static const char *kv_type(const ml_backend *be)
{
    return be->ops->kv_elem_size == sizeof(float) ? "f32" : "bf16";
}

/* One decode row of each of CAUSAL_SEQS sequences over its paged keys. */
static void bench_attn_causal(ml_backend *be)
{
    enum { CAUSAL_SEQS = 16, CAUSAL_BLOCK = 16, CAUSAL_MAX_KEYS = 1024 };
    static const int contexts[] = {256, CAUSAL_MAX_KEYS};
    const int max_blocks = CAUSAL_MAX_KEYS / CAUSAL_BLOCK, n_phys = CAUSAL_SEQS * max_blocks;
    const size_t slot = (size_t)TEXT_KV_HEADS * TEXT_HEAD_DIM;
    const size_t cache_n = (size_t)n_phys * CAUSAL_BLOCK * slot;
    const size_t rows = (size_t)CAUSAL_SEQS * TEXT_HEADS * TEXT_HEAD_DIM;
    const size_t es = be->ops->kv_elem_size;
    void *kc = random_kv(be, cache_n), *vc = random_kv(be, cache_n);
    float *q = backend_alloc(be, rows * sizeof *q), *out = backend_alloc(be, rows * sizeof *out);
    for (size_t i = 0; i < rows; i++)
        q[i] = frand(-1, 1);
    int32_t *table = xmalloc((size_t)n_phys * sizeof *table);
    for (int i = 0; i < n_phys; i++)
        table[i] = i;
    for (int i = n_phys - 1; i > 0; i--) { /* blocks scattered as a long-running cache's */
        const int r = irand(i + 1), t = table[i];
        table[i] = table[r];
        table[r] = t;
    }
    int32_t seq_start[CAUSAL_SEQS + 1], pos0[CAUSAL_SEQS];
    for (int s = 0; s <= CAUSAL_SEQS; s++)
        seq_start[s] = s;
    for (size_t c = 0; c < sizeof contexts / sizeof contexts[0]; c++) {
        for (int s = 0; s < CAUSAL_SEQS; s++)
            pos0[s] = contexts[c] - 1;
        causal_job j = {
            .be = be,
            .p = {.out = out, .q = q, .k_cache = kc, .v_cache = vc, .block_table = table,
                  .seq_start = seq_start, .pos0 = pos0, .n_seqs = CAUSAL_SEQS,
                  .max_blocks_per_seq = max_blocks, .block_size = CAUSAL_BLOCK,
                  .n_heads = TEXT_HEADS, .n_kv_heads = TEXT_KV_HEADS,
                  .head_dim = TEXT_HEAD_DIM, .scale = 1.0f / sqrtf((float)TEXT_HEAD_DIM)}};
        const timing t = best_of(causal_run, &j, 5);
        const double bytes = 2.0 * CAUSAL_SEQS * contexts[c] * slot * (double)es;
        printf("  attn_causal decode, %d sequences x %4d keys, one layer, %s K/V   %8.3f ms  "
               "K/V %5.1f GB/s wall  %5.1f cpu\n",
               CAUSAL_SEQS, contexts[c], kv_type(be), t.wall * 1e3, bytes / t.wall / 1e9,
               bytes / t.cpu / 1e9);
    }
    be->ops->free(be, kc);
    be->ops->free(be, vc);
    be->ops->free(be, q);
    be->ops->free(be, out);
    free(table);
}

typedef struct cross_job {
    ml_backend *be;
    ml_attn_cross_params p;
    /* per layer, every sequence's state: the layer's one image */
    const void *states[TEXT_CROSS_LAYERS][CROSS_SEQS];
} cross_job;

static void cross_step(void *ctx)
{
    cross_job *j = ctx;
    for (int layer = 0; layer < TEXT_CROSS_LAYERS; layer++) {
        j->p.states = j->states[layer];
        j->be->ops->attn_cross(j->be, &j->p);
    }
}

/* One decode row of each of 1, 16 and CROSS_SEQS sequences against the one
 * image they share in every cross layer, as a decode step runs them. */
static void bench_attn_cross(ml_backend *be)
{
    const size_t plane = (size_t)VISION_TILES * VISION_REAL * TEXT_KV_HEADS * TEXT_HEAD_DIM;
    const size_t row = (size_t)TEXT_HEADS * TEXT_HEAD_DIM;
    const size_t es = be->ops->kv_elem_size;
    float *q = backend_alloc(be, CROSS_SEQS * row * sizeof *q);
    float *out = backend_alloc(be, CROSS_SEQS * row * sizeof *out);
    void *state[TEXT_CROSS_LAYERS]; /* (2, tiles · 1601, kv heads, head_dim): K then V */
    cross_job j = {.be = be};
    for (int layer = 0; layer < TEXT_CROSS_LAYERS; layer++) {
        state[layer] = random_kv(be, 2 * plane);
        for (int s = 0; s < CROSS_SEQS; s++)
            j.states[layer][s] = state[layer];
    }
    for (size_t i = 0; i < CROSS_SEQS * row; i++)
        q[i] = frand(-1, 1);
    int32_t n_images[CROSS_SEQS], seq_start[CROSS_SEQS + 1];
    for (int s = 0; s <= CROSS_SEQS; s++) {
        seq_start[s] = s;
        if (s < CROSS_SEQS)
            n_images[s] = 1;
    }
    uint8_t allowed[CROSS_SEQS * VISION_TILES];
    static const int batches[] = {1, CROSS_SEQS / 2, CROSS_SEQS};
    for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
        const int seqs = batches[b];
        for (int tiles = 1; tiles <= VISION_TILES; tiles += VISION_TILES - 1) {
            for (int c = 0; c < seqs * VISION_TILES; c++)
                allowed[c] = c % VISION_TILES < tiles;
            j.p = (ml_attn_cross_params){
                .out = out, .q = q, .k_offset = 0, .v_offset = plane * es,
                .n_images = n_images, .seq_start = seq_start, .allowed = allowed,
                .n_seqs = seqs, .n_tokens = seqs, .max_images = 1, .max_tiles = VISION_TILES,
                .chunk_len = VISION_REAL, .n_heads = TEXT_HEADS, .n_kv_heads = TEXT_KV_HEADS,
                .head_dim = TEXT_HEAD_DIM, .scale = 1.0f / sqrtf((float)TEXT_HEAD_DIM)};
            const timing t = best_of(cross_step, &j, 5);
            const double keys = (double)tiles * VISION_REAL * TEXT_CROSS_LAYERS;
            const double bytes = 2.0 * keys * TEXT_KV_HEADS * TEXT_HEAD_DIM * (double)es;
            /* q·k and p·v: 2 FLOPs a multiply-add, each row of each sequence */
            const double flops = 4.0 * seqs * TEXT_HEADS * TEXT_HEAD_DIM * keys;
            printf("  attn_cross decode step, %2d sequence(s) sharing an image, %d cross layers, "
                   "%d of %d tiles, %s K/V   %8.3f ms  allowed K/V %5.1f GB/s wall  %5.1f cpu  "
                   "%6.1f GFLOP/s wall\n",
                   seqs, TEXT_CROSS_LAYERS, tiles, VISION_TILES, kv_type(be), t.wall * 1e3,
                   bytes / t.wall / 1e9, bytes / t.cpu / 1e9, flops / t.wall / 1e9);
        }
    }
    for (int layer = 0; layer < TEXT_CROSS_LAYERS; layer++)
        be->ops->free(be, state[layer]);
    be->ops->free(be, q);
    be->ops->free(be, out);
}

/* Whether ML_BENCH_ONLY (a comma-separated list) is unset or names `group`. */
static int wanted(const char *group)
{
    const char *only = getenv("ML_BENCH_ONLY");
    if (!only || !*only)
        return 1;
    const size_t len = strlen(group);
    for (const char *p = only; (p = strstr(p, group)) != NULL; p += len)
        if ((p == only || p[-1] == ',') && (p[len] == '\0' || p[len] == ','))
            return 1;
    return 0;
}

int main(void)
{
    ml_bench_require();
    g_threads = ml_bench_env_int("ML_BENCH_THREADS", 2, 1, MAX_THREADS);

    if (wanted("bandwidth")) {
        bench_bandwidth(g_threads);
        if (g_threads > 1)
            bench_bandwidth(1);
    }
    fflush(stdout);

    char forced[32] = "";
    if (getenv("ML_CPU_ISA"))
        snprintf(forced, sizeof forced, "%s", getenv("ML_CPU_ISA"));
    const ml_cpu_isa best = ml_cpu_isa_detect();
    double f32_gemm = 0; /* the AVX-512 path's, for the bf16 ratio */
    for (ml_cpu_isa isa = ML_CPU_ISA_PLAIN; isa <= best; isa++) {
        if (*forced && strcmp(forced, ml_cpu_isa_name(isa)) != 0)
            continue;
        setenv("ML_CPU_ISA", ml_cpu_isa_name(isa), 1);
        char err[256];
        ml_backend *be = ml_backend_cpu_create(g_threads, err, sizeof err);
        if (!be) {
            fprintf(stderr, "create: %s\n", err);
            return 1;
        }
        printf("%s, %d threads\n", be->ops->name, g_threads);
        /* The plain path is the readable reference, not a fast path: its
         * compute-bound runs would take minutes unless asked for. */
        const int full = isa != ML_CPU_ISA_PLAIN || *forced;
        if (wanted("gemv"))
            bench_gemv(be, full);
        if (full && wanted("layers"))
            bench_layers(be);
        if (full && (wanted("gemm") || wanted("bf16"))) {
            const double gflops = bench_gemm(be);
            if (isa == ML_CPU_ISA_AVX512)
                f32_gemm = gflops;
        }
        if (full && wanted("attn_vision"))
            bench_attn_vision(be);
        if (wanted("activations"))
            bench_activations(be);
        if (wanted("attn_causal"))
            bench_attn_causal(be);
        if (wanted("attn_cross"))
            bench_attn_cross(be);
        be->ops->destroy(be);
        if (wanted("attn_causal") || wanted("attn_cross")) { /* again over a bf16 cache */
            be = ml_backend_cpu_create(g_threads, err, sizeof err);
            if (!be || ml_backend_cpu_bf16_kv_cache(be, err, sizeof err) != ML_OK) {
                fprintf(stderr, "bf16 K/V cache: %s\n", err);
                return 1;
            }
            printf("%s (bf16 K/V cache), %d threads\n", be->ops->name, g_threads);
            if (wanted("attn_causal"))
                bench_attn_causal(be);
            if (wanted("attn_cross"))
                bench_attn_cross(be);
            be->ops->destroy(be);
        }
        fflush(stdout);
    }
    if (wanted("bf16") && ml_cpu_has_avx512_bf16() && (!*forced || !strcmp(forced, "avx512"))) {
        char err[256];
        setenv("ML_CPU_ISA", "avx512", 1);
        ml_backend *be = ml_backend_cpu_create(g_threads, err, sizeof err);
        if (!be || ml_backend_cpu_bf16_activations(be, err, sizeof err) != ML_OK) {
            fprintf(stderr, "bf16 activations: %s\n", err);
            return 1;
        }
        printf("%s (bf16 activations), %d threads\n", be->ops->name, g_threads);
        const double gflops = bench_gemm(be);
        if (f32_gemm > 0)
            printf("  bf16 activations: GEMM %.2fx the f32 path\n", gflops / f32_gemm);
        bench_gemv(be, 1);
        bench_attn_vision(be);
        be->ops->destroy(be);
    }
    return 0;
}

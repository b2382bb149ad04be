/* f32 FMA peak, the compute ceiling of the CPU engine (label bench; skipped
 * unless ML_BENCH=1): ML_BENCH_THREADS (default 2) threads, each running
 * CHAINS independent chains of vector FMAs held in registers, nothing read
 * from memory, best of a few passes; then one thread.
 *
 * The engine computes in f32 with FMA whatever the weights' dtype (bf16 and
 * FP8 weights are widened exactly), so this is the bound of its matmuls and
 * attention: the roofline benchmark (roofline.sh) divides a step's FLOPs by
 * it. The width is that of the kernels the engine runs: the ISA comes from
 * ml_cpu_isa_select, as the CPU backend's does (the widest the CPU and OS
 * support, or ML_CPU_ISA), and is printed. An FMA counts as 2 FLOPs.
 *
 * On a CPU with AVX-512 BF16 it then measures the bf16 dot peak the same
 * way: chains of VDPBF16PS (f32 += the dot of two bf16 pairs, 4 FLOPs a
 * lane), the ceiling of the bf16 Linears and vision attention of the opt-in
 * bf16 activations (roofline.sh --cpu-activations bf16). Where those run on
 * AMX (ml_cpu_amx_select, as the backend picks) it measures TDPBF16PS too:
 * four 16 x 16 f32 tiles each taking the products of two 16 x 32 bf16
 * tiles, 16384 FLOPs an instruction, their ceiling there. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/cpu_features.h"
#include "cpu/cpu_kernels.h"
#include "harness.h"

#if ML_CPU_X86
#include <immintrin.h>
#endif

#define MAX_THREADS 64
#define PASSES 5
/* Independent accumulators: at least FMA latency (4 cycles) x FMA ports (2)
 * so that every port issues every cycle, few enough to stay in registers
 * (AVX2 has 16). */
#define CHAINS 12
/* FMAs per chain per pass: ~0.1-0.5 s a pass at the rates of a current core. */
#define ROUNDS (50 * 1000 * 1000)
/* acc = acc * MUL + ADD converges to ADD / (1 - MUL) = 1: the values stay
 * finite and normal however many rounds run. */
#define MUL 0.5f
#define ADD 0.5f
/* bf16 pairs (low half first): (1, -1) and (1, 1). */
#define PAIR_ONE_MINUS_ONE 0xbf803f80u
#define PAIR_ONE_ONE 0x3f803f80u

/* Each returns the sum of its accumulators' lanes, checked by the caller,
 * so that no FMA can be elided. mul and add come through volatile loads in
 * run_chains so the compiler cannot fold the loop. */
#if ML_CPU_X86
__attribute__((target("avx512f"))) static float chains_avx512(float mul, float add, long n)
{
    const __m512 m = _mm512_set1_ps(mul), a = _mm512_set1_ps(add);
    __m512 acc[CHAINS];
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < n; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++)
        s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float chains_avx2(float mul, float add, long n)
{
    const __m256 m = _mm256_set1_ps(mul), a = _mm256_set1_ps(add);
    __m256 acc[CHAINS];
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm256_set1_ps((float)c);
    for (long i = 0; i < n; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm256_fmadd_ps(acc[c], m, a);
    float lanes[8], sum = 0;
    for (int c = 0; c < CHAINS; c++) {
        _mm256_storeu_ps(lanes, acc[c]);
        for (int l = 0; l < 8; l++)
            sum += lanes[l];
    }
    return sum;
}

/* Each VDPBF16PS adds 1·1 + 1·(-1) = 0: the accumulators keep their start
 * values, exactly, however many rounds run. */
__attribute__((target("avx512f,avx512bf16"))) static float chains_bf16(long n)
{
    const __m512bh a = (__m512bh)_mm512_set1_epi32((int)PAIR_ONE_MINUS_ONE);
    const __m512bh b = (__m512bh)_mm512_set1_epi32((int)PAIR_ONE_ONE);
    __m512 acc[CHAINS];
    for (int c = 0; c < CHAINS; c++)
        acc[c] = _mm512_set1_ps((float)c);
    for (long i = 0; i < n; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __m512 s = acc[0];
    for (int c = 1; c < CHAINS; c++)
        s = _mm512_add_ps(s, acc[c]);
    return _mm512_reduce_add_ps(s);
}

/* AMX: C tiles 0-3 += A tiles 4-5 times B tiles 6-7, every tile 16 rows of
 * 64 bytes (gemm_tile_amx's configuration, ml_cpu_amx_shape). A's pairs (1, -1) and B's (1, 1): each instruction adds 0, and
 * tile t keeps its start value t. */
#define AMX_TILE_FLOATS 256
#define AMX_FLOPS (16.0 * 16 * 32 * 2)
#define AMX_C_TILES 4
/* TDPBF16PS rounds a pass takes (4 an iteration): a FMA chain's rounds
 * would take ~10x as long. */
#define AMX_ROUNDS (ROUNDS / 10)

__attribute__((target("amx-tile,amx-bf16"))) static float chains_amx(long n)
{
    static _Thread_local uint32_t a[AMX_TILE_FLOATS], b[AMX_TILE_FLOATS];
    static _Thread_local float c[AMX_C_TILES][AMX_TILE_FLOATS];
    for (int i = 0; i < AMX_TILE_FLOATS; i++) {
        a[i] = PAIR_ONE_MINUS_ONE;
        b[i] = PAIR_ONE_ONE;
        for (int t = 0; t < AMX_C_TILES; t++)
            c[t][i] = (float)t;
    }
    /* GCC's tile loads name their address as a register, not as memory:
     * the stores above must be done before them */
    __asm__ volatile("" : : "r"(a), "r"(b), "r"(c) : "memory");
    _tile_loadconfig(&ml_cpu_amx_shape);
    _tile_loadd(0, c[0], 64);
    _tile_loadd(1, c[1], 64);
    _tile_loadd(2, c[2], 64);
    _tile_loadd(3, c[3], 64);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    for (long i = 0; i < n; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    _tile_stored(2, c[2], 64);
    _tile_stored(3, c[3], 64);
    _tile_release();
    float sum = 0;
    for (int t = 0; t < AMX_C_TILES; t++)
        for (int i = 0; i < AMX_TILE_FLOATS; i++)
            sum += c[t][i];
    return sum;
}
#endif

/* The portable build's kernels: scalar multiply-add, one lane. */
static float chains_plain(float mul, float add, long n)
{
    float acc[CHAINS];
    for (int c = 0; c < CHAINS; c++)
        acc[c] = (float)c;
    for (long i = 0; i < n; i++)
        for (int c = 0; c < CHAINS; c++)
            acc[c] = acc[c] * mul + add;
    float sum = 0;
    for (int c = 0; c < CHAINS; c++)
        sum += acc[c];
    return sum;
}

/* What a thread's chains run: f32 FMAs in an ISA, bf16 dot products, or
 * AMX tiles. */
typedef struct peak_kind {
    ml_cpu_isa isa;
    int bf16_dot, amx;
} peak_kind;

typedef struct worker {
    peak_kind kind;
    float sum;
} worker;

static int lanes_of(ml_cpu_isa isa)
{
    return isa == ML_CPU_ISA_AVX512 ? 16 : isa == ML_CPU_ISA_AVX2 ? 8 : 1;
}

/* FLOPs of one instruction of a chain: an FMA is 2 a lane, a bf16 dot of
 * two pairs 4 (16 f32 lanes). */
static double flops_per_op(peak_kind k)
{
    return k.amx ? AMX_FLOPS : k.bf16_dot ? 4.0 * 16 : 2.0 * lanes_of(k.isa);
}

/* Instructions of a chain in a pass (AMX: all four tiles' in one). */
static double ops_per_pass(peak_kind k)
{
    return k.amx ? (double)AMX_C_TILES * AMX_ROUNDS : (double)CHAINS * ROUNDS;
}

/* The sum of the accumulators' lanes after any number of rounds: FMA
 * chains converge to ADD / (1 - MUL) = 1, dot chains keep their start
 * values 0 .. CHAINS - 1. */
static float expected_sum(peak_kind k)
{
    if (k.amx)
        return (float)AMX_TILE_FLOATS * AMX_C_TILES * (AMX_C_TILES - 1) / 2;
    return k.bf16_dot ? 16.0f * CHAINS * (CHAINS - 1) / 2 : (float)(CHAINS * lanes_of(k.isa));
}

static void *run_chains(void *arg)
{
    worker *w = arg;
    volatile float mul = MUL, add = ADD;
#if ML_CPU_X86
    if (w->kind.amx) {
        w->sum = chains_amx(AMX_ROUNDS);
        return NULL;
    }
    if (w->kind.bf16_dot) {
        w->sum = chains_bf16(ROUNDS);
        return NULL;
    }
    if (w->kind.isa == ML_CPU_ISA_AVX512) {
        w->sum = chains_avx512(mul, add, ROUNDS);
        return NULL;
    }
    if (w->kind.isa == ML_CPU_ISA_AVX2) {
        w->sum = chains_avx2(mul, add, ROUNDS);
        return NULL;
    }
#endif
    w->sum = chains_plain(mul, add, ROUNDS);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best GFLOP/s of PASSES passes with `threads` threads. */
static double peak(peak_kind kind, int threads)
{
    double best = 1e30;
    for (int pass = 0; pass < PASSES; pass++) {
        pthread_t tid[MAX_THREADS];
        worker w[MAX_THREADS];
        const double t0 = now_s();
        for (int t = 0; t < threads; t++) {
            w[t] = (worker){.kind = kind};
            if (pthread_create(&tid[t], NULL, run_chains, &w[t]) != 0) {
                fprintf(stderr, "pthread_create failed\n");
                exit(1);
            }
        }
        for (int t = 0; t < threads; t++)
            pthread_join(tid[t], NULL);
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
        const float expect = expected_sum(kind);
        for (int t = 0; t < threads; t++)
            check(w[t].sum > 0.99f * expect && w[t].sum < 1.01f * expect,
                  "peak: sum %g, expected %g", (double)w[t].sum, (double)expect);
    }
    return flops_per_op(kind) * ops_per_pass(kind) * threads / best / 1e9;
}

int main(void)
{
    ml_bench_require();
    int threads = ml_bench_env_int("ML_BENCH_THREADS", 2, 1, MAX_THREADS);
    ml_cpu_isa isa;
    char err[256];
    if (ml_cpu_isa_select(&isa, err, sizeof err) != ML_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const peak_kind fma = {.isa = isa};
    printf("f32 FMA peak, %d thread(s), %s, %d chains: %8.1f GFLOP/s\n", threads,
           ml_cpu_isa_name(isa), CHAINS, peak(fma, threads));
    if (threads > 1)
        printf("f32 FMA peak, 1 thread(s), %s, %d chains: %8.1f GFLOP/s\n", ml_cpu_isa_name(isa),
               CHAINS, peak(fma, 1));
    if (ML_CPU_X86 && ml_cpu_has_avx512_bf16()) {
        const peak_kind dot = {.isa = ML_CPU_ISA_AVX512, .bf16_dot = 1};
        printf("bf16 dot peak, %d thread(s), avx512-bf16, %d chains: %8.1f GFLOP/s\n", threads,
               CHAINS, peak(dot, threads));
        int amx = 0;
        if (ml_cpu_amx_select(&amx, err, sizeof err) != ML_OK) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        if (amx)
            printf("amx bf16 peak, %d thread(s), amx-bf16, %d tiles: %8.1f GFLOP/s\n", threads,
                   AMX_C_TILES, peak((peak_kind){.amx = 1}, threads));
    }
    return check_done();
}

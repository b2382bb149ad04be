/* The CPU backend's matmul against a double-precision reference on each ISA
 * path and thread count (cpu_ops_util.h), its batch invariance, the order
 * of its sums on the packed weights (bit for bit, bf16 and FP8, per ISA),
 * the opt-in bf16 activations (AVX-512 BF16; refused elsewhere) against the
 * same reference on x rounded to bf16, FP8 with them (every code widened to
 * bf16 exactly; the bf16 sum of the codes), the grouped path's widening of
 * every bf16 value and code, and the LoRA's gemv kernel of each ISA across
 * block shapes.
 *
 * Tolerance, with u = 2^-24: |y - ref| <= (K + 3)·u·(Σ_k |x_k·w_k| + |bias|
 * + |y0|), the classic bound of f32 recursive summation (any summation order
 * and FMA or not satisfies it; blocked/vector sums are far below it). A
 * wrong or missing term costs ~|x·w| ≈ Σ/K, far above it for the K used
 * here. With bf16 activations the reference takes x rounded to bf16 and the
 * bound holds as it is: VDPBF16PS's products are exact in f32 and each pair
 * adds at most two roundings, so a sum of K terms still has at most K + 3. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "cpu/cpu_internal.h"
#include "cpu/cpu_kernels.h"
#include "cpu_ops_util.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

/* ---- matmul ------------------------------------------------------------------------ */

/* The ops on a row-major weight (N, K), packed by the backend first as the
 * model binds every Linear (backend.h linear_weight). */
static void matmul_rm(ml_backend *be, float *y, const float *x, const uint16_t *w,
                      const uint16_t *bias, int M, int K, int N, int accumulate)
{
    const uint16_t *p = be->ops->linear_weight(be, w, N, K, sizeof *w);
    check(p != NULL, "linear_weight %d x %d bf16", N, K);
    if (p)
        be->ops->matmul(be, y, x, p, bias, M, K, N, accumulate);
    else /* failed above; y defined for the comparisons that follow */
        memset(y, 0, (size_t)M * N * sizeof *y);
    be->ops->linear_weight_free(be, p);
}

static void matmul_f8_rm(ml_backend *be, float *y, const float *x, const uint8_t *w,
                         const float *scale, const uint16_t *bias, int M, int K, int N,
                         int quant_x)
{
    const uint8_t *p = be->ops->linear_weight(be, w, N, K, sizeof *w);
    check(p != NULL, "linear_weight %d x %d F8_E4M3", N, K);
    if (p)
        be->ops->matmul_f8(be, y, x, p, scale, bias, M, K, N, quant_x);
    else
        memset(y, 0, (size_t)M * N * sizeof *y);
    be->ops->linear_weight_free(be, p);
}

/* bf16_x: be runs bf16 activations (ml_backend_cpu_bf16_activations). */
static void test_matmul_case(ml_backend *be[N_BACKENDS], int bf16_x, int M, int K, int N,
                             int with_bias, int accumulate)
{
    float *x = xmalloc((size_t)M * K * sizeof *x);
    uint16_t *w = xmalloc((size_t)N * K * sizeof *w);
    uint16_t *bias = xmalloc((size_t)N * sizeof *bias);
    float *y0 = xmalloc((size_t)M * N * sizeof *y0);
    float *y[N_BACKENDS];
    double *want = xmalloc((size_t)M * N * sizeof *want);
    double *bound = xmalloc((size_t)M * N * sizeof *bound);
    fill(x, (size_t)M * K, -1, 1);
    fill_bf16(w, (size_t)N * K, -1, 1);
    fill_bf16(bias, (size_t)N, -1, 1);
    fill(y0, (size_t)M * N, -1, 1);

    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                const float xk = x[(size_t)m * K + k];
                double p = (double)(bf16_x ? ml_round_bf16(xk) : xk) *
                           ml_bf16_to_f32(w[(size_t)n * K + k]);
                s += p;
                a += fabs(p);
            }
            if (with_bias) {
                s += ml_bf16_to_f32(bias[n]);
                a += fabs(ml_bf16_to_f32(bias[n]));
            }
            if (accumulate) {
                s += y0[(size_t)m * N + n];
                a += fabs(y0[(size_t)m * N + n]);
            }
            want[(size_t)m * N + n] = s;
            bound[(size_t)m * N + n] = (K + 3) * U * a * 1.01;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "matmul%s M=%d K=%d N=%d bias=%d acc=%d",
             bf16_x ? " bf16 activations" : "", M, K, N, with_bias, accumulate);
    for (int b = 0; b < N_BACKENDS; b++) {
        y[b] = xmalloc((size_t)M * N * sizeof *y[b]);
        memcpy(y[b], y0, (size_t)M * N * sizeof *y[b]);
        matmul_rm(be[b], y[b], x, w, with_bias ? bias : NULL, M, K, N, accumulate);
    }
    check_bounded(y[0], want, bound, (size_t)M * N, what);
    check_same(y[0], y[1], (size_t)M * N * sizeof *y[0], what);
    for (int b = 0; b < N_BACKENDS; b++)
        free(y[b]);
    free(x);
    free(w);
    free(bias);
    free(y0);
    free(want);
    free(bound);
}

static void test_matmul(ml_backend *be[N_BACKENDS], int bf16_x)
{
    static const int Ms[] = {1, 3, 16, 17, 64, 200};
    static const int KNs[][2] = {{1, 1}, {7, 5}, {33, 37}, {300, 130}, {520, 300}};
    int i = 0;
    for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
        for (size_t b = 0; b < sizeof KNs / sizeof KNs[0]; b++, i++)
            test_matmul_case(be, bf16_x, Ms[a], KNs[b][0], KNs[b][1], i % 2, (i / 2) % 2);
    /* A weight of odd row length (unaligned rows) through both regimes. */
    test_matmul_case(be, bf16_x, 2, 4099, 9, 1, 0);
    test_matmul_case(be, bf16_x, 40, 1031, 70, 0, 1);
}

/* Batch invariance: a sequence decoded alone (M = 1) and in a step of any
 * size, on either side of the GEMV/GEMM switch, gets bit-identical rows,
 * whatever block of a kernel or thread's part each element lands in. */
static void test_matmul_batch_invariance(ml_backend *be)
{
    /* K: four KC blocks and an odd tail (masked or scalar tails); N: a
     * ragged last block of every kernel; every M to MAX_M: past the GEMV
     * regime and the GEMM's first row tiles (the AMX kernel's second); then
     * BIG_M: at least 16 row tiles of any kernel on one thread, where blocks
     * are widened (f32) or K blocks grouped (bf16 activations; matmul.c). */
    enum { K = 1031, N = 67, MAX_M = 40, BIG_M = 16 * ML_CPU_AMX_TILE_ROWS };
    float *x = xmalloc((size_t)BIG_M * K * sizeof *x);
    float *alone = xmalloc((size_t)BIG_M * N * sizeof *alone);
    float *y = xmalloc((size_t)BIG_M * N * sizeof *y);
    uint16_t *w = xmalloc((size_t)N * K * sizeof *w);
    fill(x, (size_t)BIG_M * K, -1, 1);
    fill_bf16(w, (size_t)N * K, -1, 1);
    uint16_t *bias = xmalloc((size_t)N * sizeof *bias);
    fill_bf16(bias, (size_t)N, -1, 1);
    for (int m = 0; m < BIG_M; m++)
        matmul_rm(be, alone + (size_t)m * N, x + (size_t)m * K, w, bias, 1, K, N, 0);
    int same = 1, first_bad = 0;
    for (int M = 2; M <= BIG_M; M = M == MAX_M ? BIG_M : M + 1) {
        matmul_rm(be, y, x, w, bias, M, K, N, 0);
        const int ok = memcmp(y, alone, (size_t)M * N * sizeof *y) == 0;
        if (!ok && same)
            first_bad = M;
        same &= ok;
    }
    check(same, "matmul [%s]: batch of %d rows differs from the rows alone", g_isa, first_bad);
    free(x);
    free(alone);
    free(y);
    free(w);
    free(bias);
}

/* FP8 weights (matmul_f8): y = s · (x · qᵀ) + b with the sum exactly the
 * bf16 matmul's of q widened to bf16 (exact), at every M to MAX_M on both
 * sides of the GEMV/GEMM switch and at BIG_M (widened blocks in f32,
 * grouped K blocks with bf16 activations), with and without bias; so its
 * batch invariance is the bf16 path's, checked too. */
static void test_matmul_f8(ml_backend *be, ml_backend *bf16_ref)
{
    enum { K = 1031, N = 67, MAX_M = 40, BIG_M = 200 };
    float *x = xmalloc((size_t)BIG_M * K * sizeof *x);
    float *y8 = xmalloc((size_t)BIG_M * N * sizeof *y8);
    float *y16 = xmalloc((size_t)BIG_M * N * sizeof *y16);
    float *alone = xmalloc((size_t)MAX_M * N * sizeof *alone);
    uint8_t *w8 = xmalloc((size_t)N * K);
    uint16_t *w16 = xmalloc((size_t)N * K * sizeof *w16);
    uint16_t *bias = xmalloc((size_t)N * sizeof *bias);
    float *scale = xmalloc((size_t)N * sizeof *scale);
    fill(x, (size_t)BIG_M * K, -1, 1);
    fill(x + K, K, -1000, 1000); /* a row of larger activations */
    fill_bf16(bias, (size_t)N, -1, 1);
    for (int n = 0; n < N; n++) {
        /* absmax / 448 of weights of magnitude ~0.01..1, held in bf16 */
        scale[n] = ml_round_bf16(frand(0.01f, 1.0f) / ML_F8E4M3_MAX);
        for (int k = 0; k < K; k++) {
            uint8_t c = (uint8_t)irand(256);
            if ((c & 0x7f) == 0x7f) /* NaN: never in a checkpoint */
                c ^= 1;
            w8[(size_t)n * K + k] = c;
            w16[(size_t)n * K + k] = ml_f32_to_bf16(ml_f8e4m3_to_f32(c));
        }
    }
    int same = 1, first_bad = 0;
    for (int M = 1; M <= BIG_M; M = M == MAX_M ? BIG_M : M + 1) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            matmul_f8_rm(be, y8, x, w8, scale, with_bias ? bias : NULL, M, K, N, 0);
            matmul_rm(bf16_ref, y16, x, w16, NULL, M, K, N, 0);
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    float *v = &y16[(size_t)m * N + n];
                    *v = scale[n] * *v + (with_bias ? ml_bf16_to_f32(bias[n]) : 0.0f);
                }
            const int ok = memcmp(y8, y16, (size_t)M * N * sizeof *y8) == 0;
            if (!ok && same)
                first_bad = M;
            same &= ok;
        }
    }
    check(same, "matmul_f8 [%s]: M = %d is not scale times the bf16 sum of q, plus bias", g_isa,
          first_bad);
    for (int m = 0; m < MAX_M; m++)
        matmul_f8_rm(be, alone + (size_t)m * N, x + (size_t)m * K, w8, scale, bias, 1, K, N,
                           0);
    matmul_f8_rm(be, y8, x, w8, scale, bias, MAX_M, K, N, 0);
    check(memcmp(y8, alone, (size_t)MAX_M * N * sizeof *y8) == 0,
          "matmul_f8 [%s]: a batch of %d rows differs from the rows alone", g_isa, MAX_M);
    free(x);
    free(y8);
    free(y16);
    free(alone);
    free(w8);
    free(w16);
    free(bias);
    free(scale);
}

/* The FP8 widening of every one of the 256 codes, exact: ml_cpu_f8_to_f32
 * against dtype.h's reference conversion (the NaN codes, which no
 * checkpoint holds, widen to ±480), and the ISA's gemm_packed on a strip of
 * all the codes against one-hot activations (each output is then one
 * product, the widened weight times 1 or 300). */
enum { F8_CODES = 256 };

static float f8_want(int c)
{
    return (c & 0x7f) == 0x7f ? ((c & 0x80) ? -480.0f : 480.0f) : ml_f8e4m3_to_f32((uint8_t)c);
}

/* The i-th of every prefetch a kernel call can make, in turn (none of them
 * changes a result); ML_CPU_PREFETCH_NEXT over at's bytes. */
static ml_cpu_prefetch prefetch_kind(int i, const void *at, size_t bytes)
{
    const ml_cpu_prefetch_kind kind = (ml_cpu_prefetch_kind)(i % (ML_CPU_PREFETCH_NEXT + 1));
    return (ml_cpu_prefetch){
        .kind = kind, .next = at, .bytes = kind == ML_CPU_PREFETCH_NEXT ? bytes : 0};
}

static void test_f8_codes(const ml_cpu_kernels *kn)
{
    int exact = 1, strip = 1;
    for (int c = 0; c < F8_CODES; c++) {
        const float got = ml_cpu_f8_to_f32((uint8_t)c), want = f8_want(c);
        exact &= memcmp(&got, &want, sizeof got) == 0;
    }
    /* steps x strip_cols codes: every code once, code (p·S + c) at (p, c) */
    const int S = kn->strip_cols, steps = F8_CODES / S;
    uint8_t w[F8_CODES];
    for (int p = 0; p < steps; p++)
        for (int c = 0; c < S; c++)
            w[ml_cpu_packed_index(S, 1, p, c)] = (uint8_t)(p * S + c);
    float x[F8_CODES], y[ML_CPU_MAX_STRIP_COLS];
    static const float ones[] = {1.0f, 300.0f};
    for (int v = 0; v < 2; v++) {
        for (int one = 0; one < steps; one++) {
            for (int p = 0; p < steps; p++)
                x[p] = p == one ? ones[v] : 0.0f;
            memset(y, 0, sizeof y);
            const ml_cpu_prefetch pf = prefetch_kind(one, w, sizeof w);
            kn->gemm_packed(1, S, steps, x, (size_t)steps, w, ML_CPU_BLOCK_F8, &pf, NULL, y,
                            (size_t)S, 1);
            for (int c = 0; c < S; c++)
                strip &= y[c] == ones[v] * f8_want(one * S + c);
        }
    }
    check(exact, "ml_cpu_f8_to_f32: a code differs from ml_f8e4m3_to_f32");
    check(strip, "gemm_packed f8 [%s]: a code is not widened exactly", ml_cpu_isa_name(kn->isa));
    if (!kn->gemm_tile_f8_pairs || !ml_cpu_has_avx512_bf16() || !ml_cpu_has_avx512_vbmi())
        return;
    /* The same codes in the pair layout through gemm_tile_f8_pairs (bf16
     * activations), a tile as wide as the strip and one as its half: one
     * of each pair of activations is set, so each output is one exact
     * product plus an exact zero. */
    uint16_t wpairs[F8_CODES / 2];
    uint8_t *wp = (uint8_t *)wpairs;
    uint32_t xp[F8_CODES / 2];
    for (int p = 0; p < steps; p++)
        for (int c = 0; c < S; c++)
            wp[ml_cpu_f8_pair_index(S, p, c)] = (uint8_t)(p * S + c);
    int pairs = 1, stored = 1;
    for (int n = S; n >= S / 2; n -= S / 2) {
        for (int v = 0; v < 2; v++) {
            for (int one = 0; one < steps; one++) {
                for (int q = 0; q < steps / 2; q++)
                    xp[q] = ml_cpu_bf16_pair(2 * q == one ? ones[v] : 0.0f,
                                             2 * q + 1 == one ? ones[v] : 0.0f);
                memset(y, 0, sizeof y);
                const ml_cpu_prefetch pf = prefetch_kind(one, wpairs, sizeof wpairs);
                kn->gemm_tile_f8_pairs(1, n, steps / 2, xp, (size_t)steps / 2, 1, wpairs,
                                       (size_t)S, &pf, y, (size_t)S, 1);
                for (int c = 0; c < S; c++)
                    pairs &= y[c] == (c < n ? ones[v] * f8_want(one * S + c) : 0.0f);
                /* add = 0: the same sums stored over whatever y held, and
                 * nothing past n written */
                float ys[ML_CPU_MAX_STRIP_COLS];
                memset(ys, 0xa5, sizeof ys);
                kn->gemm_tile_f8_pairs(1, n, steps / 2, xp, (size_t)steps / 2, 1, wpairs,
                                       (size_t)S, &pf, ys, (size_t)S, 0);
                for (int c = 0; c < S; c++) {
                    uint32_t bits;
                    memcpy(&bits, &ys[c], sizeof bits);
                    stored &= c < n ? ys[c] == y[c] : bits == 0xa5a5a5a5u;
                }
            }
        }
    }
    check(pairs, "gemm_tile_f8_pairs [%s]: a code is not widened to bf16 exactly",
          ml_cpu_isa_name(kn->isa));
    check(stored, "gemm_tile_f8_pairs [%s]: add = 0 stores other sums than it adds, or past n",
          ml_cpu_isa_name(kn->isa));
}

/* Whether got holds the f32 of codes 0 .. k·S - 1 in order, exactly, and
 * its next float is still the 0xa5 fill (nothing written past the block). */
static int f8_block_widened(const float *got, int k, int S)
{
    int ok = 1;
    for (int v = 0; v < k * S; v++) {
        const float want = ml_cpu_f8_to_f32((uint8_t)v);
        ok &= memcmp(&got[v], &want, sizeof want) == 0;
    }
    uint32_t past;
    memcpy(&past, &got[k * S], sizeof past);
    return ok && past == 0xa5a5a5a5u;
}

/* FP8 in the pair layout with f32 activations (gemm_packed_f8_pairs,
 * widen_f8_pairs, where the ISA and CPU have them) against gemm_packed on
 * the strip layout, bit for bit: every code at every step, each tile
 * height, a full and a half-width tile, an even and an odd number of steps
 * (x then has no element past the last step: ASan sees a read past it),
 * each prefetch, add = 1 and 0, the widened copy and widen_f8_pairs equal
 * to the codes' f32 and not written past the steps. */
static void test_f8_pairs_f32(const ml_cpu_kernels *kn)
{
    if (!kn->gemm_packed_f8_pairs || !ml_cpu_has_avx512_vbmi())
        return;
    /* one ISA's draws: keep them out of the stream the paths compared share */
    const uint64_t rng = ml_test_rng;
    const int S = kn->strip_cols, steps = F8_CODES / S;
    uint8_t strip[F8_CODES];
    uint16_t pairs[F8_CODES / 2];
    uint8_t *wp = (uint8_t *)pairs;
    for (int p = 0; p < steps; p++)
        for (int c = 0; c < S; c++) {
            strip[ml_cpu_packed_index(S, 1, p, c)] = (uint8_t)(p * S + c);
            wp[ml_cpu_f8_pair_index(S, p, c)] = (uint8_t)(p * S + c);
        }
    int same = 1, widened = 1, stored = 1;
    for (int k = steps; k >= steps - 1; k--) {
        float got[F8_CODES + ML_CPU_MAX_STRIP_COLS];
        memset(got, 0xa5, sizeof got);
        kn->widen_f8_pairs(got, pairs, k);
        widened &= f8_block_widened(got, k, S);
        for (int m = 1; m <= kn->tile_rows; m++) {
            float *x = xmalloc((size_t)m * k * sizeof *x);
            fill(x, (size_t)m * k, -2, 2);
            for (int n = S; n >= S / 2; n -= S / 2) {
                const ml_cpu_prefetch pf = prefetch_kind(m + n, pairs, sizeof pairs);
                float want[ML_CPU_TILE_MAX_ROWS * ML_CPU_MAX_STRIP_COLS] = {0};
                float y[ML_CPU_TILE_MAX_ROWS * ML_CPU_MAX_STRIP_COLS] = {0};
                float ys[ML_CPU_TILE_MAX_ROWS * ML_CPU_MAX_STRIP_COLS];
                memset(ys, 0xa5, sizeof ys);
                memset(got, 0xa5, sizeof got);
                kn->gemm_packed(m, n, k, x, (size_t)k, strip, ML_CPU_BLOCK_F8, NULL, NULL, want,
                                (size_t)S, 1);
                kn->gemm_packed_f8_pairs(m, n, k, x, (size_t)k, pairs, &pf, got, y, (size_t)S, 1);
                kn->gemm_packed_f8_pairs(m, n, k, x, (size_t)k, pairs, &pf, NULL, ys, (size_t)S,
                                         0);
                same &= memcmp(y, want, sizeof y) == 0;
                widened &= f8_block_widened(got, k, S);
                for (int i = 0; i < m; i++)
                    for (int c = 0; c < S; c++) {
                        const size_t at = (size_t)i * S + c;
                        uint32_t past;
                        memcpy(&past, &ys[at], sizeof past);
                        stored &= c < n ? ys[at] == y[at] : past == 0xa5a5a5a5u;
                    }
            }
            free(x);
        }
    }
    rand_seed(rng);
    check(same, "gemm_packed_f8_pairs [%s]: a sum differs from gemm_packed's on the strip layout",
          ml_cpu_isa_name(kn->isa));
    check(widened,
          "widen_f8_pairs or gemm_packed_f8_pairs's copy [%s]: a code is not widened exactly, "
          "or a write past the steps",
          ml_cpu_isa_name(kn->isa));
    check(stored, "gemm_packed_f8_pairs [%s]: add = 0 stores other sums than it adds, or past n",
          ml_cpu_isa_name(kn->isa));
}

/* The packed layout and the order of every sum, bit for bit, per dtype
 * and ISA: the backend's matmul (linear_weight, then matmul or matmul_f8)
 * against a scalar model of the order matmul.c states, y = (y or 0) +
 * bias, then per K block of ORDER_KC in turn y += (the block's products
 * summed from 0 by fused multiply-adds in increasing k), FP8 then scale ·
 * sum + bias. ORDER_KC is matmul.c's GEMM_KC: it is part of the order, so
 * a change of it must show here. The vector ISAs sum with FMA (fmaf is
 * its exact model); plain C's separate multiply and add are held to the
 * summation bound by test_matmul_case instead. */
#define ORDER_KC 256

static void test_packed_order(ml_backend *be, ml_cpu_isa isa, int M)
{
    if (isa == ML_CPU_ISA_PLAIN)
        return;
    enum { K = 2 * ORDER_KC + 77, N = 71 };
    /* run on the vector paths only: keep its draws out of the stream the
     * cases compared across paths share */
    const uint64_t rng = ml_test_rng;
    float *x = xmalloc((size_t)M * K * sizeof *x);
    uint16_t *w = xmalloc((size_t)N * K * sizeof *w);
    uint8_t *w8 = xmalloc((size_t)N * K);
    uint16_t *bias = xmalloc((size_t)N * sizeof *bias);
    float *scale = xmalloc((size_t)N * sizeof *scale);
    float *y0 = xmalloc((size_t)M * N * sizeof *y0), *y = xmalloc((size_t)M * N * sizeof *y);
    float *want = xmalloc((size_t)M * N * sizeof *want);
    fill(x, (size_t)M * K, -1, 1);
    fill_bf16(w, (size_t)N * K, -1, 1);
    fill_bf16(bias, (size_t)N, -1, 1);
    fill(y0, (size_t)M * N, -1, 1);
    for (int n = 0; n < N; n++) {
        scale[n] = ml_round_bf16(frand(0.01f, 1.0f) / ML_F8E4M3_MAX);
        for (int k = 0; k < K; k++) {
            const uint8_t c = (uint8_t)irand(F8_CODES);
            w8[(size_t)n * K + k] = (c & 0x7f) == 0x7f ? c ^ 1 : c;
        }
    }
    for (int f8 = 0; f8 < 2; f8++) {
        for (int m = 0; m < M; m++) {
            for (int n = 0; n < N; n++) {
                const float b = ml_bf16_to_f32(bias[n]);
                float acc_y = f8 ? 0.0f : y0[(size_t)m * N + n] + b;
                for (int k0 = 0; k0 < K; k0 += ORDER_KC) {
                    float acc = 0.0f;
                    for (int k = k0; k < K && k < k0 + ORDER_KC; k++) {
                        const size_t at = (size_t)n * K + k;
                        acc = fmaf(x[(size_t)m * K + k],
                                   f8 ? ml_cpu_f8_to_f32(w8[at]) : ml_bf16_to_f32(w[at]), acc);
                    }
                    acc_y += acc;
                }
                want[(size_t)m * N + n] = f8 ? 1.0f * scale[n] * acc_y + b : acc_y;
            }
        }
        memcpy(y, y0, (size_t)M * N * sizeof *y);
        if (f8)
            matmul_f8_rm(be, y, x, w8, scale, bias, M, K, N, 0);
        else
            matmul_rm(be, y, x, w, bias, M, K, N, 1);
        check(memcmp(y, want, (size_t)M * N * sizeof *y) == 0,
              "packed %s [%s], M = %d: a sum is not in the stated order",
              f8 ? "F8_E4M3" : "bf16", g_isa, M);
    }
    rand_seed(rng);
    free(x);
    free(w);
    free(w8);
    free(bias);
    free(scale);
    free(y0);
    free(y);
    free(want);
}

/* ---- W8A8 ----------------------------------------------------------------------- */

/* The quantized value of v by dtype.c's conversion and back (the
 * reference: an independent rounding of the same contract). */
static float f8_round_ref(float v)
{
    return ml_f8e4m3_to_f32(ml_f32_to_f8e4m3(v));
}

/* The activation quantizer (ml_cpu_quantize_rows): the scale of random
 * rows is absmax / 448 and each element the reference's E4M3 rounding of
 * x / s; a zero row has scale 1 and zeros; a row with absmax 448 (scale 1)
 * holding every midpoint between adjacent E4M3 values, positive and
 * negative, normal and subnormal, rounds each to the neighbour with the
 * even code; and the absmax element of every random row is ±448 exactly,
 * saturated where x / s rounds above 448 (found and counted). */
static void test_quantize_rows(void)
{
    enum { K = 257, RANDOM_ROWS = 64, TIES = 2 * 126 + 1 };
    float *x = xmalloc((size_t)(RANDOM_ROWS + 1) * K * sizeof *x);
    float *qx = xmalloc((size_t)(RANDOM_ROWS + 1) * K * sizeof *qx);
    float sx[RANDOM_ROWS + 1];
    /* run on one path only: keep its draws out of the stream the cases
     * compared across paths share */
    const uint64_t rng = ml_test_rng;
    int scale_ok = 1, elems_ok = 1, absmax_ok = 1, over = 0;
    /* random rows of magnitudes 2^-20 .. 2^20 (scales far from 1) */
    for (int m = 0; m < RANDOM_ROWS; m++) {
        const float mag = ldexpf(1.0f, irand(41) - 20);
        fill(x + (size_t)m * K, K, -mag, mag);
    }
    memset(x + (size_t)RANDOM_ROWS * K, 0, K * sizeof *x);
    ml_cpu_quantize_rows(qx, sx, x, 0, RANDOM_ROWS + 1, K);
    for (int m = 0; m < RANDOM_ROWS; m++) {
        const float *xr = x + (size_t)m * K, *qr = qx + (size_t)m * K;
        float amax = 0.0f;
        for (int k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(xr[k]));
        const float s = amax / ML_F8E4M3_MAX;
        scale_ok &= sx[m] == s;
        for (int k = 0; k < K; k++) {
            elems_ok &= qr[k] == f8_round_ref(xr[k] / s);
            if (fabsf(xr[k]) == amax) {
                absmax_ok &= fabsf(qr[k]) == ML_F8E4M3_MAX;
                over += fabsf(xr[k] / s) > ML_F8E4M3_MAX;
            }
        }
    }
    int zero_ok = sx[RANDOM_ROWS] == 1.0f;
    for (int k = 0; k < K; k++)
        zero_ok &= qx[(size_t)RANDOM_ROWS * K + k] == 0.0f;
    /* the ties row: 448 first (scale 1), then the midpoints of codes
     * c, c + 1 for c = 0 .. 125 (126 is 448's code), each sign */
    float ties[TIES];
    ties[0] = ML_F8E4M3_MAX;
    for (int c = 0; c < 126; c++) {
        const float mid = (ml_f8e4m3_to_f32((uint8_t)c) + ml_f8e4m3_to_f32((uint8_t)(c + 1))) / 2;
        ties[1 + 2 * c] = mid;
        ties[2 + 2 * c] = -mid;
    }
    ml_cpu_quantize_rows(qx, sx, ties, 0, 1, TIES);
    int ties_ok = sx[0] == 1.0f;
    for (int c = 0; c < 126; c++) {
        const int even = c % 2 == 0 ? c : c + 1;
        const float want = ml_f8e4m3_to_f32((uint8_t)even);
        ties_ok &= qx[1 + 2 * c] == want && qx[2 + 2 * c] == -want;
    }
    check(scale_ok, "quantize_rows: a scale is not absmax / 448");
    check(elems_ok, "quantize_rows: an element is not the E4M3 rounding of x / s");
    check(absmax_ok, "quantize_rows: an absmax element is not ±448 (%d rounded above 448)", over);
    check(zero_ok, "quantize_rows: a zero row is not scale 1 and zeros");
    check(ties_ok, "quantize_rows: a midpoint does not round to the even code");
    printf("  quantize_rows: %d rows, %d absmax elements saturated from above 448, %d ties\n",
           RANDOM_ROWS, over, 2 * 126);
    rand_seed(rng);
    free(x);
    free(qx);
}

/* matmul_f8 with quant_x against a double reference of the contract (the
 * quantizer's qx and s_x, q widened, Σ qx·q in double times s_x·scale plus
 * bias), within the f32 summation bound of test_matmul_case (qx·q is
 * exact, so the sum is the only rounding past the quantization, with one
 * more for the scale product); bitwise equal to the W8A16 op run on the
 * quantized rows with its scale times s_x (the same driver, so the
 * regimes' batch invariance carries over), at every M on both sides of
 * the GEMV/GEMM switch, with and without bias; a zero row gives the bias;
 * and a batch equals its rows alone. */
static void test_matmul_f8_a8(ml_backend *be)
{
    enum { K = 1031, N = 67, MAX_M = 40 };
    float *x = xmalloc((size_t)MAX_M * K * sizeof *x);
    float *qx = xmalloc((size_t)MAX_M * K * sizeof *qx);
    float sx[MAX_M];
    float *y = xmalloc((size_t)MAX_M * N * sizeof *y);
    float *y16 = xmalloc((size_t)MAX_M * N * sizeof *y16);
    float *alone = xmalloc((size_t)MAX_M * N * sizeof *alone);
    uint8_t *w8 = xmalloc((size_t)N * K);
    uint16_t *bias = xmalloc((size_t)N * sizeof *bias);
    float *scale = xmalloc((size_t)N * sizeof *scale);
    float *srow = xmalloc((size_t)N * sizeof *srow);
    fill(x, (size_t)MAX_M * K, -2, 2);
    memset(x + (size_t)3 * K, 0, K * sizeof *x); /* row 3 is zero */
    fill_bf16(bias, (size_t)N, -1, 1);
    for (int n = 0; n < N; n++) {
        scale[n] = ml_round_bf16(frand(0.01f, 1.0f) / ML_F8E4M3_MAX);
        for (int k = 0; k < K; k++) {
            uint8_t c = (uint8_t)irand(256);
            w8[(size_t)n * K + k] = (c & 0x7f) == 0x7f ? c ^ 1 : c;
        }
    }
    ml_cpu_quantize_rows(qx, sx, x, 0, MAX_M, K);
    double worst = 0;
    int bound_ok = 1, same = 1, first_bad = 0, zero_ok = 1;
    for (int M = 1; M <= MAX_M; M++) {
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const uint16_t *b = with_bias ? bias : NULL;
            matmul_f8_rm(be, y, x, w8, scale, b, M, K, N, 1);
            int ok = 1;
            for (int m = 0; m < M; m++) {
                for (int n = 0; n < N; n++)
                    srow[n] = sx[m] * scale[n];
                matmul_f8_rm(be, y16 + (size_t)m * N, qx + (size_t)m * K, w8, srow, b, 1, K,
                                   N, 0);
            }
            ok &= memcmp(y, y16, (size_t)M * N * sizeof *y) == 0;
            if (!ok && same)
                first_bad = M;
            same &= ok;
            if (M != MAX_M)
                continue;
            for (int m = 0; m < M; m++) {
                for (int n = 0; n < N; n++) {
                    double s = 0, a = 0;
                    for (int k = 0; k < K; k++) {
                        const double p = (double)qx[(size_t)m * K + k] *
                                         ml_f8e4m3_to_f32(w8[(size_t)n * K + k]);
                        s += p;
                        a += fabs(p);
                    }
                    const double sc = (double)sx[m] * scale[n];
                    const double bn = with_bias ? ml_bf16_to_f32(bias[n]) : 0.0;
                    const double want = s * sc + bn, got = y[(size_t)m * N + n];
                    const double bound = (K + 3) * U * (a * sc + fabs(bn)) * 1.01;
                    bound_ok &= fabs(got - want) <= bound;
                    if (bound > 0 && fabs(got - want) / bound > worst)
                        worst = fabs(got - want) / bound;
                    if (m == 3)
                        zero_ok &= got == (float)bn;
                }
            }
        }
    }
    check(bound_ok, "matmul_f8 W8A8 [%s]: beyond the f32 summation bound of the double "
          "reference (worst err/bound %.3g)", g_isa, worst);
    check(same, "matmul_f8 W8A8 [%s]: M = %d is not the W8A16 op on the quantized rows", g_isa,
          first_bad);
    check(zero_ok, "matmul_f8 W8A8 [%s]: a zero row is not the bias", g_isa);
    for (int m = 0; m < MAX_M; m++)
        matmul_f8_rm(be, alone + (size_t)m * N, x + (size_t)m * K, w8, scale, bias, 1, K, N,
                           1);
    matmul_f8_rm(be, y, x, w8, scale, bias, MAX_M, K, N, 1);
    check(memcmp(y, alone, (size_t)MAX_M * N * sizeof *y) == 0,
          "matmul_f8 W8A8 [%s]: a batch of %d rows differs from the rows alone", g_isa, MAX_M);
    printf("  matmul_f8 W8A8 [%s]: worst err/bound %.3g against the double reference\n", g_isa,
           worst);
    free(x);
    free(qx);
    free(y);
    free(y16);
    free(alone);
    free(w8);
    free(bias);
    free(scale);
    free(srow);
}

/* The widenings, bit for bit against the scalar conversions: widen_strip
 * (the grouped matmul's) and the copy gemm_packed leaves as it goes (the
 * first row tile's over a decode block), of every bf16 value (NaN
 * payloads too) and every F8_E4M3 code, each at its place in a strip, and
 * nothing written past the block's k steps. */
static void test_widen_strip(const ml_cpu_kernels *kn)
{
    /* every bf16 value; those below 2.0 in magnitude (bits under 0x4000,
     * zeros and subnormals among them), whose sums stay finite */
    enum { BF16_VALUES = 65536, BF16_BELOW_TWO = 0x4000 };
    const int S = kn->strip_cols;
    uint16_t *w = xmalloc(BF16_VALUES * sizeof *w);
    uint8_t w8[F8_CODES];
    float *got = xmalloc((BF16_VALUES + ML_CPU_MAX_STRIP_COLS) * sizeof *got);
    float *left = xmalloc((BF16_VALUES + ML_CPU_MAX_STRIP_COLS) * sizeof *left);
    float *x = xmalloc(BF16_VALUES * sizeof *x);
    float y[ML_CPU_MAX_STRIP_COLS];
    int same = 1, copied = 1, stored = 1;
    for (int f8 = 0; f8 < 2; f8++) {
        const int steps = (f8 ? F8_CODES : BF16_VALUES) / S;
        for (int p = 0; p < steps; p++)
            for (int c = 0; c < S; c++) {
                const int v = p * S + c;
                if (f8)
                    w8[ml_cpu_packed_index(S, 1, p, c)] = (uint8_t)v;
                else
                    w[ml_cpu_packed_index(S, 0, p, c)] = (uint16_t)v;
            }
        memset(got, 0xa5, (BF16_VALUES + ML_CPU_MAX_STRIP_COLS) * sizeof *got);
        memset(left, 0xa5, (BF16_VALUES + ML_CPU_MAX_STRIP_COLS) * sizeof *left);
        const void *strip = f8 ? (const void *)w8 : (const void *)w;
        kn->widen_strip(got, strip, f8, steps);
        for (int p = 0; p < steps; p++) /* no draws: the paths compared share the stream */
            x[p] = (float)(p % 7 - 3) * 0.25f;
        const ml_cpu_block src = f8 ? ML_CPU_BLOCK_F8 : ML_CPU_BLOCK_BF16;
        memset(y, 0, sizeof y);
        kn->gemm_packed(1, S, steps, x, (size_t)steps, strip, src, NULL, left, y, (size_t)S, 1);
        for (int v = 0; v < steps * S; v++) {
            const float want = f8 ? ml_cpu_f8_to_f32((uint8_t)v) : ml_bf16_to_f32((uint16_t)v);
            same &= memcmp(&got[v], &want, sizeof want) == 0;
            copied &= memcmp(&left[v], &want, sizeof want) == 0;
        }
        uint32_t past;
        memcpy(&past, &got[steps * S], sizeof past);
        same &= past == 0xa5a5a5a5u;
        memcpy(&past, &left[steps * S], sizeof past);
        copied &= past == 0xa5a5a5a5u;
        /* and the copy read back gives the packed strip's sums, over steps
         * whose sums are finite (the bf16 sweep's infinities and NaNs
         * would make every sum NaN) */
        const int summed = f8 ? steps : BF16_BELOW_TWO / S;
        float y32[ML_CPU_MAX_STRIP_COLS] = {0};
        memset(y, 0, sizeof y);
        kn->gemm_packed(1, S, summed, x, (size_t)steps, strip, src, NULL, NULL, y, (size_t)S, 1);
        kn->gemm_packed(1, S, summed, x, (size_t)steps, left, ML_CPU_BLOCK_F32, NULL, NULL, y32,
                        (size_t)S, 1);
        for (int c = 0; c < S; c++)
            copied &= isfinite(y[c]) && memcmp(&y[c], &y32[c], sizeof y[c]) == 0;
        /* add = 0: the same sums stored over whatever y held (== : a sum of
         * exactly 0 may be -0 where 0 + sum is +0) */
        float ys[ML_CPU_MAX_STRIP_COLS], y32s[ML_CPU_MAX_STRIP_COLS];
        memset(ys, 0xa5, sizeof ys);
        memset(y32s, 0xa5, sizeof y32s);
        kn->gemm_packed(1, S, summed, x, (size_t)steps, strip, src, NULL, NULL, ys, (size_t)S, 0);
        kn->gemm_packed(1, S, summed, x, (size_t)steps, left, ML_CPU_BLOCK_F32, NULL, NULL, y32s,
                        (size_t)S, 0);
        for (int c = 0; c < S; c++)
            stored &= ys[c] == y[c] && y32s[c] == y[c];
    }
    check(same, "widen_strip [%s]: a value is not widened exactly, or a write past the block",
          ml_cpu_isa_name(kn->isa));
    check(copied,
          "gemm_packed [%s]: its widened copy differs from the strip's values, writes past "
          "the block, or reads back to other sums",
          ml_cpu_isa_name(kn->isa));
    check(stored, "gemm_packed [%s]: add = 0 stores other sums than it adds",
          ml_cpu_isa_name(kn->isa));
    free(w);
    free(got);
    free(left);
    free(x);
}

/* The bf16 operands' rounding (bf16_pairs, bf16_pair_rows, where the ISA
 * has them) against ml_cpu_bf16_pair, bit for bit: random values over the
 * whole exponent range and every special kind, at every length to past two
 * vectors (the masked tails, odd lengths). */
static void test_bf16_rounding(const ml_cpu_kernels *kn)
{
    if (!kn->bf16_pairs)
        return;
    enum { MAX_N = 40 };
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u, /* zeros, subnormals */
        0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f80ffffu,             /* ties, either side */
        0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,             /* max (to inf), infs */
        0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, 0xffbfffffu, /* NaNs */
    };
    const size_t n_special = sizeof special / sizeof special[0];
    float lo[MAX_N], hi[MAX_N];
    uint32_t got[MAX_N], want[MAX_N];
    const uint64_t rng = ml_test_rng;
    int same = 1;
    for (int round = 0; round < 64; round++) {
        for (int i = 0; i < MAX_N; i++) {
            uint32_t b[2];
            for (int h = 0; h < 2; h++)
                b[h] = (round + i + h) % 3 == 0 ? special[(size_t)(round * 7 + i * 3 + h) % n_special]
                                                : (uint32_t)(urand() * 4294967296.0);
            memcpy(&lo[i], &b[0], sizeof lo[i]);
            memcpy(&hi[i], &b[1], sizeof hi[i]);
        }
        for (size_t n = 0; n <= MAX_N; n++) {
            memset(got, 0xa5, sizeof got);
            kn->bf16_pairs(got, lo, n);
            for (size_t q = 0; q < (n + 1) / 2; q++)
                same &= got[q] == ml_cpu_bf16_pair(lo[2 * q], 2 * q + 1 < n ? lo[2 * q + 1] : 0.0f);
            same &= (n + 1) / 2 == MAX_N || got[(n + 1) / 2] == 0xa5a5a5a5u; /* no write past */
            memset(got, 0xa5, sizeof got);
            kn->bf16_pair_rows(got, lo, hi, n);
            for (size_t i = 0; i < n; i++)
                want[i] = ml_cpu_bf16_pair(lo[i], hi[i]);
            same &= memcmp(got, want, n * sizeof *got) == 0;
            same &= n == MAX_N || got[n] == 0xa5a5a5a5u;
        }
    }
    check(same, "bf16 rounding [%s]: a pair differs from ml_cpu_bf16_pair",
          ml_cpu_isa_name(kn->isa));
    rand_seed(rng);
}

/* The register tile (attention's scores and PV, the vector ISAs' f32 GEMM
 * blocks) at every shape up to the ISA's, A row- and column-major: with
 * add = 0 the sum is stored over whatever C held and nothing outside the
 * m x n tile is written; with add = 1 over C0 it is C0 + that sum, bit for
 * bit; both layouts give the same bits; and on the vector ISAs each sum is
 * the fused multiply-adds from 0 in increasing p (fmaf, their exact
 * model). Plain C's separate multiply and add are held to the summation
 * bound by the attention and matmul tests instead. */
static void test_gemm_tile(const ml_cpu_kernels *kn)
{
    static const int Ks[] = {0, 1, 37};
    enum { MAX_K = 37, LDC = ML_CPU_TILE_MAX_COLS + 3, C_ROWS = ML_CPU_TILE_MAX_ROWS + 1 };
    const int R = kn->tile_rows, W = kn->tile_cols;
    float a[ML_CPU_TILE_MAX_ROWS * MAX_K], at[MAX_K * ML_CPU_TILE_MAX_ROWS];
    float b[MAX_K * ML_CPU_TILE_MAX_COLS];
    float c0[C_ROWS * LDC], stored[C_ROWS * LDC], stored_t[C_ROWS * LDC], added[C_ROWS * LDC];
    /* The draws depend on the ISA's tile shape: keep them out of the
     * stream the later cases share across paths. */
    const uint64_t rng = ml_test_rng;
    int exact = 1, layouts = 1, sums = 1, outside = 1;
    for (size_t t = 0; t < sizeof Ks / sizeof Ks[0]; t++) {
        const int k = Ks[t];
        fill(a, (size_t)R * MAX_K, -1, 1);
        fill(b, (size_t)MAX_K * W, -1, 1);
        fill(c0, C_ROWS * LDC, -1, 1);
        for (int i = 0; i < R; i++)
            for (int p = 0; p < k; p++)
                at[(size_t)p * R + i] = a[(size_t)i * k + p];
        for (int m = 1; m <= R; m++) {
            for (int n = 1; n <= W; n++) {
                memset(stored, 0xa5, sizeof stored);
                memset(stored_t, 0xa5, sizeof stored_t);
                memcpy(added, c0, sizeof added);
                kn->gemm_tile(m, n, k, a, (size_t)k, 1, b, (size_t)W, stored, LDC, 0);
                kn->gemm_tile(m, n, k, at, 1, (size_t)R, b, (size_t)W, stored_t, LDC, 0);
                kn->gemm_tile(m, n, k, a, (size_t)k, 1, b, (size_t)W, added, LDC, 1);
                for (int i = 0; i < C_ROWS; i++) {
                    for (int j = 0; j < LDC; j++) {
                        const size_t e = (size_t)i * LDC + (size_t)j;
                        uint32_t bits, bits_t;
                        memcpy(&bits, &stored[e], sizeof bits);
                        memcpy(&bits_t, &stored_t[e], sizeof bits_t);
                        if (i >= m || j >= n) {
                            outside &= bits == 0xa5a5a5a5u && bits_t == 0xa5a5a5a5u &&
                                       memcmp(&added[e], &c0[e], sizeof c0[e]) == 0;
                            continue;
                        }
                        layouts &= memcmp(&stored[e], &stored_t[e], sizeof stored[e]) == 0;
                        const float sum = c0[e] + stored[e];
                        sums &= memcmp(&added[e], &sum, sizeof sum) == 0;
                        if (kn->isa == ML_CPU_ISA_PLAIN)
                            continue;
                        float want = 0.0f;
                        for (int p = 0; p < k; p++)
                            want = fmaf(a[(size_t)i * k + p], b[(size_t)p * W + j], want);
                        exact &= stored[e] == want;
                    }
                }
            }
        }
    }
    const char *isa = ml_cpu_isa_name(kn->isa);
    check(exact, "gemm_tile [%s]: a sum is not the fused multiply-adds in increasing p", isa);
    check(layouts, "gemm_tile [%s]: A column-major gives other bits than row-major", isa);
    check(sums, "gemm_tile [%s]: add = 1 is not C plus the sum add = 0 stores", isa);
    check(outside, "gemm_tile [%s]: a write outside the m x n tile", isa);
    rand_seed(rng);
}

/* The AMX tile (bf16 activations on a CPU with AMX-BF16), at every shape up
 * to its 32 rows and the strip's columns and over pair counts with and
 * without a short last chunk: each element's bits are those of the 1 x 1
 * call on its row of A and its column of B (the kernel's batch
 * invariance); add = 0 stores nothing outside the m x n tile; a call over
 * the first chunk and one adding the rest give one call's bits; the sum
 * holds the summation bound against the double reference; a subnormal
 * input counts as zero, as the contract says. */
static void test_gemm_tile_amx(const ml_cpu_kernels *kn)
{
    if (!kn->gemm_tile_amx || !ml_cpu_has_amx_bf16()) {
        fprintf(stderr, "gemm_tile_amx [%s]: no AMX-BF16 here\n", ml_cpu_isa_name(kn->isa));
        return;
    }
    enum {
        R = ML_CPU_AMX_TILE_ROWS,
        S = ML_CPU_MAX_STRIP_COLS,
        CHUNK = ML_CPU_AMX_CHUNK_PAIRS,
        MAX_KP = 2 * CHUNK + 5,
        A_ROWS = R + ML_CPU_AMX_ROW_STEP - 1, /* the rows a tile load reads past m */
        LDB = S + 8, /* B's rows longer than the strip: the attention's Qᵀ */
        LDC = S + 3,
        C_ROWS = R + 1,
    };
    static const int kps[] = {0, 1, CHUNK, CHUNK + 5, MAX_KP};
    static uint32_t a[A_ROWS * MAX_KP], b[MAX_KP * LDB], bj[MAX_KP * S];
    static float c0[C_ROWS * LDC], stored[C_ROWS * LDC], added[C_ROWS * LDC], one[R * S];
    const uint64_t rng = ml_test_rng;
    int alone = 1, outside = 1, chunked = 1, bounded = 1;
    for (size_t t = 0; t < sizeof kps / sizeof kps[0]; t++) {
        const int kp = kps[t];
        for (size_t e = 0; e < sizeof a / sizeof a[0]; e++)
            a[e] = ml_cpu_bf16_pair(2 * urand() - 1, 2 * urand() - 1);
        for (size_t e = 0; e < sizeof b / sizeof b[0]; e++)
            b[e] = ml_cpu_bf16_pair(2 * urand() - 1, 2 * urand() - 1);
        fill(c0, C_ROWS * LDC, -1, 1);
        /* each element alone: row i of A against column j of B moved to column 0 */
        for (int j = 0; j < S; j++) {
            memset(bj, 0, sizeof bj);
            for (int p = 0; p < kp; p++)
                bj[(size_t)p * S] = b[(size_t)p * LDB + j];
            for (int i = 0; i < R; i++) {
                kn->gemm_tile_amx(1, 1, kp, a + (size_t)i * MAX_KP, MAX_KP, bj, S, NULL,
                                  &one[i * S + j], 1, 0);
                double want = 0, mag = 0;
                for (int p = 0; p < kp; p++) {
                    const uint32_t ap = a[(size_t)i * MAX_KP + p], bp = b[(size_t)p * LDB + j];
                    for (int h = 0; h < 2; h++) {
                        const double prod = (double)ml_bf16_to_f32((uint16_t)(ap >> 16 * h)) *
                                            ml_bf16_to_f32((uint16_t)(bp >> 16 * h));
                        want += prod;
                        mag += fabs(prod);
                    }
                }
                bounded &= fabs(one[i * S + j] - want) <= (2 * kp + 3) * U * mag;
            }
        }
        for (int m = 1; m <= R; m++) {
            for (int n = 1; n <= S; n++) {
                const ml_cpu_prefetch pf = prefetch_kind(m + n, b, (size_t)kp * LDB * sizeof *b);
                memset(stored, 0xa5, sizeof stored);
                memcpy(added, c0, sizeof added);
                kn->gemm_tile_amx(m, n, kp, a, MAX_KP, b, LDB, &pf, stored, LDC, 0);
                kn->gemm_tile_amx(m, n, kp, a, MAX_KP, b, LDB, &pf, added, LDC, 1);
                for (int i = 0; i < C_ROWS; i++) {
                    for (int j = 0; j < LDC; j++) {
                        const size_t e = (size_t)i * LDC + (size_t)j;
                        uint32_t bits;
                        memcpy(&bits, &stored[e], sizeof bits);
                        if (i >= m || j >= n)
                            outside &= bits == 0xa5a5a5a5u &&
                                       memcmp(&added[e], &c0[e], sizeof c0[e]) == 0;
                        else
                            alone &= memcmp(&stored[e], &one[i * S + j], sizeof one[0]) == 0;
                    }
                }
                if (kp <= CHUNK)
                    continue;
                memcpy(stored, c0, sizeof stored);
                kn->gemm_tile_amx(m, n, CHUNK, a, MAX_KP, b, LDB, NULL, stored, LDC, 1);
                kn->gemm_tile_amx(m, n, kp - CHUNK, a + CHUNK, MAX_KP, b + (size_t)CHUNK * LDB,
                                  LDB, NULL, stored, LDC, 1);
                chunked &= memcmp(stored, added, sizeof stored) == 0;
            }
        }
    }
    /* 2^-133 (a bf16 subnormal) times 2^127: 2^-6 were it not counted as zero */
    const uint32_t sub = ml_cpu_bf16_pair(0x1p-133f, 0.0f);
    uint32_t big[S] = {ml_cpu_bf16_pair(0x1p127f, 0.0f)}; /* a B row as the kernel reads it */
    float daz = -1.0f;
    kn->gemm_tile_amx(1, 1, 1, &sub, 1, big, S, NULL, &daz, 1, 0);
    const char *isa = ml_cpu_isa_name(kn->isa);
    check(alone, "gemm_tile_amx [%s]: an element's bits depend on the tile around it", isa);
    check(outside, "gemm_tile_amx [%s]: a write outside the m x n tile", isa);
    check(chunked, "gemm_tile_amx [%s]: two calls over the chunks differ from one", isa);
    check(bounded, "gemm_tile_amx [%s]: a sum outside the summation bound", isa);
    check(daz == 0.0f, "gemm_tile_amx [%s]: a subnormal input gave %g, not 0", isa, daz);
    rand_seed(rng);
}

/* LoRA's gemv: dot (r, j) of every block shape equals the 1 x 1 block's, bit for bit. */
static void test_gemv_kernel(const ml_cpu_kernels *kn)
{
    static const int Ks[] = {1, 15, 16, 37, 300, 1031};
    const int max_r = kn->gemv_rows, max_c = kn->gemv_cols, max_k = 1031;
    uint16_t *w = xmalloc((size_t)max_r * max_k * sizeof *w);
    float *x = xmalloc((size_t)max_c * max_k * sizeof *x);
    float one[ML_CPU_GEMV_MAX_ROWS][ML_CPU_GEMV_MAX_COLS];
    float dots[ML_CPU_GEMV_MAX_ROWS * ML_CPU_GEMV_MAX_COLS];
    /* The draws depend on the ISA's block shape: keep them out of the
     * stream the later cases share across paths. */
    const uint64_t rng = ml_test_rng;
    int same = 1;
    for (size_t t = 0; t < sizeof Ks / sizeof Ks[0]; t++) {
        const int K = Ks[t];
        fill_bf16(w, (size_t)max_r * K, -1, 1);
        fill(x, (size_t)max_c * K, -1, 1);
        for (int r = 0; r < max_r; r++)
            for (int j = 0; j < max_c; j++)
                kn->gemv(1, 1, K, w + (size_t)r * K, (size_t)K, x + (size_t)j * K, (size_t)K,
                         &one[r][j]);
        for (int rows = 1; rows <= max_r; rows++) {
            for (int cols = 1; cols <= max_c; cols++) {
                /* the block starting at the last rows / cols, so each dot
                 * moves to another place in the block as the shape grows */
                const int r0 = max_r - rows, j0 = max_c - cols;
                kn->gemv(rows, cols, K, w + (size_t)r0 * K, (size_t)K, x + (size_t)j0 * K,
                         (size_t)K, dots);
                for (int r = 0; r < rows; r++)
                    for (int j = 0; j < cols; j++)
                        same &= memcmp(&dots[r * cols + j], &one[r0 + r][j0 + j],
                                       sizeof *dots) == 0;
            }
        }
    }
    check(same, "gemv [%s]: a dot depends on the block shape", ml_cpu_isa_name(kn->isa));
    rand_seed(rng);
    free(w);
    free(x);
}

/* Opt-in bf16 activations: on a CPU with AVX-512 BF16 the matmul against
 * the reference on rounded x and batch invariant, as the f32 path, on AMX
 * where the CPU has it and on the vector kernel (ML_CPU_AMX=0); refused
 * with ML_ERR_UNSUPPORTED on every other path, and once a Linear is bound. */
/* A one-thread backend with bf16 activations on the vector kernel. */
static ml_backend *vector_bf16_backend(ml_cpu_isa isa)
{
    char err[ERRLEN] = "";
    const char *was = getenv("ML_CPU_AMX");
    char *saved = was ? strdup(was) : NULL;
    setenv("ML_CPU_AMX", "0", 1);
    ml_backend *be = cpu_ops_create(isa, 1, err, sizeof err);
    const ml_status st = be ? ml_backend_cpu_bf16_activations(be, err, sizeof err) : ML_ERR_NOMEM;
    check(st == ML_OK, "bf16 activations on the vector kernel [%s]: %s", g_isa, err);
    if (saved)
        setenv("ML_CPU_AMX", saved, 1);
    else
        unsetenv("ML_CPU_AMX");
    free(saved);
    if (st == ML_OK)
        return be;
    if (be)
        be->ops->destroy(be);
    return NULL;
}

static void test_bf16_activations_on(ml_cpu_isa isa, int amx)
{
    const int threads[N_BACKENDS] = {1, THREADS_MANY};
    const int supported = isa == ML_CPU_ISA_AVX512 && ml_cpu_has_avx512_bf16();
    ml_backend *be[N_BACKENDS];
    int ready = 1;
    for (int b = 0; b < N_BACKENDS; b++) {
        char err[ERRLEN] = "";
        be[b] = cpu_ops_create(isa, threads[b], err, sizeof err);
        check(be[b] != NULL, "create %s x%d: %s", g_isa, threads[b], err);
        if (!be[b])
            return;
        const ml_status st = ml_backend_cpu_bf16_activations(be[b], err, sizeof err);
        check(st == (supported ? ML_OK : ML_ERR_UNSUPPORTED),
              "bf16 activations [%s]: status %d (%s), want %s", g_isa, (int)st, err,
              supported ? "OK" : "UNSUPPORTED");
        ready &= st == ML_OK;
        if (st == ML_OK)
            check((strstr(be[b]->ops->name, "-amx") != NULL) == amx,
                  "bf16 activations [%s]: backend %s, AMX wanted %d", g_isa, be[b]->ops->name,
                  amx);
    }
    if (ready) {
        test_matmul(be, 1);
        test_matmul_batch_invariance(be[0]);
        test_matmul_batch_invariance(be[1]);
        /* FP8 on the pair kernel: the bf16 sum of its codes on that kernel,
         * as in f32 (with AMX, the bf16 Linears' sums are the AMX kernel's) */
        if (ml_cpu_has_avx512_vbmi())
            for (int b = 0; b < N_BACKENDS; b++) {
                ml_backend *ref = amx ? vector_bf16_backend(isa) : be[b];
                if (ref)
                    test_matmul_f8(be[b], ref);
                if (ref && ref != be[b])
                    ref->ops->destroy(ref);
                test_matmul_f8_a8(be[b]);
            }
        else
            fprintf(stderr, "bf16 activations [%s]: FP8 keeps f32 activations without "
                            "AVX512_VBMI\n", g_isa);
    } else {
        fprintf(stderr, "bf16 activations [%s]: not on this CPU, refused as they must be\n",
                g_isa);
    }
    for (int b = 0; b < N_BACKENDS; b++)
        be[b]->ops->destroy(be[b]);
    if (!supported)
        return;

    char err[ERRLEN] = "";
    ml_backend *late = cpu_ops_create(isa, 1, err, sizeof err);
    check(late != NULL, "create %s: %s", g_isa, err);
    if (!late)
        return;
    static const uint16_t one[1] = {0x3f80};
    const void *w = late->ops->linear_weight(late, one, 1, 1, sizeof one[0]);
    check(w != NULL, "linear_weight 1 x 1");
    check(ml_backend_cpu_bf16_activations(late, err, sizeof err) == ML_ERR_INVALID_ARG &&
              strstr(err, "already packed"),
          "bf16 activations refused once a Linear is packed: %s", err);
    late->ops->linear_weight_free(late, w);
    check(ml_backend_cpu_bf16_activations(late, err, sizeof err) == ML_OK,
          "bf16 activations once the Linear is freed: %s", err);
    late->ops->destroy(late);
}

static void test_bf16_activations(ml_cpu_isa isa)
{
    const int amx = isa == ML_CPU_ISA_AVX512 && ml_cpu_has_amx_bf16();
    char err[ERRLEN] = "";
    int out = -1;
    setenv("ML_CPU_AMX", "yes", 1);
    check(ml_cpu_amx_select(&out, err, sizeof err) == ML_ERR_INVALID_ARG && out == -1,
          "ML_CPU_AMX=yes: %s", err);
    setenv("ML_CPU_AMX", "1", 1);
    const ml_status forced = ml_cpu_amx_select(&out, err, sizeof err);
    check(ml_cpu_has_amx_bf16() ? forced == ML_OK && out == 1 : forced == ML_ERR_UNSUPPORTED,
          "ML_CPU_AMX=1: status %d (%s)", (int)forced, err);
    /* both kernels see the same inputs: the later one's cases compare with
     * the first's by name (cpu_ops_util.h) */
    const uint64_t rng = ml_test_rng;
    if (amx) {
        setenv("ML_CPU_AMX", "", 1);
        test_bf16_activations_on(isa, 1);
        rand_seed(rng);
    } else if (isa == ML_CPU_ISA_AVX512) {
        fprintf(stderr, "bf16 activations [%s]: no AMX-BF16 here, the vector kernel only\n",
                g_isa);
    }
    setenv("ML_CPU_AMX", "0", 1);
    test_bf16_activations_on(isa, 0);
    unsetenv("ML_CPU_AMX");
}

static void run_path(ml_backend *be[N_BACKENDS], ml_cpu_isa isa)
{
    test_gemm_tile(ml_cpu_kernels_for(isa));
    test_gemm_tile_amx(ml_cpu_kernels_for(isa));
    test_gemv_kernel(ml_cpu_kernels_for(isa));
    test_bf16_rounding(ml_cpu_kernels_for(isa));
    test_f8_codes(ml_cpu_kernels_for(isa));
    test_f8_pairs_f32(ml_cpu_kernels_for(isa));
    test_widen_strip(ml_cpu_kernels_for(isa));
    if (isa == ML_CPU_ISA_PLAIN) /* the quantizer is plain C on every ISA */
        test_quantize_rows();
    test_matmul(be, 0);
    test_matmul_batch_invariance(be[0]);
    test_matmul_batch_invariance(be[1]);
    /* 13 rows: gemm_packed; 200 on one thread: at least 16 row tiles,
     * whose blocks are widened for gemm_tile (matmul.c) */
    test_packed_order(be[0], isa, 13);
    test_packed_order(be[1], isa, 13);
    test_packed_order(be[0], isa, 200);
    test_matmul_f8(be[0], be[0]);
    test_matmul_f8(be[1], be[1]);
    test_matmul_f8_a8(be[0]);
    test_matmul_f8_a8(be[1]);
    test_bf16_activations(isa);
}

int main(void)
{
    return cpu_ops_run_paths(run_path, 0);
}

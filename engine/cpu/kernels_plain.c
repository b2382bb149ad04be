/* Portable kernels: the readable reference of cpu_kernels.h, and the path
 * used on CPUs without AVX2. Plain loops, f32 accumulation in the order the
 * contract states. */
#include <assert.h>
#include <math.h>

#include "cpu/cpu_kernels.h"
#include "dtype.h"

/* Shapes the drivers tile with; the loops below accept any size. */
#define TILE_ROWS 4
#define TILE_COLS 16
#define GEMV_ROWS 4
#define GEMV_COLS 4
#define STRIP_COLS 16

static void gemm_tile(int m, int n, int k, const float *a, size_t a_rs, size_t a_cs,
                      const float *b, size_t ldb, float *c, size_t ldc, int add)
{
    for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int p = 0; p < k; p++)
                acc += a[(size_t)i * a_rs + (size_t)p * a_cs] * b[(size_t)p * ldb + j];
            c[(size_t)i * ldc + j] = add ? c[(size_t)i * ldc + j] + acc : acc;
        }
    }
}

static void gemv(int rows, int cols, int K, const uint16_t *w, size_t ldw, const float *x,
                 size_t ldx, float *dots)
{
    for (int r = 0; r < rows; r++) {
        for (int j = 0; j < cols; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc += ml_bf16_to_f32(w[(size_t)r * ldw + k]) * x[(size_t)j * ldx + k];
            dots[r * cols + j] = acc;
        }
    }
}

/* The f32 of column c at step p of a packed strip (bf16, or F8_E4M3 codes
 * for f8 != 0), exactly. */
static float strip_value(const void *w, int f8, int p, int c)
{
    const size_t at = ml_cpu_packed_index(STRIP_COLS, f8, p, c);
    return f8 ? ml_cpu_f8_to_f32(((const uint8_t *)w)[at])
              : ml_bf16_to_f32(((const uint16_t *)w)[at]);
}

static void widen_strip(float *dst, const void *w, int f8, int k)
{
    for (int p = 0; p < k; p++)
        for (int c = 0; c < STRIP_COLS; c++)
            dst[(size_t)p * STRIP_COLS + c] = strip_value(w, f8, p, c);
}

/* The same of a block gemm_packed reads. */
static float block_value(const void *w, ml_cpu_block src, int p, int c)
{
    return src == ML_CPU_BLOCK_F32 ? ((const float *)w)[(size_t)p * STRIP_COLS + (size_t)c]
                                   : strip_value(w, src == ML_CPU_BLOCK_F8, p, c);
}

static void gemm_packed(int m, int n, int k, const float *x, size_t ldx, const void *w,
                        ml_cpu_block src, const ml_cpu_prefetch *pf, float *widened, float *y,
                        size_t ldy, int add)
{
    (void)pf; /* no prefetch: the readable reference */
    for (int i = 0; i < m; i++) {
        for (int c = 0; c < n; c++) {
            float acc = 0.0f;
            for (int p = 0; p < k; p++)
                acc += x[(size_t)i * ldx + p] * block_value(w, src, p, c);
            y[(size_t)i * ldy + c] = add ? y[(size_t)i * ldy + c] + acc : acc;
        }
    }
    if (widened && src != ML_CPU_BLOCK_F32)
        widen_strip(widened, w, src == ML_CPU_BLOCK_F8, k);
}

static void softmax_block(float *s, size_t lds, int nk, int nq, float scale, float *m, float *l,
                          float *alpha)
{
    for (int c = 0; c < nq; c++) {
        float mx = m[c];
        for (int j = 0; j < nk; j++) {
            float x = s[(size_t)j * lds + c] * scale;
            mx = x > mx ? x : mx;
        }
        const float sh = mx == -INFINITY ? 0.0f : mx;
        float sum = 0.0f;
        for (int j = 0; j < nk; j++) {
            float *e = &s[(size_t)j * lds + c];
            *e = exp2f(*e * scale - sh);
            sum += *e;
        }
        alpha[c] = exp2f(m[c] - sh);
        l[c] = l[c] * alpha[c] + sum;
        m[c] = mx;
    }
}

static void exp_n(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = expf(x[i]);
}

static void erf_n(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = erff(x[i]);
}

static void gelu(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] * 0.5f * (1.0f + erff(x[i] * (float)M_SQRT1_2));
}

static void silu_mul(float *y, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

const ml_cpu_kernels ml_cpu_kernels_plain = {
    .isa = ML_CPU_ISA_PLAIN,
    .gemm_tile = gemm_tile,
    .tile_rows = TILE_ROWS,
    .tile_cols = TILE_COLS,
    .gemv = gemv,
    .gemv_rows = GEMV_ROWS,
    .gemv_cols = GEMV_COLS,
    .gemm_packed = gemm_packed,
    .strip_cols = STRIP_COLS,
    .softmax_block = softmax_block,
    .exp_n = exp_n,
    .erf_n = erf_n,
    .gelu = gelu,
    .silu_mul = silu_mul,
    .bf16_widen = ml_bf16_to_f32_n,
    .widen_strip = widen_strip,
};

const ml_cpu_kernels *ml_cpu_kernels_for(ml_cpu_isa isa)
{
    switch (isa) {
    case ML_CPU_ISA_PLAIN: return &ml_cpu_kernels_plain;
#if ML_CPU_X86
    case ML_CPU_ISA_AVX2: return &ml_cpu_kernels_avx2;
    case ML_CPU_ISA_AVX512: return &ml_cpu_kernels_avx512;
#else
    case ML_CPU_ISA_AVX2:
    case ML_CPU_ISA_AVX512: break;
#endif
    }
    assert(!"ISA not built for this architecture");
    return &ml_cpu_kernels_plain;
}

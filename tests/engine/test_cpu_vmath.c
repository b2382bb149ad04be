/* The vector exp, erf, gelu and silu of each ISA (cpu_kernels.h, vmath.h)
 * over a sweep of every f32 binade, against libm and the plain kernel; the
 * bf16 widening of each ISA over every bf16 value. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_features.h"
#include "cpu/cpu_kernels.h"
#include "cpu_ops_util.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

/* ---- exp, erf and the activations of each ISA (cpu_kernels.h, vmath.h) ---------------- */

/* 2^24 inputs spread over all 2^32 bit patterns (stride 2^8, with the low
 * byte varied so that every mantissa bit moves): every binade of both
 * signs, denormals, zeros, infinities and NaNs. Errors are measured
 *   exp, erf    against double-precision libm: exp in ulps of the result
 *               (where it is a normal f32), erf absolutely in units of
 *               2^-24
 *   gelu, silu  against the plain kernel's f32 expressions (libm's erff,
 *               expf; torch writes the same ones): silu(g) = g / (1 +
 *               expf(-g)) in ulps, gelu in units of max(ulp, |x|·2^-25),
 *               the second being what one 2^-24 step of erf moves the
 *               result by (1 + erff(x/√2) is itself only that fine, and
 *               for x < 0 it cancels to far below one ulp of 1)
 * and must stay within VM_BOUND. The maxima over every f32 input were 0.94
 * ulp (exp), 0.99 (erf), 2.0 (gelu) and 4.0 (silu); against the exact
 * functions both gelu expressions are within 1.7 units and both silu ones
 * within 2.4 ulp. Special values must match exactly: NaN, the infinities,
 * signed zeros, exp's flush to 0 below FLT_MIN and overflow to +inf. The
 * vector ISAs must agree bit for bit (vmath.h is the same arithmetic at
 * both widths). */
#define VM_SWEEP (1u << 24)
#define VM_CHUNK 65536u

enum { VM_EXP, VM_ERF, VM_GELU, VM_SILU, VM_FUNCS };
static const char *const VM_NAME[VM_FUNCS] = {"exp", "erf", "gelu", "silu"};
static const double VM_BOUND[VM_FUNCS] = {1.0, 1.0, 2.0, 4.0};

static float sweep_input(uint32_t i)
{
    const uint32_t bits = i << 8 | ((i * 0x9du) & 0xffu);
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* One ulp of the f32 nearest w (2^-149 at zero and among denormals). */
static double ulp_f32(double w)
{
    int e;
    frexp(w, &e);
    return w == 0 ? 0x1p-149 : fmax(ldexp(1.0, e - 24), 0x1p-149);
}

/* The reference of function f at x: double for exp and erf, the f32
 * expression for gelu and silu. */
static double vm_reference(int f, float x)
{
    switch (f) {
    case VM_EXP: return exp((double)x);
    case VM_ERF: return erf((double)x);
    case VM_GELU: return x * 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
    case VM_SILU: return x / (1.0f + expf(-x));
    }
    return NAN;
}

/* Error of y = f(x) against want in f's units; INFINITY for a special value
 * that does not match. */
static double vm_error(int f, float x, float y, double want)
{
    if (isnan(want) || isnan(y))
        return isnan(want) && isnan(y) ? 0 : INFINITY;
    switch (f) {
    case VM_EXP:
        if (want > FLT_MAX)
            return y == INFINITY ? 0 : INFINITY;
        if (want < FLT_MIN) /* flushed (vector) or denormal (libm) */
            return y >= 0 && y < FLT_MIN ? 0 : INFINITY;
        return fabs(y - want) / ulp_f32(want);
    case VM_ERF:
        return signbit(y) != signbit(x) ? INFINITY : fabs(y - want) / U;
    case VM_GELU:
    case VM_SILU: {
        const float w = (float)want;
        if (isinf(w) || isinf(y) || (w == 0 && y == 0))
            return memcmp(&w, &y, sizeof y) == 0 ? 0 : INFINITY;
        const double unit = f == VM_GELU ? fmax(ulp_f32(want), fabs((double)x) * 0x1p-25)
                                         : ulp_f32(want);
        return fabs(y - want) / unit;
    }
    }
    return INFINITY;
}

static void vm_apply(const ml_cpu_kernels *kn, int f, float *y, const float *x,
                     const float *ones, size_t n)
{
    switch (f) {
    case VM_EXP: kn->exp_n(y, x, n); break;
    case VM_ERF: kn->erf_n(y, x, n); break;
    case VM_GELU:
        memcpy(y, x, n * sizeof *y);
        kn->gelu(y, n);
        break;
    case VM_SILU: kn->silu_mul(y, x, ones, n); break;
    }
}

static void test_vector_math(void)
{
    const ml_cpu_isa best = ml_cpu_isa_detect();
    float *x = xmalloc(VM_CHUNK * sizeof *x), *ones = xmalloc(VM_CHUNK * sizeof *ones);
    float *y = xmalloc(VM_CHUNK * sizeof *y), *first_vec = xmalloc(VM_CHUNK * sizeof *first_vec);
    double *want = xmalloc(VM_CHUNK * sizeof *want);
    double worst[ML_CPU_ISA_AVX512 + 1][VM_FUNCS] = {{0}};
    float worst_at[ML_CPU_ISA_AVX512 + 1][VM_FUNCS] = {{0}};
    int vec_same[VM_FUNCS];
    for (int f = 0; f < VM_FUNCS; f++)
        vec_same[f] = 1;
    for (uint32_t i = 0; i < VM_CHUNK; i++)
        ones[i] = 1.0f;

    for (uint32_t c0 = 0; c0 < VM_SWEEP; c0 += VM_CHUNK) {
        for (uint32_t i = 0; i < VM_CHUNK; i++)
            x[i] = sweep_input(c0 + i);
        for (int f = 0; f < VM_FUNCS; f++) {
            for (uint32_t i = 0; i < VM_CHUNK; i++)
                want[i] = vm_reference(f, x[i]);
            for (ml_cpu_isa isa = ML_CPU_ISA_PLAIN; isa <= best; isa++) {
                vm_apply(ml_cpu_kernels_for(isa), f, y, x, ones, VM_CHUNK);
                for (uint32_t i = 0; i < VM_CHUNK; i++) {
                    const double e = vm_error(f, x[i], y[i], want[i]);
                    if (e > worst[isa][f]) {
                        worst[isa][f] = e;
                        worst_at[isa][f] = x[i];
                    }
                }
                if (isa == ML_CPU_ISA_AVX2)
                    memcpy(first_vec, y, VM_CHUNK * sizeof *y);
                else if (isa > ML_CPU_ISA_AVX2)
                    vec_same[f] &= memcmp(first_vec, y, VM_CHUNK * sizeof *y) == 0;
            }
        }
    }
    for (ml_cpu_isa isa = ML_CPU_ISA_PLAIN; isa <= best; isa++) {
        for (int f = 0; f < VM_FUNCS; f++) {
            check(worst[isa][f] <= VM_BOUND[f], "%s [%s]: error %.3g at x = %.9g (bound %.3g)",
                  VM_NAME[f], ml_cpu_isa_name(isa), worst[isa][f], worst_at[isa][f], VM_BOUND[f]);
            fprintf(stderr, "  %-4s [%s] max error %.3f at x = %.9g\n", VM_NAME[f],
                    ml_cpu_isa_name(isa), worst[isa][f], worst_at[isa][f]);
        }
    }
    for (int f = 0; f < VM_FUNCS; f++)
        check(best < ML_CPU_ISA_AVX512 || vec_same[f], "%s: avx2 and avx512 differ", VM_NAME[f]);
    free(x);
    free(ones);
    free(y);
    free(first_vec);
    free(want);
}

/* ---- bf16_widen of each ISA ------------------------------------------------------------ */

#define BF16_VALUES 65536
/* Lengths from 0 to past two AVX-512 vectors, so that every tail occurs. */
#define WIDEN_MAX_LEN 37

/* Every bf16 bit pattern widened as ml_bf16_to_f32 does, in one call and
 * at every length from 0 to WIDEN_MAX_LEN from a random start, on each
 * ISA; nothing past n written. */
static void test_bf16_widen(void)
{
    uint16_t *src = xmalloc(BF16_VALUES * sizeof *src);
    float *dst = xmalloc((BF16_VALUES + 1) * sizeof *dst);
    for (uint32_t v = 0; v < BF16_VALUES; v++)
        src[v] = (uint16_t)v;
    const float sentinel = -12345.0f;
    for (ml_cpu_isa isa = ML_CPU_ISA_PLAIN; isa <= ml_cpu_isa_detect(); isa++) {
        const ml_cpu_kernels *kn = ml_cpu_kernels_for(isa);
        int ok = 1;
        dst[BF16_VALUES] = sentinel;
        kn->bf16_widen(dst, src, BF16_VALUES);
        for (uint32_t v = 0; v < BF16_VALUES; v++) {
            const float want = ml_bf16_to_f32(src[v]);
            ok &= memcmp(&dst[v], &want, sizeof want) == 0;
        }
        ok &= dst[BF16_VALUES] == sentinel;
        for (size_t n = 0; n <= WIDEN_MAX_LEN; n++) {
            const size_t at = (size_t)irand(BF16_VALUES - WIDEN_MAX_LEN);
            for (size_t i = 0; i <= WIDEN_MAX_LEN; i++)
                dst[i] = sentinel;
            kn->bf16_widen(dst, src + at, n);
            for (size_t i = 0; i < n; i++) {
                const float want = ml_bf16_to_f32(src[at + i]);
                ok &= memcmp(&dst[i], &want, sizeof want) == 0;
            }
            for (size_t i = n; i <= WIDEN_MAX_LEN; i++)
                ok &= dst[i] == sentinel;
        }
        check(ok, "bf16_widen [%s]: every bf16 value exact, nothing past n written",
              ml_cpu_isa_name(isa));
    }
    free(src);
    free(dst);
}

int main(void)
{
    test_vector_math();
    test_bf16_widen();
    return check_done();
}

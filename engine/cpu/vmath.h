/* Vector exp and erf for f32, and the activations built on them, written
 * once for both vector widths of the CPU backend.
 *
 * Included only by kernels_avx2.c and kernels_avx512.c, each compiled with
 * its own instruction flags, after defining VMATH_BITS: 512 for 16 lanes
 * (zmm, AVX-512 F/DQ), 256 for 8 (ymm, AVX2 + FMA). The width layer (vf_*)
 * is the only part that differs between the two; everything below it is
 * shared, so both ISAs run the same arithmetic, operation for operation,
 * and get the same bits per element.
 *
 * Accuracy, against double-precision libm over every float (checked
 * exhaustively during development; tests/engine/test_cpu_vmath.c repeats a
 * 2^24-point sweep of each function):
 *   vm_exp  <= 1 ulp (0.94 measured) for ln(FLT_MIN) <= x <= ln(FLT_MAX);
 *           +inf above; 0 below (results under FLT_MIN flush to 0 rather
 *           than go denormal), so exp(-inf) = 0; exp(0) = 1 exactly;
 *           NaN -> NaN.
 *   vm_exp2_below_hi (softmax's exp, in powers of 2) < 1 ulp (0.65
 *           measured) for -126 <= t <= 0, 0 below (test_cpu_attention's
 *           sweep of softmax_block).
 *   vm_erf  absolute error <= 2^-24 (0.99 * 2^-24 measured), i.e. within
 *           one ulp of the results near +-1 where GELU's 1 + erf
 *           cancels; erf(x) = +-1 exactly for |x| >= VM_ERF_ONE_AT (where
 *           1 - erfc(x) rounds to 1); odd, so erf(-0) = -0; +-inf -> +-1;
 *           NaN -> NaN.
 * GELU's result x * 0.5 * (1 + erf(x / sqrt 2)) therefore differs from the
 * same expression with libm's erff by at most 2 units of max(ulp(result),
 * |x| * 2^-25), the second term being what one 2^-24 step of erf moves it
 * by (the resolution of 1 + erff itself for x < 0); against the exact GELU
 * both are within 1.7 such units. SiLU g / (1 + exp(-g)) is within 4 ulp of
 * the expression with libm's expf, and both within 2.4 ulp of the exact
 * value. (Maxima over every f32 input.) */
#ifndef ML_CPU_VMATH_H
#define ML_CPU_VMATH_H

#include <immintrin.h>
#include <stddef.h>

#define VM_INLINE static inline __attribute__((always_inline))

/* ---- width layer ----------------------------------------------------------- */
/* vf: one vector of f32; vf_mask: a per-lane condition. min and max return
 * their second operand when either is NaN (x86 semantics), which the
 * callers use to keep a NaN argument a NaN. */

#if VMATH_BITS == 512

#define VF_LANES 16
typedef __m512 vf;
typedef __mmask16 vf_mask;

VM_INLINE vf vf_set1(float x) { return _mm512_set1_ps(x); }
VM_INLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
VM_INLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
VM_INLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
VM_INLINE vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
VM_INLINE vf vf_fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
VM_INLINE vf vf_fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
VM_INLINE vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
VM_INLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
VM_INLINE vf vf_and(vf a, vf b) { return _mm512_and_ps(a, b); }
VM_INLINE vf vf_andnot(vf a, vf b) { return _mm512_andnot_ps(a, b); }
VM_INLINE vf vf_or(vf a, vf b) { return _mm512_or_ps(a, b); }
VM_INLINE vf vf_round(vf x)
{
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
VM_INLINE vf_mask vf_lt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
/* m ? a : b per lane */
VM_INLINE vf vf_select(vf_mask m, vf a, vf b) { return _mm512_mask_blend_ps(m, b, a); }
/* p · 2^n for integral n in [-126, 128], one rounding; 0 where zero is
 * set (the mask folded into the scalef: no blend after it). */
VM_INLINE vf vf_ldexp_or_zero(vf_mask zero, vf p, vf n)
{
    return _mm512_maskz_scalef_ps((__mmask16)~zero, p, n);
}
/* Lanes [0, n) of p (n <= VF_LANES); the others are 0 and not read. */
VM_INLINE vf vf_load_n(const float *p, int n)
{
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
}
VM_INLINE void vf_store_n(float *p, vf v, int n)
{
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v);
}

#elif VMATH_BITS == 256

#define VF_LANES 8
typedef __m256 vf;
typedef __m256 vf_mask;

VM_INLINE vf vf_set1(float x) { return _mm256_set1_ps(x); }
VM_INLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
VM_INLINE vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
VM_INLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
VM_INLINE vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
VM_INLINE vf vf_fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
VM_INLINE vf vf_fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
VM_INLINE vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
VM_INLINE vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
VM_INLINE vf vf_and(vf a, vf b) { return _mm256_and_ps(a, b); }
VM_INLINE vf vf_andnot(vf a, vf b) { return _mm256_andnot_ps(a, b); }
VM_INLINE vf vf_or(vf a, vf b) { return _mm256_or_ps(a, b); }
VM_INLINE vf vf_round(vf x)
{
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
/* p · 2^n for integral n in [-126, 128] as p · 2^(n - n/2) · 2^(n/2): both
 * factors are normal numbers built in the exponent field, the first product
 * is exact, so only the second rounds (as scalef does in one step). */
VM_INLINE vf vf_ldexp(vf p, vf n)
{
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256i ni = _mm256_cvtps_epi32(n), half = _mm256_srai_epi32(ni, 1);
    const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    const __m256 hi = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, hi), lo);
}
VM_INLINE vf_mask vf_lt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
VM_INLINE vf vf_select(vf_mask m, vf a, vf b) { return _mm256_blendv_ps(b, a, m); }
/* vf_ldexp, and 0 where zero is set (a compare's all-ones lanes). */
VM_INLINE vf vf_ldexp_or_zero(vf_mask zero, vf p, vf n) { return vf_andnot(zero, vf_ldexp(p, n)); }
VM_INLINE __m256i vf_first(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
VM_INLINE vf vf_load_n(const float *p, int n) { return _mm256_maskload_ps(p, vf_first(n)); }
VM_INLINE void vf_store_n(float *p, vf v, int n) { _mm256_maskstore_ps(p, vf_first(n), v); }

#else
#error "define VMATH_BITS as 256 or 512 before including vmath.h"
#endif

/* ---- exp -------------------------------------------------------------------- */

/* Below VM_EXP_LO = ln(FLT_MIN) the result is flushed to 0 (softmax
 * weights that small do not matter next to the row maximum's 1, and
 * denormals would slow every later multiply). Above VM_EXP_HI the argument
 * is clamped: with n = 128 every result is past FLT_MAX, i.e. +inf. */
#define VM_EXP_LO (-87.33654f)
#define VM_EXP_HI 89.0f
#define VM_LOG2E 1.44269504088896341f
/* ln 2 split so that n · VM_LN2_HI is exact for |n| < 2^9 (Cody-Waite). */
#define VM_LN2_HI 0.693359375f
#define VM_LN2_LO (-2.12194440e-4f)

/* exp(x) = 2^n · e^r with n = round(x / ln 2), |r| <= ln2/2 and e^r by its
 * degree-7 Taylor polynomial (truncation < 1e-8 relative), for every x (a
 * NaN stays NaN: min returns its second operand). */
VM_INLINE vf vm_exp(vf x)
{
    x = vf_min(vf_set1(VM_EXP_HI), x);
    const vf_mask tiny = vf_lt(x, vf_set1(VM_EXP_LO));
    x = vf_max(vf_set1(VM_EXP_LO), x);
    const vf n = vf_round(vf_mul(x, vf_set1(VM_LOG2E)));
    vf r = vf_fnmadd(n, vf_set1(VM_LN2_HI), x);
    r = vf_fnmadd(n, vf_set1(VM_LN2_LO), r);
    vf p = vf_set1(1.0f / 5040.0f);
    p = vf_fmadd(p, r, vf_set1(1.0f / 720.0f));
    p = vf_fmadd(p, r, vf_set1(1.0f / 120.0f));
    p = vf_fmadd(p, r, vf_set1(1.0f / 24.0f));
    p = vf_fmadd(p, r, vf_set1(1.0f / 6.0f));
    p = vf_fmadd(p, r, vf_set1(0.5f));
    p = vf_fmadd(p, r, vf_set1(1.0f));
    p = vf_fmadd(p, r, vf_set1(1.0f));
    return vf_ldexp_or_zero(tiny, p, n);
}

/* ---- exp2 ------------------------------------------------------------------- */

/* Below VM_EXP2_LO = log2(FLT_MIN) the result is 0, as vm_exp's below
 * ln(FLT_MIN). */
#define VM_EXP2_LO (-126.0f)
/* t + 1.5 * 2^23 - 1.5 * 2^23 is t rounded to an integer (ties to even)
 * for |t| < 2^22: the sum's ulp is 1. Two adds on any FMA port, against
 * a rounding instruction of two uops on one. */
#define VM_ROUND_SHIFT 0x1.8p23f

/* 2^t for t <= 128 (the softmax's argument: at most a rounding above 0).
 * t = n + f with n = round(t) and f = t - n exact, |f| <= 1/2, and 2^f by
 * its degree-6 minimax polynomial on [-1/2, 1/2] (relative error 1.9e-9;
 * the constant term 1, so 2^0 is exactly 1): accuracy in the header. 0
 * for t < VM_EXP2_LO, -inf included: the mask zeroes those lanes, whatever
 * n and f hold there (NaN for -inf). Eleven uops against vm_exp's sixteen
 * (AVX-512): no clamps, no reduction by ln 2 (the caller folds log2 e into
 * its scale), a degree less, the rounding by adds. */
VM_INLINE vf vm_exp2_below_hi(vf t)
{
    const vf_mask tiny = vf_lt(t, vf_set1(VM_EXP2_LO));
    const vf n = vf_sub(vf_add(t, vf_set1(VM_ROUND_SHIFT)), vf_set1(VM_ROUND_SHIFT));
    const vf f = vf_sub(t, n);
    vf p = vf_set1(1.53458124e-04f); /* minimax, k = 6 .. 0 */
    p = vf_fmadd(p, f, vf_set1(1.33999309e-03f));
    p = vf_fmadd(p, f, vf_set1(9.61848907e-03f));
    p = vf_fmadd(p, f, vf_set1(5.55032864e-02f));
    p = vf_fmadd(p, f, vf_set1(2.40226462e-01f));
    p = vf_fmadd(p, f, vf_set1(6.93147182e-01f));
    p = vf_fmadd(p, f, vf_set1(1.0f));
    return vf_ldexp_or_zero(tiny, p, n);
}

/* ---- erf -------------------------------------------------------------------- */

/* With t = |x|:
 *   t < VM_ERF_SPLIT:  erf = t + t · A(t²), A(u) ≈ erf(√u)/√u - 1 (degree
 *                      6); the FMA adds t · A to t with one rounding, so A
 *                      (|A| <= 0.16) needs only absolute accuracy
 *   otherwise:         erf = 1 - exp(B(t - VM_ERF_SPLIT) - t²), B(s) ≈
 *                      ln(erfc(t)) + t² (degree 7; smooth, -2 < B < -0.8),
 *                      t clamped to VM_ERF_ONE_AT
 * The coefficients are least-squares fits with minimax weights (B's
 * weighted by erfc, its effect on erf), rounded to f32: evaluated exactly
 * they are within 0.04 · 2^-24 of erf; the rest of the error bound is f32
 * rounding. */
#define VM_ERF_SPLIT 1.0f
/* erfc(4) = 1.5e-8 < 2^-25: from here on erf rounds to 1. */
#define VM_ERF_ONE_AT 4.0f
#define VM_ERF_A0 1.283791657e-01f
#define VM_ERF_A1 (-3.761262583e-01f)
#define VM_ERF_A2 1.128358516e-01f
#define VM_ERF_A3 (-2.685381253e-02f)
#define VM_ERF_A4 5.188328732e-03f
#define VM_ERF_A5 (-8.010202232e-04f)
#define VM_ERF_A6 7.853888203e-05f
#define VM_ERF_B0 (-8.496055101e-01f)
#define VM_ERF_B1 (-6.389675146e-01f)
#define VM_ERF_B2 1.568929185e-01f
#define VM_ERF_B3 (-4.156348159e-02f)
#define VM_ERF_B4 1.004645380e-02f
#define VM_ERF_B5 (-2.011967988e-03f)
#define VM_ERF_B6 2.895286875e-04f
#define VM_ERF_B7 (-2.168689906e-05f)

VM_INLINE vf vm_erf(vf x)
{
    const vf sign = vf_set1(-0.0f);
    const vf t = vf_andnot(sign, x);

    const vf u = vf_mul(t, t);
    vf a = vf_set1(VM_ERF_A6);
    a = vf_fmadd(a, u, vf_set1(VM_ERF_A5));
    a = vf_fmadd(a, u, vf_set1(VM_ERF_A4));
    a = vf_fmadd(a, u, vf_set1(VM_ERF_A3));
    a = vf_fmadd(a, u, vf_set1(VM_ERF_A2));
    a = vf_fmadd(a, u, vf_set1(VM_ERF_A1));
    a = vf_fmadd(a, u, vf_set1(VM_ERF_A0));
    const vf inner = vf_fmadd(t, a, t);

    /* A NaN t stays NaN through min (second operand) and takes this branch. */
    const vf tc = vf_min(vf_set1(VM_ERF_ONE_AT), t);
    const vf s = vf_sub(tc, vf_set1(VM_ERF_SPLIT));
    vf b = vf_set1(VM_ERF_B7);
    b = vf_fmadd(b, s, vf_set1(VM_ERF_B6));
    b = vf_fmadd(b, s, vf_set1(VM_ERF_B5));
    b = vf_fmadd(b, s, vf_set1(VM_ERF_B4));
    b = vf_fmadd(b, s, vf_set1(VM_ERF_B3));
    b = vf_fmadd(b, s, vf_set1(VM_ERF_B2));
    b = vf_fmadd(b, s, vf_set1(VM_ERF_B1));
    b = vf_fmadd(b, s, vf_set1(VM_ERF_B0));
    const vf outer = vf_sub(vf_set1(1.0f), vm_exp(vf_fnmadd(tc, tc, b)));

    /* Both branches are >= 0: the sign of x is or-ed back in. */
    return vf_or(vf_select(vf_lt(t, vf_set1(VM_ERF_SPLIT)), inner, outer), vf_and(sign, x));
}

/* ---- array kernels (the entries of cpu_kernels.h) ---------------------------- */

static inline int vm_lanes_left(size_t n, size_t i)
{
    return n - i < VF_LANES ? (int)(n - i) : VF_LANES;
}

static void vm_exp_n(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i += VF_LANES) {
        const int m = vm_lanes_left(n, i);
        vf_store_n(y + i, vm_exp(vf_load_n(x + i, m)), m);
    }
}

static void vm_erf_n(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i += VF_LANES) {
        const int m = vm_lanes_left(n, i);
        vf_store_n(y + i, vm_erf(vf_load_n(x + i, m)), m);
    }
}

/* The operations and their order are those of the plain kernel (and of
 * torch): x · ½ first, then times 1 + erf(x · (1/√2)). */
static void vm_gelu(float *x, size_t n)
{
    const vf half = vf_set1(0.5f), one = vf_set1(1.0f), inv_sqrt2 = vf_set1(0.70710678118654752f);
    for (size_t i = 0; i < n; i += VF_LANES) {
        const int m = vm_lanes_left(n, i);
        const vf v = vf_load_n(x + i, m);
        const vf e = vm_erf(vf_mul(v, inv_sqrt2));
        vf_store_n(x + i, vf_mul(vf_mul(v, half), vf_add(one, e)), m);
    }
}

/* g / (1 + exp(-g)) · u, as the plain kernel and torch order it. */
static void vm_silu_mul(float *y, const float *gate, const float *up, size_t n)
{
    const vf zero = vf_set1(0.0f), one = vf_set1(1.0f);
    for (size_t i = 0; i < n; i += VF_LANES) {
        const int m = vm_lanes_left(n, i);
        const vf g = vf_load_n(gate + i, m), u = vf_load_n(up + i, m);
        const vf e = vm_exp(vf_sub(zero, g));
        vf_store_n(y + i, vf_mul(vf_div(g, vf_add(one, e)), u), m);
    }
}

#endif

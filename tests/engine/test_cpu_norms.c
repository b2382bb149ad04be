/* The CPU backend's normalisations, activations and rope against a
 * double-precision reference on each ISA path and thread count
 * (cpu_ops_util.h).
 *
 * Tolerances, with u = 2^-24:
 * - norms: (dim/16 + 16)·u relative: a 16-lane sum of dim squares, then a
 *   handful of roundings.
 * - gelu, silu, rope: a few roundings plus libm's <= 1 ulp erff/expf/cosf/
 *   sinf; values are O(1), so 1e-6 absolute + 1e-6 relative. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_features.h"
#include "cpu_ops_util.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

/* ---- normalisation and activations -------------------------------------------------- */

static void test_norms(ml_backend *be[N_BACKENDS])
{
    static const int dims[] = {1, 17, 80, 4096};
    const int rows = 5;
    const float eps = 1e-5f;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int dim = dims[di];
        const size_t n = (size_t)rows * dim;
        float *x = xmalloc(n * sizeof *x), *y[N_BACKENDS];
        uint16_t *w = xmalloc((size_t)dim * sizeof *w), *bb = xmalloc((size_t)dim * sizeof *bb);
        double *want = xmalloc(n * sizeof *want);
        fill(x, n, -3, 3);
        x[0] += 5.0f; /* an offset row: layernorm's centring matters */
        fill_bf16(w, (size_t)dim, -2, 2);
        fill_bf16(bb, (size_t)dim, -1, 1);
        const double rtol = (dim / 16.0 + 16) * U;
        char what[64];

        for (int r = 0; r < rows; r++) {
            double ss = 0;
            for (int i = 0; i < dim; i++)
                ss += (double)x[r * dim + i] * x[r * dim + i];
            double inv = 1.0 / sqrt(ss / dim + eps);
            for (int i = 0; i < dim; i++)
                want[r * dim + i] = x[r * dim + i] * inv * ml_bf16_to_f32(w[i]);
        }
        snprintf(what, sizeof what, "rmsnorm dim=%d", dim);
        for (int b = 0; b < N_BACKENDS; b++) {
            y[b] = xmalloc(n * sizeof *y[b]);
            be[b]->ops->rmsnorm(be[b], y[b], x, w, rows, dim, eps);
        }
        check_close_d(y[0], want, n, 1e-30, rtol, what);
        check_same(y[0], y[1], n * sizeof *y[0], what);

        for (int r = 0; r < rows; r++) {
            double mean = 0, var = 0;
            for (int i = 0; i < dim; i++)
                mean += x[r * dim + i];
            mean /= dim;
            for (int i = 0; i < dim; i++)
                var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
            var /= dim;
            double inv = 1.0 / sqrt(var + eps);
            for (int i = 0; i < dim; i++)
                want[r * dim + i] =
                    (x[r * dim + i] - mean) * inv * ml_bf16_to_f32(w[i]) + ml_bf16_to_f32(bb[i]);
        }
        snprintf(what, sizeof what, "layernorm dim=%d", dim);
        for (int b = 0; b < N_BACKENDS; b++)
            be[b]->ops->layernorm(be[b], y[b], x, w, bb, rows, dim, eps);
        /* Centred values near 0 carry the absolute error of mean and inv. */
        check_close_d(y[0], want, n, 8 * rtol, rtol, what);
        check_same(y[0], y[1], n * sizeof *y[0], what);
        for (int b = 0; b < N_BACKENDS; b++)
            free(y[b]);
        free(x);
        free(w);
        free(bb);
        free(want);
    }
}

static void test_activations(ml_backend *be[N_BACKENDS])
{
    const size_t n = 100003; /* several chunks and a ragged end */
    float *x = xmalloc(n * sizeof *x), *u = xmalloc(n * sizeof *u), *y[N_BACKENDS];
    double *want = xmalloc(n * sizeof *want);
    fill(x, n, -6, 6);
    fill(u, n, -2, 2);
    x[0] = 0.0f;
    x[1] = -30.0f;
    x[2] = 30.0f;

    for (size_t i = 0; i < n; i++)
        want[i] = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
    for (int b = 0; b < N_BACKENDS; b++) {
        y[b] = xmalloc(n * sizeof *y[b]);
        memcpy(y[b], x, n * sizeof *x);
        be[b]->ops->gelu(be[b], y[b], n);
    }
    check_close_d(y[0], want, n, 1e-6, 1e-6, "gelu");
    check_same(y[0], y[1], n * sizeof *y[0], "gelu");

    for (size_t i = 0; i < n; i++)
        want[i] = x[i] / (1.0 + exp(-(double)x[i])) * u[i];
    for (int b = 0; b < N_BACKENDS; b++) {
        /* y aliases gate, as the contract allows */
        memcpy(y[b], x, n * sizeof *x);
        be[b]->ops->silu_mul(be[b], y[b], y[b], u, n);
    }
    check_close_d(y[0], want, n, 1e-6, 1e-6, "silu_mul (y aliases gate)");
    check_same(y[0], y[1], n * sizeof *y[0], "silu_mul");
    for (int b = 0; b < N_BACKENDS; b++)
        free(y[b]);
    free(x);
    free(u);
    free(want);
}

static void test_rope(ml_backend *be[N_BACKENDS])
{
    static const int dims[] = {16, 80, 128};
    const int n_tokens = 37, n_heads = 3;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int hd = dims[di], half = hd / 2;
        const size_t n = (size_t)n_tokens * n_heads * hd;
        float *x = xmalloc(n * sizeof *x), *y[N_BACKENDS], inv_freq[64];
        int32_t pos[37];
        double *want = xmalloc(n * sizeof *want);
        fill(x, n, -1, 1);
        for (int i = 0; i < half; i++)
            inv_freq[i] = (float)(1.0 / pow(500000.0, 2.0 * i / hd));
        for (int t = 0; t < n_tokens; t++)
            pos[t] = t < 30 ? t : 131000 - t; /* small and far positions */
        for (int t = 0; t < n_tokens; t++) {
            for (int h = 0; h < n_heads; h++) {
                const float *xr = x + ((size_t)t * n_heads + h) * hd;
                double *wr = want + ((size_t)t * n_heads + h) * hd;
                for (int i = 0; i < half; i++) {
                    const float angle = (float)pos[t] * inv_freq[i]; /* f32, as specified */
                    wr[i] = xr[i] * cos(angle) - xr[i + half] * sin(angle);
                    wr[i + half] = xr[i + half] * cos(angle) + xr[i] * sin(angle);
                }
            }
        }
        char what[64];
        snprintf(what, sizeof what, "rope head_dim=%d", hd);
        for (int b = 0; b < N_BACKENDS; b++) {
            y[b] = xmalloc(n * sizeof *y[b]);
            memcpy(y[b], x, n * sizeof *x);
            be[b]->ops->rope(be[b], y[b], pos, inv_freq, n_tokens, n_heads, hd);
        }
        check_close_d(y[0], want, n, 1e-6, 1e-6, what);
        check_same(y[0], y[1], n * sizeof *y[0], what);
        for (int b = 0; b < N_BACKENDS; b++)
            free(y[b]);
        free(x);
        free(want);
    }
}


static void run_path(ml_backend *be[N_BACKENDS], ml_cpu_isa isa)
{
    test_norms(be);
    test_activations(be);
    test_rope(be);
}

int main(void)
{
    return cpu_ops_run_paths(run_path, 0);
}

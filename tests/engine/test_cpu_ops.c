/* Every op of the CPU backend against a naive double-precision reference
 * written here, for each ISA path this machine supports (plain, avx2,
 * avx512) and for 1 and 3 threads; the 1- and 3-thread results must also be
 * bit-identical (work is split, never summed in a thread-dependent order).
 *
 * Tolerances, with u = 2^-24 (f32 unit roundoff):
 * - matmul: |y - ref| <= (K + 3)·u·(Σ_k |x_k·w_k| + |bias| + |y0|), the
 *   classic bound of f32 recursive summation (any summation order and FMA or
 *   not satisfies it; blocked/vector sums are far below it). A wrong or
 *   missing term costs ~|x·w| ≈ Σ/K, far above it for the K used here.
 * - norms: (dim/16 + 16)·u relative: a 16-lane sum of dim squares, then a
 *   handful of roundings.
 * - gelu, silu, rope: a few roundings plus libm's <= 1 ulp erff/expf/cosf/
 *   sinf; values are O(1), so 1e-6 absolute + 1e-6 relative.
 * - attention: per output element, max|v| · (2·δs + (n_keys + 16)·u) where
 *   δs = 2·head_dim·u·scale·max_j Σ_d |q_d·k_jd| bounds the error of a
 *   scaled score: an error δ in scores scales the softmax weights by
 *   e^(±2δ), and the weights' sum carries at most n_keys roundings.
 * - the vector exp inside softmax_block: 4 ulp relative. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cpu/cpu_features.h"
#include "cpu/cpu_kernels.h"
#include "cpu/threadpool.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

#define U (1.0 / 16777216.0) /* 2^-24 */
#define N_BACKENDS 2         /* 1 thread and THREADS_MANY threads */
#define THREADS_MANY 3
#define ERRLEN 256

static const char *g_isa = "";

/* ---- helpers ----------------------------------------------------------------- */

/* Path against path: the first ISA's result of every check_bounded case is
 * kept by name, and each later ISA must agree with it within twice the
 * bound (both are within the bound of the same reference). */
#define MAX_CASES 128
static struct {
    char what[96];
    float *got;
    size_t n;
} g_first[MAX_CASES];
static int g_n_first;

static void check_against_first_path(const float *got, const double *bound, size_t n,
                                     const char *what)
{
    for (int c = 0; c < g_n_first; c++) {
        if (strcmp(g_first[c].what, what) != 0)
            continue;
        size_t bad = 0;
        for (size_t i = 0; i < n && g_first[c].n == n; i++)
            bad += !(fabs((double)got[i] - g_first[c].got[i]) <= 2 * bound[i]);
        check(g_first[c].n == n && bad == 0, "%s: %s and the first path differ at %zu elements",
              what, g_isa, bad);
        return;
    }
    if (g_n_first == MAX_CASES)
        return;
    snprintf(g_first[g_n_first].what, sizeof g_first[0].what, "%s", what);
    g_first[g_n_first].got = malloc(n * sizeof *got);
    if (!g_first[g_n_first].got)
        return;
    memcpy(g_first[g_n_first].got, got, n * sizeof *got);
    g_first[g_n_first].n = n;
    g_n_first++;
}

static void free_first_paths(void)
{
    for (int c = 0; c < g_n_first; c++)
        free(g_first[c].got);
}

/* Pass when |got[i] - want[i]| <= bound[i] for all i; prints the worst ratio. */
static void check_bounded(const float *got, const double *want, const double *bound, size_t n,
                          const char *what)
{
    check_against_first_path(got, bound, n, what);
    double worst = 0;
    size_t at = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        double r = d / (bound[i] > 0 ? bound[i] : 1e-300);
        if (!(d <= bound[i]))
            bad++;
        if (r > worst || r != r) {
            worst = r;
            at = i;
        }
    }
    double max_abs = 0, max_ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        max_abs = d > max_abs ? d : max_abs;
        max_ref = fabs(want[i]) > max_ref ? fabs(want[i]) : max_ref;
    }
    check(bad == 0, "%s [%s]: %zu/%zu outside bound; worst at %zu: got %.9g want %.9g bound %.3g",
          what, g_isa, bad, n, at, n ? got[at] : 0.0, n ? want[at] : 0.0, n ? bound[at] : 0.0);
    fprintf(stderr, "  %-56s n=%-7zu err/bound %.2g  max|err| %.2g (max|ref| %.2g)\n", what, n,
            worst, max_abs, max_ref);
}

/* got vs a double reference with atol + rtol·|want|. */
static void check_close_d(const float *got, const double *want, size_t n, double atol, double rtol,
                          const char *what)
{
    double *bound = xmalloc(n * sizeof *bound);
    for (size_t i = 0; i < n; i++)
        bound[i] = atol + rtol * fabs(want[i]);
    check_bounded(got, want, bound, n, what);
    free(bound);
}

static void check_same(const void *a, const void *b, size_t bytes, const char *what)
{
    check(memcmp(a, b, bytes) == 0, "%s [%s]: 1-thread and %d-thread results differ", what, g_isa,
          THREADS_MANY);
}

/* ---- memory ops ---------------------------------------------------------------- */

static void test_memory(ml_backend *be)
{
    const ml_backend_ops *o = be->ops;
    check(o->kv_elem_size == sizeof(float), "kv_elem_size");
    float *p = o->alloc(be, 1000 * sizeof(float));
    check(p && ((uintptr_t)p % 64) == 0, "alloc aligned");
    float src[1000], back[1000];
    fill(src, 1000, -1, 1);
    o->upload(be, p, src, sizeof src);
    o->download(be, back, p, sizeof back);
    check(memcmp(src, back, sizeof src) == 0, "upload/download round trip");
    check(o->weight(be, src, sizeof src) == src, "weight returns the host pointer");
    o->zero(be, p, 1000);
    int zero = 1;
    for (int i = 0; i < 1000; i++)
        zero &= p[i] == 0.0f;
    check(zero, "zero");
    o->free(be, p);
    void *empty = o->alloc(be, 0);
    check(empty != NULL, "alloc(0) gives a block");
    o->free(be, empty);
    char err[ERRLEN] = "";
    check(o->synchronize(be, err, sizeof err) == ML_OK, "synchronize");
}

/* ---- matmul ------------------------------------------------------------------------ */

static void test_matmul_case(ml_backend *be[N_BACKENDS], int M, int K, int N, int with_bias,
                             int accumulate)
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
                double p = (double)x[(size_t)m * K + k] * ml_bf16_to_f32(w[(size_t)n * K + k]);
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
    snprintf(what, sizeof what, "matmul M=%d K=%d N=%d bias=%d acc=%d", M, K, N, with_bias,
             accumulate);
    for (int b = 0; b < N_BACKENDS; b++) {
        y[b] = xmalloc((size_t)M * N * sizeof *y[b]);
        memcpy(y[b], y0, (size_t)M * N * sizeof *y[b]);
        be[b]->ops->matmul(be[b], y[b], x, w, with_bias ? bias : NULL, M, K, N, accumulate);
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

static void test_matmul(ml_backend *be[N_BACKENDS])
{
    static const int Ms[] = {1, 3, 16, 17, 64, 200};
    static const int KNs[][2] = {{1, 1}, {7, 5}, {33, 37}, {300, 130}, {520, 300}};
    int i = 0;
    for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
        for (size_t b = 0; b < sizeof KNs / sizeof KNs[0]; b++, i++)
            test_matmul_case(be, Ms[a], KNs[b][0], KNs[b][1], i % 2, (i / 2) % 2);
    /* A weight of odd row length (unaligned rows) through both regimes. */
    test_matmul_case(be, 2, 4099, 9, 1, 0);
    test_matmul_case(be, 40, 1031, 70, 0, 1);
}

/* Batch invariance: a sequence decoded alone (M = 1) and in a batch of any
 * size of the GEMV regime gets bit-identical rows, whatever block of the
 * kernel each dot lands in. */
static void test_matmul_batch_invariance(ml_backend *be)
{
    enum { K = 1031, N = 67, MAX_M = 16 }; /* odd K: masked or scalar tails */
    float *x = xmalloc((size_t)MAX_M * K * sizeof *x);
    float *alone = xmalloc((size_t)MAX_M * N * sizeof *alone);
    float *y = xmalloc((size_t)MAX_M * N * sizeof *y);
    uint16_t *w = xmalloc((size_t)N * K * sizeof *w);
    fill(x, (size_t)MAX_M * K, -1, 1);
    fill_bf16(w, (size_t)N * K, -1, 1);
    for (int m = 0; m < MAX_M; m++)
        be->ops->matmul(be, alone + (size_t)m * N, x + (size_t)m * K, w, NULL, 1, K, N, 0);
    int same = 1, first_bad = 0;
    for (int M = 2; M <= MAX_M; M++) {
        be->ops->matmul(be, y, x, w, NULL, M, K, N, 0);
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
}

/* gemv: dot (r, j) of every block shape equals the 1 x 1 block's, bit for bit. */
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

/* ---- elementwise and data movement ------------------------------------------------- */

static void test_elementwise(ml_backend *be)
{
    const ml_backend_ops *o = be->ops;
    enum { ROWS = 7, DIM = 33, PERIOD = 3 };
    float y[ROWS * DIM], y0[ROWS * DIM], x[ROWS * DIM], rs[ROWS];
    double want[ROWS * DIM];
    uint16_t w[PERIOD * DIM];
    fill(y0, ROWS * DIM, -1, 1);
    fill(x, ROWS * DIM, -1, 1);
    fill(rs, ROWS, 0, 1);
    rs[2] = 0.0f;
    fill_bf16(w, PERIOD * DIM, -1, 1);
    const float gate = -0.75f;

    for (int with_scale = 0; with_scale < 2; with_scale++) {
        memcpy(y, y0, sizeof y);
        o->add_rows(be, y, x, with_scale ? rs : NULL, gate, ROWS, DIM);
        for (int r = 0; r < ROWS; r++)
            for (int i = 0; i < DIM; i++)
                want[r * DIM + i] =
                    y0[r * DIM + i] + (double)gate * (with_scale ? rs[r] : 1.0f) * x[r * DIM + i];
        check_close_d(y, want, ROWS * DIM, 1e-6, 1e-6, with_scale ? "add_rows row_scale" : "add_rows");
    }

    memcpy(y, y0, sizeof y);
    o->add_bf16(be, y, w, gate, ROWS, PERIOD, DIM);
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < DIM; i++)
            want[r * DIM + i] = y0[r * DIM + i] + (double)gate * ml_bf16_to_f32(w[(r % PERIOD) * DIM + i]);
    check_close_d(y, want, ROWS * DIM, 1e-6, 1e-6, "add_bf16");

    /* copy_2d: a transposing copy into a strided destination, then a plain one. */
    float dst[DIM * ROWS + 8];
    for (size_t i = 0; i < sizeof dst / sizeof dst[0]; i++)
        dst[i] = -99.0f;
    o->copy_2d(be, dst, x, ROWS, DIM, 1, ROWS, DIM);
    int ok = 1;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < DIM; c++)
            ok &= dst[c * ROWS + r] == x[r * DIM + c];
    ok &= dst[DIM * ROWS] == -99.0f;
    check(ok, "copy_2d transposing");
    o->copy_2d(be, dst, x, 3, 5, 6, 1, DIM); /* rows of 5 at stride 6 */
    ok = 1;
    for (int r = 0; r < 3; r++) {
        for (int c = 0; c < 5; c++)
            ok &= dst[r * 6 + c] == x[r * DIM + c];
    }
    check(ok, "copy_2d strided rows");

    int32_t ids[4] = {2, 0, 2, 1};
    o->embed(be, y, w, ids, 4, DIM);
    ok = 1;
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < DIM; d++)
            ok &= y[i * DIM + d] == ml_bf16_to_f32(w[ids[i] * DIM + d]);
    check(ok, "embed");

    /* kv_write into shuffled slots, kv_store */
    enum { SLOTS = 20, KVH = 2, HD = 5, T = 4 };
    float kc[SLOTS * KVH * HD] = {0}, vc[SLOTS * KVH * HD] = {0}, k[T * KVH * HD], v[T * KVH * HD];
    fill(k, T * KVH * HD, -1, 1);
    fill(v, T * KVH * HD, -1, 1);
    int32_t slot[T] = {17, 3, 9, 0};
    o->kv_write(be, kc, vc, k, v, slot, T, KVH, HD);
    ok = 1;
    for (int t = 0; t < T; t++)
        ok &= !memcmp(kc + slot[t] * KVH * HD, k + t * KVH * HD, KVH * HD * sizeof(float)) &&
              !memcmp(vc + slot[t] * KVH * HD, v + t * KVH * HD, KVH * HD * sizeof(float));
    ok &= kc[1 * KVH * HD] == 0.0f && vc[19 * KVH * HD] == 0.0f;
    check(ok, "kv_write");
    /* Negative slots are padding rows: only the real rows land. */
    float kc2[SLOTS * KVH * HD], vc2[SLOTS * KVH * HD];
    memcpy(kc2, kc, sizeof kc2);
    memcpy(vc2, vc, sizeof vc2);
    int32_t padded[T] = {-1, 5, -1, 12};
    o->kv_write(be, kc, vc, v, k, padded, T, KVH, HD);
    memcpy(kc2 + 5 * KVH * HD, v + 1 * KVH * HD, KVH * HD * sizeof(float));
    memcpy(vc2 + 5 * KVH * HD, k + 1 * KVH * HD, KVH * HD * sizeof(float));
    memcpy(kc2 + 12 * KVH * HD, v + 3 * KVH * HD, KVH * HD * sizeof(float));
    memcpy(vc2 + 12 * KVH * HD, k + 3 * KVH * HD, KVH * HD * sizeof(float));
    check(!memcmp(kc, kc2, sizeof kc2) && !memcmp(vc, vc2, sizeof vc2),
          "kv_write skips negative (padding) slots");
    o->kv_store(be, kc, k, T * KVH * HD);
    check(!memcmp(kc, k, sizeof k), "kv_store");
}

static void test_patchify(ml_backend *be)
{
    enum { N_IMG = 2, SIDE = 28, P = 14, G = SIDE / P, C = 3 };
    static float pixels[N_IMG * C * SIDE * SIDE], patches[N_IMG * G * G * C * P * P];
    fill(pixels, sizeof pixels / sizeof pixels[0], -1, 1);
    be->ops->patchify(be, patches, pixels, N_IMG, SIDE, P);
    int ok = 1;
    for (int i = 0; i < N_IMG; i++)
        for (int py = 0; py < G; py++)
            for (int px = 0; px < G; px++)
                for (int c = 0; c < C; c++)
                    for (int ky = 0; ky < P; ky++)
                        for (int kx = 0; kx < P; kx++)
                            ok &= patches[((i * G * G) + py * G + px) * C * P * P + (c * P + ky) * P + kx] ==
                                  pixels[((i * C + c) * SIDE + py * P + ky) * SIDE + px * P + kx];
    check(ok, "patchify (c, ky, kx) order, row-major patches");
}

/* The sample op against ml_sample_one row by row: each row's penalty
 * entries found through its pen_start, each thread's scratch its own (rows
 * outnumber the threads), greedy ties to the lowest id, NaN ignored, a row
 * without a finite maximum reported as such. */
static void test_sample(ml_backend *be)
{
    enum { ROWS = 7, V = 1000, PEN = 4 };
    static float logits[ROWS * V];
    fill(logits, ROWS * V, -5, 5);
    logits[0 * V + 10] = 9.0f;
    logits[0 * V + 700] = 9.0f; /* tie: lowest index wins */
    logits[1 * V + 5] = 50.0f;
    logits[1 * V + 42] = NAN; /* never chosen */
    for (int i = 0; i < V; i++)
        logits[2 * V + i] = i % 2 ? -INFINITY : NAN; /* no finite maximum */
    ml_sample_row rows[ROWS];
    int32_t pen_id[ROWS * PEN];
    uint32_t pen_count[ROWS * PEN];
    for (int r = 0; r < ROWS; r++) {
        rows[r] = (ml_sample_row){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                  .logprobs = 1, .n_top = (uint32_t)r};
        for (int i = 0; i < PEN; i++) {
            pen_id[r * PEN + i] = i * (V / PEN) + irand(V / PEN);
            pen_count[r * PEN + i] = (uint32_t)irand(3);
        }
    }
    rows[3] = (ml_sample_row){.u = 0.25, .temperature = 0.8f, .top_p = 0.9f, .top_k = 50,
                              .repetition_penalty = 1.3f, .frequency_penalty = 0.5f,
                              .logprobs = 1, .n_top = 5, .pen_start = 3 * PEN, .n_pen = PEN};
    rows[4] = (ml_sample_row){.u = 0.999, .temperature = 1.2f, .top_p = 1.0f, .min_p = 0.1f,
                              .repetition_penalty = 0.7f, .presence_penalty = -1.0f,
                              .pen_start = 4 * PEN, .n_pen = PEN};
    rows[5] = (ml_sample_row){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 2.0f,
                              .presence_penalty = 2.0f, .pen_start = 5 * PEN, .n_pen = PEN};
    rows[6] = (ml_sample_row){.u = 0.5, .temperature = 1.0f, .top_p = 0.5f, .repetition_penalty = 1.0f};
    size_t bytes = be->ops->sample_scratch_bytes(be, ROWS, V);
    void *scratch = be->ops->alloc(be, bytes);
    void *mem = aligned_alloc(64, ml_sample_scratch_bytes(V));
    ml_sample_out got[ROWS], want;
    check(scratch && mem, "sample: scratch of %zu bytes", bytes);
    if (!scratch || !mem) {
        be->ops->free(be, scratch);
        free(mem);
        return;
    }
    ml_sample_params p = {.out = got, .logits = logits, .row = rows, .pen_id = pen_id,
                          .pen_count = pen_count, .scratch = scratch, .rows = ROWS, .vocab = V};
    be->ops->sample(be, &p);
    ml_sample_scratch *s = ml_sample_scratch_init(mem, V);
    for (int r = 0; r < ROWS; r++) {
        ml_sample_one(s, logits + (size_t)r * V, &rows[r], pen_id + rows[r].pen_start,
                      pen_count + rows[r].pen_start, NULL, &want);
        check(memcmp(&got[r], &want, sizeof want) == 0, "sample: row %d: op %d, reference %d", r,
              got[r].chosen.id, want.chosen.id);
    }
    check(got[0].chosen.id == 10 && got[1].chosen.id == 5 &&
              got[2].chosen.id == ML_SAMPLE_NO_TOKEN && got[0].n_top == 0 && got[1].n_top == 1 &&
              got[1].top[0].id == 5,
          "sample: greedy %d %d %d", got[0].chosen.id, got[1].chosen.id, got[2].chosen.id);
    be->ops->free(be, scratch);
    free(mem);
}

/* ---- attention: reference ------------------------------------------------------------ */

/* One query row against n keys (rows key[j], val[j]) with a visibility
 * predicate `see` (NULL = all); writes the double result and bound. */
static void ref_attend(const float *q, const float *const *key, const float *const *val,
                       const uint8_t *see, int n, int hd, float scale, double *out, double *bound)
{
    double *s = xmalloc((size_t)n * sizeof *s);
    double mx = -INFINITY, amax = 0, vmax = 0;
    int visible = 0;
    for (int j = 0; j < n; j++) {
        if (see && !see[j])
            continue;
        double d = 0, a = 0;
        for (int i = 0; i < hd; i++) {
            d += (double)q[i] * key[j][i];
            a += fabs((double)q[i] * key[j][i]);
        }
        s[j] = d * scale;
        amax = a * scale > amax ? a * scale : amax;
        mx = s[j] > mx ? s[j] : mx;
        for (int i = 0; i < hd; i++)
            vmax = fabs(val[j][i]) > vmax ? fabs(val[j][i]) : vmax;
        visible++;
    }
    double l = 0;
    for (int i = 0; i < hd; i++)
        out[i] = 0;
    for (int j = 0; j < n; j++) {
        if (see && !see[j])
            continue;
        double p = exp(s[j] - mx);
        l += p;
        for (int i = 0; i < hd; i++)
            out[i] += p * val[j][i];
    }
    const double ds = 2.0 * hd * U * amax;
    for (int i = 0; i < hd; i++) {
        out[i] /= l;
        bound[i] = vmax * (4.0 * ds + (visible + 16) * U);
    }
    free(s);
}

/* ---- attention: vision --------------------------------------------------------------- */

static void test_attn_vision_case(ml_backend *be[N_BACKENDS], int n_seq, int tiles, int tile_len,
                                  int real_len, int n_heads, int hd)
{
    const int seq_len = tiles * tile_len;
    const size_t n = (size_t)n_seq * seq_len * n_heads * hd;
    float *q = xmalloc(n * sizeof *q), *k = xmalloc(n * sizeof *k), *v = xmalloc(n * sizeof *v);
    float *out[N_BACKENDS];
    double *want = xmalloc(n * sizeof *want), *bound = xmalloc(n * sizeof *bound);
    uint8_t *valid = xmalloc((size_t)n_seq * seq_len);
    fill(q, n, -2, 2);
    fill(k, n, -1, 1);
    fill(v, n, -1, 1);
    /* Sequence s has tiles 0 .. s (others padded); each tile's last
     * tile_len - real_len tokens are padding. */
    for (int s = 0; s < n_seq; s++)
        for (int t = 0; t < seq_len; t++)
            valid[s * seq_len + t] = t / tile_len <= s % tiles && t % tile_len < real_len;
    const float scale = 1.0f / sqrtf((float)hd);

    const float **kr = xmalloc((size_t)seq_len * sizeof *kr), **vr = xmalloc((size_t)seq_len * sizeof *vr);
    for (int s = 0; s < n_seq; s++) {
        for (int h = 0; h < n_heads; h++) {
            for (int j = 0; j < seq_len; j++) {
                kr[j] = k + (((size_t)s * seq_len + j) * n_heads + h) * hd;
                vr[j] = v + (((size_t)s * seq_len + j) * n_heads + h) * hd;
            }
            for (int t = 0; t < seq_len; t++) {
                const size_t at = (((size_t)s * seq_len + t) * n_heads + h) * hd;
                ref_attend(q + at, kr, vr, valid[s * seq_len + t] ? NULL : valid + s * seq_len,
                           seq_len, hd, scale, want + at, bound + at);
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attn_vision seqs=%d len=%d heads=%d hd=%d", n_seq, seq_len,
             n_heads, hd);
    for (int b = 0; b < N_BACKENDS; b++) {
        out[b] = xmalloc(n * sizeof *out[b]);
        ml_attn_vision_params p = {.out = out[b], .q = q, .k = k, .v = v, .valid = valid,
                                   .n_seq = n_seq, .seq_len = seq_len, .n_heads = n_heads,
                                   .head_dim = hd, .scale = scale};
        be[b]->ops->attn_vision(be[b], &p);
    }
    check_bounded(out[0], want, bound, n, what);
    check_same(out[0], out[1], n * sizeof *out[0], what);
    for (int b = 0; b < N_BACKENDS; b++)
        free(out[b]);
    free(q);
    free(k);
    free(v);
    free(want);
    free(bound);
    free(valid);
    free(kr);
    free(vr);
}

static void test_attn_vision(ml_backend *be[N_BACKENDS])
{
    test_attn_vision_case(be, 4, 2, 8, 8, 3, 16); /* odd sequences have no padding */
    test_attn_vision_case(be, 3, 4, 56, 53, 2, 80); /* 224 keys: several blocks */
    test_attn_vision_case(be, 1, 2, 24, 21, 2, 128);
    test_attn_vision_case(be, 2, 2, 20, 19, 1, 256); /* the largest head_dim */
    /* mostly padding: the padding queries skip the key blocks without a valid key */
    test_attn_vision_case(be, 2, 4, 100, 97, 2, 80);
}

/* ---- attention: causal over the paged cache --------------------------------------- */

static void test_attn_causal_case(ml_backend *be[N_BACKENDS], int n_heads, int n_kv, int hd,
                                  int block_size)
{
    enum { SEQS = 4 };
    static const int pos0[SEQS] = {0, 5, 9, 37};
    static const int n_new[SEQS] = {7, 1, 0, 100}; /* one sequence sits this step out */
    int32_t seq_start[SEQS + 1] = {0}, pos0_i[SEQS];
    int max_blocks = 0, total_blocks = 0;
    for (int s = 0; s < SEQS; s++) {
        seq_start[s + 1] = seq_start[s] + n_new[s];
        pos0_i[s] = pos0[s];
        int nb = (pos0[s] + n_new[s] + block_size - 1) / block_size;
        max_blocks = nb + 1 > max_blocks ? nb + 1 : max_blocks; /* a spare column */
        total_blocks += nb;
    }
    const int n_phys = total_blocks + 3; /* unused blocks hold garbage */
    int32_t *perm = xmalloc((size_t)n_phys * sizeof *perm);
    for (int i = 0; i < n_phys; i++)
        perm[i] = i;
    for (int i = n_phys - 1; i > 0; i--) { /* shuffled physical blocks */
        int r = irand(i + 1), t = perm[i];
        perm[i] = perm[r];
        perm[r] = t;
    }
    int32_t *table = xmalloc((size_t)SEQS * max_blocks * sizeof *table);
    for (int s = 0, used = 0; s < SEQS; s++) {
        int nb = (pos0[s] + n_new[s] + block_size - 1) / block_size;
        for (int b = 0; b < max_blocks; b++)
            table[s * max_blocks + b] = b < nb ? perm[used + b] : -1;
        used += nb;
    }
    const size_t cache_n = (size_t)n_phys * block_size * n_kv * hd;
    float *kc = xmalloc(cache_n * sizeof *kc), *vc = xmalloc(cache_n * sizeof *vc);
    fill(kc, cache_n, -1, 1);
    fill(vc, cache_n, -1, 1);
    const int n_tok = seq_start[SEQS];
    const size_t n = (size_t)n_tok * n_heads * hd;
    float *q = xmalloc(n * sizeof *q), *out[N_BACKENDS];
    double *want = xmalloc(n * sizeof *want), *bound = xmalloc(n * sizeof *bound);
    fill(q, n, -2, 2);
    const float scale = 1.0f / sqrtf((float)hd);
    const int group = n_heads / n_kv;

    const int max_keys = 37 + 100;
    const float **kr = xmalloc(max_keys * sizeof *kr), **vr = xmalloc(max_keys * sizeof *vr);
    for (int s = 0; s < SEQS; s++) {
        for (int h = 0; h < n_heads; h++) {
            const int g = h / group;
            for (int j = 0; j < pos0[s] + n_new[s]; j++) {
                size_t slot = (size_t)table[s * max_blocks + j / block_size] * block_size + j % block_size;
                kr[j] = kc + (slot * n_kv + g) * hd;
                vr[j] = vc + (slot * n_kv + g) * hd;
            }
            for (int t = 0; t < n_new[s]; t++) {
                const size_t at = ((size_t)(seq_start[s] + t) * n_heads + h) * hd;
                ref_attend(q + at, kr, vr, NULL, pos0[s] + t + 1, hd, scale, want + at, bound + at);
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attn_causal heads=%d kv=%d hd=%d block=%d", n_heads, n_kv, hd,
             block_size);
    for (int b = 0; b < N_BACKENDS; b++) {
        out[b] = xmalloc(n * sizeof *out[b]);
        ml_attn_causal_params p = {.out = out[b], .q = q, .k_cache = kc, .v_cache = vc,
                                   .block_table = table, .seq_start = seq_start, .pos0 = pos0_i,
                                   .n_seqs = SEQS, .max_blocks_per_seq = max_blocks,
                                   .block_size = block_size, .n_heads = n_heads,
                                   .n_kv_heads = n_kv, .head_dim = hd, .scale = scale};
        be[b]->ops->attn_causal(be[b], &p);
    }
    check_bounded(out[0], want, bound, n, what);
    check_same(out[0], out[1], n * sizeof *out[0], what);
    for (int b = 0; b < N_BACKENDS; b++)
        free(out[b]);
    free(perm);
    free(table);
    free(kc);
    free(vc);
    free(q);
    free(want);
    free(bound);
    free(kr);
    free(vr);
}

static void test_attn_causal(ml_backend *be[N_BACKENDS])
{
    test_attn_causal_case(be, 4, 4, 16, 16);   /* GQA 1 */
    test_attn_causal_case(be, 8, 2, 80, 16);   /* GQA 4 */
    test_attn_causal_case(be, 8, 1, 128, 4);   /* GQA 8, many small blocks */
}

/* ---- attention: cross ------------------------------------------------------------------- */

/* One step of CROSS_SEQS sequences: a text-only one, one with an image,
 * one with two and one that shares an image with the previous sequence
 * (resident states are shared, not copied); max_images is one more than any
 * sequence uses, so every row and state table has padding. Each image's
 * state holds two layers' K and V planes and the call reads layer 1. The
 * mask columns past a sequence's images are garbage (1) and must be
 * ignored. The rows' masks (cross_mask):
 *   MIXED  rows cycle through: no chunk allowed (every key), every chunk,
 *          random chunks
 *   TILES  as HF builds them for images with fewer tiles than slots: image
 *          state i has CROSS_TILES_USED[i] real tiles, a row sees the real
 *          tiles of one image (earlier rows the first image, later ones
 *          the second); every 13th row sees no chunk at all, which
 *          makes its items visit every key
 * With chunk_len above the kernel's key block, whole key blocks are masked
 * for every row of an item and skipped.
 *
 * Besides the naive reference, each case runs a second time with one more
 * row at the end of every sequence that may see every chunk: the item
 * holding it visits every key block, as the kernel did before it skipped
 * any, and the other rows must come out bit for bit the same (an item's
 * columns never interact, and a skipped block would only have added
 * exp(-inf) = 0 weights). */
#define CROSS_SEQS 4
#define CROSS_MAX_IMAGES 3
#define CROSS_STATES 4
#define CROSS_LAYERS 2
#define CROSS_NONE_EVERY 13
static const int CROSS_TILES_USED[CROSS_STATES] = {1, 2, 3, 1};

typedef enum cross_mask {
    CROSS_MASK_MIXED,
    CROSS_MASK_TILES,
} cross_mask;

/* Mask row of local row lt of n_tok in a sequence with images state_of[0 ..
 * n_img), global row t: stride entries, max_tiles per image. */
static void cross_mask_row(uint8_t *row, cross_mask mask, int t, int lt, int n_tok,
                           const int *state_of, int n_img, int max_tiles, int stride)
{
    const int real = n_img * max_tiles;
    const int img = n_img ? lt * n_img / n_tok : 0;
    for (int c = 0; c < stride; c++) {
        if (c >= real) {
            row[c] = 1; /* ignored */
            continue;
        }
        switch (mask) {
        case CROSS_MASK_MIXED:
            row[c] = t % 3 == 0 ? 0 : t % 3 == 1 ? 1 : urand() < 0.5;
            break;
        case CROSS_MASK_TILES:
            row[c] = t % CROSS_NONE_EVERY != CROSS_NONE_EVERY - 1 && c / max_tiles == img &&
                     c % max_tiles < CROSS_TILES_USED[state_of[img]];
            break;
        }
    }
}

static void test_attn_cross_case(ml_backend *be[N_BACKENDS], const int n_tok[CROSS_SEQS],
                                 int n_heads, int n_kv, int hd, int max_tiles, int chunk_len,
                                 cross_mask mask)
{
    /* state_of[s][i]: which of the CROSS_STATES images is image i of sequence s */
    static const int n_img[CROSS_SEQS] = {1, 0, 2, 2};
    static const int state_of[CROSS_SEQS][CROSS_MAX_IMAGES] = {{0}, {0}, {1, 2}, {2, 3}};
    const int image_keys = max_tiles * chunk_len, stride = CROSS_MAX_IMAGES * max_tiles;
    const size_t plane = (size_t)image_keys * n_kv * hd;
    const size_t plane_bytes = plane * sizeof(float);

    float *states[CROSS_STATES];
    for (int i = 0; i < CROSS_STATES; i++) {
        states[i] = xmalloc(2 * CROSS_LAYERS * plane_bytes);
        fill(states[i], 2 * CROSS_LAYERS * plane, -1, 1);
    }
    const size_t k_offset = 2 * plane_bytes, v_offset = 3 * plane_bytes; /* layer 1 */
    const void *table[CROSS_SEQS * CROSS_MAX_IMAGES];
    /* seq_start: the case; wide_start: with the row that sees every chunk */
    int32_t n_images[CROSS_SEQS], seq_start[CROSS_SEQS + 1] = {0}, wide_start[CROSS_SEQS + 1] = {0};
    for (int s = 0; s < CROSS_SEQS; s++) {
        n_images[s] = n_img[s];
        seq_start[s + 1] = seq_start[s] + n_tok[s];
        wide_start[s + 1] = wide_start[s] + n_tok[s] + 1;
        for (int i = 0; i < CROSS_MAX_IMAGES; i++) /* padding entries: a pointer never read */
            table[s * CROSS_MAX_IMAGES + i] = i < n_img[s] ? states[state_of[s][i]] : (void *)-1;
    }
    const int T = seq_start[CROSS_SEQS], T_wide = wide_start[CROSS_SEQS];
    const size_t row = (size_t)n_heads * hd;
    uint8_t *allowed = xmalloc((size_t)T * stride), *allowed_wide = xmalloc((size_t)T_wide * stride);
    float *q = xmalloc((size_t)T * row * sizeof *q), *q_wide = xmalloc((size_t)T_wide * row * sizeof *q);
    fill(q_wide, (size_t)T_wide * row, -2, 2);
    for (int s = 0; s < CROSS_SEQS; s++) {
        for (int lt = 0; lt <= n_tok[s]; lt++) {
            const int wt = wide_start[s] + lt;
            if (lt == n_tok[s]) { /* the extra row: every chunk */
                memset(allowed_wide + (size_t)wt * stride, 1, (size_t)stride);
                continue;
            }
            const int t = seq_start[s] + lt;
            cross_mask_row(allowed + (size_t)t * stride, mask, t, lt, n_tok[s], state_of[s],
                           n_img[s], max_tiles, stride);
            memcpy(allowed_wide + (size_t)wt * stride, allowed + (size_t)t * stride, (size_t)stride);
            memcpy(q + (size_t)t * row, q_wide + (size_t)wt * row, row * sizeof *q);
        }
    }
    const size_t n = (size_t)T * row;
    float *out[N_BACKENDS], *out_wide = xmalloc((size_t)T_wide * row * sizeof *out_wide);
    double *want = xmalloc(n * sizeof *want), *bound = xmalloc(n * sizeof *bound);
    const float scale = 1.0f / sqrtf((float)hd);
    const int group = n_heads / n_kv;

    const int max_keys = CROSS_MAX_IMAGES * image_keys;
    const float **kr = xmalloc((size_t)max_keys * sizeof *kr);
    const float **vr = xmalloc((size_t)max_keys * sizeof *vr);
    uint8_t *see = xmalloc((size_t)max_keys);
    for (int s = 0; s < CROSS_SEQS; s++) {
        const int n_keys = n_img[s] * image_keys;
        for (int h = 0; h < n_heads; h++) {
            for (int j = 0; j < n_keys; j++) {
                const char *state = (const char *)states[state_of[s][j / image_keys]];
                const size_t off = ((size_t)(j % image_keys) * n_kv + h / group) * hd;
                kr[j] = (const float *)(state + k_offset) + off;
                vr[j] = (const float *)(state + v_offset) + off;
            }
            for (int t = seq_start[s]; t < seq_start[s + 1]; t++) {
                const size_t at = (size_t)t * row + (size_t)h * hd;
                if (n_keys == 0) { /* text only: exactly 0 */
                    for (int d = 0; d < hd; d++)
                        want[at + d] = bound[at + d] = 0;
                    continue;
                }
                int any = 0;
                for (int j = 0; j < n_keys; j++)
                    any |= see[j] = allowed[(size_t)t * stride + j / chunk_len];
                ref_attend(q + at, kr, vr, any ? see : NULL, n_keys, hd, scale, want + at,
                           bound + at);
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attn_cross %s tokens=%d,%d,%d,%d heads=%d kv=%d hd=%d tiles=%d chunk=%d",
             mask == CROSS_MASK_MIXED ? "mixed" : "tiles", n_tok[0], n_tok[1], n_tok[2], n_tok[3],
             n_heads, n_kv, hd, max_tiles, chunk_len);
    ml_attn_cross_params p = {.q = q, .states = table, .k_offset = k_offset, .v_offset = v_offset,
                              .n_images = n_images, .seq_start = seq_start, .allowed = allowed,
                              .n_seqs = CROSS_SEQS, .n_tokens = T, .max_images = CROSS_MAX_IMAGES,
                              .max_tiles = max_tiles, .chunk_len = chunk_len, .n_heads = n_heads,
                              .n_kv_heads = n_kv, .head_dim = hd, .scale = scale};
    for (int b = 0; b < N_BACKENDS; b++) {
        out[b] = xmalloc(n * sizeof *out[b]);
        fill(out[b], n, 7, 8); /* text-only rows must be overwritten with 0 */
        p.out = out[b];
        be[b]->ops->attn_cross(be[b], &p);
    }
    check_bounded(out[0], want, bound, n, what);
    check_same(out[0], out[1], n * sizeof *out[0], what);
    int zero = 1; /* sequence 1 is the text-only one */
    for (size_t i = (size_t)seq_start[1] * row; i < (size_t)seq_start[2] * row; i++)
        zero &= out[0][i] == 0.0f && !signbit(out[0][i]);
    check(zero, "%s: text-only rows are +0", what);

    p.out = out_wide;
    p.q = q_wide;
    p.seq_start = wide_start;
    p.allowed = allowed_wide;
    p.n_tokens = T_wide;
    be[1]->ops->attn_cross(be[1], &p);
    int same = 1;
    for (int s = 0; s < CROSS_SEQS; s++)
        same &= memcmp(out_wide + (size_t)wide_start[s] * row, out[1] + (size_t)seq_start[s] * row,
                       (size_t)n_tok[s] * row * sizeof *out_wide) == 0;
    check(same, "%s [%s]: rows differ from the same rows in items that visit every key", what,
          g_isa);

    for (int b = 0; b < N_BACKENDS; b++)
        free(out[b]);
    for (int i = 0; i < CROSS_STATES; i++)
        free(states[i]);
    free(out_wide);
    free(allowed);
    free(allowed_wide);
    free(q);
    free(q_wide);
    free(want);
    free(bound);
    free(kr);
    free(vr);
    free(see);
}

static void test_attn_cross(ml_backend *be[N_BACKENDS])
{
    static const int decode[CROSS_SEQS] = {1, 1, 1, 1};
    static const int prefill[CROSS_SEQS] = {5, 3, 9, 2};
    /* several row blocks, and an empty sequence */
    static const int long_rows[CROSS_SEQS] = {40, 2, 7, 0};
    test_attn_cross_case(be, decode, 8, 2, 80, 2, 17, CROSS_MASK_MIXED);
    test_attn_cross_case(be, prefill, 8, 2, 80, 2, 17, CROSS_MASK_MIXED);
    test_attn_cross_case(be, prefill, 4, 4, 16, 4, 7, CROSS_MASK_MIXED);
    /* 120 keys an image: several blocks */
    test_attn_cross_case(be, long_rows, 8, 1, 128, 2, 60, CROSS_MASK_MIXED);
    /* images of 1-3 tiles in 4 slots; chunks longer than a key block and
     * not a multiple of it, so blocks straddle seen and unseen chunks */
    test_attn_cross_case(be, decode, 8, 2, 64, 4, 150, CROSS_MASK_TILES);
    test_attn_cross_case(be, prefill, 8, 2, 64, 4, 150, CROSS_MASK_TILES);
    test_attn_cross_case(be, long_rows, 8, 1, 32, 4, 250, CROSS_MASK_TILES);
}

/* ---- kernels ------------------------------------------------------------------------------ */

/* softmax_block over two key blocks (an online update) against double. */
static void test_softmax_kernel(const ml_cpu_kernels *kn)
{
    enum { NK = 50, NQ = 37 };
    float s1[NK * NQ], s2[NK * NQ], m[NQ], l[NQ], alpha[NQ];
    fill(s1, NK * NQ, -120, 10);
    fill(s2, NK * NQ, -60, 30);
    for (int j = 0; j < NK; j++)
        s1[j * NQ + 3] = -INFINITY; /* column 3 fully masked in block 1 */
    for (int c = 0; c < NQ; c++) {
        m[c] = -INFINITY;
        l[c] = 0;
    }
    const float scale = 0.5f;
    double e_max = 0;
    int ok = 1, ok_m = 1, ok_l = 1, ok_alpha = 1;
    for (int blk = 0; blk < 2; blk++) {
        float *s = blk ? s2 : s1, raw[NK * NQ];
        float m_old[NQ], l_old[NQ];
        memcpy(raw, s, sizeof raw);
        memcpy(m_old, m, sizeof m);
        memcpy(l_old, l, sizeof l);
        kn->softmax_block(s, NQ, NK, NQ, scale, m, l, alpha);
        for (int c = 0; c < NQ; c++) {
            double mx = m_old[c];
            for (int j = 0; j < NK; j++)
                mx = fmax(mx, (double)raw[j * NQ + c] * scale);
            ok_m &= m[c] == (float)mx;
            const double sh = isinf(mx) ? 0 : mx;
            double sum = 0;
            for (int j = 0; j < NK; j++) {
                /* The f32 argument as the kernel forms it: scale is a power
                 * of two, so only the subtraction rounds, fused or not. The
                 * rounding of a large argument is not exp's error. */
                double arg = (float)((double)raw[j * NQ + c] * scale - sh);
                double want = exp(arg);
                sum += want;
                if (want < 1.2e-38) { /* below FLT_MIN: 0 or denormal */
                    ok &= s[j * NQ + c] <= 1.2e-38f;
                    continue;
                }
                double e = fabs(s[j * NQ + c] - want) / want;
                e_max = e > e_max ? e : e_max;
            }
            const double a = exp((float)((double)m_old[c] - sh));
            ok_alpha &= fabs(alpha[c] - a) <= 4 * U * a + 1.2e-38;
            ok_l &= fabs(l[c] - (l_old[c] * a + sum)) <= (NK + 8) * U * (l_old[c] * a + sum);
        }
    }
    const char *isa = ml_cpu_isa_name(kn->isa);
    check(ok && e_max <= 4 * U, "softmax_block [%s]: exp off (max rel err %.3g ulp)", isa,
          e_max / (2 * U));
    check(ok_m, "softmax_block [%s]: running max", isa);
    check(ok_l, "softmax_block [%s]: running sum", isa);
    check(ok_alpha, "softmax_block [%s]: rescale factors", isa);
    fprintf(stderr, "  softmax_block exp max rel error %.3g ulp\n", e_max / (2 * U));
}

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

/* ---- thread pool ----------------------------------------------------------------------- */

typedef struct pool_check {
    int *hits;
    int used[THREADS_MANY]; /* each thread writes only its own slot */
} pool_check;

static void mark(void *ctx, int64_t begin, int64_t end, int tid)
{
    pool_check *pc = ctx;
    for (int64_t i = begin; i < end; i++)
        pc->hits[i]++;
    pc->used[tid] = 1;
}

static void test_pool(void)
{
    char err[ERRLEN];
    ml_cpu_pool *pool = ml_cpu_pool_create(THREADS_MANY, err, sizeof err);
    check(pool != NULL, "pool create: %s", err);
    if (!pool)
        return;
    enum { N = 1000, ROUNDS = 300 };
    static int hits[N];
    pool_check pc = {.hits = hits};
    int ok = 1;
    for (int r = 0; r < ROUNDS; r++) {
        memset(hits, 0, sizeof hits);
        const int64_t n = 1 + r % N;
        ml_cpu_pool_for(pool, n, 1 + r % 7, mark, &pc);
        for (int64_t i = 0; i < N; i++)
            ok &= hits[i] == (i < n);
        if (r % 50 == 0)
            usleep(5000); /* let the workers fall asleep on the condition variable */
    }
    check(ok, "pool_for visits every item exactly once");
    int used = 0;
    for (int t = 0; t < THREADS_MANY; t++)
        used += pc.used[t];
    check(used == THREADS_MANY, "pool_for used all %d threads (%d)", THREADS_MANY, used);
    ml_cpu_pool_destroy(pool);
    ml_cpu_pool_destroy(NULL);
}

/* ---- driver ------------------------------------------------------------------------------ */

static ml_backend *create(ml_cpu_isa isa, int threads)
{
    char err[ERRLEN] = "";
    setenv("ML_CPU_ISA", ml_cpu_isa_name(isa), 1);
    ml_backend *be = ml_backend_cpu_create(threads, err, sizeof err);
    check(be != NULL, "create %s x%d: %s", ml_cpu_isa_name(isa), threads, err);
    return be;
}

static void test_create_errors(void)
{
    char err[ERRLEN] = "";
    setenv("ML_CPU_ISA", "sse9", 1);
    check(ml_backend_cpu_create(1, err, sizeof err) == NULL && strstr(err, "sse9"),
          "unknown ML_CPU_ISA rejected: %s", err);
    unsetenv("ML_CPU_ISA");
    check(ml_backend_cpu_create(-1, err, sizeof err) == NULL, "negative thread count rejected");
    ml_backend *be = ml_backend_cpu_create(0, err, sizeof err);
    check(be != NULL, "create with one thread per CPU: %s", err);
    if (be) {
        char want[32];
        snprintf(want, sizeof want, "cpu-%s", ml_cpu_isa_name(ml_cpu_isa_detect()));
        check(strcmp(be->ops->name, want) == 0, "name %s (want %s)", be->ops->name, want);
        be->ops->destroy(be);
    }
}

int main(void)
{
    test_pool();
    test_create_errors();
    test_vector_math();
    const ml_cpu_isa best = ml_cpu_isa_detect();
    fprintf(stderr, "best ISA on this machine: %s\n", ml_cpu_isa_name(best));
    for (ml_cpu_isa isa = ML_CPU_ISA_PLAIN; isa <= best; isa++) {
        g_isa = ml_cpu_isa_name(isa);
        rand_seed(ML_TEST_RNG_SEED); /* every path sees the same inputs */
        fprintf(stderr, "== %s\n", g_isa);
        ml_backend *be[N_BACKENDS] = {create(isa, 1), create(isa, THREADS_MANY)};
        if (!be[0] || !be[1]) {
            for (int b = 0; b < N_BACKENDS; b++)
                if (be[b])
                    be[b]->ops->destroy(be[b]);
            break;
        }
        test_softmax_kernel(ml_cpu_kernels_for(isa));
        test_gemv_kernel(ml_cpu_kernels_for(isa));
        test_memory(be[0]);
        test_matmul(be);
        test_matmul_batch_invariance(be[1]);
        test_norms(be);
        test_activations(be);
        test_rope(be);
        test_elementwise(be[1]);
        test_patchify(be[1]);
        test_sample(be[1]);
        test_attn_vision(be);
        test_attn_causal(be);
        test_attn_cross(be);
        for (int b = 0; b < N_BACKENDS; b++)
            be[b]->ops->destroy(be[b]);
    }
    unsetenv("ML_CPU_ISA");
    fprintf(stderr, "%d cases compared across paths\n", g_n_first);
    free_first_paths();
    return check_done();
}

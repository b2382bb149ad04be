/* rmsnorm, layernorm, gelu, silu_mul and RoPE of the CUDA backend against
 * the CPU backend.
 * Thresholds: tests/gpu/cuda_ops_harness.h. Skipped (77) without a CUDA device. */
#include "cuda_ops_harness.h"

/* ---- norms, activations, RoPE ----------------------------------------------------------- */

static void norm_case(int layer, int rows, int dim, int in_place)
{
    const size_t n = (size_t)rows * dim;
    float *x = rand_f32(n, -3, 3), *y = xmalloc(n * sizeof *y), *got = xmalloc(n * sizeof *got);
    uint16_t *w = rand_bf16((size_t)dim, -2, 2), *b = rand_bf16((size_t)dim, -1, 1);
    float *dx = dput(x, n * sizeof *x), *dy = in_place ? dx : dput(NULL, n * sizeof *dy);
    uint16_t *dw = dput(w, (size_t)dim * 2), *db = dput(b, (size_t)dim * 2);
    const float eps = 1e-5f;
    if (layer) {
        g_cpu->ops->layernorm(g_cpu, y, x, w, b, rows, dim, eps);
        g_gpu->ops->layernorm(g_gpu, dy, dx, dw, db, rows, dim, eps);
    } else {
        g_cpu->ops->rmsnorm(g_cpu, y, x, w, rows, dim, eps);
        g_gpu->ops->rmsnorm(g_gpu, dy, dx, dw, rows, dim, eps);
    }
    char what[128];
    snprintf(what, sizeof what, "%s %dx%d%s", layer ? "layernorm" : "rmsnorm", rows, dim,
             in_place ? " in place" : "");
    dget(got, dy, n * sizeof *got, what);
    check_nmse(got, y, n, NMSE_F32, what);
    if (!in_place)
        dfree(dy);
    dfree(dx);
    dfree(dw);
    dfree(db);
    free(x);
    free(y);
    free(got);
    free(w);
    free(b);
}

static void test_norms(void)
{
    norm_case(0, 1, 4096, 0);       /* decode, block per row */
    norm_case(0, 33, 4096, 1);
    norm_case(0, 512 * 32, 128, 1); /* q_norm: warp per row */
    norm_case(0, 7, 40, 0);
    norm_case(1, 6432, 1280, 0);    /* vision tower */
    norm_case(1, 1601, 1280, 1);
    norm_case(1, 9, 32, 0);
}

static void test_activations(void)
{
    const size_t n = (size_t)3 << 20;
    float *x = rand_f32(n, -8, 8), *u = rand_f32(n, -2, 2), *got = xmalloc(n * sizeof *got);
    float *dx = dput(x, n * sizeof *x), *du = dput(u, n * sizeof *u);
    g_cpu->ops->gelu(g_cpu, x, n);
    g_gpu->ops->gelu(g_gpu, dx, n);
    dget(got, dx, n * sizeof *got, "gelu");
    check_nmse(got, x, n, NMSE_F32, "gelu (erf) 3M");
    /* silu_mul with y aliasing gate, as the model calls it. */
    g_cpu->ops->silu_mul(g_cpu, x, x, u, n);
    g_gpu->ops->silu_mul(g_gpu, dx, dx, du, n);
    dget(got, dx, n * sizeof *got, "silu_mul");
    check_nmse(got, x, n, NMSE_F32, "silu_mul 3M, y = gate");
    dfree(dx);
    dfree(du);
    free(x);
    free(u);
    free(got);
}

static void rope_case(int n_tokens, int n_heads, int hd, int max_pos)
{
    const size_t n = (size_t)n_tokens * n_heads * hd;
    float *x = rand_f32(n, -2, 2), *got = xmalloc(n * sizeof *got);
    float *inv = xmalloc((size_t)hd / 2 * sizeof *inv);
    int32_t *pos = xmalloc((size_t)n_tokens * sizeof *pos);
    for (int i = 0; i < hd / 2; i++)
        inv[i] = powf(500000.0f, -2.0f * i / hd);
    for (int t = 0; t < n_tokens; t++)
        pos[t] = t == 0 ? max_pos - 1 : irand(max_pos);
    float *dx = dput(x, n * sizeof *x), *dinv = dput(inv, (size_t)hd / 2 * sizeof *inv);
    int32_t *dpos = dput(pos, (size_t)n_tokens * sizeof *pos);
    g_cpu->ops->rope(g_cpu, x, pos, inv, n_tokens, n_heads, hd);
    g_gpu->ops->rope(g_gpu, dx, dpos, dinv, n_tokens, n_heads, hd);
    char what[128];
    snprintf(what, sizeof what, "rope %d tokens x %d heads x %d, positions < %d", n_tokens,
             n_heads, hd, max_pos);
    dget(got, dx, n * sizeof *got, what);
    check_nmse(got, x, n, NMSE_F32, what);
    dfree(dx);
    dfree(dinv);
    dfree(dpos);
    free(x);
    free(got);
    free(inv);
    free(pos);
}

int main(void)
{
    cuda_ops_open();
    fprintf(stderr, "norms, activations, rope\n");
    test_norms();
    test_activations();
    rope_case(37, 8, 128, 131072);
    rope_case(5, 3, 16, 64);
    return cuda_ops_close();
}

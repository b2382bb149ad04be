/* What the test_cuda_ops_*.c tests share: each compares ops of the CUDA
 * backend with the CPU backend (the reference) on random inputs, at small
 * shapes and at the shapes of the real model (ggml's test-backend-ops, with
 * an NMSE = Σ(gpu - cpu)² / Σcpu² per op), and is skipped (77) without a
 * CUDA device. Header-only, one copy of the backends per test binary.
 *
 * Thresholds, with u = 2^-24 (f32) and E[δ²] ≈ 2.8e-6 the mean squared
 * relative error of rounding a value to bf16 (unit roundoff 2^-8; uniform
 * error within a binade, averaged over the significand: 2^-16·0.54/3):
 * - NMSE_F32 = 1e-9: both sides in f32, only the summation order differs.
 *   A sum of K random products carries a relative error ~u·sqrt(K/2)
 *   (5e-6 at K = 14336), an NMSE of ~3e-11; norms, activations and RoPE
 *   (CUDA's erff/expf/cosf/sinf are within 2 ulp of libm) are far below.
 * - NMSE_GEMM = 2e-5: matmul with M > 4 rounds x to bf16 for the tensor
 *   cores. Each product then carries an independent relative error of
 *   variance E[δ²], so the output NMSE is E[δ²] ≈ 2.8e-6 whatever K is;
 *   2e-5 leaves 7x headroom, while one wrong element, row or bias term
 *   costs far more (a dropped term of K adds ~1/K ≥ 7e-5).
 * - NMSE_MMA = 5e-5: the tensor-core vision attention rounds Q, K, V and P
 *   to bf16: V and P each add ~E[δ²] to the NMSE, and the score error
 *   (scale·Σ q·k with both rounded, ~1.6e-3 absolute for the inputs here)
 *   shifts the softmax weights by about that relatively, ~2.5e-6 more:
 *   ~8e-6 in all, 6x headroom.
 * - NMSE_F8_MMA = 1e-6: matmul_f8's W8A8 GEMM on FP8 tensor cores (sm_89+).
 *   Its products are exact, but Hopper's FP8 MMA adds them in an
 *   accumulator narrower than f32 before cuBLASLt promotes the partial sums
 *   to f32, FAST_ACCUM off or not. Measured on an H200 (2026-12-04): NMSE
 *   5.4e-8 at 32 x 4096 x 1024, 2.2e-8 at 300 x 4096 x 1024, 2.8e-10 at
 *   K = 64. 1e-6 leaves 18x headroom and stays under the bf16 GEMM's 2.8e-6,
 *   while a dropped term (~1/K ≥ 2.4e-4 here) or a wrong scale fails it;
 *   the quantization itself is checked exactly on every path.
 * - Caches: the GPU stores K/V in bf16, the CPU in f32. The inputs of the
 *   causal and cross tests are rounded to bf16 first, so both caches hold
 *   the same values and those ops are held to NMSE_F32; kv_write and
 *   kv_store must equal ml_f32_to_bf16 of the input bit for bit.
 * - lora is f32 throughout (bf16 adapters widened): NMSE_F32.
 * - Data movement (copy_2d, embed, patchify, zero), add_rows and add_bf16
 *   must match exactly (the GPU rounds each product as the CPU does).
 * - sample: greedy tokens and top logprob ids exactly, logprob values and
 *   draws within float rounding (see test_cuda_ops_sample.c).
 *
 * In the HOST build (MLLAMA_CUDA_HOST: the backend run by the host execution
 * model, kernels/README.md) the test runs three times, in child processes
 * under the schedule orders forward, reverse and a seeded shuffle, and what
 * every run downloads must be identical bit for bit: a kernel that lacks a
 * barrier gives results that depend on the order its threads run in. With
 * MLK_HOST_SCHEDULE set, only that order runs, in this process.
 *
 *     int main(void) { cuda_ops_open(); test_...(); return cuda_ops_close(); }
 */
#ifndef ML_TEST_CUDA_OPS_HARNESS_H
#define ML_TEST_CUDA_OPS_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "dtype.h"
#include "harness.h"
#include "mlk_backend.h"
#include "mlk_device.h"
#include "test_rand.h"

#ifdef MLLAMA_CUDA_HOST
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host/mlk_host.h"
#endif

#define NMSE_F32 1e-9
#define NMSE_GEMM 2e-5
#define NMSE_MMA 5e-5
#define NMSE_F8_MMA 1e-6
#define POOL_BYTES ((size_t)8 << 30)
#define ERRLEN 512
#define RNG_SEED 0x2545f4914f6cdd1dull /* the inputs these tests have always drawn first */

static ml_backend *g_cpu, *g_gpu;

/* n random floats in [lo, hi), owned by the caller (free). */
static inline float *rand_f32(size_t n, float lo, float hi)
{
    float *x = xmalloc(n * sizeof *x);
    fill(x, n, lo, hi);
    return x;
}

/* Random values that bf16 represents exactly (the GPU's K/V caches). */
static inline float *rand_f32_bf16(size_t n, float lo, float hi)
{
    float *x = rand_f32(n, lo, hi);
    for (size_t i = 0; i < n; i++)
        x[i] = ml_round_bf16(x[i]);
    return x;
}

/* n random bf16 values from [lo, hi), owned by the caller (free). */
static inline uint16_t *rand_bf16(size_t n, float lo, float hi)
{
    uint16_t *w = xmalloc(n * sizeof *w);
    fill_bf16(w, n, lo, hi);
    return w;
}

/* float8_e4m3fn's NaN code magnitude; every other code is drawn. */
#define E4M3_NAN_CODE 0x7f

/* n random finite E4M3 codes, every binade and sign alike (subnormals
 * included), owned by the caller (free). */
static inline uint8_t *rand_e4m3(size_t n)
{
    uint8_t *w = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        w[i] = (uint8_t)(irand(E4M3_NAN_CODE) | (irand(2) << 7));
    return w;
}

static inline uint16_t *to_bf16(const float *x, size_t n)
{
    uint16_t *w = xmalloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++)
        w[i] = ml_f32_to_bf16(x[i]);
    return w;
}

/* A host image state of `layers` cross layers (each a K then a V plane of
 * keys x n_kv x hd, K as rows, as the CUDA backend keeps it) with each K
 * plane rewritten in the CPU backend's layout (backend.h kv_store_keys),
 * for g_cpu's attn_cross. */
static inline void cpu_state_keys(float *state, int layers, int keys, int n_kv, int hd)
{
    const size_t plane = (size_t)keys * n_kv * hd;
    float *rows = xmalloc(plane * sizeof *rows);
    for (int l = 0; l < layers; l++) {
        float *k = state + 2 * (size_t)l * plane;
        memcpy(rows, k, plane * sizeof *rows);
        g_cpu->ops->kv_store_keys(g_cpu, k, rows, keys, n_kv, hd);
    }
    free(rows);
}

/* The CPU reference's matmuls on a row-major weight (N, K): packed by the
 * CPU backend first, as the model binds every Linear (backend.h
 * linear_weight; the CUDA backend reads the upload of the rows as they
 * are). */
static inline void cpu_matmul(float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                              int M, int K, int N, int accumulate)
{
    const uint16_t *p = g_cpu->ops->linear_weight(g_cpu, w, N, K, sizeof *w);
    check(p != NULL, "cpu linear_weight %d x %d", N, K);
    if (p)
        g_cpu->ops->matmul(g_cpu, y, x, p, bias, M, K, N, accumulate);
    g_cpu->ops->linear_weight_free(g_cpu, p);
}

static inline void cpu_matmul_f8(float *y, const float *x, const uint8_t *w, const float *scale,
                                 const uint16_t *bias, int M, int K, int N)
{
    const uint8_t *p = g_cpu->ops->linear_weight(g_cpu, w, N, K, sizeof *w);
    check(p != NULL, "cpu linear_weight %d x %d F8_E4M3", N, K);
    if (p)
        g_cpu->ops->matmul_f8(g_cpu, y, x, p, scale, bias, M, K, N, 0);
    g_cpu->ops->linear_weight_free(g_cpu, p);
}

static inline void sync_ok(const char *what)
{
    char err[ERRLEN] = "";
    ml_status st = g_gpu->ops->synchronize(g_gpu, err, sizeof err);
    check(st == ML_OK, "%s: synchronize: %s", what, err);
}

/* Device copy of host bytes (exits when the pool is exhausted). */
static inline void *dput(const void *host, size_t bytes)
{
    void *d = g_gpu->ops->alloc(g_gpu, bytes);
    if (!d) {
        fprintf(stderr, "device pool exhausted (%zu bytes)\n", bytes);
        exit(1);
    }
    if (host)
        g_gpu->ops->upload(g_gpu, d, host, bytes);
    return d;
}

/* Device copy of host bytes in a block 4 bytes larger (never empty, even
 * for an empty input); only the host's `bytes` are read. */
static inline void *dput_padded(const void *host, size_t bytes)
{
    void *d = dput(NULL, bytes + 4);
    if (bytes)
        g_gpu->ops->upload(g_gpu, d, host, bytes);
    return d;
}

static inline void dget(void *host, const void *dev, size_t bytes, const char *what)
{
    g_gpu->ops->download(g_gpu, host, dev, bytes);
    sync_ok(what);
}

static inline void dfree(void *d)
{
    g_gpu->ops->free(g_gpu, d);
}

static inline void check_nmse(const float *got, const float *want, size_t n, double tol, const char *what)
{
    const double e = tensor_nmse(got, want, n);
    double max_abs = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]);
        max_abs = d > max_abs || d != d ? d : max_abs;
    }
    check(e <= tol, "%s: NMSE %.3g above %.3g (max |diff| %.3g)", what, e, tol, max_abs);
    fprintf(stderr, "  %-64s NMSE %.2e (limit %.0e) max|diff| %.2e\n", what, e, tol, max_abs);
}

static inline void check_exact(const void *got, const void *want, size_t bytes, const char *what)
{
    size_t at = 0;
    while (at < bytes && ((const unsigned char *)got)[at] == ((const unsigned char *)want)[at])
        at++;
    check(at == bytes, "%s: differs from the CPU at byte %zu of %zu", what, at, bytes);
    fprintf(stderr, "  %-64s %s\n", what, at == bytes ? "exact" : "DIFFERS");
}

/* One member of a device group summing host's n floats with all_reduce_sum,
 * on the thread that runs cuda_reduce_thread(job) (collectives block until
 * every member has joined, so each member needs its own thread). */
typedef struct cuda_reduce_job {
    ml_backend *be;   /* borrowed: the member this thread drives */
    float *host;      /* (n): in, then the sum */
    size_t n;
    ml_status st;
} cuda_reduce_job;

static inline void *cuda_reduce_thread(void *arg)
{
    cuda_reduce_job *j = arg;
    const ml_backend_ops *o = j->be->ops;
    float *d = o->alloc(j->be, j->n * 4);
    char err[ERRLEN] = "";
    j->st = ML_ERR_NOMEM;
    if (!d)
        return NULL;
    o->upload(j->be, d, j->host, j->n * 4);
    o->all_reduce_sum(j->be, d, j->n);
    o->download(j->be, j->host, d, j->n * 4);
    j->st = o->synchronize(j->be, err, sizeof err);
    if (j->st != ML_OK)
        fprintf(stderr, "all_reduce_sum: %s\n", err);
    o->free(j->be, d);
    return NULL;
}

#ifdef MLLAMA_CUDA_HOST
#define SCHEDULE_ORDERS 3
#define SCHEDULE_SEED 0x5eed
#define DIGEST_MAX (1 << 16)

/* All of a run's download digests (at most DIGEST_MAX); the count. */
static size_t read_digests(int fd, mlk_host_digest *d)
{
    size_t n = 0, got = 0;
    for (;;) {
        ssize_t r = read(fd, (char *)d + got, DIGEST_MAX * sizeof *d - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        n = got / sizeof *d;
        if (n == DIGEST_MAX)
            break;
    }
    close(fd);
    return n;
}

/* The schedule-order runs (header comment). In each child: returns, with
 * its order set and its downloads digested. In the parent: waits for the
 * children, compares their downloads and exits with the verdict: a failed
 * child's status (its log, if it was not the forward run, copied to
 * stderr), 1 when the runs downloaded different bytes, else 0 (or 77 when
 * every child skipped). */
static void cuda_ops_fork_orders(void)
{
    static const int orders[SCHEDULE_ORDERS] = {
        MLK_HOST_SCHEDULE_FORWARD, MLK_HOST_SCHEDULE_REVERSE, MLK_HOST_SCHEDULE_SHUFFLE};
    static const char *const names[SCHEDULE_ORDERS] = {"forward", "reverse", "shuffle"};
    if (getenv("MLK_HOST_SCHEDULE"))
        return;
    fflush(NULL);
    pid_t pid[SCHEDULE_ORDERS];
    int fd[SCHEDULE_ORDERS];
    FILE *log[SCHEDULE_ORDERS] = {NULL, NULL, NULL};
    for (int i = 0; i < SCHEDULE_ORDERS; i++) {
        int p[2];
        if (i > 0)
            log[i] = tmpfile();
        if (pipe(p) != 0 || (i > 0 && !log[i]) || (pid[i] = fork()) < 0) {
            perror("schedule orders");
            exit(1);
        }
        if (pid[i] == 0) {
            close(p[0]);
            for (int j = 0; j < i; j++)
                close(fd[j]);
            if (log[i])
                dup2(fileno(log[i]), STDERR_FILENO);
            mlk_host_schedule_set(orders[i], SCHEDULE_SEED);
            mlk_host_digest_downloads(p[1]);
            return;
        }
        close(p[1]);
        fd[i] = p[0];
    }
    static mlk_host_digest d[SCHEDULE_ORDERS][DIGEST_MAX];
    size_t n[SCHEDULE_ORDERS];
    int code = 0, skipped = 0;
    for (int i = 0; i < SCHEDULE_ORDERS; i++) {
        n[i] = read_digests(fd[i], d[i]);
        int status = 0;
        waitpid(pid[i], &status, 0);
        const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        skipped += rc == 77;
        if (rc != 0 && rc != 77) {
            fprintf(stderr, "schedule order %s: exit status %d\n", names[i], rc);
            if (log[i]) {
                rewind(log[i]);
                for (int c; (c = fgetc(log[i])) != EOF;)
                    fputc(c, stderr);
            }
            code = code ? code : rc;
        }
        if (log[i])
            fclose(log[i]);
    }
    if (code)
        exit(code);
    if (skipped == SCHEDULE_ORDERS)
        exit(77);
    for (int i = 1; i < SCHEDULE_ORDERS; i++) {
        size_t at = 0;
        while (at < n[0] && at < n[i] && d[0][at].bytes == d[i][at].bytes &&
               d[0][at].hash == d[i][at].hash)
            at++;
        if (at < n[0] || at < n[i]) {
            fprintf(stderr, "FAIL schedule order %s: download %zu of %zu (%llu bytes) differs from "
                            "the forward order's\n",
                    names[i], at, n[0], at < n[i] ? d[i][at].bytes : 0ull);
            exit(1);
        }
    }
    fprintf(stderr, "schedule orders forward, reverse, shuffle: %zu downloads identical\n", n[0]);
    exit(0);
}
#endif

/* Skip (77) without a device; seed the inputs and create both backends
 * (exits with the failures when one cannot be). Returns the device count. */
static inline int cuda_ops_open(void)
{
    const int n_devices = mlk_device_count();
    if (n_devices == 0)
        ml_test_skip("no CUDA device");
#ifdef MLLAMA_CUDA_HOST
    cuda_ops_fork_orders();
#endif
    rand_seed(RNG_SEED);
    char err[ERRLEN] = "";
    g_cpu = ml_backend_cpu_create(0, err, sizeof err);
    check(g_cpu != NULL, "cpu backend: %s", err);
    g_gpu = ml_backend_cuda_create(0, POOL_BYTES, 0, err, sizeof err);
    check(g_gpu != NULL, "cuda backend: %s", err);
    if (!g_cpu || !g_gpu)
        exit(check_done());
    fprintf(stderr, "cpu backend %s, cuda backend %s\n", g_cpu->ops->name, g_gpu->ops->name);
    return n_devices;
}

/* Destroy both backends; the exit code. */
static inline int cuda_ops_close(void)
{
    g_gpu->ops->destroy(g_gpu);
    g_cpu->ops->destroy(g_cpu);
    return check_done();
}

#endif

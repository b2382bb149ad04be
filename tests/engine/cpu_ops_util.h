/* The helpers of the CPU backend's op tests (tests/engine/test_cpu_*.c):
 * every op against a naive double-precision reference written in the test,
 * for each ISA path this machine supports (plain, avx2, avx512) and for 1
 * and 3 threads; the 1- and 3-thread results must also be bit-identical
 * (work is split, never summed in a thread-dependent order), and each path
 * must agree with the first within twice the bound. Tolerances are in
 * u = 2^-24 (f32 unit roundoff); each test states its own. Header-only,
 * test code only. */
#ifndef ML_TEST_CPU_OPS_UTIL_H
#define ML_TEST_CPU_OPS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "harness.h"
#include "test_rand.h"

#define U (1.0 / 16777216.0) /* 2^-24 */
#define N_BACKENDS 2         /* 1 thread and THREADS_MANY threads */
#define THREADS_MANY 3
#define ERRLEN 256

/* The ISA path under test, for messages. */
static const char *g_isa = "";

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

static inline void check_against_first_path(const float *got, const double *bound, size_t n,
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

static inline void free_first_paths(void)
{
    for (int c = 0; c < g_n_first; c++)
        free(g_first[c].got);
}

/* Pass when |got[i] - want[i]| <= bound[i] for all i; prints the worst ratio. */
static inline void check_bounded(const float *got, const double *want, const double *bound,
                                 size_t n, const char *what)
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
static inline void check_close_d(const float *got, const double *want, size_t n, double atol,
                                 double rtol, const char *what)
{
    double *bound = xmalloc(n * sizeof *bound);
    for (size_t i = 0; i < n; i++)
        bound[i] = atol + rtol * fabs(want[i]);
    check_bounded(got, want, bound, n, what);
    free(bound);
}

static inline void check_same(const void *a, const void *b, size_t bytes, const char *what)
{
    check(memcmp(a, b, bytes) == 0, "%s [%s]: 1-thread and %d-thread results differ", what, g_isa,
          THREADS_MANY);
}

/* A CPU backend on isa with `threads` threads (0: one per CPU); NULL, with
 * the reason in err, when it cannot be made. */
static inline ml_backend *cpu_ops_create(ml_cpu_isa isa, int threads, char *err, size_t errlen)
{
    setenv("ML_CPU_ISA", ml_cpu_isa_name(isa), 1);
    return ml_backend_cpu_create(threads, err, errlen);
}

/* run(be, isa) on every ISA path this machine supports, plain first, with
 * be[0] a 1-thread and be[1] a THREADS_MANY-thread backend of that path and
 * the random stream at rand_seed(ML_TEST_RNG_SEED), so that every path sees
 * the same inputs. With check_create each creation is a check (the test of
 * creating backends, test_cpu_backend, counts them) and a failed one ends
 * the loop; without, a failed creation ends the test (exit 1), as a failed
 * allocation does. Returns check_done(). */
static inline int cpu_ops_run_paths(void (*run)(ml_backend *be[N_BACKENDS], ml_cpu_isa isa),
                                    int check_create)
{
    const ml_cpu_isa best = ml_cpu_isa_detect();
    fprintf(stderr, "best ISA on this machine: %s\n", ml_cpu_isa_name(best));
    for (ml_cpu_isa isa = ML_CPU_ISA_PLAIN; isa <= best; isa++) {
        g_isa = ml_cpu_isa_name(isa);
        rand_seed(ML_TEST_RNG_SEED); /* every path sees the same inputs */
        fprintf(stderr, "== %s\n", g_isa);
        ml_backend *be[N_BACKENDS];
        const int threads[N_BACKENDS] = {1, THREADS_MANY};
        int made = 1;
        for (int b = 0; b < N_BACKENDS; b++) {
            char err[ERRLEN] = "";
            be[b] = cpu_ops_create(isa, threads[b], err, sizeof err);
            if (check_create)
                check(be[b] != NULL, "create %s x%d: %s", g_isa, threads[b], err);
            else if (!be[b]) {
                fprintf(stderr, "create %s x%d: %s\n", g_isa, threads[b], err);
                exit(1);
            }
            made &= be[b] != NULL;
        }
        if (!made) {
            for (int b = 0; b < N_BACKENDS; b++)
                if (be[b])
                    be[b]->ops->destroy(be[b]);
            break;
        }
        run(be, isa);
        for (int b = 0; b < N_BACKENDS; b++)
            be[b]->ops->destroy(be[b]);
    }
    unsetenv("ML_CPU_ISA");
    fprintf(stderr, "%d cases compared across paths\n", g_n_first);
    free_first_paths();
    return check_done();
}

#endif

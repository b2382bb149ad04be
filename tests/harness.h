/* A tiny test harness: checks that count failures, close-enough comparisons
 * with a printed max diff, and a skip exit (77, registered as SKIP_RETURN_CODE).
 *
 *     int main(void) { check(1 + 1 == 2, "arithmetic"); return check_done(); }
 */
#ifndef ML_TEST_HARNESS_H
#define ML_TEST_HARNESS_H

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ML_TEST_SKIP 77

/* Every check of a test executable counts here (harness.c). */
extern int ml_test_failures;
extern int ml_test_checks;

static inline void ml_check_at(int ok, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static inline void ml_check_at(int ok, const char *file, int line, const char *fmt, ...)
{
    ml_test_checks++;
    if (ok)
        return;
    ml_test_failures++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

#define check(cond, ...) ml_check_at(!!(cond), __FILE__, __LINE__, __VA_ARGS__)

/* |a - b| <= atol + rtol * |b| */
#define check_close(a, b, atol, rtol, what)                                             \
    do {                                                                                \
        double ca_ = (a), cb_ = (b);                                                    \
        check(fabs(ca_ - cb_) <= (atol) + (rtol)*fabs(cb_), "%s: %.9g vs %.9g", (what), \
              ca_, cb_);                                                                \
    } while (0)

/* Compare n floats; report max absolute and relative error and the first
 * values. Passes when every element satisfies |got-want| <= atol + rtol*|want|.
 * Returns the max absolute difference. */
static inline double check_tensor_at(const float *got, const float *want, size_t n, double atol,
                                     double rtol, const char *what, const char *file, int line)
{
    double max_abs = 0, max_rel = 0;
    size_t worst = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= atol + rtol * fabs((double)want[i])))
            bad++;
        if (d > max_abs || d != d) {
            max_abs = d;
            worst = i;
        }
        double r = d / (fabs((double)want[i]) + 1e-30);
        if (r > max_rel && fabs((double)want[i]) > atol)
            max_rel = r;
    }
    ml_check_at(bad == 0, file, line,
                "%s: %zu/%zu elements out of tolerance; max abs %.3g at %zu (got %.7g want %.7g)",
                what, bad, n, max_abs, worst, n ? got[worst] : 0.0, n ? want[worst] : 0.0);
    fprintf(stderr, "  %-40s n=%-9zu max_abs=%.3g max_rel=%.3g first=[%.5g %.5g %.5g]\n", what, n,
            max_abs, max_rel, n > 0 ? got[0] : 0.0, n > 1 ? got[1] : 0.0, n > 2 ? got[2] : 0.0);
    return max_abs;
}
#define check_tensor(got, want, n, atol, rtol, what) \
    check_tensor_at((got), (want), (n), (atol), (rtol), (what), __FILE__, __LINE__)

/* Normalised mean squared error sum (got - want)^2 / sum want^2 (the plain
 * sum when want is all zero), the error measure of ggml's test-backend-ops. */
static inline double tensor_nmse(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? num / den : num;
}

/* Print a summary and return the process exit code. */
static inline int check_done(void)
{
    fprintf(stderr, "%d checks, %d failures\n", ml_test_checks, ml_test_failures);
    return ml_test_failures ? 1 : 0;
}

/* Exit as skipped, saying why. */
static inline void ml_test_skip(const char *why)
{
    fprintf(stderr, "SKIP: %s\n", why);
    exit(ML_TEST_SKIP);
}

/* ---- benchmarks (label bench) ----------------------------------------- */

/* A benchmark runs only with ML_BENCH=1; otherwise it exits as skipped. */
static inline void ml_bench_require(void)
{
    const char *on = getenv("ML_BENCH");
    if (!on || strcmp(on, "1") != 0)
        ml_test_skip("benchmarks run only with ML_BENCH=1");
}

/* The environment variable `name` as an integer in [lo, hi], else def
 * (unset, not a number or out of range). */
static inline int ml_bench_env_int(const char *name, int def, int lo, int hi)
{
    const char *v = getenv(name);
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    return v && *v && !*end && n >= lo && n <= hi ? (int)n : def;
}

#endif

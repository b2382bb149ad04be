/* Samples of a benchmark's measure and their order statistics, shared by
 * the benches that report percentiles (nearest rank, as tests/bench/README.md
 * states them). Header-only: each bench is one executable.
 * @locality: one thread per samples. */
#ifndef ML_BENCH_SAMPLES_H
#define ML_BENCH_SAMPLES_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define BENCH_SAMPLES_FIRST_CAP 256

typedef struct samples {
    double *v; /* owned; samples_free */
    size_t n, cap;
} samples;

static inline void samples_add(samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : BENCH_SAMPLES_FIRST_CAP;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) {
            fprintf(stderr, "bench: out of memory\n");
            exit(1);
        }
    }
    s->v[s->n++] = x;
}

static inline void samples_free(samples *s)
{
    free(s->v);
    *s = (samples){0};
}

/* qsort's comparison for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of n values (sorts them); NaN when n is 0. */
static inline double bench_median(double *v, size_t n)
{
    if (!n)
        return NAN;
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static inline double samples_mean(const samples *s)
{
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->v[i];
    return s->n ? sum / (double)s->n : NAN;
}

/* The p-th percentile (nearest rank); sorts the samples. NaN when empty. */
static inline double samples_percentile(samples *s, double p)
{
    if (!s->n)
        return NAN;
    qsort(s->v, s->n, sizeof *s->v, bench_cmp_double);
    size_t rank = (size_t)ceil(p / 100.0 * (double)s->n);
    return s->v[rank ? rank - 1 : 0];
}

#endif

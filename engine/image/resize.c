/* Pillow's bilinear resampler for 8-bit RGB, reimplemented from the
 * description of libImaging/Resample.c (Pillow 13): ImagingResampleInner with
 * the BILINEAR filter, precompute_coeffs and normalize_coeffs_8bpc.
 *
 * Per output coordinate the filter is the triangle of support 1 stretched by
 * the downscale factor (antialiasing); weights are normalised in double,
 * quantised to 22 fractional bits and applied with an int32 accumulator that
 * starts at one half. The image is resampled in two separable passes with a
 * uint8 rounding in between, so the order of the passes is part of the
 * result (vertical_first below). When the horizontal pass comes first, its
 * rows are produced on demand into a ring of as many rows as the vertical
 * filter has taps: the same rows with the same arithmetic as Pillow's
 * intermediate image, in a fraction of the memory. */
#include "image/image.h"

#include <math.h>
#include <string.h>

#define PRECISION_BITS (32 - 8 - 2) /* Pillow: 8 bits of result, 2 of headroom */
#define ACC_HALF (1 << (PRECISION_BITS - 1))
#define BILINEAR_SUPPORT 1.0
#define WORKSPACE_ALIGN 64

/* Filter taps of one axis: output i reads source [first[i], first[i] + count[i])
 * with weights weights[i * ksize + k]. */
typedef struct axis_coeffs {
    int32_t *first;   /* (n_out) */
    int32_t *count;   /* (n_out) */
    int32_t *weights; /* (n_out, ksize), 22-bit fixed point */
    int ksize;
} axis_coeffs;

static double bilinear_filter(double x)
{
    if (x < 0.0)
        x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double axis_scale(uint32_t n_in, uint32_t n_out)
{
    /* Pillow takes (box[1] - box[0]) in float and divides in double; the box
     * is the whole image, so the float difference is n_in exactly. */
    return (double)(float)n_in / n_out;
}

static int axis_ksize(uint32_t n_in, uint32_t n_out)
{
    double filterscale = axis_scale(n_in, n_out);
    if (filterscale < 1.0)
        filterscale = 1.0;
    return (int)ceil(BILINEAR_SUPPORT * filterscale) * 2 + 1;
}

/* precompute_coeffs + normalize_coeffs_8bpc for one axis. */
static void axis_coeffs_compute(axis_coeffs *ax, uint32_t n_in, uint32_t n_out)
{
    double scale = axis_scale(n_in, n_out);
    double filterscale = scale < 1.0 ? 1.0 : scale;
    double support = BILINEAR_SUPPORT * filterscale;
    double inv_filterscale = 1.0 / filterscale;
    for (uint32_t i = 0; i < n_out; i++) {
        /* Pillow adds the box origin (0.0) first; adding zero is exact. */
        double center = (i + 0.5) * scale;
        int lo = (int)(center - support + 0.5);
        int hi = (int)(center + support + 0.5);
        if (lo < 0)
            lo = 0;
        if (hi > (int)n_in)
            hi = (int)n_in;
        int n = hi - lo;
        /* Sum first, then divide each weight by the sum, as Pillow does; the
         * filter is recomputed rather than stored, which gives the same
         * doubles. */
        double total = 0.0;
        for (int k = 0; k < n; k++)
            total += bilinear_filter(((k + lo) - center + 0.5) * inv_filterscale);
        int32_t *w = ax->weights + (size_t)i * ax->ksize;
        for (int k = 0; k < n; k++) {
            double v = bilinear_filter(((k + lo) - center + 0.5) * inv_filterscale);
            if (total != 0.0)
                v /= total;
            /* Round half away from zero; the triangle is never negative. */
            w[k] = (int32_t)(0.5 + v * (1 << PRECISION_BITS));
        }
        ax->first[i] = lo;
        ax->count[i] = n;
    }
}

/* The weights of one output sum to 2^22 plus at most half a unit per tap
 * (ksize <= 2 * 65535 + 1), so 255 * sum + 2^21 stays below 2^31. */
static inline uint8_t clip8(int32_t acc)
{
    int32_t v = acc >> PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* One row, horizontal taps: (src_w, 3) -> (dst_w, 3). The coefficient
 * arrays are read into locals first: stores through uint8_t may alias them. */
static void resample_row(const uint8_t *src, uint8_t *dst, uint32_t dst_w, const axis_coeffs *ax)
{
    const int32_t *first = ax->first, *count = ax->count, *weights = ax->weights;
    size_t ksize = (size_t)ax->ksize;
    for (uint32_t x = 0; x < dst_w; x++) {
        const uint8_t *s = src + (size_t)first[x] * ML_IMAGE_CHANNELS;
        const int32_t *w = weights + x * ksize;
        int32_t n = count[x];
        int32_t r = ACC_HALF, g = ACC_HALF, b = ACC_HALF;
        for (int32_t k = 0; k < n; k++) {
            int32_t wk = w[k];
            r += s[3 * k] * wk;
            g += s[3 * k + 1] * wk;
            b += s[3 * k + 2] * wk;
        }
        dst[3 * x] = clip8(r);
        dst[3 * x + 1] = clip8(g);
        dst[3 * x + 2] = clip8(b);
    }
}

/* One output row, vertical taps over `count` rows; acc is (row_bytes) scratch. */
static void resample_column(const uint8_t *const *rows, const int32_t *w, int32_t count,
                            uint8_t *dst, size_t row_bytes, int32_t *acc)
{
    for (size_t i = 0; i < row_bytes; i++)
        acc[i] = ACC_HALF;
    for (int32_t k = 0; k < count; k++) {
        const uint8_t *row = rows[k];
        int32_t wk = w[k];
        for (size_t i = 0; i < row_bytes; i++)
            acc[i] += row[i] * wk;
    }
    for (size_t i = 0; i < row_bytes; i++)
        dst[i] = clip8(acc[i]);
}

/* ---- pass order and workspace ------------------------------------------ */

/* Pillow 13 (PR #9549) runs the vertical pass first when the height shrinks
 * by more than twice as many pixels as the width does; older Pillow always
 * ran the horizontal pass first. The order decides where the intermediate
 * uint8 rounding happens, so it changes pixels. For aspect-preserving
 * downscales this means images more than twice as tall as wide. */
static int vertical_first(uint32_t src_w, uint32_t src_h, uint32_t dst_w, uint32_t dst_h)
{
    int64_t shrink_w = (int64_t)src_w - dst_w, shrink_h = (int64_t)src_h - dst_h;
    return src_w != dst_w && dst_h < src_h && shrink_h > 2 * shrink_w;
}

typedef struct resize_plan {
    int need_h, need_v, v_first;
    int ksize_h, ksize_v;
    size_t off_h[3], off_v[3]; /* first, count, weights */
    /* Horizontal first: a ring of ksize_v horizontally resampled rows
     * (dst_w wide). Vertical first: one vertically resampled row (src_w). */
    size_t off_rows_buf;
    size_t off_rows; /* (ksize_v) row pointers for the vertical taps */
    size_t off_acc;  /* int32 accumulators for one vertical output row */
    size_t total;
} resize_plan;

static size_t take(size_t *cursor, size_t bytes)
{
    size_t at = *cursor;
    *cursor += (bytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
    return at;
}

static void plan_axis(size_t *cursor, size_t off[3], uint32_t n_out, int ksize)
{
    off[0] = take(cursor, sizeof(int32_t) * n_out);
    off[1] = take(cursor, sizeof(int32_t) * n_out);
    off[2] = take(cursor, sizeof(int32_t) * n_out * (size_t)ksize);
}

static void resize_plan_make(resize_plan *rp, uint32_t src_w, uint32_t src_h, uint32_t dst_w,
                             uint32_t dst_h)
{
    memset(rp, 0, sizeof *rp);
    rp->need_h = src_w != dst_w;
    rp->need_v = src_h != dst_h;
    rp->v_first = vertical_first(src_w, src_h, dst_w, dst_h);
    size_t cursor = 0;
    if (rp->need_h) {
        rp->ksize_h = axis_ksize(src_w, dst_w);
        plan_axis(&cursor, rp->off_h, dst_w, rp->ksize_h);
    }
    if (rp->need_v) {
        rp->ksize_v = axis_ksize(src_h, dst_h);
        plan_axis(&cursor, rp->off_v, dst_h, rp->ksize_v);
        /* The vertical pass runs at the source width when it comes first. */
        size_t v_row_bytes = (size_t)(rp->v_first ? src_w : dst_w) * ML_IMAGE_CHANNELS;
        if (rp->v_first)
            rp->off_rows_buf = take(&cursor, v_row_bytes);
        else if (rp->need_h)
            rp->off_rows_buf = take(&cursor, v_row_bytes * (size_t)rp->ksize_v);
        rp->off_rows = take(&cursor, sizeof(const uint8_t *) * (size_t)rp->ksize_v);
        rp->off_acc = take(&cursor, sizeof(int32_t) * v_row_bytes);
    }
    rp->total = cursor + WORKSPACE_ALIGN; /* slack for aligning the caller's pointer */
}

static int resize_args_ok(uint32_t src_w, uint32_t src_h, uint32_t dst_w, uint32_t dst_h)
{
    return src_w && src_h && dst_w && dst_h && src_w <= ML_IMAGE_MAX_SIDE &&
           src_h <= ML_IMAGE_MAX_SIDE && dst_w <= ML_IMAGE_MAX_SIDE && dst_h <= ML_IMAGE_MAX_SIDE;
}

size_t ml_image_resize_workspace_size(uint32_t src_w, uint32_t src_h, uint32_t dst_w,
                                      uint32_t dst_h)
{
    if (!resize_args_ok(src_w, src_h, dst_w, dst_h))
        return 0;
    resize_plan rp;
    resize_plan_make(&rp, src_w, src_h, dst_w, dst_h);
    return rp.total;
}

static axis_coeffs axis_at(uint8_t *base, const size_t off[3], int ksize)
{
    axis_coeffs ax = {
        .first = (int32_t *)(void *)(base + off[0]),
        .count = (int32_t *)(void *)(base + off[1]),
        .weights = (int32_t *)(void *)(base + off[2]),
        .ksize = ksize,
    };
    return ax;
}

/* ---- driver ------------------------------------------------------------- */

ml_status ml_image_resize(const uint8_t *src, uint32_t src_w, uint32_t src_h, uint8_t *dst,
                          uint32_t dst_w, uint32_t dst_h, void *workspace, size_t workspace_size)
{
    if (!resize_args_ok(src_w, src_h, dst_w, dst_h))
        return ML_ERR_INVALID_ARG;
    resize_plan rp;
    resize_plan_make(&rp, src_w, src_h, dst_w, dst_h);
    if (workspace_size < rp.total)
        return ML_ERR_INVALID_ARG;
    uint8_t *base = workspace;
    base += (WORKSPACE_ALIGN - (uintptr_t)base % WORKSPACE_ALIGN) % WORKSPACE_ALIGN;

    size_t src_row = (size_t)src_w * ML_IMAGE_CHANNELS;
    size_t dst_row = (size_t)dst_w * ML_IMAGE_CHANNELS;
    if (!rp.need_h && !rp.need_v) {
        memcpy(dst, src, dst_row * dst_h);
        return ML_OK;
    }
    axis_coeffs hx = {0}, vy = {0};
    if (rp.need_h) {
        hx = axis_at(base, rp.off_h, rp.ksize_h);
        axis_coeffs_compute(&hx, src_w, dst_w);
    }
    if (!rp.need_v) {
        for (uint32_t y = 0; y < dst_h; y++)
            resample_row(src + y * src_row, dst + y * dst_row, dst_w, &hx);
        return ML_OK;
    }
    vy = axis_at(base, rp.off_v, rp.ksize_v);
    axis_coeffs_compute(&vy, src_h, dst_h);
    uint8_t *rows_buf = base + rp.off_rows_buf;
    const uint8_t **rows = (const uint8_t **)(void *)(base + rp.off_rows);
    int32_t *acc = (int32_t *)(void *)(base + rp.off_acc);

    if (rp.v_first) {
        /* Each output row: vertical taps over source rows at the source
         * width, clipped to uint8, then the horizontal taps. */
        for (uint32_t y = 0; y < dst_h; y++) {
            for (int32_t k = 0; k < vy.count[y]; k++)
                rows[k] = src + (size_t)(vy.first[y] + k) * src_row;
            resample_column(rows, vy.weights + (size_t)y * vy.ksize, vy.count[y], rows_buf,
                            src_row, acc);
            resample_row(rows_buf, dst + y * dst_row, dst_w, &hx);
        }
        return ML_OK;
    }

    /* Horizontal first. Source rows used by the vertical pass only move
     * forward, so row r can live in ring slot r % ksize_v: the rows still
     * needed span at most ksize_v. */
    int32_t next_row = 0; /* first source row not yet resampled horizontally */
    for (uint32_t y = 0; y < dst_h; y++) {
        int32_t lo = vy.first[y], n = vy.count[y];
        for (int32_t k = 0; k < n; k++) {
            int32_t r = lo + k;
            if (!rp.need_h) {
                rows[k] = src + (size_t)r * src_row;
                continue;
            }
            uint8_t *slot = rows_buf + (size_t)(r % rp.ksize_v) * dst_row;
            if (r >= next_row) {
                resample_row(src + (size_t)r * src_row, slot, dst_w, &hx);
                next_row = r + 1;
            }
            rows[k] = slot;
        }
        resample_column(rows, vy.weights + (size_t)y * vy.ksize, n, dst + y * dst_row, dst_row,
                        acc);
    }
    return ML_OK;
}

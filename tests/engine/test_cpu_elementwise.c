/* The CPU backend's elementwise and data-movement ops (add_rows, add_bf16,
 * copy_2d, embed, kv_write, kv_store, kv_store_keys, patchify) and its
 * sample op, on each ISA path (cpu_ops_util.h). */
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

    /* kv_store_keys transposes each kv head's keys: (kv head, dim, key),
     * over keys that span several of its parts and end inside one. */
    enum { KEYS = 150 };
    static float keys[KEYS * KVH * HD], kt[KVH * HD * KEYS];
    fill(keys, KEYS * KVH * HD, -1, 1);
    o->kv_store_keys(be, kt, keys, KEYS, KVH, HD);
    ok = 1;
    for (int key = 0; key < KEYS; key++)
        for (int h = 0; h < KVH; h++)
            for (int d = 0; d < HD; d++)
                ok &= kt[(h * HD + d) * KEYS + key] == keys[(key * KVH + h) * HD + d];
    check(ok, "kv_store_keys");
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
 * entries found through its pen_start and its bias entries through its
 * bias_start (not in row order), each thread's scratch its own (rows
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
    /* Row 5's bias first: +30 lifts id 123 over every logit in [-5, 5] and
     * its penalties; row 3's pushes its best ids down. */
    const ml_logit_bias bias[] = {{123, 30.0f}, {7, -100.0f}, {300, 2.5f}, {999, -100.0f}};
    rows[5].bias_start = 0;
    rows[5].n_bias = 1;
    rows[3].bias_start = 1;
    rows[3].n_bias = 3;
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
                          .pen_count = pen_count, .bias = bias, .scratch = scratch,
                          .rows = ROWS, .vocab = V};
    be->ops->sample(be, &p);
    ml_sample_scratch *s = ml_sample_scratch_init(mem, V);
    for (int r = 0; r < ROWS; r++) {
        ml_sample_one(s, logits + (size_t)r * V, &rows[r], pen_id + rows[r].pen_start,
                      pen_count + rows[r].pen_start, bias + rows[r].bias_start, NULL, &want);
        check(memcmp(&got[r], &want, sizeof want) == 0, "sample: row %d: op %d, reference %d", r,
              got[r].chosen.id, want.chosen.id);
    }
    check(got[0].chosen.id == 10 && got[1].chosen.id == 5 &&
              got[2].chosen.id == ML_SAMPLE_NO_TOKEN && got[0].n_top == 0 && got[1].n_top == 1 &&
              got[1].top[0].id == 5,
          "sample: greedy %d %d %d", got[0].chosen.id, got[1].chosen.id, got[2].chosen.id);
    check(got[5].chosen.id == 123, "sample: row 5's bias forces 123 (got %d)", got[5].chosen.id);
    be->ops->free(be, scratch);
    free(mem);
}


static void run_path(ml_backend *be[N_BACKENDS], ml_cpu_isa isa)
{
    test_elementwise(be[1]);
    test_patchify(be[1]);
    test_sample(be[1]);
}

int main(void)
{
    return cpu_ops_run_paths(run_path, 0);
}

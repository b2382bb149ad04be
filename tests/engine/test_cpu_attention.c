/* The CPU backend's attention ops (vision, causal over the paged cache,
 * cross) against a double-precision reference on each ISA path and thread
 * count (cpu_ops_util.h), the vision attention with bf16 activations on a
 * CPU with AVX-512 BF16, the causal and cross attention over a bf16 K/V
 * cache, and the softmax_block kernel of each ISA.
 *
 * Tolerances, with u = 2^-24:
 * - attention: per output element, max|v| · (2·δs + (n_keys + 16)·u) where
 *   δs = 2·head_dim·u·scale·max_j Σ_d |q_d·k_jd| bounds the error of a
 *   scaled score: an error δ in scores scales the softmax weights by
 *   e^(±2δ), and the weights' sum carries at most n_keys roundings.
 * - bf16 activations: the reference takes q, k and v rounded to bf16, as
 *   the backend does, and the bound above grows by 2^-8·max|v|: the
 *   weights are rounded to bf16 before they multiply V (a relative 2^-9
 *   each, so at most 2^-9·max|v| on a weighted mean of v, twice for
 *   slack); the scores' products of rounded q and k are exact in f32.
 * - the vector exp2 inside softmax_block: 4 ulp relative.
 * - a bf16 K/V cache: none. Its kv ops must store each value's bf16
 *   rounding, and since widening it back is exact, its attention must equal,
 *   bit for bit, the f32 cache's over values rounded to bf16 beforehand. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_features.h"
#include "cpu/cpu_kernels.h"
#include "cpu_ops_util.h"
#include "dtype.h"
#include "harness.h"
#include "test_rand.h"

/* ---- attention: reference ------------------------------------------------------------ */

/* One query row against n keys (rows key[j], val[j]) with a visibility
 * predicate `see` (NULL = all); writes the double result and bound. */
/* BF16_WEIGHTS: the bound's term for weights rounded to bf16 (header). */
#define BF16_WEIGHTS 0x1p-8

static void ref_attend(const float *q, const float *const *key, const float *const *val,
                       const uint8_t *see, int n, int hd, float scale, double weights_round,
                       double *out, double *bound)
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
        bound[i] = vmax * (4.0 * ds + (visible + 16) * U + weights_round);
    }
    free(s);
}

/* ---- attention: vision --------------------------------------------------------------- */

/* bf16: be runs bf16 activations (ml_backend_cpu_bf16_activations). */
static void test_attn_vision_case(ml_backend *be[N_BACKENDS], int bf16, int n_seq, int tiles,
                                  int tile_len, int real_len, int n_heads, int hd)
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
    /* What the reference multiplies: the inputs, or with bf16 activations
     * (and a head_dim and length the bf16 path takes) their bf16 values. */
    const int rounded = bf16 && hd % 2 == 0 && seq_len % 2 == 0;
    float *qb = xmalloc(n * sizeof *qb), *kb = xmalloc(n * sizeof *kb), *vb = xmalloc(n * sizeof *vb);
    for (size_t i = 0; i < n; i++) {
        qb[i] = rounded ? ml_round_bf16(q[i]) : q[i];
        kb[i] = rounded ? ml_round_bf16(k[i]) : k[i];
        vb[i] = rounded ? ml_round_bf16(v[i]) : v[i];
    }

    const float **kr = xmalloc((size_t)seq_len * sizeof *kr), **vr = xmalloc((size_t)seq_len * sizeof *vr);
    for (int s = 0; s < n_seq; s++) {
        for (int h = 0; h < n_heads; h++) {
            for (int j = 0; j < seq_len; j++) {
                kr[j] = kb + (((size_t)s * seq_len + j) * n_heads + h) * hd;
                vr[j] = vb + (((size_t)s * seq_len + j) * n_heads + h) * hd;
            }
            for (int t = 0; t < seq_len; t++) {
                const size_t at = (((size_t)s * seq_len + t) * n_heads + h) * hd;
                ref_attend(qb + at, kr, vr, valid[s * seq_len + t] ? NULL : valid + s * seq_len,
                           seq_len, hd, scale, rounded ? BF16_WEIGHTS : 0, want + at, bound + at);
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attn_vision%s seqs=%d len=%d heads=%d hd=%d",
             bf16 ? " bf16 activations" : "", n_seq, seq_len, n_heads, hd);
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
    free(qb);
    free(kb);
    free(vb);
    free(want);
    free(bound);
    free(valid);
    free(kr);
    free(vr);
}

static void test_attn_vision(ml_backend *be[N_BACKENDS], int bf16)
{
    test_attn_vision_case(be, bf16, 4, 2, 8, 8, 3, 16); /* odd sequences have no padding */
    test_attn_vision_case(be, bf16, 3, 4, 56, 53, 2, 80); /* 224 keys: several blocks */
    test_attn_vision_case(be, bf16, 1, 2, 24, 21, 2, 128);
    test_attn_vision_case(be, bf16, 2, 2, 20, 19, 1, 256); /* the largest head_dim */
    /* mostly padding: the padding queries skip the key blocks without a valid key */
    test_attn_vision_case(be, bf16, 2, 4, 100, 97, 2, 80);
    if (bf16) /* an odd length: the f32 path, within the same bound */
        test_attn_vision_case(be, bf16, 2, 1, 45, 41, 2, 80);
}

/* bf16 activations, on a CPU with AVX-512 BF16 (test_cpu_matmul checks the
 * refusal elsewhere): the vision attention as above, on AMX where the CPU
 * has it and on the vector kernel (ML_CPU_AMX=0), over the same inputs. */
static void test_attn_vision_bf16(ml_cpu_isa isa)
{
    if (isa != ML_CPU_ISA_AVX512 || !ml_cpu_has_avx512_bf16())
        return;
    const int threads[N_BACKENDS] = {1, THREADS_MANY};
    const uint64_t rng = ml_test_rng;
    for (int amx = ml_cpu_has_amx_bf16(); amx >= 0; amx--) {
        setenv("ML_CPU_AMX", amx ? "1" : "0", 1);
        rand_seed(rng);
        ml_backend *be[N_BACKENDS] = {NULL};
        int ready = 1;
        for (int b = 0; b < N_BACKENDS; b++) {
            char err[ERRLEN] = "";
            be[b] = cpu_ops_create(isa, threads[b], err, sizeof err);
            ready &= be[b] && ml_backend_cpu_bf16_activations(be[b], err, sizeof err) == ML_OK;
            check(ready, "bf16 activations [%s] x%d, AMX %d: %s", g_isa, threads[b], amx, err);
        }
        if (ready)
            test_attn_vision(be, 1);
        for (int b = 0; b < N_BACKENDS; b++)
            if (be[b])
                be[b]->ops->destroy(be[b]);
    }
    unsetenv("ML_CPU_AMX");
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
                ref_attend(q + at, kr, vr, NULL, pos0[s] + t + 1, hd, scale, 0, want + at,
                           bound + at);
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
 *   REAL   TILES without the rows that see no chunk, and the padded tiles'
 *          K and V in the backend's states NaN: with chunk_len a multiple
 *          of the key block no block straddles a real and a padded tile, so
 *          a kernel that reads a padded tile's keys, which a decode step
 *          should not stream, gives NaN
 * With chunk_len above the kernel's key block, whole key blocks are masked
 * for every row of an item and skipped.
 *
 * Besides the naive reference, each case runs a second time with one more
 * row at the end of every sequence that may see every chunk: the item
 * holding it visits every key block, as the kernel did before it skipped
 * any, and the other rows must come out bit for bit the same (an item's
 * columns never interact, and a skipped block would only have added
 * exp(-inf) = 0 weights); not with REAL, whose padded tiles that row would
 * read. */
#define CROSS_SEQS 4
#define CROSS_MAX_IMAGES 3
#define CROSS_STATES 4
#define CROSS_LAYERS 2
#define CROSS_NONE_EVERY 13
static const int CROSS_TILES_USED[CROSS_STATES] = {1, 2, 3, 1};

typedef enum cross_mask {
    CROSS_MASK_MIXED,
    CROSS_MASK_TILES,
    CROSS_MASK_REAL,
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
        case CROSS_MASK_REAL:
            row[c] = (mask == CROSS_MASK_REAL || t % CROSS_NONE_EVERY != CROSS_NONE_EVERY - 1) &&
                     c / max_tiles == img && c % max_tiles < CROSS_TILES_USED[state_of[img]];
            break;
        }
    }
}

/* Keys per chunk in the REAL cases: a multiple of the CPU kernel's key block
 * (attention.c ATTN_BK) and of the CUDA kernel's key tile (32). */
#define CROSS_POISON_CHUNK 96

/* NaN in the keys [real_keys, image_keys) of each of the planes (K as
 * kv_store_keys lays it out: width rows of image_keys keys; V: image_keys
 * rows of width) of a state. */
static void poison_padded_tiles(float *state, int real_keys, int image_keys, int planes,
                                int width)
{
    const size_t plane = (size_t)image_keys * width;
    for (int pl = 0; pl < planes; pl++) {
        float *at = state + pl * plane;
        for (int r = 0; r < width; r++)
            for (int key = real_keys; key < image_keys; key++)
                at[pl % 2 == 0 ? (size_t)r * image_keys + key : (size_t)key * width + r] = NAN;
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

    /* states: the planes as the reference reads them, K as rows; stored:
     * the same as the backend keeps them, K through kv_store_keys. */
    float *states[CROSS_STATES], *stored[CROSS_STATES];
    for (int i = 0; i < CROSS_STATES; i++) {
        states[i] = xmalloc(2 * CROSS_LAYERS * plane_bytes);
        fill(states[i], 2 * CROSS_LAYERS * plane, -1, 1);
        stored[i] = xmalloc(2 * CROSS_LAYERS * plane_bytes);
        memcpy(stored[i], states[i], 2 * CROSS_LAYERS * plane_bytes);
        for (int l = 0; l < CROSS_LAYERS; l++)
            be[0]->ops->kv_store_keys(be[0], stored[i] + 2 * l * plane, states[i] + 2 * l * plane,
                                      image_keys, n_kv, hd);
        if (mask == CROSS_MASK_REAL)
            poison_padded_tiles(stored[i], CROSS_TILES_USED[i] * chunk_len, image_keys,
                                2 * CROSS_LAYERS, n_kv * hd);
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
            table[s * CROSS_MAX_IMAGES + i] = i < n_img[s] ? stored[state_of[s][i]] : (void *)-1;
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
                ref_attend(q + at, kr, vr, any ? see : NULL, n_keys, hd, scale, 0, want + at,
                           bound + at);
            }
        }
    }
    char what[96];
    static const char *const MASK_NAMES[] = {"mixed", "tiles", "real tiles"};
    snprintf(what, sizeof what, "attn_cross %s tokens=%d,%d,%d,%d heads=%d kv=%d hd=%d tiles=%d chunk=%d",
             MASK_NAMES[mask], n_tok[0], n_tok[1], n_tok[2], n_tok[3],
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

    if (mask != CROSS_MASK_REAL) {
        p.out = out_wide;
        p.q = q_wide;
        p.seq_start = wide_start;
        p.allowed = allowed_wide;
        p.n_tokens = T_wide;
        be[1]->ops->attn_cross(be[1], &p);
        int same = 1;
        for (int s = 0; s < CROSS_SEQS; s++)
            same &= memcmp(out_wide + (size_t)wide_start[s] * row,
                           out[1] + (size_t)seq_start[s] * row,
                           (size_t)n_tok[s] * row * sizeof *out_wide) == 0;
        check(same, "%s [%s]: rows differ from the same rows in items that visit every key",
              what, g_isa);
    }

    for (int b = 0; b < N_BACKENDS; b++)
        free(out[b]);
    for (int i = 0; i < CROSS_STATES; i++) {
        free(states[i]);
        free(stored[i]);
    }
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
    /* the padded tiles not read: chunks of whole key blocks */
    test_attn_cross_case(be, decode, 8, 2, 64, 4, CROSS_POISON_CHUNK, CROSS_MASK_REAL);
    test_attn_cross_case(be, long_rows, 8, 1, 32, 4, 2 * CROSS_POISON_CHUNK, CROSS_MASK_REAL);
}

/* Sequences that see the same images, as n > 1 choices of a request do,
 * run as one item per kv head and block of rows (attention.c
 * merge_image_runs): each sequence's rows must come out bit for bit as when
 * the sequence runs alone. n_seqs sequences of n_tok[s] tokens see images
 * SHARED_PLAN[s % 6] of two states (A = 0, B = 1): runs of A, of A then B,
 * a text-only sequence between them, and a last A apart from the first run.
 * Each token's mask is random over its images' chunks (some see only B's,
 * some none): a key block one row of a run sees is masked for others. */
#define SHARED_PLAN_LEN 6
static const int SHARED_PLAN_N[SHARED_PLAN_LEN] = {1, 1, 2, 2, 0, 1};

static void test_attn_cross_shared_case(ml_backend *be, int n_seqs, const int *n_tok, int n_heads,
                                        int n_kv, int hd, int max_tiles, int chunk_len)
{
    enum { MAX_IMAGES = 2 };
    const int image_keys = max_tiles * chunk_len, stride = MAX_IMAGES * max_tiles;
    const size_t plane = (size_t)image_keys * n_kv * hd, row = (size_t)n_heads * hd;
    float *state[MAX_IMAGES];
    for (int i = 0; i < MAX_IMAGES; i++) {
        float *raw = xmalloc(2 * plane * sizeof *raw);
        state[i] = xmalloc(2 * plane * sizeof *state[i]);
        fill(raw, 2 * plane, -1, 1);
        memcpy(state[i], raw, 2 * plane * sizeof *raw);
        be->ops->kv_store_keys(be, state[i], raw, image_keys, n_kv, hd);
        free(raw);
    }
    const void **table = xmalloc((size_t)n_seqs * MAX_IMAGES * sizeof *table);
    int32_t *n_images = xmalloc((size_t)n_seqs * sizeof *n_images);
    int32_t *seq_start = xmalloc((size_t)(n_seqs + 1) * sizeof *seq_start);
    seq_start[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        n_images[s] = SHARED_PLAN_N[s % SHARED_PLAN_LEN];
        for (int i = 0; i < MAX_IMAGES; i++)
            table[(size_t)s * MAX_IMAGES + i] = i < n_images[s] ? state[i] : (const void *)-1;
        seq_start[s + 1] = seq_start[s] + n_tok[s];
    }
    const int T = seq_start[n_seqs];
    uint8_t *allowed = xmalloc((size_t)T * stride);
    for (size_t i = 0; i < (size_t)T * stride; i++)
        allowed[i] = urand() < 0.5;
    float *q = xmalloc((size_t)T * row * sizeof *q);
    float *all = xmalloc((size_t)T * row * sizeof *all), *alone = xmalloc(row * sizeof *alone);
    fill(q, (size_t)T * row, -2, 2);
    ml_attn_cross_params p = {.out = all, .q = q, .states = table, .k_offset = 0,
                              .v_offset = plane * sizeof(float), .n_images = n_images,
                              .seq_start = seq_start, .allowed = allowed, .n_seqs = n_seqs,
                              .n_tokens = T, .max_images = MAX_IMAGES, .max_tiles = max_tiles,
                              .chunk_len = chunk_len, .n_heads = n_heads, .n_kv_heads = n_kv,
                              .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    be->ops->attn_cross(be, &p);
    int same = 1;
    for (int s = 0; s < n_seqs; s++) {
        for (int t = seq_start[s]; t < seq_start[s + 1]; t++) {
            /* the sequence alone, one token at a time (a decode step's rows) */
            const int32_t one_start[2] = {0, 1};
            ml_attn_cross_params a = p;
            a.out = alone;
            a.q = q + (size_t)t * row;
            a.states = table + (size_t)s * MAX_IMAGES;
            a.n_images = n_images + s;
            a.seq_start = one_start;
            a.allowed = allowed + (size_t)t * stride;
            a.n_seqs = 1;
            a.n_tokens = 1;
            be->ops->attn_cross(be, &a);
            same &= memcmp(alone, all + (size_t)t * row, row * sizeof *alone) == 0;
        }
    }
    check(same,
          "attn_cross, %d sequences sharing images, heads=%d kv=%d hd=%d tiles=%d chunk=%d [%s]: "
          "a row differs from the same row alone",
          n_seqs, n_heads, n_kv, hd, max_tiles, chunk_len, g_isa);
    for (int i = 0; i < MAX_IMAGES; i++)
        free(state[i]);
    free(table);
    free(n_images);
    free(seq_start);
    free(allowed);
    free(q);
    free(all);
    free(alone);
}

static void test_attn_cross_shared(ml_backend *be[N_BACKENDS])
{
    /* 30 decode sequences: runs longer than one block of rows at group 4 */
    int decode[30], mixed[13];
    for (int s = 0; s < 30; s++)
        decode[s] = 1;
    for (int s = 0; s < 13; s++)
        mixed[s] = 1 + (s * 7) % 5; /* prefill chunks beside decode rows */
    for (int b = 0; b < N_BACKENDS; b++) {
        test_attn_cross_shared_case(be[b], 30, decode, 8, 2, 64, 2, 70);
        test_attn_cross_shared_case(be[b], 13, mixed, 8, 2, 64, 2, 70);
        test_attn_cross_shared_case(be[b], 13, mixed, 4, 4, 16, 4, 7);
    }
}

/* ---- attention over a bf16 K/V cache ------------------------------------------------ */

/* The bf16 store of n values (kv16 a cache of ml_backend_cpu_bf16_kv_cache)
 * holds each one's RNE rounding. */
static int stored_bf16(const uint16_t *kv16, const float *raw, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (kv16[i] != ml_f32_to_bf16(raw[i]))
            return 0;
    return 1;
}

static float *rounded_copy(const float *x, size_t n)
{
    float *r = xmalloc(n * sizeof *r);
    for (size_t i = 0; i < n; i++)
        r[i] = ml_round_bf16(x[i]);
    return r;
}

/* Causal: sequences with ctx[s] keys each, the last n_new[s] of them new
 * this step, in blocks mapped in reverse order; the cache written by
 * kv_write, rounded values into be32's f32 cache, raw ones into be16's. */
static void test_kv16_causal_case(ml_backend *be32, ml_backend *be16, int n_heads, int n_kv,
                                  int hd, int block_size)
{
    enum { SEQS = 3 };
    static const int ctx[SEQS] = {1, 97, 300}; /* one key; a block and one; several blocks */
    static const int n_new[SEQS] = {1, 1, 20};
    int32_t seq_start[SEQS + 1] = {0}, pos0[SEQS], slot_base[SEQS + 1] = {0};
    int max_blocks = 0;
    for (int s = 0; s < SEQS; s++) {
        seq_start[s + 1] = seq_start[s] + n_new[s];
        pos0[s] = ctx[s] - n_new[s];
        const int nb = (ctx[s] + block_size - 1) / block_size;
        max_blocks = nb > max_blocks ? nb : max_blocks;
        slot_base[s + 1] = slot_base[s] + nb;
    }
    const int n_phys = slot_base[SEQS];
    int32_t *table = xmalloc((size_t)SEQS * max_blocks * sizeof *table);
    for (int s = 0; s < SEQS; s++)
        for (int b = 0; b < max_blocks; b++)
            table[s * max_blocks + b] =
                b < slot_base[s + 1] - slot_base[s] ? n_phys - 1 - (slot_base[s] + b) : -1;
    /* every key of every sequence, in order, and its slot */
    int keys = 0;
    for (int s = 0; s < SEQS; s++)
        keys += ctx[s];
    const size_t row = (size_t)n_kv * hd, cache_n = (size_t)n_phys * block_size * row;
    int32_t *slot = xmalloc((size_t)keys * sizeof *slot);
    for (int s = 0, i = 0; s < SEQS; s++)
        for (int j = 0; j < ctx[s]; j++, i++)
            slot[i] = table[s * max_blocks + j / block_size] * block_size + j % block_size;
    float *k = xmalloc((size_t)keys * row * sizeof *k), *v = xmalloc((size_t)keys * row * sizeof *v);
    fill(k, (size_t)keys * row, -1, 1);
    fill(v, (size_t)keys * row, -1, 1);
    float *k_r = rounded_copy(k, (size_t)keys * row), *v_r = rounded_copy(v, (size_t)keys * row);
    float *kc32 = xmalloc(cache_n * sizeof *kc32), *vc32 = xmalloc(cache_n * sizeof *vc32);
    uint16_t *kc16 = xmalloc(cache_n * sizeof *kc16), *vc16 = xmalloc(cache_n * sizeof *vc16);
    be32->ops->kv_write(be32, kc32, vc32, k_r, v_r, slot, keys, n_kv, hd);
    be16->ops->kv_write(be16, kc16, vc16, k, v, slot, keys, n_kv, hd);
    int stored = 1;
    for (int i = 0; i < keys; i++)
        stored &= stored_bf16(kc16 + (size_t)slot[i] * row, k + (size_t)i * row, row) &&
                  stored_bf16(vc16 + (size_t)slot[i] * row, v + (size_t)i * row, row);

    const size_t n = (size_t)seq_start[SEQS] * n_heads * hd;
    float *q = xmalloc(n * sizeof *q), *out32 = xmalloc(n * sizeof *out32);
    float *out16 = xmalloc(n * sizeof *out16);
    fill(q, n, -2, 2);
    ml_attn_causal_params p = {.out = out32, .q = q, .k_cache = kc32, .v_cache = vc32,
                               .block_table = table, .seq_start = seq_start, .pos0 = pos0,
                               .n_seqs = SEQS, .max_blocks_per_seq = max_blocks,
                               .block_size = block_size, .n_heads = n_heads, .n_kv_heads = n_kv,
                               .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    be32->ops->attn_causal(be32, &p);
    p.out = out16;
    p.k_cache = kc16;
    p.v_cache = vc16;
    be16->ops->attn_causal(be16, &p);

    char what[96];
    snprintf(what, sizeof what, "attn_causal bf16 cache heads=%d kv=%d hd=%d block=%d [%s]",
             n_heads, n_kv, hd, block_size, g_isa);
    check(stored, "%s: kv_write stored other than each value's bf16", what);
    check(!memcmp(out32, out16, n * sizeof *out32),
          "%s: not the f32 cache's result over the rounded values", what);
    free(table);
    free(slot);
    free(k);
    free(v);
    free(k_r);
    free(v_r);
    free(kc32);
    free(vc32);
    free(kc16);
    free(vc16);
    free(q);
    free(out32);
    free(out16);
}

/* Cross: three sequences (one image, two images, text only) over states
 * stored by kv_store_keys and kv_store, rounded values into be32's f32
 * states, raw ones into be16's; chunks longer than a key block, allowed at
 * random, so that items skip blocks, straddle images and prefetch the next
 * block of theirs. */
static void test_kv16_cross_case(ml_backend *be32, ml_backend *be16, int n_heads, int n_kv,
                                 int hd, int max_tiles, int chunk_len, int decode)
{
    enum { SEQS = 3, MAX_IMAGES = 2, STATES = 2 };
    static const int n_img[SEQS] = {1, 2, 0};
    const int n_tok[SEQS] = {decode ? 1 : 6, decode ? 1 : 9, decode ? 1 : 3};
    const int image_keys = max_tiles * chunk_len, stride = MAX_IMAGES * max_tiles;
    const size_t plane = (size_t)image_keys * n_kv * hd;
    float *raw[STATES][2], *st32[STATES];
    uint16_t *st16[STATES];
    int stored = 1;
    for (int i = 0; i < STATES; i++) {
        st32[i] = xmalloc(2 * plane * sizeof *st32[i]);
        st16[i] = xmalloc(2 * plane * sizeof *st16[i]);
        for (int kv = 0; kv < 2; kv++) {
            raw[i][kv] = xmalloc(plane * sizeof *raw[i][kv]);
            fill(raw[i][kv], plane, -1, 1);
        }
        float *k_r = rounded_copy(raw[i][0], plane), *v_r = rounded_copy(raw[i][1], plane);
        be32->ops->kv_store_keys(be32, st32[i], k_r, image_keys, n_kv, hd);
        be32->ops->kv_store(be32, st32[i] + plane, v_r, plane);
        be16->ops->kv_store_keys(be16, st16[i], raw[i][0], image_keys, n_kv, hd);
        be16->ops->kv_store(be16, st16[i] + plane, raw[i][1], plane);
        stored &= stored_bf16(st16[i] + plane, raw[i][1], plane);
        for (int h = 0; h < n_kv; h++) /* K transposed: (kv head, dim, key) */
            for (int d = 0; d < hd; d++)
                for (int key = 0; key < image_keys; key++)
                    stored &= st16[i][((size_t)h * hd + d) * image_keys + key] ==
                              ml_f32_to_bf16(raw[i][0][((size_t)key * n_kv + h) * hd + d]);
        free(k_r);
        free(v_r);
    }
    int32_t n_images[SEQS], seq_start[SEQS + 1] = {0};
    const void *t32[SEQS * MAX_IMAGES], *t16[SEQS * MAX_IMAGES];
    for (int s = 0; s < SEQS; s++) {
        n_images[s] = n_img[s];
        seq_start[s + 1] = seq_start[s] + n_tok[s];
        for (int i = 0; i < MAX_IMAGES; i++) {
            t32[s * MAX_IMAGES + i] = i < n_img[s] ? (const void *)st32[(s + i) % STATES] : NULL;
            t16[s * MAX_IMAGES + i] = i < n_img[s] ? (const void *)st16[(s + i) % STATES] : NULL;
        }
    }
    const int T = seq_start[SEQS];
    uint8_t *allowed = xmalloc((size_t)T * stride);
    for (int t = 0; t < T * stride; t++)
        allowed[t] = urand() < 0.5;
    const size_t n = (size_t)T * n_heads * hd;
    float *q = xmalloc(n * sizeof *q), *out32 = xmalloc(n * sizeof *out32);
    float *out16 = xmalloc(n * sizeof *out16);
    fill(q, n, -2, 2);
    ml_attn_cross_params p = {.out = out32, .q = q, .states = t32, .k_offset = 0,
                              .v_offset = plane * sizeof(float), .n_images = n_images,
                              .seq_start = seq_start, .allowed = allowed, .n_seqs = SEQS,
                              .n_tokens = T, .max_images = MAX_IMAGES, .max_tiles = max_tiles,
                              .chunk_len = chunk_len, .n_heads = n_heads, .n_kv_heads = n_kv,
                              .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    be32->ops->attn_cross(be32, &p);
    p.out = out16;
    p.states = t16;
    p.v_offset = plane * sizeof(uint16_t);
    be16->ops->attn_cross(be16, &p);

    char what[112];
    snprintf(what, sizeof what, "attn_cross bf16 states %s heads=%d kv=%d hd=%d tiles=%d chunk=%d [%s]",
             decode ? "decode" : "prefill", n_heads, n_kv, hd, max_tiles, chunk_len, g_isa);
    check(stored, "%s: kv_store or kv_store_keys stored other than each value's bf16", what);
    check(!memcmp(out32, out16, n * sizeof *out32),
          "%s: not the f32 states' result over the rounded values", what);
    for (int i = 0; i < STATES; i++) {
        free(st32[i]);
        free(st16[i]);
        free(raw[i][0]);
        free(raw[i][1]);
    }
    free(allowed);
    free(q);
    free(out32);
    free(out16);
}

/* Both kinds on this ISA, 3 threads each, an f32-cache backend against a
 * bf16-cache one. */
static void test_attn_kv16(ml_cpu_isa isa)
{
    char err[ERRLEN] = "";
    ml_backend *be32 = cpu_ops_create(isa, THREADS_MANY, err, sizeof err);
    ml_backend *be16 = be32 ? cpu_ops_create(isa, THREADS_MANY, err, sizeof err) : NULL;
    const int ready = be16 && ml_backend_cpu_bf16_kv_cache(be16, err, sizeof err) == ML_OK;
    check(ready, "bf16 K/V cache [%s]: %s", g_isa, err);
    if (ready) {
        check(be16->ops->kv_elem_size == sizeof(uint16_t) &&
                  be32->ops->kv_elem_size == sizeof(float),
              "bf16 K/V cache [%s]: kv_elem_size %zu (f32 backend %zu)", g_isa,
              be16->ops->kv_elem_size, be32->ops->kv_elem_size);
        test_kv16_causal_case(be32, be16, 8, 2, 128, 16); /* GQA 4, the engine's shapes */
        test_kv16_causal_case(be32, be16, 4, 4, 80, 4);
        test_kv16_cross_case(be32, be16, 8, 2, 128, 2, 150, 1);
        test_kv16_cross_case(be32, be16, 8, 2, 64, 4, 61, 0);
    }
    if (be32 && isa == ML_CPU_ISA_PLAIN) { /* the mode is fixed once a model is loaded */
        static const uint16_t one[1] = {0x3f80};
        const void *w = be32->ops->linear_weight(be32, one, 1, 1, sizeof one[0]);
        check(w != NULL, "linear_weight 1 x 1");
        check(ml_backend_cpu_bf16_kv_cache(be32, err, sizeof err) == ML_ERR_INVALID_ARG &&
                  strstr(err, "a model is already loaded") &&
                  be32->ops->kv_elem_size == sizeof(float),
              "bf16 K/V cache refused once a Linear is bound: %s", err);
        be32->ops->linear_weight_free(be32, w);
    }
    if (be32)
        be32->ops->destroy(be32);
    if (be16)
        be16->ops->destroy(be16);
}

/* ---- kernels ------------------------------------------------------------------------------ */

/* softmax_block over two key blocks (an online update) against double,
 * in powers of 2 as the kernel computes. */
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
                double want = exp2(arg);
                sum += want;
                if (want < 1.2e-38) { /* below FLT_MIN: 0 or denormal */
                    ok &= s[j * NQ + c] <= 1.2e-38f;
                    continue;
                }
                double e = fabs(s[j * NQ + c] - want) / want;
                e_max = e > e_max ? e : e_max;
            }
            const double a = exp2((float)((double)m_old[c] - sh));
            ok_alpha &= fabs(alpha[c] - a) <= 4 * U * a + 1.2e-38;
            ok_l &= fabs(l[c] - (l_old[c] * a + sum)) <= (NK + 8) * U * (l_old[c] * a + sum);
        }
    }
    const char *isa = ml_cpu_isa_name(kn->isa);
    check(ok && e_max <= 4 * U, "softmax_block [%s]: exp2 off (max rel err %.3g ulp)", isa,
          e_max / (2 * U));
    check(ok_m, "softmax_block [%s]: running max", isa);
    check(ok_l, "softmax_block [%s]: running sum", isa);
    check(ok_alpha, "softmax_block [%s]: rescale factors", isa);
    fprintf(stderr, "  softmax_block exp2 max rel error %.3g ulp\n", e_max / (2 * U));
}


/* softmax_block's exp2 over its whole range: a column whose scores are
 * SWEEP_KEYS points t in [-128, 0] (with scale 1 and a score of 0 in the
 * column the argument is t itself), each weight against double exp2. The
 * header's bound is 1 ulp (2U relative) and 0 below 2^-126 (libm's
 * denormals on the plain path). */
#define SWEEP_KEYS (1 << 22)
#define SWEEP_LO (-128.0)

static void test_softmax_exp2_sweep(const ml_cpu_kernels *kn)
{
    float *s = xmalloc((size_t)SWEEP_KEYS * sizeof *s);
    for (int j = 0; j < SWEEP_KEYS; j++)
        s[j] = (float)(SWEEP_LO * j / (SWEEP_KEYS - 1)); /* from 0 down */
    float m = -INFINITY, l = 0, alpha;
    kn->softmax_block(s, 1, SWEEP_KEYS, 1, 1.0f, &m, &l, &alpha);
    double e_max = 0;
    int zero_below = 1;
    for (int j = 0; j < SWEEP_KEYS; j++) {
        const float t = (float)(SWEEP_LO * j / (SWEEP_KEYS - 1));
        const double want = exp2(t);
        if (t < -126.0f) {
            zero_below &= kn->isa == ML_CPU_ISA_PLAIN ? s[j] < FLT_MIN : s[j] == 0.0f;
            continue;
        }
        const double e = fabs(s[j] - want) / want;
        e_max = e > e_max ? e : e_max;
    }
    const char *isa = ml_cpu_isa_name(kn->isa);
    check(e_max <= 2 * U, "softmax_block [%s]: exp2 over [-126, 0] off by %.3g ulp", isa,
          e_max / (2 * U));
    check(zero_below, "softmax_block [%s]: exp2 below 2^-126 not 0", isa);
    check(s[0] == 1.0f && alpha == 0.0f, "softmax_block [%s]: 2^0 = %.9g, 2^-inf = %g", isa,
          s[0], alpha);
    fprintf(stderr, "  softmax_block exp2 over [-126, 0]: max rel error %.3g ulp\n",
            e_max / (2 * U));
    free(s);
}

static void run_path(ml_backend *be[N_BACKENDS], ml_cpu_isa isa)
{
    test_softmax_kernel(ml_cpu_kernels_for(isa));
    test_softmax_exp2_sweep(ml_cpu_kernels_for(isa));
    test_attn_vision(be, 0);
    test_attn_causal(be);
    test_attn_cross(be);
    test_attn_cross_shared(be);
    test_attn_vision_bf16(isa);
    test_attn_kv16(isa);
}

int main(void)
{
    return cpu_ops_run_paths(run_path, 0);
}

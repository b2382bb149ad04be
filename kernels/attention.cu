/* The attention ops of backend.h: validate the parameters, translate them
 * into mlk_attn_args and choose a kernel and launch shape.
 *
 * - attn_vision: the tensor-core kernel (attn_mma.cu) for head dims it is
 *   built for, else the SIMT kernel with 16-row warps.
 * - attn_causal: the SIMT kernel. Token counts live in device memory
 *   (seq_start, pos0), so the shape depends only on host-known values:
 *   4-row warps when a token's GQA group fits (decode: one CTA row block
 *   per sequence, keys split over the CTA's warps and over z_slots CTAs),
 *   and sequences with more rows stride their row blocks over the same
 *   CTAs. Nothing here reads the lengths, so a decode step can be recorded
 *   in a graph and replayed at growing positions.
 * - attn_cross: the SIMT kernel over every sequence of the step at once,
 *   the same way: image counts, token ranges and state pointers live in
 *   device memory, and the shape comes from the call's scalars. A step of
 *   about one token per sequence (decode) splits each sequence's keys (a
 *   token over an image's 6404) over CTAs; longer ones stride row blocks.
 * Unsupported shapes (head_dim not a multiple of 8 or above 256) latch
 * ML_ERR_UNSUPPORTED.
 *
 * Batch-invariant backends (mlk_backend.batch_invariant): the shapes above
 * follow the step (z from the number of sequences, the cross-attention's
 * warp shape and split from the average sequence), so a decode row's keys
 * are split and merged differently as other sequences come and go. There,
 * causal and cross use rows_per_warp(group) and BI_KV_SPLITS CTAs per
 * (kv head, sequence) always, with the split on: a single-block sequence's
 * keys go in BI_KV_SPLITS parts of ceil(tiles / BI_KV_SPLITS) tiles, a
 * function of its own length, merged in split order; longer sequences
 * stride their row blocks, each row's keys walked by one warp in order as
 * before. When the partials of every sequence would not fit the
 * workspace, the sequences go in groups, one launch each (seq0). The
 * vision attention needs nothing: an image's rows never meet another
 * image's in its shape or order. */
#include <cstring>

#include "attention.cuh"

/* Resident CTAs aimed for per SM when choosing z_slots. */
#define CTAS_PER_SM 4
/* The fewest key tiles (of 32) worth a CTA of their own. */
#define MIN_TILES_PER_SPLIT 4
#define KEY_TILE_KEYS 32
/* Alignment of the cross-attention K/V planes: one 16-byte load of 8 bf16. */
#define KV_LOAD_ALIGN 16
#define VISION_ROWS MLK_ATTN_SIMT_MAX_ROWS
/* The SIMT kernel's rows per CTA in its many-rows shape. */
#define SIMT_CTA_ROWS(rows_per_warp) (4 * (rows_per_warp))
/* Batch-invariant backends: CTAs a decode sequence's keys are split over,
 * whatever the step (a single sequence at batch 1 still spreads over the
 * GPU: 16 x 8 kv heads = 128 CTAs). */
#define BI_KV_SPLITS 16

void mlk_attn_init(mlk_backend *b)
{
    mlk_attn_simt_init();
    mlk_attn_mma_init();
}

static int check_heads(mlk_backend *b, const char *op, int n_heads, int n_kv_heads, int head_dim)
{
    if (head_dim < 8 || head_dim % 8 != 0 || head_dim > MLK_MAX_HEAD_DIM) {
        mlk_latch(b, ML_ERR_UNSUPPORTED, op, "head_dim %d (a multiple of 8 up to %d)", head_dim,
                  MLK_MAX_HEAD_DIM);
        return -1;
    }
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads != 0) {
        mlk_latch(b, ML_ERR_INVALID_ARG, op, "%d heads over %d kv heads", n_heads, n_kv_heads);
        return -1;
    }
    return 0;
}

/* Rows per warp: 4 when one token's GQA group fits (decode), else 8. */
static int rows_per_warp(int rows)
{
    return rows <= 4 ? 4 : MLK_ATTN_SIMT_MAX_ROWS;
}

/* Largest split count (<= want) whose partials fit the workspace. */
static int fit_splits(int want, int n_seqs, int n_kv_heads, int rows, int head_dim)
{
    const size_t per_split = (size_t)n_seqs * n_kv_heads * rows * (head_dim + 2) * sizeof(float);
    const size_t fit = MLK_ATTN_WS_BYTES / per_split;
    return (size_t)want < fit ? want : (int)fit;
}

/* The batch-invariant launch of a causal or cross call: BI_KV_SPLITS CTAs
 * per (kv head, sequence) with the split on, the sequences in as few
 * groups as the workspace allows. */
static void attn_invariant(mlk_backend *b, mlk_attn_args *a, int rpw, const char *op)
{
    a->split = 1;
    a->partial = b->attn_ws;
    const size_t per_seq =
        (size_t)BI_KV_SPLITS * a->n_kv_heads * rpw * (a->head_dim + 2) * sizeof(float);
    const int group = (int)(MLK_ATTN_WS_BYTES / per_seq);
    if (group < 1) {
        mlk_latch(b, ML_ERR_UNSUPPORTED, op,
                  "batch-invariant split of %d kv heads needs %zu bytes of partials per sequence",
                  a->n_kv_heads, per_seq);
        return;
    }
    const int n_seqs = a->n_seqs;
    for (int s0 = 0; s0 < n_seqs && b->err_status == ML_OK; s0 += group) {
        a->seq0 = s0;
        a->n_seqs = n_seqs - s0 < group ? n_seqs - s0 : group;
        mlk_attn_simt(b, a, rpw, BI_KV_SPLITS, op);
    }
}

void mlk_attn_vision(ml_backend *be, const ml_attn_vision_params *p)
{
    mlk_backend *b = mlk_of(be);
    const char *op = "attn_vision";
    if (p->n_seq <= 0 || p->seq_len <= 0 || mlk_enter(b) ||
        check_heads(b, op, p->n_heads, p->n_heads, p->head_dim))
        return;
    mlk_attn_args a;
    memset(&a, 0, sizeof a);
    a.kind = MLK_ATTN_VISION;
    a.out = p->out;
    a.q = p->q;
    a.k = p->k;
    a.v = p->v;
    a.valid = p->valid;
    a.n_seqs = p->n_seq;
    a.seq_len = p->seq_len;
    a.n_heads = a.n_kv_heads = p->n_heads;
    a.group = 1;
    a.head_dim = p->head_dim;
    a.scale = p->scale;
    if (mlk_attn_vision_mma(b, &a, op) == 0)
        return;
    const int blocks = (p->seq_len + SIMT_CTA_ROWS(VISION_ROWS) - 1) / SIMT_CTA_ROWS(VISION_ROWS);
    mlk_attn_simt(b, &a, VISION_ROWS, blocks, op);
}

void mlk_attn_causal(ml_backend *be, const ml_attn_causal_params *p)
{
    mlk_backend *b = mlk_of(be);
    const char *op = "attn_causal";
    if (p->n_seqs <= 0 || mlk_enter(b) ||
        check_heads(b, op, p->n_heads, p->n_kv_heads, p->head_dim))
        return;
    if (p->block_size < 1 || p->max_blocks_per_seq < 1) {
        mlk_latch(b, ML_ERR_INVALID_ARG, op, "blocks of %d, %d per sequence", p->block_size,
                  p->max_blocks_per_seq);
        return;
    }
    mlk_attn_args a;
    memset(&a, 0, sizeof a);
    a.kind = MLK_ATTN_CAUSAL;
    a.out = p->out;
    a.q = p->q;
    a.k = p->k_cache;
    a.v = p->v_cache;
    a.block_table = p->block_table;
    a.seq_start = p->seq_start;
    a.pos0 = p->pos0;
    a.n_seqs = p->n_seqs;
    a.max_blocks = p->max_blocks_per_seq;
    a.block_size = p->block_size;
    a.n_heads = p->n_heads;
    a.n_kv_heads = p->n_kv_heads;
    a.group = p->n_heads / p->n_kv_heads;
    a.head_dim = p->head_dim;
    a.scale = p->scale;
    const int rpw = rows_per_warp(a.group);
    if (b->batch_invariant) {
        attn_invariant(b, &a, rpw, op);
        return;
    }
    /* Enough CTAs to fill the GPU whatever the lengths turn out to be:
     * decode sequences split their keys over them, longer ones stride
     * their row blocks. */
    const int pairs = p->n_seqs * p->n_kv_heads;
    int z = (CTAS_PER_SM * b->sm_count + pairs - 1) / pairs;
    z = z < 1 ? 1 : z > MLK_ATTN_MAX_SPLITS ? MLK_ATTN_MAX_SPLITS : z;
    const int splits = fit_splits(z, p->n_seqs, p->n_kv_heads, rpw, p->head_dim);
    if (splits >= 2) {
        a.split = 1;
        a.partial = b->attn_ws;
        z = splits;
    }
    mlk_attn_simt(b, &a, rpw, z, op);
}

void mlk_attn_cross(ml_backend *be, const ml_attn_cross_params *p)
{
    mlk_backend *b = mlk_of(be);
    const char *op = "attn_cross";
    if (p->n_seqs <= 0 || p->n_tokens <= 0 || mlk_enter(b) ||
        check_heads(b, op, p->n_heads, p->n_kv_heads, p->head_dim))
        return;
    /* Planes at 16-byte multiples keep the kernel's 16-byte K loads aligned. */
    if (p->max_images < 0 || p->max_tiles < 1 || p->chunk_len < 1 ||
        p->k_offset % KV_LOAD_ALIGN != 0 || p->v_offset % KV_LOAD_ALIGN != 0) {
        mlk_latch(b, ML_ERR_INVALID_ARG, op,
                  "%d images of %d tiles of %d keys, K at +%zu, V at +%zu (multiples of %d)",
                  p->max_images, p->max_tiles, p->chunk_len, p->k_offset, p->v_offset,
                  KV_LOAD_ALIGN);
        return;
    }
    mlk_attn_args a;
    memset(&a, 0, sizeof a);
    a.kind = MLK_ATTN_CROSS;
    a.out = p->out;
    a.q = p->q;
    a.states = p->states;
    a.k_offset = p->k_offset;
    a.v_offset = p->v_offset;
    a.n_images = p->n_images;
    a.seq_start = p->seq_start;
    a.allowed = p->allowed;
    a.n_seqs = p->n_seqs;
    a.max_images = p->max_images;
    a.max_tiles = p->max_tiles;
    a.n_chunks = p->max_images * p->max_tiles;
    a.chunk_len = p->chunk_len;
    a.image_keys = p->max_tiles * p->chunk_len;
    a.n_heads = p->n_heads;
    a.n_kv_heads = p->n_kv_heads;
    a.group = p->n_heads / p->n_kv_heads;
    a.head_dim = p->head_dim;
    a.scale = p->scale;
    if (b->batch_invariant) {
        attn_invariant(b, &a, rows_per_warp(a.group), op);
        return;
    }
    /* The average sequence's rows choose the warp shape: one token's GQA
     * group in a decode step, many rows in a prefill. */
    const int rows = (p->n_tokens + p->n_seqs - 1) / p->n_seqs * a.group;
    const int rpw = rows_per_warp(rows);
    const int pairs = p->n_seqs * p->n_kv_heads;
    int z = (CTAS_PER_SM * b->sm_count + pairs - 1) / pairs;
    z = z < 1 ? 1 : z > MLK_ATTN_MAX_SPLITS ? MLK_ATTN_MAX_SPLITS : z;
    if (rows <= rpw) {
        /* Decode: split each sequence's keys over the z CTAs, no more of
         * them than the longest key list (max_images images) fills. */
        const int tiles = (p->max_images * a.image_keys + KEY_TILE_KEYS - 1) / KEY_TILE_KEYS;
        if (z > tiles / MIN_TILES_PER_SPLIT)
            z = tiles / MIN_TILES_PER_SPLIT;
        z = fit_splits(z, p->n_seqs, p->n_kv_heads, rpw, p->head_dim);
        if (z >= 2) {
            a.split = 1;
            a.partial = b->attn_ws;
        } else {
            z = 1;
        }
    }
    mlk_attn_simt(b, &a, rpw, z, op);
}

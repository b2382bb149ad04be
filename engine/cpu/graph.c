/* Graph ops of the CPU backend (graph.h; backend.h graph_begin, graph_end,
 * graph_replay): the CUDA-graph decode path recorded and replayed on the
 * CPU, so that the model's record/replay logic runs in CI without a GPU.
 * A layer over the op table: it reads the backend's own table and swaps
 * base.ops, and needs nothing of engine/cpu but the core (cpu_internal.h).
 *
 * graph_begin points base.ops at a second table, rec_ops, whose op entries
 * append a copy of their arguments to a list instead of running, and whose
 * memory entries (alloc, free, weight, linear_weight, upload, download,
 * synchronize)
 * refuse with a latched error, as they fail under CUDA stream capture: the
 * CPU could run them, but model code that works here must work there.
 * graph_end points base.ops back at the real table and stores the list in
 * the slot, unless an error was latched during the recording (a refused
 * call, no memory for the records: the core's n_latched moved since
 * graph_begin); then the slot is left empty, as CUDA leaves it after a
 * failed capture. graph_replay runs the list through the real table.
 *
 * A record holds pointers and scalars by value, so backend memory is read
 * when the replay runs, as on a device. What the caller may reuse as soon
 * as a call returns is copied at record time: the params structs of the
 * attention and sample ops (by value in the record) and the host arrays a call names
 * (record_copy; today lora's segs only). Recording allocates; replay does
 * not, and adds a switch per op to what the ops cost.
 * @locality: the thread driving the backend, as every op. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/graph.h"

#include "cpu/cpu_internal.h"

/* Records the list starts with; it doubles from there. A decode step of
 * the 11B model is ~10^3 ops. */
#define GRAPH_INITIAL_OPS 256

/* ---- records ------------------------------------------------------------------ */

typedef enum graph_op_kind {
    GRAPH_OP_MATMUL,
    GRAPH_OP_MATMUL_F8,
    GRAPH_OP_LORA,
    GRAPH_OP_RMSNORM,
    GRAPH_OP_LAYERNORM,
    GRAPH_OP_GELU,
    GRAPH_OP_SILU_MUL,
    GRAPH_OP_ROPE,
    GRAPH_OP_ADD_ROWS,
    GRAPH_OP_ADD_BF16,
    GRAPH_OP_ZERO,
    GRAPH_OP_COPY_2D,
    GRAPH_OP_EMBED,
    GRAPH_OP_PATCHIFY,
    GRAPH_OP_ATTN_VISION,
    GRAPH_OP_ATTN_CAUSAL,
    GRAPH_OP_ATTN_CROSS,
    GRAPH_OP_KV_WRITE,
    GRAPH_OP_KV_STORE,
    GRAPH_OP_KV_STORE_KEYS,
    GRAPH_OP_SAMPLE,
    GRAPH_OP_ALL_REDUCE_SUM,
} graph_op_kind;

/* The arguments of each op after `be`, in the op's parameter order
 * (backend.h), so that a record is one positional compound literal. */
typedef struct args_matmul {
    float *y;
    const float *x;
    const uint16_t *w, *bias;
    int M, K, N, accumulate;
} args_matmul;

typedef struct args_matmul_f8 {
    float *y;
    const float *x;
    const uint8_t *w;
    const float *scale;
    const uint16_t *bias;
    int M, K, N, quant_x;
} args_matmul_f8;

typedef struct args_lora {
    float *y;
    const float *x;
    const ml_lora_segment *segs; /* (n_segs), owned by the graph */
    int n_segs, K, N;
    float *scratch;
    int max_rank;
} args_lora;

typedef struct args_rmsnorm {
    float *y;
    const float *x;
    const uint16_t *w;
    int rows, dim;
    float eps;
} args_rmsnorm;

typedef struct args_layernorm {
    float *y;
    const float *x;
    const uint16_t *w, *b;
    int rows, dim;
    float eps;
} args_layernorm;

typedef struct args_gelu {
    float *x;
    size_t n;
} args_gelu;

typedef struct args_silu_mul {
    float *y;
    const float *gate, *up;
    size_t n;
} args_silu_mul;

typedef struct args_rope {
    float *x;
    const int32_t *pos;
    const float *inv_freq;
    int n_tokens, n_heads, head_dim;
} args_rope;

typedef struct args_add_rows {
    float *y;
    const float *x, *row_scale;
    float gate;
    int rows, dim;
} args_add_rows;

typedef struct args_add_bf16 {
    float *y;
    const uint16_t *w;
    float alpha;
    int rows, period, dim;
} args_add_bf16;

typedef struct args_zero {
    float *y;
    size_t n;
} args_zero;

typedef struct args_copy_2d {
    float *dst;
    const float *src;
    int rows, cols;
    size_t dst_row, dst_col, src_row;
} args_copy_2d;

typedef struct args_embed {
    float *y;
    const uint16_t *table;
    const int32_t *ids;
    int n, dim;
} args_embed;

typedef struct args_patchify {
    float *patches;
    const float *pixels;
    int n_img, side, patch;
} args_patchify;

typedef struct args_kv_write {
    void *k_cache, *v_cache;
    const float *k, *v;
    const int32_t *slot;
    int n_tokens, n_kv_heads, head_dim;
} args_kv_write;

typedef struct args_kv_store {
    void *dst;
    const float *src;
    size_t n;
} args_kv_store;

typedef struct args_kv_store_keys {
    void *dst;
    const float *src;
    int n_keys, n_kv_heads, head_dim;
} args_kv_store_keys;

typedef struct args_all_reduce_sum {
    float *x;
    size_t n;
} args_all_reduce_sum;

/* One recorded call. */
typedef struct graph_op {
    graph_op_kind kind;
    union {
        args_matmul matmul;
        args_matmul_f8 matmul_f8;
        args_lora lora;
        args_rmsnorm rmsnorm;
        args_layernorm layernorm;
        args_gelu gelu;
        args_silu_mul silu_mul;
        args_rope rope;
        args_add_rows add_rows;
        args_add_bf16 add_bf16;
        args_zero zero;
        args_copy_2d copy_2d;
        args_embed embed;
        args_patchify patchify;
        ml_attn_vision_params attn_vision;
        ml_attn_causal_params attn_causal;
        ml_attn_cross_params attn_cross;
        args_kv_write kv_write;
        args_kv_store kv_store;
        args_kv_store_keys kv_store_keys;
        ml_sample_params sample;
        args_all_reduce_sum all_reduce_sum;
    } u;
} graph_op;

/* A host array copied into a graph; the graph keeps them in a list. */
typedef struct graph_copy {
    struct graph_copy *next;
    max_align_t data[]; /* the copied bytes */
} graph_copy;

/* A recorded op sequence. All zero: an empty slot. */
typedef struct graph {
    graph_op *ops;      /* owned: (n_ops) in issue order */
    size_t n_ops, cap_ops;
    graph_copy *copies; /* owned: list of host arrays copied at record time */
    int recorded;       /* stored by graph_end (it may hold no op) */
} graph;

/* While slot rec_slot is recorded, base.ops points at rec_ops, whose ops
 * append to rec instead of running. */
struct ml_cpu_graphs {
    ml_backend_ops rec_ops;
    int rec_slot;              /* -1: not recording */
    unsigned latched_at_begin; /* the core's n_latched when the recording began */
    graph rec;
    graph slots[ML_GRAPH_SLOTS];
};

/* Free what a graph owns and zero it (an empty slot again). */
static void graph_deinit(graph *g)
{
    while (g->copies) {
        graph_copy *next = g->copies->next;
        free(g->copies);
        g->copies = next;
    }
    free(g->ops);
    *g = (graph){0};
}

/* ---- errors ------------------------------------------------------------------- */

/* 1 when slot names one; otherwise latches and returns 0. */
static int valid_slot(ml_cpu_backend *cb, int slot, const char *op)
{
    if (slot >= 0 && slot < ML_GRAPH_SLOTS)
        return 1;
    ml_cpu_latch(cb, ML_ERR_INVALID_ARG, op, "slot %d outside [0, %d)", slot, ML_GRAPH_SLOTS);
    return 0;
}

/* 1 (latched) when a recording is under way: op is not allowed in it. */
static int refused(ml_backend *be, const char *op)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    if (cb->graphs->rec_slot < 0)
        return 0;
    ml_cpu_latch(cb, ML_ERR_INVALID_ARG, op, "not allowed while recording graph slot %d",
                 cb->graphs->rec_slot);
    return 1;
}

/* ---- the recording table ------------------------------------------------------- */

/* The next record of the recording, or NULL when out of memory (latched,
 * and the recording will be discarded). */
static graph_op *record(ml_backend *be, graph_op_kind kind)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    graph *g = &cb->graphs->rec;
    if (g->n_ops == g->cap_ops) {
        size_t cap = g->cap_ops ? 2 * g->cap_ops : GRAPH_INITIAL_OPS;
        graph_op *ops = cap <= SIZE_MAX / sizeof *ops ? realloc(g->ops, cap * sizeof *ops)
                                                             : NULL;
        if (!ops) {
            ml_cpu_latch(cb, ML_ERR_NOMEM, "graph record", "out of memory after %zu ops",
                         g->n_ops);
            return NULL;
        }
        g->ops = ops;
        g->cap_ops = cap;
    }
    graph_op *op = &g->ops[g->n_ops++];
    op->kind = kind;
    return op;
}

/* A copy of `bytes` of host memory at src owned by the recording, or NULL
 * when out of memory (latched, and the recording will be discarded). */
static void *record_copy(ml_backend *be, const void *src, size_t bytes)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    graph_copy *c = bytes <= SIZE_MAX - sizeof *c ? malloc(sizeof *c + bytes) : NULL;
    if (!c) {
        ml_cpu_latch(cb, ML_ERR_NOMEM, "graph record", "out of memory for %zu bytes of arguments",
                     bytes);
        return NULL;
    }
    if (bytes)
        memcpy(c->data, src, bytes);
    c->next = cb->graphs->rec.copies;
    cb->graphs->rec.copies = c;
    return c->data;
}

static void *rec_alloc(ml_backend *be, size_t bytes)
{
    refused(be, "alloc");
    return NULL;
}

/* free(NULL) and empty transfers are no-ops, not errors, as on CUDA. */
static void rec_free(ml_backend *be, void *p)
{
    if (p)
        refused(be, "free");
}

static void rec_upload(ml_backend *be, void *dst, const void *src_host, size_t bytes)
{
    if (bytes)
        refused(be, "upload");
}

static void rec_download(ml_backend *be, void *dst_host, const void *src, size_t bytes)
{
    if (bytes)
        refused(be, "download");
}

static const void *rec_weight(ml_backend *be, const void *host, size_t bytes)
{
    if (host)
        refused(be, "weight");
    return NULL;
}

static void rec_weight_free(ml_backend *be, const void *w)
{
    if (w)
        refused(be, "weight_free");
}

static const void *rec_linear_weight(ml_backend *be, const void *host, int rows, int cols,
                                     size_t elem_size)
{
    if (host)
        refused(be, "linear_weight");
    return NULL;
}

static void rec_linear_weight_free(ml_backend *be, const void *w)
{
    if (w)
        refused(be, "linear_weight_free");
}

/* Refused like the others, and reported at once: this is the synchronize. */
static ml_status rec_synchronize(ml_backend *be, char *err, size_t errlen)
{
    refused(be, "synchronize");
    return ml_cpu_of(be)->ops.synchronize(be, err, errlen);
}

static void rec_matmul(ml_backend *be, float *y, const float *x, const uint16_t *w,
                       const uint16_t *bias, int M, int K, int N, int accumulate)
{
    graph_op *op = record(be, GRAPH_OP_MATMUL);
    if (op)
        op->u.matmul = (args_matmul){y, x, w, bias, M, K, N, accumulate};
}

static void rec_matmul_f8(ml_backend *be, float *y, const float *x, const uint8_t *w,
                          const float *scale, const uint16_t *bias, int M, int K, int N,
                          int quant_x)
{
    graph_op *op = record(be, GRAPH_OP_MATMUL_F8);
    if (op)
        op->u.matmul_f8 = (args_matmul_f8){y, x, w, scale, bias, M, K, N, quant_x};
}

static void rec_lora(ml_backend *be, float *y, const float *x, const ml_lora_segment *segs,
                     int n_segs, int K, int N, float *scratch, int max_rank)
{
    graph_op *op = record(be, GRAPH_OP_LORA);
    if (!op)
        return;
    /* segs is the caller's host array, borrowed for the call only. */
    const size_t bytes = n_segs > 0 ? (size_t)n_segs * sizeof *segs : 0;
    op->u.lora = (args_lora){y, x, record_copy(be, segs, bytes), n_segs, K, N, scratch, max_rank};
}

static void rec_rmsnorm(ml_backend *be, float *y, const float *x, const uint16_t *w, int rows,
                        int dim, float eps)
{
    graph_op *op = record(be, GRAPH_OP_RMSNORM);
    if (op)
        op->u.rmsnorm = (args_rmsnorm){y, x, w, rows, dim, eps};
}

static void rec_layernorm(ml_backend *be, float *y, const float *x, const uint16_t *w,
                          const uint16_t *b, int rows, int dim, float eps)
{
    graph_op *op = record(be, GRAPH_OP_LAYERNORM);
    if (op)
        op->u.layernorm = (args_layernorm){y, x, w, b, rows, dim, eps};
}

static void rec_gelu(ml_backend *be, float *x, size_t n)
{
    graph_op *op = record(be, GRAPH_OP_GELU);
    if (op)
        op->u.gelu = (args_gelu){x, n};
}

static void rec_silu_mul(ml_backend *be, float *y, const float *gate, const float *up, size_t n)
{
    graph_op *op = record(be, GRAPH_OP_SILU_MUL);
    if (op)
        op->u.silu_mul = (args_silu_mul){y, gate, up, n};
}

static void rec_rope(ml_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                     int n_tokens, int n_heads, int head_dim)
{
    graph_op *op = record(be, GRAPH_OP_ROPE);
    if (op)
        op->u.rope = (args_rope){x, pos, inv_freq, n_tokens, n_heads, head_dim};
}

static void rec_add_rows(ml_backend *be, float *y, const float *x, const float *row_scale,
                         float gate, int rows, int dim)
{
    graph_op *op = record(be, GRAPH_OP_ADD_ROWS);
    if (op)
        op->u.add_rows = (args_add_rows){y, x, row_scale, gate, rows, dim};
}

static void rec_add_bf16(ml_backend *be, float *y, const uint16_t *w, float alpha, int rows,
                         int period, int dim)
{
    graph_op *op = record(be, GRAPH_OP_ADD_BF16);
    if (op)
        op->u.add_bf16 = (args_add_bf16){y, w, alpha, rows, period, dim};
}

static void rec_zero(ml_backend *be, float *y, size_t n)
{
    graph_op *op = record(be, GRAPH_OP_ZERO);
    if (op)
        op->u.zero = (args_zero){y, n};
}

static void rec_copy_2d(ml_backend *be, float *dst, const float *src, int rows, int cols,
                        size_t dst_row, size_t dst_col, size_t src_row)
{
    graph_op *op = record(be, GRAPH_OP_COPY_2D);
    if (op)
        op->u.copy_2d = (args_copy_2d){dst, src, rows, cols, dst_row, dst_col, src_row};
}

static void rec_embed(ml_backend *be, float *y, const uint16_t *table, const int32_t *ids, int n,
                      int dim)
{
    graph_op *op = record(be, GRAPH_OP_EMBED);
    if (op)
        op->u.embed = (args_embed){y, table, ids, n, dim};
}

static void rec_patchify(ml_backend *be, float *patches, const float *pixels, int n_img,
                         int side, int patch)
{
    graph_op *op = record(be, GRAPH_OP_PATCHIFY);
    if (op)
        op->u.patchify = (args_patchify){patches, pixels, n_img, side, patch};
}

/* The params structs are the caller's, borrowed for the call: kept by
 * value. Everything they point to is backend memory (backend.h). */
static void rec_attn_vision(ml_backend *be, const ml_attn_vision_params *p)
{
    graph_op *op = record(be, GRAPH_OP_ATTN_VISION);
    if (op)
        op->u.attn_vision = *p;
}

static void rec_attn_causal(ml_backend *be, const ml_attn_causal_params *p)
{
    graph_op *op = record(be, GRAPH_OP_ATTN_CAUSAL);
    if (op)
        op->u.attn_causal = *p;
}

static void rec_attn_cross(ml_backend *be, const ml_attn_cross_params *p)
{
    graph_op *op = record(be, GRAPH_OP_ATTN_CROSS);
    if (op)
        op->u.attn_cross = *p;
}

static void rec_kv_write(ml_backend *be, void *k_cache, void *v_cache, const float *k,
                         const float *v, const int32_t *slot, int n_tokens, int n_kv_heads,
                         int head_dim)
{
    graph_op *op = record(be, GRAPH_OP_KV_WRITE);
    if (op)
        op->u.kv_write =
            (args_kv_write){k_cache, v_cache, k, v, slot, n_tokens, n_kv_heads, head_dim};
}

static void rec_kv_store(ml_backend *be, void *dst, const float *src, size_t n)
{
    graph_op *op = record(be, GRAPH_OP_KV_STORE);
    if (op)
        op->u.kv_store = (args_kv_store){dst, src, n};
}

static void rec_kv_store_keys(ml_backend *be, void *dst, const float *src, int n_keys,
                              int n_kv_heads, int head_dim)
{
    graph_op *op = record(be, GRAPH_OP_KV_STORE_KEYS);
    if (op)
        op->u.kv_store_keys = (args_kv_store_keys){dst, src, n_keys, n_kv_heads, head_dim};
}

static void rec_sample(ml_backend *be, const ml_sample_params *p)
{
    graph_op *op = record(be, GRAPH_OP_SAMPLE);
    if (op)
        op->u.sample = *p;
}

/* Each member of a group records its own graph; their replays meet in the
 * collective in the order they recorded it, as NCCL calls in CUDA graphs. */
static void rec_all_reduce_sum(ml_backend *be, float *x, size_t n)
{
    graph_op *op = record(be, GRAPH_OP_ALL_REDUCE_SUM);
    if (op)
        op->u.all_reduce_sum = (args_all_reduce_sum){x, n};
}

/* Every entry is set: an op added to backend.h but not here is a NULL
 * call while recording (a crash at once), never an op that silently runs
 * eagerly. name, destroy, kv_elem_size, sample_scratch_bytes (a query, not
 * an op), the graph ops and n_graph_slots come from the backend's own table
 * at graph_begin. */
static const ml_backend_ops rec_ops_template = {
    .alloc = rec_alloc,
    .free = rec_free,
    .upload = rec_upload,
    .download = rec_download,
    .weight = rec_weight,
    .weight_free = rec_weight_free,
    .linear_weight = rec_linear_weight,
    .linear_weight_free = rec_linear_weight_free,
    .synchronize = rec_synchronize,
    .matmul = rec_matmul,
    .matmul_f8 = rec_matmul_f8,
    .lora = rec_lora,
    .rmsnorm = rec_rmsnorm,
    .layernorm = rec_layernorm,
    .gelu = rec_gelu,
    .silu_mul = rec_silu_mul,
    .rope = rec_rope,
    .add_rows = rec_add_rows,
    .add_bf16 = rec_add_bf16,
    .zero = rec_zero,
    .copy_2d = rec_copy_2d,
    .embed = rec_embed,
    .patchify = rec_patchify,
    .attn_vision = rec_attn_vision,
    .attn_causal = rec_attn_causal,
    .attn_cross = rec_attn_cross,
    .kv_write = rec_kv_write,
    .kv_store = rec_kv_store,
    .kv_store_keys = rec_kv_store_keys,
    .sample = rec_sample,
    .all_reduce_sum = rec_all_reduce_sum,
};

/* ---- replay ----------------------------------------------------------------------- */

static void replay_op(ml_backend *be, const ml_backend_ops *o, const graph_op *op)
{
    switch (op->kind) {
    case GRAPH_OP_MATMUL: {
        const args_matmul *a = &op->u.matmul;
        o->matmul(be, a->y, a->x, a->w, a->bias, a->M, a->K, a->N, a->accumulate);
        break;
    }
    case GRAPH_OP_MATMUL_F8: {
        const args_matmul_f8 *a = &op->u.matmul_f8;
        o->matmul_f8(be, a->y, a->x, a->w, a->scale, a->bias, a->M, a->K, a->N, a->quant_x);
        break;
    }
    case GRAPH_OP_LORA: {
        const args_lora *a = &op->u.lora;
        o->lora(be, a->y, a->x, a->segs, a->n_segs, a->K, a->N, a->scratch, a->max_rank);
        break;
    }
    case GRAPH_OP_RMSNORM: {
        const args_rmsnorm *a = &op->u.rmsnorm;
        o->rmsnorm(be, a->y, a->x, a->w, a->rows, a->dim, a->eps);
        break;
    }
    case GRAPH_OP_LAYERNORM: {
        const args_layernorm *a = &op->u.layernorm;
        o->layernorm(be, a->y, a->x, a->w, a->b, a->rows, a->dim, a->eps);
        break;
    }
    case GRAPH_OP_GELU:
        o->gelu(be, op->u.gelu.x, op->u.gelu.n);
        break;
    case GRAPH_OP_SILU_MUL: {
        const args_silu_mul *a = &op->u.silu_mul;
        o->silu_mul(be, a->y, a->gate, a->up, a->n);
        break;
    }
    case GRAPH_OP_ROPE: {
        const args_rope *a = &op->u.rope;
        o->rope(be, a->x, a->pos, a->inv_freq, a->n_tokens, a->n_heads, a->head_dim);
        break;
    }
    case GRAPH_OP_ADD_ROWS: {
        const args_add_rows *a = &op->u.add_rows;
        o->add_rows(be, a->y, a->x, a->row_scale, a->gate, a->rows, a->dim);
        break;
    }
    case GRAPH_OP_ADD_BF16: {
        const args_add_bf16 *a = &op->u.add_bf16;
        o->add_bf16(be, a->y, a->w, a->alpha, a->rows, a->period, a->dim);
        break;
    }
    case GRAPH_OP_ZERO:
        o->zero(be, op->u.zero.y, op->u.zero.n);
        break;
    case GRAPH_OP_COPY_2D: {
        const args_copy_2d *a = &op->u.copy_2d;
        o->copy_2d(be, a->dst, a->src, a->rows, a->cols, a->dst_row, a->dst_col, a->src_row);
        break;
    }
    case GRAPH_OP_EMBED: {
        const args_embed *a = &op->u.embed;
        o->embed(be, a->y, a->table, a->ids, a->n, a->dim);
        break;
    }
    case GRAPH_OP_PATCHIFY: {
        const args_patchify *a = &op->u.patchify;
        o->patchify(be, a->patches, a->pixels, a->n_img, a->side, a->patch);
        break;
    }
    case GRAPH_OP_ATTN_VISION:
        o->attn_vision(be, &op->u.attn_vision);
        break;
    case GRAPH_OP_ATTN_CAUSAL:
        o->attn_causal(be, &op->u.attn_causal);
        break;
    case GRAPH_OP_ATTN_CROSS:
        o->attn_cross(be, &op->u.attn_cross);
        break;
    case GRAPH_OP_KV_WRITE: {
        const args_kv_write *a = &op->u.kv_write;
        o->kv_write(be, a->k_cache, a->v_cache, a->k, a->v, a->slot, a->n_tokens, a->n_kv_heads,
                    a->head_dim);
        break;
    }
    case GRAPH_OP_KV_STORE:
        o->kv_store(be, op->u.kv_store.dst, op->u.kv_store.src, op->u.kv_store.n);
        break;
    case GRAPH_OP_KV_STORE_KEYS: {
        const args_kv_store_keys *a = &op->u.kv_store_keys;
        o->kv_store_keys(be, a->dst, a->src, a->n_keys, a->n_kv_heads, a->head_dim);
        break;
    }
    case GRAPH_OP_SAMPLE:
        o->sample(be, &op->u.sample);
        break;
    case GRAPH_OP_ALL_REDUCE_SUM:
        o->all_reduce_sum(be, op->u.all_reduce_sum.x, op->u.all_reduce_sum.n);
        break;
    }
}

/* ---- the graph ops ---------------------------------------------------------------- */

ml_cpu_graphs *ml_cpu_graphs_create(void)
{
    ml_cpu_graphs *gs = calloc(1, sizeof *gs);
    if (gs)
        gs->rec_slot = -1;
    return gs;
}

void ml_cpu_graphs_destroy(ml_cpu_graphs *gs)
{
    if (!gs)
        return;
    graph_deinit(&gs->rec);
    for (int i = 0; i < ML_GRAPH_SLOTS; i++)
        graph_deinit(&gs->slots[i]);
    free(gs);
}

void ml_cpu_graph_begin(ml_backend *be, int slot)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    if (!valid_slot(cb, slot, "graph_begin") || refused(be, "graph_begin"))
        return;
    ml_cpu_graphs *gs = cb->graphs;
    ml_backend_ops *t = &gs->rec_ops;
    *t = rec_ops_template;
    t->name = cb->ops.name;
    t->destroy = cb->ops.destroy;
    t->kv_elem_size = cb->ops.kv_elem_size;
    t->sample_scratch_bytes = cb->ops.sample_scratch_bytes;
    t->graph_begin = cb->ops.graph_begin;
    t->graph_end = cb->ops.graph_end;
    t->graph_replay = cb->ops.graph_replay;
    t->n_graph_slots = cb->ops.n_graph_slots;
    if (!cb->ops.all_reduce_sum) /* a backend made alone has none (backend.h) */
        t->all_reduce_sum = NULL;
    gs->rec_slot = slot;
    gs->latched_at_begin = cb->n_latched;
    cb->base.ops = t;
}

void ml_cpu_graph_end(ml_backend *be, int slot)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    ml_cpu_graphs *gs = cb->graphs;
    if (gs->rec_slot < 0 || slot != gs->rec_slot) {
        ml_cpu_latch(cb, ML_ERR_INVALID_ARG, "graph_end", "slot %d is not being recorded", slot);
        return;
    }
    cb->base.ops = &cb->ops;
    gs->rec_slot = -1;
    graph *g = &gs->slots[slot];
    graph_deinit(g);
    /* A failed recording empties the slot: never replay a stale step. */
    if (cb->n_latched != gs->latched_at_begin) {
        graph_deinit(&gs->rec);
        return;
    }
    *g = gs->rec;
    g->recorded = 1;
    gs->rec = (graph){0};
}

void ml_cpu_graph_replay(ml_backend *be, int slot)
{
    ml_cpu_backend *cb = ml_cpu_of(be);
    if (!valid_slot(cb, slot, "graph_replay") || refused(be, "graph_replay"))
        return;
    const graph *g = &cb->graphs->slots[slot];
    if (!g->recorded) {
        ml_cpu_latch(cb, ML_ERR_INVALID_ARG, "graph_replay", "slot %d holds no graph", slot);
        return;
    }
    for (size_t i = 0; i < g->n_ops; i++)
        replay_op(be, &cb->ops, &g->ops[i]);
}

/* The CUDA backend object: create/destroy, the op table, memory (pool,
 * weights, transfers), synchronize with latched errors, and graph capture.
 * The compute ops live in their own files (matmul.cu, norm.cu, ...). */
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mlk_internal.cuh"

/* The interface restates the backend's sizes for the memory plan, which
 * includes no CUDA header (backend.h, through mlk_internal.cuh). */
static_assert(ML_PLAN_CUDA_WORKSPACE_BYTES == MLK_WORKSPACE_BYTES,
              "engine/backend.h restates MLK_WORKSPACE_BYTES");
static_assert(ML_PLAN_CUDA_KV_ELEM_SIZE == sizeof(uint16_t),
              "engine/backend.h restates the bf16 K/V caches");

/* Share of the free device memory taken when pool_bytes is 0: the rest is
 * left to the CUDA context, cuBLAS kernels' modules and other processes.
 * One number with the memory plan's (backend.h). */
#define POOL_DEFAULT_SHARE (ML_PLAN_CUDA_POOL_SHARE_TENTHS / 10.0)
/* Pool sizes are rounded down to this (the driver's large-page size). */
#define POOL_GRANULE ((size_t)2 << 20)
/* The first compute capability with FP8 (E4M3) tensor cores: Ada, sm_89. */
#define FP8_MMA_MIN_SM 89

/* ---- errors ---------------------------------------------------------------------- */

void mlk_latch(mlk_backend *b, ml_status st, const char *op, const char *fmt, ...)
{
    if (b->err_status != ML_OK)
        return;
    b->err_status = st;
    int n = snprintf(b->err, sizeof b->err, "cuda %s: ", op);
    if (n < 0 || (size_t)n >= sizeof b->err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err + n, sizeof b->err - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Errors after which the context stays usable: a bad argument or a
 * configuration refused before anything ran. Everything else (a kernel
 * fault, a lost device) poisons the context. */
static int recoverable(cudaError_t rc)
{
    switch (rc) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorMemoryAllocation:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorGraphExecUpdateFailure:
        return 1;
    default:
        return 0;
    }
}

int mlk_cuda_failed(mlk_backend *b, cudaError_t rc, const char *op)
{
    if (rc == cudaSuccess)
        return 0;
    mlk_latch(b, rc == cudaErrorMemoryAllocation ? ML_ERR_NOMEM : ML_ERR_IO, op, "%s (%s)",
              cudaGetErrorString(rc), cudaGetErrorName(rc));
    if (!recoverable(rc))
        b->fatal = 1;
    return 1;
}

int mlk_enter(mlk_backend *b)
{
    if (b->err_status != ML_OK)
        return 1;
    return mlk_cuda_failed(b, cudaSetDevice(b->device), "set device");
}

void mlk_launched(mlk_backend *b, const char *op)
{
    mlk_cuda_failed(b, cudaGetLastError(), op);
}

/* ---- memory ------------------------------------------------------------------------ */

static int capturing(mlk_backend *b, const char *op)
{
    if (b->capture_slot < 0)
        return 0;
    mlk_latch(b, ML_ERR_INVALID_ARG, op, "not allowed while recording graph slot %d",
              b->capture_slot);
    return 1;
}

static void *cuda_alloc(ml_backend *be, size_t bytes)
{
    mlk_backend *b = mlk_of(be);
    if (capturing(b, "alloc"))
        return NULL;
    return mlk_pool_alloc(&b->pool, bytes);
}

static void cuda_free(ml_backend *be, void *p)
{
    mlk_backend *b = mlk_of(be);
    if (!p || capturing(b, "free"))
        return;
    /* A block still read by queued work may be reused by a later alloc,
     * but only by ops queued after it on the same stream: safe. */
    if (mlk_pool_free(&b->pool, p) != 0)
        mlk_latch(b, ML_ERR_INVALID_ARG, "free", "%p is not a live pool block", p);
}

/* A copy per call, owned by the caller until cuda_weight_free (backend.h).
 * No cache keyed by the host address: a model loaded after another was
 * destroyed maps its checkpoint where the old mmap may have been, and would
 * get the old model's copy of any tensor of the same size at an address the
 * two share. */
static const void *cuda_weight(ml_backend *be, const void *host, size_t bytes)
{
    mlk_backend *b = mlk_of(be);
    if (!host || capturing(b, "weight") || mlk_enter(b))
        return NULL;
    void *dev = mlk_pool_alloc(&b->pool, bytes);
    if (!dev) {
        mlk_latch(b, ML_ERR_NOMEM, "weight",
                  "pool full: %zu bytes wanted, %zu of %zu MiB in use", bytes,
                  b->pool.used_bytes >> 20, b->pool.capacity >> 20);
        return NULL;
    }
    /* Pageable source (usually the checkpoint's mmap): the copy has read
     * the host bytes when the call returns. */
    if (mlk_cuda_failed(b, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, b->stream),
                        "weight upload")) {
        mlk_pool_free(&b->pool, dev);
        return NULL;
    }
    return dev;
}

static void cuda_weight_free(ml_backend *be, const void *w)
{
    cuda_free(be, (void *)w);
}

/* cuBLASLt and the GEMV kernels read a Linear row-major, as stored: the
 * same upload as any weight. */
static const void *cuda_linear_weight(ml_backend *be, const void *host, int rows, int cols,
                                      size_t elem_size)
{
    if (rows <= 0 || cols <= 0) {
        mlk_latch(mlk_of(be), ML_ERR_INVALID_ARG, "linear_weight", "%d x %d", rows, cols);
        return NULL;
    }
    return cuda_weight(be, host, (size_t)rows * (size_t)cols * elem_size);
}

static void cuda_upload(ml_backend *be, void *dst, const void *src_host, size_t bytes)
{
    mlk_backend *b = mlk_of(be);
    if (!bytes || capturing(b, "upload") || mlk_enter(b))
        return;
    if (bytes <= MLK_STAGE_UP_BYTES - b->stage_up_used) {
        /* Pinned: truly asynchronous; the region is reused after synchronize. */
        unsigned char *stage = b->stage_up + b->stage_up_used;
        memcpy(stage, src_host, bytes);
        b->stage_up_used += (bytes + MLK_POOL_ALIGN - 1) / MLK_POOL_ALIGN * MLK_POOL_ALIGN;
        if (b->stage_up_used > MLK_STAGE_UP_BYTES)
            b->stage_up_used = MLK_STAGE_UP_BYTES;
        mlk_cuda_failed(b, cudaMemcpyAsync(dst, stage, bytes, cudaMemcpyHostToDevice, b->stream),
                        "upload");
        return;
    }
    /* Pageable: the driver has taken the bytes when the call returns. */
    mlk_cuda_failed(b, cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, b->stream),
                    "upload");
}

/* The stream has drained: deliver the staged downloads (unless an error
 * made them meaningless) and recycle both staging buffers. */
static void staging_drained(mlk_backend *b, int deliver)
{
    for (int i = 0; deliver && i < b->n_pending; i++)
        memcpy(b->pending[i].dst_host, b->stage_down + b->pending[i].stage_off,
               b->pending[i].bytes);
    b->n_pending = 0;
    b->stage_down_used = 0;
    b->stage_up_used = 0;
}

static void cuda_download(ml_backend *be, void *dst_host, const void *src, size_t bytes)
{
    mlk_backend *b = mlk_of(be);
    if (!bytes || capturing(b, "download") || mlk_enter(b))
        return;
    if (bytes <= MLK_STAGE_DOWN_BYTES - b->stage_down_used &&
        b->n_pending < MLK_MAX_PENDING_DOWNLOADS) {
        size_t off = b->stage_down_used;
        b->stage_down_used += (bytes + MLK_POOL_ALIGN - 1) / MLK_POOL_ALIGN * MLK_POOL_ALIGN;
        if (b->stage_down_used > MLK_STAGE_DOWN_BYTES)
            b->stage_down_used = MLK_STAGE_DOWN_BYTES;
        if (mlk_cuda_failed(b, cudaMemcpyAsync(b->stage_down + off, src, bytes,
                                               cudaMemcpyDeviceToHost, b->stream),
                            "download"))
            return;
        b->pending[b->n_pending++] = mlk_pending_download{dst_host, off, bytes};
        return;
    }
    /* Too large for the staging: drain first so that staged downloads into
     * the same buffer cannot land after this one, then copy synchronously. */
    if (mlk_cuda_failed(b, cudaStreamSynchronize(b->stream), "download"))
        return;
    staging_drained(b, 1);
    if (!mlk_cuda_failed(b, cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, b->stream),
                         "download"))
        mlk_cuda_failed(b, cudaStreamSynchronize(b->stream), "download");
}

static ml_status cuda_synchronize(ml_backend *be, char *err, size_t errlen)
{
    mlk_backend *b = mlk_of(be);
    /* A synchronize inside a capture would invalidate it: report instead. */
    if (!capturing(b, "synchronize") && !b->fatal) {
        int failed = mlk_cuda_failed(b, cudaSetDevice(b->device), "synchronize") ||
                     mlk_cuda_failed(b, cudaStreamSynchronize(b->stream), "synchronize");
        staging_drained(b, !failed && b->err_status == ML_OK);
    }
    ml_status st = b->err_status;
    if (st != ML_OK && err && errlen)
        snprintf(err, errlen, "%s", b->err);
    if (!b->fatal) { /* request-level: report once, keep serving */
        b->err_status = ML_OK;
        b->err[0] = '\0';
    }
    return st;
}

/* ---- graphs ------------------------------------------------------------------------- */

static int valid_slot(mlk_backend *b, int slot, const char *op)
{
    if (slot >= 0 && slot < MLK_GRAPH_SLOTS)
        return 1;
    mlk_latch(b, ML_ERR_INVALID_ARG, op, "slot %d outside [0, %d)", slot, MLK_GRAPH_SLOTS);
    return 0;
}

static void cuda_graph_begin(ml_backend *be, int slot)
{
    mlk_backend *b = mlk_of(be);
    if (!valid_slot(b, slot, "graph_begin") || capturing(b, "graph_begin") || mlk_enter(b))
        return;
    if (!mlk_cuda_failed(b, cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal),
                         "graph_begin"))
        b->capture_slot = slot;
}

static void cuda_graph_end(ml_backend *be, int slot)
{
    mlk_backend *b = mlk_of(be);
    if (b->capture_slot < 0 || slot != b->capture_slot) {
        mlk_latch(b, ML_ERR_INVALID_ARG, "graph_end", "slot %d is not being recorded", slot);
        return;
    }
    /* End the capture even after an error, so the stream runs eagerly again. */
    b->capture_slot = -1;
    cudaGraph_t graph = NULL;
    cudaError_t rc = cudaStreamEndCapture(b->stream, &graph);
    cudaGraphExec_t *exec = &b->graphs[slot];
    if (mlk_cuda_failed(b, rc, "graph_end") || b->err_status != ML_OK) {
        /* A failed recording empties the slot: never replay a stale step. */
        if (graph)
            cudaGraphDestroy(graph);
        if (*exec)
            cudaGraphExecDestroy(*exec);
        *exec = NULL;
        return;
    }
    if (*exec) {
        /* Same topology (the usual re-record of a decode step): patch in place. */
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(*exec, graph, &info) == cudaSuccess) {
            cudaGraphDestroy(graph);
            return;
        }
        cudaGetLastError();
        cudaGraphExecDestroy(*exec);
        *exec = NULL;
    }
    mlk_cuda_failed(b, cudaGraphInstantiate(exec, graph, 0), "graph_end");
    cudaGraphDestroy(graph);
}

static void cuda_graph_replay(ml_backend *be, int slot)
{
    mlk_backend *b = mlk_of(be);
    if (!valid_slot(b, slot, "graph_replay") || capturing(b, "graph_replay") || mlk_enter(b))
        return;
    if (!b->graphs[slot]) {
        mlk_latch(b, ML_ERR_INVALID_ARG, "graph_replay", "slot %d holds no graph", slot);
        return;
    }
    mlk_cuda_failed(b, cudaGraphLaunch(b->graphs[slot], b->stream), "graph_replay");
}

/* ---- create / destroy ----------------------------------------------------------------- */

void mlk_backend_free(ml_backend *be)
{
    mlk_backend *b = mlk_of(be);
    if (!b)
        return;
    cudaSetDevice(b->device);
    if (b->stream)
        cudaStreamSynchronize(b->stream);
    mlk_nccl_destroy(b);
    for (int i = 0; i < MLK_GRAPH_SLOTS; i++)
        if (b->graphs[i])
            cudaGraphExecDestroy(b->graphs[i]);
    if (b->lt)
        cublasLtDestroy(b->lt);
    if (b->stream)
        cudaStreamDestroy(b->stream);
    if (b->stage_up)
        cudaFreeHost(b->stage_up);
    if (b->stage_down)
        cudaFreeHost(b->stage_down);
    mlk_pool_deinit(&b->pool);
    free(b);
}

static const ml_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = mlk_backend_free,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .weight = cuda_weight,
    .weight_free = cuda_weight_free,
    .linear_weight = cuda_linear_weight,
    .linear_weight_free = cuda_weight_free,
    .kv_elem_size = sizeof(uint16_t),
    .synchronize = cuda_synchronize,
    .matmul = mlk_matmul,
    .matmul_f8 = mlk_matmul_f8,
    .lora = mlk_lora,
    .rmsnorm = mlk_rmsnorm,
    .layernorm = mlk_layernorm,
    .gelu = mlk_gelu,
    .silu_mul = mlk_silu_mul,
    .rope = mlk_rope,
    .add_rows = mlk_add_rows,
    .add_bf16 = mlk_add_bf16,
    .zero = mlk_zero,
    .copy_2d = mlk_copy_2d,
    .embed = mlk_embed,
    .patchify = mlk_patchify,
    .attn_vision = mlk_attn_vision,
    .attn_causal = mlk_attn_causal,
    .attn_cross = mlk_attn_cross,
    .kv_write = mlk_kv_write,
    .kv_store = mlk_kv_store,
    .kv_store_keys = mlk_kv_store_keys,
    .sample = mlk_sample,
    .sample_scratch_bytes = mlk_sample_scratch_bytes,
    .all_reduce_sum = NULL,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_replay = cuda_graph_replay,
    .n_graph_slots = MLK_GRAPH_SLOTS,
};

/* Create-time failures: fill err and *st, return 1. */
static int create_fail(ml_status *st, ml_status code, char *err, size_t errlen, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));

static int create_fail(ml_status *st, ml_status code, char *err, size_t errlen, const char *fmt,
                       ...)
{
    *st = code;
    if (err && errlen) {
        int n = snprintf(err, errlen, "cuda backend: ");
        va_list ap;
        va_start(ap, fmt);
        if (n >= 0 && (size_t)n < errlen)
            vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return 1;
}

static int create_cuda_failed(cudaError_t rc, const char *what, ml_status *st, char *err,
                              size_t errlen)
{
    if (rc == cudaSuccess)
        return 0;
    cudaGetLastError();
    return create_fail(st, rc == cudaErrorMemoryAllocation ? ML_ERR_NOMEM : ML_ERR_IO, err,
                       errlen, "%s: %s", what, cudaGetErrorString(rc));
}

mlk_backend *mlk_backend_new(int device, size_t pool_bytes, int batch_invariant, ml_status *st,
                             char *err, size_t errlen)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
        cudaGetLastError();
        create_fail(st, ML_ERR_INVALID_ARG, err, errlen, "device %d not present (%d devices)",
                    device, n);
        return NULL;
    }
    cudaDeviceProp prop;
    if (create_cuda_failed(cudaSetDevice(device), "set device", st, err, errlen) ||
        create_cuda_failed(cudaGetDeviceProperties(&prop, device), "device properties", st, err,
                           errlen))
        return NULL;
    if (prop.major < 8) {
        create_fail(st, ML_ERR_UNSUPPORTED, err, errlen, "%s is sm_%d%d; sm_80 or later is required",
                    prop.name, prop.major, prop.minor);
        return NULL;
    }
    if (pool_bytes == 0) {
        size_t free_b = 0, total_b = 0;
        if (create_cuda_failed(cudaMemGetInfo(&free_b, &total_b), "memory info", st, err, errlen))
            return NULL;
        pool_bytes = (size_t)((double)free_b * POOL_DEFAULT_SHARE);
    }
    pool_bytes -= pool_bytes % POOL_GRANULE;
    if (pool_bytes < MLK_WORKSPACE_BYTES + POOL_GRANULE) {
        create_fail(st, ML_ERR_INVALID_ARG, err, errlen,
                    "a %zu MiB pool leaves nothing beside the %zu MiB of workspaces",
                    pool_bytes >> 20, (size_t)MLK_WORKSPACE_BYTES >> 20);
        return NULL;
    }

    mlk_backend *b = (mlk_backend *)calloc(1, sizeof *b);
    if (!b) {
        create_fail(st, ML_ERR_NOMEM, err, errlen, "out of host memory");
        return NULL;
    }
    b->ops = cuda_ops;
    b->base.ops = &b->ops;
    b->device = device;
    b->sm_count = prop.multiProcessorCount;
    b->cc_major = prop.major;
    b->fp8_mma = prop.major * 10 + prop.minor >= FP8_MMA_MIN_SM;
    b->batch_invariant = batch_invariant != 0;
    b->world = 1;
    b->capture_slot = -1;
    snprintf(b->name, sizeof b->name, "cuda:%d", device);
    b->ops.name = b->name;

    void *base = NULL;
    if (create_cuda_failed(cudaMalloc(&base, pool_bytes), "pool allocation", st, err, errlen))
        goto fail;
    if (mlk_pool_init(&b->pool, base, pool_bytes) != 0) {
        cudaFree(base);
        create_fail(st, ML_ERR_NOMEM, err, errlen, "out of host memory");
        goto fail;
    }
    b->xbf16 = (__nv_bfloat16 *)mlk_pool_alloc(&b->pool, MLK_XBF16_BYTES);
    b->bias_f32 = (float *)mlk_pool_alloc(&b->pool, MLK_BIAS_F32_BYTES);
    b->lt_ws = mlk_pool_alloc(&b->pool, MLK_LT_WS_BYTES);
    b->attn_ws = (float *)mlk_pool_alloc(&b->pool, MLK_ATTN_WS_BYTES);
    if (create_cuda_failed(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking), "stream",
                           st, err, errlen) ||
        create_cuda_failed(cudaHostAlloc((void **)&b->stage_up, MLK_STAGE_UP_BYTES,
                                         cudaHostAllocDefault), "pinned staging", st, err, errlen) ||
        create_cuda_failed(cudaHostAlloc((void **)&b->stage_down, MLK_STAGE_DOWN_BYTES,
                                         cudaHostAllocDefault), "pinned staging", st, err, errlen))
        goto fail;
    if (cublasLtCreate(&b->lt) != CUBLAS_STATUS_SUCCESS) {
        b->lt = NULL;
        create_fail(st, ML_ERR_IO, err, errlen, "cuBLASLt initialisation failed");
        goto fail;
    }
    mlk_attn_init(b);
    if (create_cuda_failed(cudaGetLastError(), "kernel attributes", st, err, errlen))
        goto fail;
    *st = ML_OK;
    return b;
fail:
    mlk_backend_free(&b->base);
    return NULL;
}

extern "C" ml_backend *ml_backend_cuda_create(int device, size_t pool_bytes, int batch_invariant,
                                              char *err, size_t errlen)
{
    ml_status st;
    mlk_backend *b = mlk_backend_new(device, pool_bytes, batch_invariant, &st, err, errlen);
    return b ? &b->base : NULL;
}

/* Tensor parallelism: groups of backends joined by one NCCL communicator,
 * and all_reduce_sum over them (ncclAllReduce on each backend's stream).
 * Built without NCCL (MLK_HAVE_NCCL undefined), a group can only have one
 * member, whose all_reduce_sum is the identity, so graph code written for
 * tensor parallelism still runs at TP = 1.
 *
 * Batch-invariant groups (ml_backend_cuda_create_group's batch_invariant)
 * cannot use ncclAllReduce: NCCL picks its algorithm (ring, tree), protocol
 * and chunking by the message size, rows · width, so which partial sums an
 * element's total is built from changes with the step's rows. Theirs is an
 * ncclAllGather of chunks of MLK_GATHER_BYTES / world into the pool's
 * staging, then x[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... in rank order,
 * on every member: the same bits on every rank and for every n, as the
 * CPU group adds. It moves (world - 1) · n floats into each member against
 * a ring all-reduce's 2 (world - 1) / world · n: the same at world 2,
 * world / 2 times more beyond. */
#include <cstdio>
#include <cstdlib>

#include "mlk_internal.cuh"

#ifdef MLK_HAVE_NCCL
#include <nccl.h>
#endif

#define RANK_SUM_THREADS 256

#ifdef MLK_HAVE_NCCL
/* x[i] = Σ_r parts[r·len + i] for r = 0 .. world-1, added in that order. */
__global__ void rank_sum_kernel(float *x, const float *parts, size_t len, int world)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = parts[i];
        for (int r = 1; r < world; r++)
            s += parts[(size_t)r * len + i];
        x[i] = s;
    }
}

/* The batch-invariant all_reduce_sum (see the top of the file). Every
 * chunk's collective is issued even after an error, as in mlk_all_reduce_sum:
 * the peers wait in each one. */
static void rank_order_sum(mlk_backend *b, float *x, size_t n)
{
    const size_t chunk = MLK_GATHER_BYTES / sizeof(float) / (size_t)b->world;
    for (size_t c0 = 0; c0 < n; c0 += chunk) {
        const size_t len = n - c0 < chunk ? n - c0 : chunk;
        const ncclResult_t rc = ncclAllGather(x + c0, b->gather, len, ncclFloat32,
                                              (ncclComm_t)b->nccl, b->stream);
        if (rc != ncclSuccess)
            mlk_latch(b, ML_ERR_IO, "all_reduce_sum", "%s", ncclGetErrorString(rc));
        mlk_launch(rank_sum_kernel, mlk_blocks(len, RANK_SUM_THREADS), RANK_SUM_THREADS, 0,
                   b->stream, x + c0, b->gather, len, b->world);
        mlk_launched(b, "all_reduce_sum");
    }
}
#endif

void mlk_all_reduce_sum(ml_backend *be, float *x, size_t n)
{
    mlk_backend *b = mlk_of(be);
    if (!n || !b->nccl)
        return;
    /* Issued even when this member has latched an error and skips its other
     * ops: every peer is waiting in the same collective, and a member that
     * left it out would hang them all. The sum is then meaningless, and
     * this member's synchronize reports its error to the caller. */
    mlk_cuda_failed(b, cudaSetDevice(b->device), "set device");
#ifdef MLK_HAVE_NCCL
    if (b->gather) {
        rank_order_sum(b, x, n);
        return;
    }
    const ncclResult_t rc =
        ncclAllReduce(x, x, n, ncclFloat32, ncclSum, (ncclComm_t)b->nccl, b->stream);
    if (rc != ncclSuccess)
        mlk_latch(b, ML_ERR_IO, "all_reduce_sum", "%s", ncclGetErrorString(rc));
#endif
}

void mlk_nccl_destroy(mlk_backend *b)
{
#ifdef MLK_HAVE_NCCL
    if (b->nccl)
        ncclCommDestroy((ncclComm_t)b->nccl);
#endif
    b->nccl = NULL;
}

extern "C" int ml_backend_cuda_has_nccl(void)
{
#ifdef MLK_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

static ml_status group_fail(ml_backend **out, int n, ml_status st, char *err, size_t errlen,
                            const char *msg, const char *detail)
{
    for (int i = 0; i < n; i++) {
        mlk_backend_free(out[i]);
        out[i] = NULL;
    }
    if (msg && err && errlen)
        snprintf(err, errlen, "cuda group: %s%s", msg, detail ? detail : "");
    return st;
}

extern "C" ml_status ml_backend_cuda_create_group(int n_devices, const int *devices,
                                                  size_t pool_bytes, int batch_invariant,
                                                  ml_backend **out, char *err, size_t errlen)
{
    if (n_devices < 1 || !devices || !out)
        return group_fail(out, 0, ML_ERR_INVALID_ARG, err, errlen, "no devices", NULL);
    for (int i = 0; i < n_devices; i++) {
        out[i] = NULL;
        for (int j = 0; j < i; j++)
            if (devices[j] == devices[i])
                return group_fail(out, 0, ML_ERR_INVALID_ARG, err, errlen,
                                  "a device is listed twice", NULL);
    }
#ifndef MLK_HAVE_NCCL
    if (n_devices > 1)
        return group_fail(out, 0, ML_ERR_UNSUPPORTED, err, errlen,
                          "built without NCCL: one device per group", NULL);
#endif
    for (int i = 0; i < n_devices; i++) {
        ml_status st;
        mlk_backend *b = mlk_backend_new(devices[i], pool_bytes, batch_invariant, &st, err, errlen);
        if (!b)
            return group_fail(out, i, st, NULL, 0, NULL, NULL);
        b->ops.all_reduce_sum = mlk_all_reduce_sum;
        out[i] = &b->base;
    }
#ifdef MLK_HAVE_NCCL
    ncclComm_t *comms = (ncclComm_t *)calloc((size_t)n_devices, sizeof *comms);
    if (!comms)
        return group_fail(out, n_devices, ML_ERR_NOMEM, err, errlen, "out of host memory", NULL);
    const ncclResult_t rc = ncclCommInitAll(comms, n_devices, devices);
    if (rc != ncclSuccess) {
        free(comms);
        return group_fail(out, n_devices, ML_ERR_IO, err, errlen, "ncclCommInitAll: ",
                          ncclGetErrorString(rc));
    }
    for (int i = 0; i < n_devices; i++) {
        mlk_backend *b = mlk_of(out[i]);
        b->nccl = comms[i];
        b->world = n_devices;
    }
    free(comms);
    /* A single member's sum is exact already; larger groups stage. */
    for (int i = 0; batch_invariant && n_devices > 1 && i < n_devices; i++) {
        mlk_backend *b = mlk_of(out[i]);
        b->gather = (float *)mlk_pool_alloc(&b->pool, MLK_GATHER_BYTES);
        if (!b->gather)
            return group_fail(out, n_devices, ML_ERR_NOMEM, err, errlen,
                              "pool too small for the batch-invariant all-reduce staging", NULL);
    }
#endif
    return ML_OK;
}

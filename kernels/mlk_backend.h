/* The CUDA backend: the op table of engine/backend.h on NVIDIA GPUs (sm_80
 * and later), callable from C without CUDA headers. Consumers that link
 * mlk_cuda get MLLAMA_HAVE_CUDA=1 and call these under #ifdef.
 *
 * Differences from the CPU reference that callers see:
 * - kv_elem_size is 2: K/V caches and resident cross-attention states are
 *   bf16 (the CPU keeps f32); matmul rounds its f32 activations to bf16 for
 *   the tensor cores (cuBLASLt, f32 accumulation) except in the M <= 4
 *   decode path (which a batch-invariant backend does not take); the
 *   vision attention rounds Q, K, V and P to bf16.
 *   Results therefore agree with the CPU to bf16 level (an NMSE of ~3e-6
 *   per matmul), not bitwise: tests/gpu compares them by NMSE.
 * - Unless created batch_invariant, a row's result may depend on the other
 *   rows of the call (the matmul regime and cuBLASLt algorithm follow M,
 *   the attention splits follow the number of sequences): README.md in
 *   this directory lists each case.
 * - Ops are queued on one stream and return at once; errors are latched
 *   and reported by synchronize. download's host buffer is complete only
 *   after synchronize returns.
 * - The graph ops are implemented (backend.h); all_reduce_sum only on
 *   backends made by ml_backend_cuda_create_group (NULL otherwise).
 * @locality: one backend is driven by one thread at a time. */
#ifndef MLK_BACKEND_H
#define MLK_BACKEND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h"

/* A backend on CUDA device `device` owning one device pool of pool_bytes
 * (0 = backend.h's ML_PLAN_CUDA_POOL_SHARE_TENTHS of the device's free
 * memory) from which alloc, weight and the backend's own workspaces (about
 * MLK_WORKSPACE_BYTES, see mlk_internal.cuh) are carved. batch_invariant
 * != 0: every op's result for a row (a token, a sequence) is bit-identical
 * whatever the other rows of the call are (matmul: one cuBLASLt algorithm
 * per weight shape for every M, no GEMV regime, no split-K; attention: a
 * decode sequence's keys split by its own length, not by the batch;
 * kernels/README.md "Batch invariance"); 0: the fastest choice per shape.
 * Fixed for the backend's life. Returns NULL and fills err when the device
 * is absent, the pool cannot be allocated or is smaller than the workspaces,
 * or cuBLASLt fails to start. Destroy with be->ops->destroy(be). */
ml_backend *ml_backend_cuda_create(int device, size_t pool_bytes, int batch_invariant, char *err,
                                   size_t errlen);

/* n_devices backends, one per entry of devices[], joined by one NCCL
 * communicator so all_reduce_sum sums across them (tensor parallelism),
 * each created as ml_backend_cuda_create(devices[i], pool_bytes,
 * batch_invariant). A batch-invariant group of two or more sums in rank
 * order (an all-gather and a local sum: collective.cu), the same bits on
 * every member and for every n; it takes 32 MiB more of each pool.
 * On success out[0 .. n_devices) are owned by the caller, each destroyed
 * with its ops->destroy; each must then be driven by its own thread
 * (collectives block until every member has joined). Errors:
 * ML_ERR_INVALID_ARG (bad count or device), ML_ERR_UNSUPPORTED (built
 * without NCCL and n_devices > 1), ML_ERR_NOMEM, ML_ERR_IO (CUDA or NCCL
 * failure); nothing is left allocated on error. */
ml_status ml_backend_cuda_create_group(int n_devices, const int *devices, size_t pool_bytes,
                                       int batch_invariant, ml_backend **out, char *err,
                                       size_t errlen);

/* 1 when this build has NCCL (all_reduce_sum across devices), else 0. */
int ml_backend_cuda_has_nccl(void);

#ifdef __cplusplus
}
#endif

#endif

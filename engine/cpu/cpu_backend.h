/* The CPU backend's constructors (cpu_backend.c): the op table of
 * engine/backend.h on the host, the reference every other backend is
 * tested against. The twin of kernels/mlk_backend.h. */
#ifndef ML_CPU_BACKEND_H
#define ML_CPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "status.h"

/* The CPU backend with n_threads threads, the caller's included (0 = one per
 * online CPU). Its kernels use the widest ISA the CPU supports unless the
 * environment variable ML_CPU_ISA (plain, avx2, avx512) names a lower one.
 * Returns NULL and fills err on failure (an unknown or unsupported
 * ML_CPU_ISA, out of memory, a thread that would not start). */
ml_backend *ml_backend_cpu_create(int n_threads, char *err, size_t errlen);

/* Opt-in bf16 activations (model.cpu_activations = "bf16"): from now on a
 * bf16 Linear rounds its input rows to bf16 (RNE, as torch's
 * .to(torch.bfloat16) and the CUDA backend's GEMM inputs) and multiplies
 * them with AVX-512 BF16's dot product, twice the f32 FMA rate, instead of
 * widening its weights to f32: no longer the f32 reference's numerics
 * (engine/cpu/README.md states the error against it), still batch
 * invariant. FP8 Linears, attention and everything else are unchanged.
 * Call it before any Linear is bound (linear_weight packs for the mode).
 * Returns ML_OK; ML_ERR_UNSUPPORTED when this CPU (or the ML_CPU_ISA
 * chosen) has no AVX-512 BF16; ML_ERR_INVALID_ARG once Linears are bound. */
ml_status ml_backend_cpu_bf16_activations(ml_backend *be, char *err, size_t errlen);

/* Opt-in bf16 K/V (model.cpu_kv_cache = "bf16"): the paged K/V caches and
 * the images' cross-attention states hold bf16 (kv_elem_size becomes 2):
 * kv_write, kv_store and kv_store_keys round to it (RNE, as the CUDA
 * backend's caches), the causal and cross attention widen what they read
 * back to f32 and compute as before. Half the memory and half the bytes
 * read per cached key; not the f32 reference's numerics (every cached K and
 * V rounded; tests/golden/README.md states the error). Any ISA. Call it
 * before a model is loaded on the backend: its caches are sized by
 * kv_elem_size. Returns ML_OK; ML_ERR_INVALID_ARG once Linears are bound
 * (a model is loaded). */
ml_status ml_backend_cpu_bf16_kv_cache(ml_backend *be, char *err, size_t errlen);

/* How fast this process reads the backend's packed weights (every Linear
 * bound, FP8 and bf16): passes (>= 1) streaming reads of them all with the
 * backend's threads, as a decode step's matmuls read them. Returns the
 * fastest pass's seconds and sets *bytes to the bytes each pass read; 0 and
 * *bytes 0 when no Linear is bound (or out of memory). *bytes / seconds is
 * the read bandwidth a memory-bound decode step of this process can reach:
 * the bound of tests/bench/roofline.sh measured on the step's own pages
 * (engine/cpu/read_rate.c says why). Reads only; nothing changes. */
double ml_backend_cpu_weights_read(ml_backend *be, int passes, uint64_t *bytes);

/* `world` CPU backends of threads_each threads each (0 = the online CPUs
 * shared evenly, at least one) forming one tensor-parallel group: their
 * all_reduce_sum is an in-process collective, for `world` threads each
 * driving one member (every rank gets bit-identical sums, added in rank
 * order). out[0 .. world) receives the members, each owned by the caller
 * (destroy each; the group goes with the last). On failure every out[i] is
 * NULL, nothing is left allocated and err says why: ML_ERR_INVALID_ARG
 * (world outside [1, ML_CPU_GROUP_MAX], threads_each < 0), the ISA
 * selection's error (ML_CPU_ISA, as ml_backend_cpu_create), ML_ERR_NOMEM
 * (memory, or a thread that would not start). */
#define ML_CPU_GROUP_MAX 64
ml_status ml_backend_cpu_create_group(int world, int threads_each, ml_backend **out, char *err,
                                      size_t errlen);

#endif
